// Recipe variants: selection, cached calibration and application over a pipeline's models.
#include "eval/run/recipe_variant.h"

#include <fmt/format.h>

#include <chrono>

#include "eval/quant/apply.h"
#include "eval/quant/calibrate_run.h"
#include "kernels/error.h"

namespace qeval::eval {

namespace fs = std::filesystem;

CalibrationData CalibrationSource::calibration_data(const VariantSpec&, const RunSpec&, bool) const { return {}; }

std::shared_ptr<const Graph> recipe_graph(const Graph& base, const quant::Selection& selection,
                                          const quant::Recipe& recipe, const quant::CalibrationResult& calibration) {
  return std::make_shared<const Graph>(quant::apply_recipe(base, selection, recipe, calibration).graph);
}

RecipeGraphs apply_pipeline_recipe(const RunDriver& driver, const VariantSpec& v, const RunSpec& spec, bool progress) {
  const auto t0 = std::chrono::steady_clock::now();
  const CalibrationData data = driver.calibration_data(v, spec, progress);
  if (data.models.empty())
    throw UnsupportedError(fmt::format(
        "{}: variant '{}': recipe variants of a {} pipeline need a calibration set qeval does not have yet; "
        "calibrate with `qeval calibrate --model M.onnx --data DIR` and give quantized.onnx as \"onnx\"",
        spec.source.empty() ? std::string("the default run") : spec.source.string(), v.name, driver.kind().name));
  RecipeGraphs out;
  const quant::Recipe recipe = quant::load_recipe(v.recipe);
  const fs::path cache = calibration_cache_dir(spec);
  // One model: a recipe that selects nothing in it is an error there (select_nodes says why).
  const bool several = data.models.size() > 1;
  out.cache_hit = true;
  std::string data_fingerprint;  // the same data for every model
  for (const std::string& model : data.models) {
    const std::shared_ptr<const Graph> base = driver.reference_graph(model);
    quant::Selection selection = quant::select_nodes(*base, recipe, /*allow_empty=*/several);
    if (selection.targets.empty()) continue;  // this model stays in float
    const std::unique_ptr<quant::CalibrationSet> set = data.set(model);
    bool hit = false;
    quant::CalibrationResult calibration = quant::calibrate_cached(*base, selection, recipe, *set, cache, &hit);
    out.cache_hit = out.cache_hit && hit;
    data_fingerprint = set->fingerprint();
    out.graphs[model] = recipe_graph(*base, selection, recipe, calibration);
    out.quantized.push_back({model, base, std::move(selection), std::move(calibration)});
  }
  if (out.quantized.empty()) {
    std::string models;
    for (const auto& m : data.models) models += (models.empty() ? "" : " or ") + m;
    throw InputError(recipe.source + ": recipe '" + recipe.name + "' selects no node of " + spec.pipeline.string() +
                     "'s " + models + " (level " + quant::level_string(recipe.level) + ")");
  }
  for (const std::string& m : driver.models())
    if (!out.graphs.count(m)) out.graphs[m] = driver.reference_graph(m);
  out.parsed = recipe;
  out.recipe = {recipe.name, v.recipe.string(), "fnv1a64:" + recipe.fingerprint()};
  out.calibration = reports::Artifact{data.artifact.name, data.artifact.path, "fnv1a64:" + data_fingerprint};
  out.calibration_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

BuiltVariant recipe_variant(const VariantSpec& v, RecipeGraphs r) {
  BuiltVariant b;
  b.spec = v;
  b.options.precision = v.precision;
  b.graphs = std::move(r.graphs);
  b.kind = reports::VariantKind::kRecipe;
  b.recipe = r.recipe;
  b.calibration = r.calibration;
  b.calibration_cache_hit = r.cache_hit;
  b.calibration_s = r.calibration_s;
  for (const auto& q : r.quantized)
    for (const auto& l : q.selection.left_out) b.unquantized.push_back({q.model, l.node, l.op_type, l.reason});
  return b;
}

fs::path calibration_cache_dir(const RunSpec& run) {
  return run.calibration.cache.empty() ? quant::default_calibration_cache() : run.calibration.cache;
}

fs::path calibration_prompts(const VariantSpec& v, const RunSpec& run, const fs::path& pipeline_default,
                             const fs::path& pipeline_file) {
  const fs::path prompts = run.calibration.prompts.empty() ? pipeline_default : run.calibration.prompts;
  if (prompts.empty())
    throw InputError(
        fmt::format("variant '{}': {} names no calibration prompts; give \"calibration\": "
                    "{{\"prompts\": ...}} in the run config ({})",
                    v.name, pipeline_file.string(), kRunConfigDoc));
  return prompts;
}

}  // namespace qeval::eval
