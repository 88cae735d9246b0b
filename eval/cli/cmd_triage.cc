// qeval triage: which quantized nodes of a recipe variant break the gate, and the fallback recipe.
#include <fmt/format.h>

#include <filesystem>

#include "base/exit_codes.h"
#include "base/files.h"
#include "base/progress.h"
#include "base/terminal.h"
#include "eval/cli/command.h"
#include "eval/quant/recipe.h"
#include "eval/run/gate.h"
#include "eval/run/out_lock.h"
#include "eval/run/outputs.h"
#include "eval/run/triage.h"
#include "kernels/error.h"
#include "qeval/version.h"
#include "reports/json_text.h"
#include "reports/triage_report.h"

namespace qeval::cli {
namespace {

namespace fs = std::filesystem;

struct TriageArgs {
  std::string config, variant, gate, out = "qeval-triage", metric, rank = "sensitivity";
  int count = 0;
  std::size_t batch = 12;
};

int run_triage(const TriageArgs& a, const Context& ctx) {
  eval::RunSpec spec = eval::read_run_config(a.config);
  if (a.count > 0) spec.count = a.count;
  if (!a.gate.empty()) spec.gate = a.gate;
  if (spec.gate.empty())
    throw InputError(a.config +
                     ": triage needs a gate to search for: --gate G.json or \"gate\" in the config "
                     "(docs/gate.md)");
  const eval::Gate gate = eval::load_gate(spec.gate, eval::GateMetrics::kRun);
  const fs::path out = a.out;
  const eval::OutFolderLock lock(out, ctx.command_line);  // the previous report stays until replaced

  eval::TriageOptions options;
  options.variant = a.variant;
  options.metric = a.metric;
  options.sensitivity = a.rank == "sensitivity";
  options.batch = a.batch;
  options.progress = base::progress_settings().mode != base::ProgressMode::kNone;
  eval::TriageOutcome t = eval::run_triage(spec, gate, options);
  t.report.tool_version = QEVAL_VERSION;
  t.report.created_utc = utc_now();
  t.report.command_line = ctx.command_line;
  if (!t.report.chosen.empty()) {
    const fs::path recipe = out / (base::file_name_for(t.override_recipe.name) + ".json");
    base::write_file_atomic(recipe, reports::dump_json_readable(t.override_recipe.document()));
    t.report.override_recipe.path = recipe.string();
  }
  reports::write_triage_report(t.report, out);
  fmt::print("{}", reports::render_summary_text(t.report, out, base::stdout_columns()));
  return t.passed ? base::kExitPass : base::kExitGateFailed;
}

Runner add_triage(CLI::App& app) {
  auto a = std::make_shared<TriageArgs>();
  auto* cmd = app.add_subcommand(
      "triage",
      "Find the quantized nodes of a recipe variant that make it fail its gate, and the smallest set to\n"
      "keep in high precision so that it passes. Takes the run config of `qeval run` (txt2img,\n"
      "segmentation or a single model; docs/run-config.md). Ranks the variant's quantized nodes by\n"
      "local error and by sensitivity (the output metric with only that node quantized, and with\n"
      "only that node kept in high precision), then searches: ranked greedy fallback (keep nodes in\n"
      "rank order until the gate passes, then re-quantize those not needed; every set verified by a\n"
      "run) against Polygraphy-style bisection over the topological and the ranked prefix. Writes the\n"
      "fallback recipe <recipe>-fallback.json (the recipe plus \"exclude_nodes\": usable as is by\n"
      "`qeval run` and `qeval calibrate`), triage.json and triage.html under --out. Exit: 0 a set\n"
      "that passes was found (or the variant passes as given), 1 none passes, 2 bad input.\n"
      "docs/triage.md.");
  cmd->add_option("--config", a->config, "the run config (JSON, docs/run-config.md)")->required();
  cmd->add_option("--variant", a->variant, "the recipe variant to triage (a name in the config's variants)")
      ->required();
  cmd->add_option("--gate", a->gate,
                  "gate file (docs/gate.md); overrides the config's \"gate\"; required if it has none");
  cmd->add_option("--out", a->out, "output folder (default qeval-triage)");
  cmd->add_option("--count", a->count, "evaluate only the first N prompts (overrides the config's \"count\")")
      ->check(whole_number_at_least(1));
  cmd->add_option("--metric", a->metric,
                  "the output metric that ranks nodes (default: the gate's first check's, else the pipeline's "
                  "first: psnr_db, mask_iou, output_sqnr_db)");
  cmd->add_option("--rank", a->rank,
                  "sensitivity (default; two runs per node) or local (local error only: one run, for large graphs)")
      ->check(CLI::IsMember({"sensitivity", "local"}));
  cmd->add_option("--batch", a->batch, "configurations evaluated side by side in one pass (default 12)")
      ->check(whole_number_at_least(1));
  return [a](const Context& ctx) { return run_triage(*a, ctx); };
}

const bool kRegistered = register_command(50, add_triage);

}  // namespace
}  // namespace qeval::cli
