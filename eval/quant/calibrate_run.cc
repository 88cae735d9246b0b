// qeval calibrate's work, outside the CLI.
#include "eval/quant/calibrate_run.h"

#include <algorithm>
#include <cstdlib>

#include "base/files.h"
#include "eval/exec/onnx_export.h"
#include "eval/exec/onnx_import.h"
#include "eval/quant/segmentation_calibration.h"
#include "eval/quant/txt2img_calibration.h"
#include "kernels/error.h"

namespace qeval::eval::quant {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path default_calibration_cache() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "qeval" / "calibration";
  if (const char* home = std::getenv("HOME"); home && *home) return fs::path(home) / ".cache" / "qeval" / "calibration";
  return fs::temp_directory_path() / "qeval-calibration";
}

json scales_document(const Recipe& recipe, const CalibratedModel& m, const AppliedRecipe& applied) {
  json j = m.calibration.to_json();
  j["recipe_file"] = recipe.source;
  j["recipe_definition"] = recipe.canonical();
  j["quant_format"] = format_name(recipe.format);
  if (!m.name.empty()) j["model_name"] = m.name;
  json sel = json::object();
  for (std::size_t c = 1; c < kNodeCategoryCount; ++c) {
    const auto cat = static_cast<NodeCategory>(c);
    if (category_level(cat) == 0) continue;
    sel[category_name(cat)] = {{"candidates", m.selection.candidates[c]}, {"selected", m.selection.selected[c]}};
  }
  j["selection"] = {{"categories", sel},
                    {"excluded_by_default", m.selection.excluded_by_default},
                    {"excluded_by_pattern", m.selection.excluded_by_pattern},
                    {"included_by_pattern", m.selection.included_by_pattern},
                    {"nodes", json::array()}};
  for (const auto& t : m.selection.targets)
    j["selection"]["nodes"].push_back({{"node", t.node}, {"category", category_name(t.category)}});
  j["weights"] = json::array();
  for (const auto& w : applied.weights)
    j["weights"].push_back({{"node", w.node}, {"weight", w.weight}, {"axis", w.axis}, {"amax", w.amax}});
  j["opset"] = {{"from", applied.opset_from},
                {"to", applied.opset_to},
                {"rewritten_nodes", applied.opset_rewritten_nodes},
                {"rewrites", applied.opset_rewrites}};
  return j;
}

namespace {

// Writes <m.out>/scales.json and <m.out>/quantized.onnx and fills m's counts.
void write_model(const Recipe& recipe, CalibratedModel& m, const AppliedRecipe& applied) {
  m.quantized_activations = applied.quantized_activations;
  m.quantized_weights = static_cast<int>(applied.weights.size());
  m.smoothed_layers = applied.smoothed_layers;
  m.opset_from = applied.opset_from;
  m.opset_to = applied.opset_to;
  m.opset_rewritten_nodes = applied.opset_rewritten_nodes;
  std::error_code ec;
  fs::create_directories(m.out, ec);
  if (!fs::is_directory(m.out, ec)) throw InputError(m.out.string() + ": cannot create the output folder");
  base::write_file_atomic(m.out / "scales.json", scales_document(recipe, m, applied).dump(1) + "\n");
  ExportOptions eo;
  eo.graph_name = "qeval " + recipe.name + (m.name.empty() ? "" : " " + m.name);
  save_onnx(applied.graph, m.out / "quantized.onnx", eo);
}

void calibrate_into(CalibratedModel& m, const Recipe& recipe, const Graph& graph, CalibrationSet& set,
                    const CalibrateOptions& o) {
  m.data_description = set.describe();
  m.calibration = o.cache_dir ? calibrate_cached(graph, m.selection, recipe, set, *o.cache_dir, &m.cache_hit)
                              : calibrate(graph, m.selection, recipe, set);
}

fs::path default_prompts(const CalibrateOptions& o, const fs::path& configured) {
  const fs::path prompts = o.prompts.empty() ? configured : o.prompts;
  if (prompts.empty())
    throw InputError(o.pipeline.string() + ": no --prompts given and pipeline.json names no calibration prompts");
  return prompts;
}

// Both models of a segmentation pipeline, each in <out>/<model>/.
CalibrateSummary run_segmentation(const CalibrateOptions& o, Recipe recipe) {
  CalibrateSummary s;
  s.recipe = std::move(recipe);
  const SegmentationPipeline pipeline = SegmentationPipeline::load(o.pipeline);
  const PointPromptSet prompts =
      read_point_prompts_limited(default_prompts(o, pipeline.config().calibration_prompts), o.limit);
  for (auto& r : calibrate_segmentation(pipeline, s.recipe, prompts, o.cache_dir, o.progress)) {
    CalibratedModel m;
    m.name = r.model;
    m.model = (r.model == "image_encoder" ? pipeline.config().image_encoder : pipeline.config().mask_decoder).model;
    m.out = o.out / r.model;
    m.selection = std::move(r.selection);
    m.calibration = std::move(r.calibration);
    m.cache_hit = r.cache_hit;
    m.data_description = r.data_description;
    write_model(s.recipe, m, r.applied);
    s.models.push_back(std::move(m));
  }
  for (const std::string model : {"image_encoder", "mask_decoder"})
    if (std::none_of(s.models.begin(), s.models.end(), [&](const CalibratedModel& m) { return m.name == model; }))
      s.left_fp32.push_back(model);
  return s;
}

}  // namespace

CalibrateSummary run_calibrate(const CalibrateOptions& o) {
  Recipe recipe = load_recipe(o.recipe);
  const bool pipeline = !o.pipeline.empty();
  if (pipeline == !o.model.empty())
    throw InputError(
        "qeval calibrate: give either --pipeline DIR (txt2img: per-step UNet calibration; "
        "segmentation: image encoder and mask decoder on point prompts) or --model M.onnx with --data DIR");
  if (pipeline && read_pipeline_task(o.pipeline) == PipelineTask::kSegmentation)
    return run_segmentation(o, std::move(recipe));
  CalibrateSummary s;
  s.recipe = std::move(recipe);
  CalibratedModel m;
  m.out = o.out;
  std::shared_ptr<const Graph> graph;
  std::optional<Txt2ImgModels> models;
  if (pipeline) {
    models.emplace(Txt2ImgModels::load(o.pipeline));
    graph = models->unet;
    m.model = models->config.unet.model;
  } else {
    if (o.data.empty()) throw InputError("qeval calibrate: --model needs --data DIR (calibration samples)");
    graph = std::make_shared<const Graph>(load_onnx(o.model));
    m.model = o.model;
  }
  m.selection = select_nodes(*graph, s.recipe);
  if (pipeline) {
    Txt2ImgCalibrationSet set(*models,
                              read_prompt_lines(default_prompts(o, models->config.calibration_prompts), o.limit),
                              o.steps, 0, o.progress);
    calibrate_into(m, s.recipe, *graph, set, o);
  } else {
    TensorCalibrationSet set = TensorCalibrationSet::from_folder(o.data, *graph);
    calibrate_into(m, s.recipe, *graph, set, o);
  }
  write_model(s.recipe, m, apply_recipe(*graph, m.selection, s.recipe, m.calibration));
  s.models.push_back(std::move(m));
  return s;
}

}  // namespace qeval::eval::quant
