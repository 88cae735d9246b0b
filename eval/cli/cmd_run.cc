// qeval run: the evaluator (variants against the reference over a prompt or image set) -> report.
#include <fmt/format.h>
#include <tbb/task_arena.h>

#include <filesystem>

#include "eval/cli/command.h"
#include "eval/exit_codes.h"
#include "eval/gate.h"
#include "eval/progress.h"
#include "eval/run/evaluator.h"
#include "eval/run/run_report_build.h"
#include "kernels/error.h"
#include "qeval/version.h"
#include "reports/run_report.h"

namespace qeval::cli {
namespace {

namespace fs = std::filesystem;

struct RunArgs {
  std::string config, out = "qeval-run", gate;
  int count = 0;
  bool no_layers = false;
};

int run_run(const RunArgs& a, const Context& ctx) {
  eval::RunSpec spec = a.config.empty() ? eval::default_run_config() : eval::read_run_config(a.config);
  if (a.count > 0) spec.count = a.count;
  if (a.no_layers) spec.observe.layers = false;
  if (!a.gate.empty()) spec.gate = a.gate;
  const eval::Gate gate = spec.gate.empty() ? eval::Gate{} : eval::load_gate(spec.gate);
  const fs::path out = a.out;
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw InputError("--out " + out.string() + ": cannot create the folder: " + ec.message());
  // A report.json present means a complete report of this run: remove the previous run's first.
  for (const char* f : {"report.json", "report.html", "junit.xml"}) fs::remove(out / f, ec);

  const auto driver = eval::make_run_driver(spec);
  auto variants = eval::build_variants(spec, *driver, eval::stderr_is_terminal());
  if (eval::stderr_is_terminal()) {
    std::string names;
    for (const auto& v : variants) names += (names.empty() ? "" : ", ") + v.spec.name;
    fmt::print(stderr, "qeval run: {} ({}), {} units, variants {} (reference {})\n", driver->name(),
               eval::run_pipeline_kind_name(driver->kind()), driver->units(), names, spec.reference);
  }
  eval::EvaluatorOptions options;
  options.out_dir = out;
  options.progress = eval::stderr_is_terminal();
  const eval::RunResult result = eval::evaluate(spec, *driver, std::move(variants), options);

  eval::ReportContext rc;
  rc.tool_version = QEVAL_VERSION;
  rc.created_utc = utc_now();
  rc.command_line = ctx.command_line;
  rc.threads = tbb::this_task_arena::max_concurrency();
  reports::RunReport report = eval::build_run_report(spec, *driver, result, rc);
  eval::apply_run_gate(gate, report);
  reports::write_run_report(report, out);
  fmt::print("{}", reports::render_summary_text(report, out));
  return report.gate.passed ? eval::kExitPass : eval::kExitGateFailed;
}

Runner add_run(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  auto* cmd = app.add_subcommand(
      "run",
      "Evaluate quantization variants against a reference variant over a prompt or image set and\n"
      "write report.json (docs/report.schema.json), report.html, junit.xml and the output images\n"
      "under --out. Measures final-image metrics (PSNR/SSIM/MS-SSIM; mask IoU, boundary F and logit\n"
      "error for segmentation), per-layer error (accumulated and local) and activation drift per\n"
      "timestep, teacher-forced UNet error, the first NaN/Inf. With no --config: the shipped tiny-sd,\n"
      "fp32 reference vs fp16 (and the shipped int8/fp8 recipes when present) on 8 prompts.\n"
      "Config format: docs/run-config.md; gates: docs/gate.md. Results are identical for any\n"
      "--threads. Exit: 0 gate passed, 1 gate failed, 2 bad input.");
  cmd->add_option("--config", a->config, "the run config (JSON, docs/run-config.md)");
  cmd->add_option("--out", a->out, "output folder (default qeval-run)");
  cmd->add_option("--gate", a->gate, "gate file (docs/gate.md); overrides the config's \"gate\"");
  cmd->add_option("--count", a->count, "evaluate only the first N prompts (overrides the config's \"count\")")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--no-layers", a->no_layers, "skip per-layer observation (final outputs only; faster)");
  return [a](const Context& ctx) { return run_run(*a, ctx); };
}

const bool kRegistered = register_command(10, add_run);

}  // namespace
}  // namespace qeval::cli
