// qeval calibrate's work, outside the CLI.
#include "eval/quant/calibrate_run.h"

#include <cstdlib>

#include "eval/onnx_export.h"
#include "eval/onnx_import.h"
#include "eval/quant/txt2img_calibration.h"
#include "kernels/error.h"
#include "reports/files.h"

namespace qeval::eval::quant {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path default_calibration_cache() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "qeval" / "calibration";
  if (const char* home = std::getenv("HOME"); home && *home) return fs::path(home) / ".cache" / "qeval" / "calibration";
  return fs::temp_directory_path() / "qeval-calibration";
}

json scales_document(const CalibrateSummary& s, const AppliedRecipe& applied) {
  json j = s.calibration.to_json();
  j["recipe_file"] = s.recipe.source;
  j["recipe_definition"] = s.recipe.canonical();
  j["quant_format"] = format_name(s.recipe.format);
  json sel = json::object();
  for (std::size_t c = 1; c < kNodeCategoryCount; ++c) {
    const auto cat = static_cast<NodeCategory>(c);
    if (category_level(cat) == 0) continue;
    sel[category_name(cat)] = {{"candidates", s.selection.candidates[c]}, {"selected", s.selection.selected[c]}};
  }
  j["selection"] = {{"categories", sel},
                    {"excluded_by_default", s.selection.excluded_by_default},
                    {"excluded_by_pattern", s.selection.excluded_by_pattern},
                    {"included_by_pattern", s.selection.included_by_pattern},
                    {"nodes", json::array()}};
  for (const auto& t : s.selection.targets)
    j["selection"]["nodes"].push_back({{"node", t.node}, {"category", category_name(t.category)}});
  j["weights"] = json::array();
  for (const auto& w : applied.weights)
    j["weights"].push_back({{"node", w.node}, {"weight", w.weight}, {"axis", w.axis}, {"amax", w.amax}});
  j["opset"] = {{"from", applied.opset_from}, {"to", applied.opset_to}};
  return j;
}

namespace {

void calibrate_into(CalibrateSummary& s, const Graph& graph, CalibrationSet& set, const CalibrateOptions& o) {
  s.data_description = set.describe();
  if (o.cache_dir) {
    s.calibration = calibrate_cached(graph, s.selection, s.recipe, set, *o.cache_dir, &s.cache_hit);
  } else {
    s.calibration = calibrate(graph, s.selection, s.recipe, set);
  }
}

}  // namespace

CalibrateSummary run_calibrate(const CalibrateOptions& o) {
  CalibrateSummary s;
  s.recipe = load_recipe(o.recipe);
  const bool pipeline = !o.pipeline.empty();
  if (pipeline == !o.model.empty())
    throw InputError("qeval calibrate: give either --pipeline DIR (txt2img, per-step UNet calibration) or "
                     "--model M.onnx with --data DIR");
  std::shared_ptr<const Graph> graph;
  std::optional<Txt2ImgModels> models;
  if (pipeline) {
    if (read_pipeline_task(o.pipeline) != PipelineTask::kTxt2Img)
      throw InputError(o.pipeline.string() + ": --pipeline calibrates txt2img pipelines; calibrate a "
                       "segmentation model with --model M.onnx --data DIR");
    models.emplace(Txt2ImgModels::load(o.pipeline));
    graph = models->unet;
    s.model = models->config.unet.model;
  } else {
    if (o.data.empty()) throw InputError("qeval calibrate: --model needs --data DIR (calibration samples)");
    graph = std::make_shared<const Graph>(load_onnx(o.model));
    s.model = o.model;
  }
  s.selection = select_nodes(*graph, s.recipe);
  if (pipeline) {
    std::filesystem::path prompts = o.prompts.empty() ? models->config.calibration_prompts : o.prompts;
    if (prompts.empty())
      throw InputError(o.pipeline.string() + ": no --prompts given and pipeline.json names no calibration prompts");
    Txt2ImgCalibrationSet set(*models, read_prompt_lines(prompts, o.limit), o.steps, 0, o.progress);
    calibrate_into(s, *graph, set, o);
  } else {
    TensorCalibrationSet set = TensorCalibrationSet::from_folder(o.data, *graph);
    calibrate_into(s, *graph, set, o);
  }
  const Graph& g = *graph;
  const AppliedRecipe applied = apply_recipe(g, s.selection, s.recipe, s.calibration);
  s.quantized_activations = applied.quantized_activations;
  s.quantized_weights = static_cast<int>(applied.weights.size());
  s.smoothed_layers = applied.smoothed_layers;
  s.opset_from = applied.opset_from;
  s.opset_to = applied.opset_to;
  std::error_code ec;
  fs::create_directories(o.out, ec);
  if (!fs::is_directory(o.out, ec)) throw InputError(o.out.string() + ": cannot create the output folder");
  reports::write_file_atomic(o.out / "scales.json", scales_document(s, applied).dump(1) + "\n");
  ExportOptions eo;
  eo.graph_name = "qeval " + s.recipe.name;
  save_onnx(applied.graph, o.out / "quantized.onnx", eo);
  return s;
}

}  // namespace qeval::eval::quant
