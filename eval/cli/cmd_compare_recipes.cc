// qeval compare-recipes: several recipes through one `qeval run` -> one comparison report.
#include <fmt/format.h>
#include <tbb/task_arena.h>

#include <filesystem>

#include "base/exit_codes.h"
#include "base/progress.h"
#include "base/terminal.h"
#include "eval/cli/command.h"
#include "eval/cli/report_context.h"
#include "eval/quant/lint.h"
#include "eval/run/compare_recipes.h"
#include "eval/run/evaluator.h"
#include "eval/run/gate.h"
#include "eval/run/out_lock.h"
#include "eval/run/run_report_build.h"
#include "kernels/error.h"
#include "reports/run_report.h"

namespace qeval::cli {
namespace {

namespace fs = std::filesystem;

struct CompareRecipesArgs {
  std::string config, out = "qeval-compare-recipes", gate, precision = "fp16", target = "sm89";
  std::vector<std::string> recipes;
  int count = 0;
};

int run_compare_recipes(const CompareRecipesArgs& a, const Context& ctx) {
  const int target_sm = eval::quant::parse_target(a.target);                  // InputError listing the targets
  const eval::Precision precision = *eval::precision_from_name(a.precision);  // CLI11 checked the name
  eval::RunSpec base = a.config.empty() ? eval::default_run_config() : eval::read_run_config(a.config);
  if (a.count > 0) base.count = a.count;
  std::vector<fs::path> recipes(a.recipes.begin(), a.recipes.end());
  eval::RunSpec spec = eval::recipe_run_spec(std::move(base), recipes, precision);
  spec.observe.layers = true;  // worst layers and the shapes behind the MAC counts
  if (!a.gate.empty()) spec.gate = a.gate;
  const eval::Gate gate = spec.gate.empty() ? eval::Gate{} : eval::load_gate(spec.gate, eval::GateMetrics::kRun);

  const fs::path out = a.out, run_dir = out / "run";
  const eval::OutFolderLock lock(out, ctx.command_line);  // the previous report stays until replaced

  const bool tty = base::progress_settings().mode != base::ProgressMode::kNone;  // progress on stderr
  const auto driver = eval::make_run_driver(spec);
  auto variants = eval::build_variants(spec, *driver, tty);
  eval::EvaluatorOptions options;
  options.out_dir = run_dir;
  options.progress = tty;
  options.progress_label = "compare-recipes";
  eval::RunResult result = eval::start_run(spec, *driver, std::move(variants), options);
  eval::CallShapes shapes(spec.reference);
  result.observation.node_hook = shapes.hook();
  result.observation.node_hook_reads_values = false;  // shapes alone: device values stay there
  result.observation.node_hook_variant = spec.reference;
  if (tty)
    fmt::print(stderr, "qeval compare-recipes: {} ({}), {} units, {} recipe(s) against {}\n",
               driver->description().name, driver->kind().name, driver->units(), recipes.size(), spec.reference);
  eval::run_units(spec, *driver, result, options);

  eval::ReportContext rc = report_context(ctx);
  rc.threads = kernels::worker_threads();
  rc.shapes = &shapes;
  reports::RunReport report = eval::build_run_report(spec, *driver, result, rc);
  eval::apply_run_gate(gate, report);
  reports::write_run_report(report, run_dir);

  eval::CompareRecipesSettings settings;
  settings.target_sm = target_sm;
  settings.run_report = "run/report.html";
  const reports::RecipeComparison comparison = eval::build_recipe_comparison(spec, result, report, shapes, settings);
  reports::write_recipe_comparison(comparison, out);
  fmt::print("{}", reports::render_summary_text(comparison, out, base::stdout_columns()));
  return comparison.any_passed() ? base::kExitPass : base::kExitGateFailed;
}

Runner add_compare_recipes(CLI::App& app) {
  auto a = std::make_shared<CompareRecipesArgs>();
  auto* cmd =
      app.add_subcommand("compare-recipes",
                         "Run several quantization recipes as variants of one `qeval run` (the config's reference\n"
                         "variant against one variant per recipe, the rest of the model in --precision) and write one\n"
                         "comparison under --out: report.json (docs/recipe-comparison.schema.json) and report.html\n"
                         "with a row per recipe (gate verdict, image or mask metrics, worst layers, share of\n"
                         "parameters and multiply-accumulates quantized, estimated weight bytes, a TensorRT speed\n"
                         "class from the `qeval lint` rules for --target) and charts of quality against the quantized\n"
                         "share; the full run report goes to --out/run. Without --config: the shipped tiny-sd run and\n"
                         "its gate. docs/compare-recipes.md. Exit: 0 at least one recipe passes the gate, 1 none\n"
                         "does, 2 bad input.");
  cmd->add_option("--config", a->config, "the run config (JSON, docs/run-config.md); its reference variant is kept");
  cmd->add_option("--recipes", a->recipes, "recipe files (docs/recipes.md), one variant each")->required();
  cmd->add_option("--gate", a->gate, "gate file (docs/gate.md); overrides the config's \"gate\"");
  cmd->add_option("--out", a->out, "output folder (default qeval-compare-recipes)");
  cmd->add_option("--precision", a->precision, "precision of what the recipes leave in float (default fp16)")
      ->check(CLI::IsMember(eval::precision_names()));
  cmd->add_option("--target", a->target,
                  "TensorRT target of the speed classes: sm75, sm80, sm86, sm89 (default), sm90");
  cmd->add_option("--count", a->count, "evaluate only the first N prompts or images (overrides the config's \"count\")")
      ->check(whole_number_at_least(1));
  return [a](const Context& ctx) { return run_compare_recipes(*a, ctx); };
}

const bool kRegistered = register_command(12, add_compare_recipes);

}  // namespace
}  // namespace qeval::cli
