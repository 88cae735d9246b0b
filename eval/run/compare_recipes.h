// `qeval compare-recipes`: several recipes run as variants of one `qeval run` (same evaluator,
// same gate), then one row per recipe: verdict, quality, worst layers, the share of parameters and
// multiply-accumulates quantized, estimated weight bytes and a speed class from the lint rules.
// docs/compare-recipes.md.
#pragma once

#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "eval/run/evaluator.h"
#include "eval/run/run_config.h"
#include "reports/recipe_comparison.h"
#include "reports/run_report_model.h"

namespace qeval::eval {

// The run behind a comparison: `base`'s reference variant, then one variant per recipe file (named
// by the recipe's "name", made unique with -2, -3, ...), the rest of each model in `precision`.
// The config's other variants are dropped. InputError for a missing or invalid recipe file (named),
// a file given twice, or no recipe.
RunSpec recipe_run_spec(RunSpec base, const std::vector<std::filesystem::path>& recipes, Precision precision);

// Shapes of one call of each model (graph inputs and node outputs), from the reference variant's
// node events (RunObservation::node_hook); thread-safe.
class CallShapes {
 public:
  explicit CallShapes(std::string reference) : reference_(std::move(reference)) {}
  NodeHook hook();
  std::map<std::string, Shape> of(const std::string& model) const;

 private:
  std::string reference_;
  mutable std::mutex mu_;
  std::map<std::string, std::map<std::string, Shape>> shapes_;     // model -> value -> shape
  std::map<std::string, std::pair<std::string, int>> first_call_;  // model -> (context, step) recorded
};

// What `variant` quantizes of one model, counted as compare-recipes counts it: the compute nodes of
// `costs` (the reference model for a recipe variant, the variant's own graph for a separate export),
// their float parameters and MACs at `call` shapes, quantized where `qeval lint` (no target) says the
// variant runs them quantized (parameters also where weight-only). `variant` null: nothing is
// quantized (a precision variant). nullopt when lint cannot run on the variant (e.g. it needs
// shapes that were not recorded). `macs` stay empty when a shape is unknown.
std::optional<reports::ModelQuantization> model_quantization(const std::string& model, const Graph& costs,
                                                             const Graph* variant,
                                                             const std::map<std::string, Shape>& call);

struct CompareRecipesSettings {
  int target_sm = 89;  // TensorRT target of the speed classes
  std::size_t worst_layers = 3;
  std::string run_report;  // path of the full run report, relative to the comparison's folder
};

// The comparison from a finished run and its gated report (build_run_report + apply_run_gate).
reports::RecipeComparison build_recipe_comparison(const RunSpec& spec, const RunResult& result,
                                                  const reports::RunReport& report, const CallShapes& shapes,
                                                  const CompareRecipesSettings& settings);

}  // namespace qeval::eval
