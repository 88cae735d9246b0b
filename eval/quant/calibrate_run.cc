// qeval calibrate's work, outside the CLI.
#include "eval/quant/calibrate_run.h"

#include <cstdlib>

#include "eval/onnx_export.h"
#include "eval/onnx_import.h"
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

CalibrateSummary run_calibrate(const CalibrateOptions& o) {
  CalibrateSummary s;
  s.recipe = load_recipe(o.recipe);
  const Graph graph = load_onnx(o.model);
  s.selection = select_nodes(graph, s.recipe);
  TensorCalibrationSet set = TensorCalibrationSet::from_folder(o.data, graph);
  s.data_description = set.describe();
  if (o.cache_dir) {
    s.calibration = calibrate_cached(graph, s.selection, s.recipe, set, *o.cache_dir, &s.cache_hit);
  } else {
    s.calibration = calibrate(graph, s.selection, s.recipe, set);
  }
  const AppliedRecipe applied = apply_recipe(graph, s.selection, s.recipe, s.calibration);
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
