// qeval run: the evaluator (variants against the reference over a prompt or image set) -> report.
#include <fmt/format.h>
#include <tbb/task_arena.h>

#include <csignal>
#include <filesystem>

#include "base/exit_codes.h"
#include "base/progress.h"
#include "eval/cli/command.h"
#include "eval/cli/interrupt.h"
#include "eval/cli/report_context.h"
#include "eval/run/compare_recipes.h"
#include "eval/run/evaluator.h"
#include "eval/run/gate.h"
#include "eval/run/out_lock.h"
#include "eval/run/run_report_build.h"
#include "eval/run/run_state.h"
#include "kernels/error.h"

namespace qeval::cli {
namespace {

namespace fs = std::filesystem;

struct RunArgs {
  std::string config, pipeline, prompts, out = "qeval-run", gate, shard;
  int count = 0;
  bool no_layers = false, fresh = false;
};

// The command that resumes an interrupted run: this one without --fresh (which would start over).
std::string resume_command(const std::string& command_line) {
  std::string s = " " + command_line + " ";
  for (std::size_t at; (at = s.find(" --fresh ")) != std::string::npos;) s.erase(at, 8);
  return s.substr(1, s.size() - 2);
}

int run_run(const RunArgs& a, const Context& ctx) {
  if (!a.config.empty() && !a.pipeline.empty())
    throw InputError("give either --config or --pipeline, not both (a run config names its \"pipeline\")");
  if (!a.prompts.empty() && a.pipeline.empty())
    throw InputError("--prompts goes with --pipeline (a run config names its \"prompts\")");
  eval::RunSpec spec = !a.pipeline.empty() ? eval::pipeline_run_config(a.pipeline, a.prompts)
                       : a.config.empty()  ? eval::default_run_config()
                                           : eval::read_run_config(a.config);
  if (a.count > 0) spec.count = a.count;
  if (a.no_layers) spec.observe.layers = false;
  if (!a.gate.empty()) spec.gate = a.gate;
  const eval::Gate gate = spec.gate.empty() ? eval::Gate{} : eval::load_gate(spec.gate, eval::GateMetrics::kRun);
  std::optional<std::pair<int, int>> shard;
  if (!a.shard.empty()) shard = eval::parse_shard(a.shard);
  const fs::path out = a.out;
  // Held until the process ends: a second qeval writing here would overwrite this run's images.
  // Nothing is removed: the previous report stays until the new one replaces it (atomically).
  const eval::OutFolderLock lock(out, ctx.command_line);

  const bool tty = base::progress_settings().mode != base::ProgressMode::kNone;  // progress on stderr
  const auto driver = eval::make_run_driver(spec);
  {  // a gate metric this run does not measure is an error before anything runs, not after
    std::vector<std::string> keys;
    for (const auto& m : driver->description().metrics) keys.push_back(m.key);
    eval::check_gate_metrics(gate, keys);
  }
  auto variants = eval::build_variants(spec, *driver, tty);
  const std::string key = eval::run_key(spec, *driver, variants);
  const std::string spec_json = eval::run_spec_json(spec);
  eval::EvaluatorOptions options;
  options.out_dir = out;
  options.progress = tty;
  if (shard) options.units = eval::shard_units(driver->units(), shard->first, shard->second);
  eval::RunResult result = eval::start_run(spec, *driver, std::move(variants), options);
  eval::CallShapes shapes(spec.reference);  // one call of each model: the MACs behind "quantized"
  result.observation.node_hook = shapes.hook();
  result.observation.node_hook_reads_values = false;  // shapes alone: device values stay there
  result.observation.node_hook_variant = spec.reference;

  // The result cache: a state of the same run in --out holds units that need not run again.
  const fs::path state = out / eval::kRunStateFile;
  if (!a.fresh && fs::exists(state)) {
    eval::RunStateInfo info;
    try {
      info = eval::read_run_state_info(state);
    } catch (const InputError& e) {
      throw InputError(std::string(e.what()) +
                       ": the saved state of an earlier run is unreadable (truncated or "
                       "damaged); rerun with --fresh to start over (it replaces the state), or remove the file");
    }
    const std::string misfit = info.key == key ? eval::run_state_fits(info, *driver) : std::string();
    if (info.key == key && misfit.empty()) {
      try {
        eval::merge_run_state(state, key, *driver, result);
      } catch (const InputError& e) {
        throw InputError(std::string(e.what()) + "; rerun with --fresh to start over (it replaces the state)");
      }
      if (shard)  // keep only this shard's units: the state may hold others (a whole run's)
        for (std::size_t i = 0; i < result.done.size(); ++i)
          if (result.done[i] && std::find(options.units.begin(), options.units.end(), i) == options.units.end())
            throw InputError(state.string() + " holds units outside shard " + a.shard +
                             "; use another --out or --fresh");
    } else if (info.key == key) {
      fmt::print(stderr, "qeval run: {} cannot be reused ({}): starting afresh\n", state.string(), misfit);
    } else {
      fmt::print(stderr, "qeval run: {} is of another run (config or models changed): starting afresh\n",
                 state.string());
    }
  }
  if (result.reused)
    fmt::print(stderr, "qeval run: reusing {} finished unit(s) from {}\n", result.reused, state.string());
  options.checkpoint = [&](const eval::RunResult& r) {
    eval::save_run_state(state, r, *driver, key, spec_json, spec.source);
  };
  if (tty) {
    std::string names;
    for (const auto& v : result.variants) names += (names.empty() ? "" : ", ") + v.spec.name;
    fmt::print(stderr, "qeval run: {} ({}), {} units{}{}, variants {} (reference {})\n", driver->description().name,
               driver->kind().name, driver->units(),
               shard ? fmt::format(", shard {} ({} units)", a.shard, options.units.size()) : "", "", names,
               spec.reference);
  }
  {
    const StopOnSignals signals;
    options.stop = [&signals] { return signals.received() != 0; };
    eval::run_units(spec, *driver, result, options);
    std::size_t done = 0;
    const std::size_t wanted = options.units.empty() ? result.done.size() : options.units.size();
    for (char d : result.done) done += d != 0;
    if (const int sig = signals.received(); sig && done < wanted) {  // all done anyway: the report follows
      fmt::print(stderr,
                 "qeval run: {} received: stopped with {} of {} units finished, saved in {} (no report written).\n"
                 "Resume with:\n  {}\n",
                 sig == SIGINT    ? "SIGINT"
                 : sig == SIGTERM ? "SIGTERM"
                                  : "a signal",
                 done, wanted, state.string(), resume_command(ctx.command_line));
      return 128 + sig;
    }
  }

  eval::ReportContext rc = report_context(ctx);
  rc.threads = kernels::worker_threads();
  rc.shard = a.shard;
  rc.shapes = &shapes;
  return eval::write_run_outputs(spec, *driver, result, gate, rc, out);
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
      "fp32 reference vs fp16, int8 level 3 and fp8 level 4 on 8 prompts, gated by\n"
      "models/tiny-sd/gate.json. Config format: docs/run-config.md; gates: docs/gate.md. Results are\n"
      "identical for any --threads and any --shard split (qeval merge); the finished units are saved\n"
      "after each one and a rerun into the same --out (or one with a larger --count) reuses them.\n"
      "SIGINT/SIGTERM: the units in progress finish and are saved, the resume command is printed.\n"
      "One qeval at a time writes into an --out folder (qeval.lock). Exit: 0 gate passed, 1 gate\n"
      "failed, 2 bad input or --out in use, 130/143 stopped by SIGINT/SIGTERM.");
  cmd->add_option("--config", a->config, "the run config (JSON, docs/run-config.md)");
  cmd->add_option("--pipeline", a->pipeline,
                  "instead of --config: a pipeline that lists its own variants (an export folder with a "
                  "quantized UNet beside unet/, docs/pipelines.md), run against its models as written");
  cmd->add_option("--prompts", a->prompts, "with --pipeline: the prompts (default: the pipeline's evaluation set)");
  cmd->add_option("--out", a->out, "output folder (default qeval-run)");
  cmd->add_option("--gate", a->gate, "gate file (docs/gate.md); overrides the config's \"gate\"");
  cmd->add_option("--count", a->count, "evaluate only the first N prompts (overrides the config's \"count\")")
      ->check(whole_number_at_least(1));
  cmd->add_option("--shard", a->shard,
                  "I/N: run only the I-th of N contiguous slices of the units (qeval merge "
                  "combines the shards' --out folders)");
  cmd->add_flag("--no-layers", a->no_layers, "skip per-layer observation (final outputs only; faster)");
  cmd->add_flag("--fresh", a->fresh, "ignore finished units saved in --out (run-state.msgpack) and run all again");
  return [a](const Context& ctx) { return run_run(*a, ctx); };
}

const bool kRegistered = register_command(10, add_run);

}  // namespace
}  // namespace qeval::cli
