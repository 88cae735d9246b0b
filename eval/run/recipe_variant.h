// Recipe variants of `qeval run`, `triage` and `compare-recipes`: the one place where a recipe is
// selected, calibrated (cached) and applied to a pipeline's models, whatever the pipeline kind (the
// driver only says which models and on what data: RunDriver::calibration_data).
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "eval/exec/graph.h"
#include "eval/quant/calibrate.h"
#include "eval/quant/recipe.h"
#include "eval/quant/select.h"
#include "eval/run/evaluator.h"
#include "reports/run_report_model.h"

namespace qeval::eval {

// A model the recipe quantized, with what re-applying the recipe to a subset of its nodes needs
// (qeval triage): the float graph, the selection and its calibration.
struct QuantizedModel {
  std::string model;
  std::shared_ptr<const Graph> base;
  quant::Selection selection;
  quant::CalibrationResult calibration;
};

// A recipe applied to a pipeline: a graph per model (the reference's where it quantizes nothing).
struct RecipeGraphs {
  std::map<std::string, std::shared_ptr<const Graph>> graphs;
  quant::Recipe parsed;                          // the recipe as read
  std::vector<QuantizedModel> quantized;         // in the pipeline's model order
  reports::Artifact recipe;                      // name, file, fingerprint
  std::optional<reports::Artifact> calibration;  // the calibration set
  bool cache_hit = false;                        // every quantized model's scales came from the cache
  double calibration_s = 0;
};

// `variant`'s recipe on `driver`'s reference graphs: for each model calibration_data names, the
// nodes the recipe selects, calibrated on that model's set (cached by recipe, model and data
// fingerprints in the run's calibration cache), and the recipe applied. A model it selects nothing
// in keeps the reference's graph (InputError when it selects nothing anywhere); UnsupportedError
// for a kind without calibration data.
RecipeGraphs apply_pipeline_recipe(const RunDriver& driver, const VariantSpec& variant, const RunSpec& run,
                                   bool progress);

// `selection` of `base` quantized by `recipe` with `calibration`: the graph a recipe variant runs
// (also for a subset of a selection's targets, the same calibration: triage's candidates).
std::shared_ptr<const Graph> recipe_graph(const Graph& base, const quant::Selection& selection,
                                          const quant::Recipe& recipe, const quant::CalibrationResult& calibration);

// A recipe variant from what apply_pipeline_recipe returned.
BuiltVariant recipe_variant(const VariantSpec& spec, RecipeGraphs graphs);

// For calibration_data: the calibration cache (the run's or the default one) and the calibration
// prompt set (the run's, else `pipeline_default`; none is an InputError naming `pipeline_file`).
std::filesystem::path calibration_cache_dir(const RunSpec& run);
std::filesystem::path calibration_prompts(const VariantSpec& variant, const RunSpec& run,
                                          const std::filesystem::path& pipeline_default,
                                          const std::filesystem::path& pipeline_file);

}  // namespace qeval::eval
