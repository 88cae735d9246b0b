// qeval merge: the --out folders of `qeval run --shard I/N` runs -> the report a single run gives.
#include <fmt/format.h>

#include <filesystem>

#include "base/exit_codes.h"
#include "base/files.h"
#include "base/input_file.h"
#include "base/progress.h"
#include "base/terminal.h"
#include "eval/cli/command.h"
#include "eval/cli/report_context.h"
#include "eval/run/evaluator.h"
#include "eval/run/gate.h"
#include "eval/run/out_lock.h"
#include "eval/run/run_report_build.h"
#include "eval/run/run_state.h"
#include "kernels/error.h"
#include "reports/run_report.h"

namespace qeval::cli {
namespace {

namespace fs = std::filesystem;

struct MergeArgs {
  std::vector<std::string> dirs;
  std::string out = "qeval-run", gate;
};

// Copies a sample's images from the shard folder that made them (relative paths are kept), each
// atomically (a merge stopped by a signal leaves no half-copied image); a FIFO or folder in an
// image's place is named.
void copy_images(const fs::path& from, const fs::path& to, const eval::UnitOutcome& unit) {
  if (fs::equivalent(from, to)) return;
  for (const auto& s : unit.samples)
    for (const auto& v : s.variants)
      for (const std::string* rel : {&v.image_path, &v.heatmap_path, &v.heatmap_x8_path}) {
        if (rel->empty() || base::describe_non_regular(from / *rel) == "no such file") continue;
        const std::vector<std::uint8_t> bytes = base::read_regular_file(from / *rel);
        fs::create_directories((to / *rel).parent_path());
        base::write_file_atomic(to / *rel, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
      }
}

// What each variant quantizes needs one call's shapes, which the shards recorded and a merge has
// not: taken from the first shard report.json that has it (a shard without one leaves it empty).
void take_quantization(reports::RunReport& report, const std::vector<std::string>& dirs) {
  for (const auto& d : dirs) {
    const fs::path f = (fs::is_directory(d) ? fs::path(d) : fs::path(d).parent_path()) / "report.json";
    if (!fs::exists(f)) continue;
    const reports::RunReport shard = reports::read_run_report(f);
    for (auto& v : report.variants)
      if (const reports::Variant* s = shard.variant(v.name); s && v.quantization.empty())
        v.quantization = s->quantization;
  }
}

int run_merge(const MergeArgs& a, const Context& ctx) {
  const fs::path out = a.out;
  const eval::OutFolderLock lock(out, ctx.command_line);  // the previous report stays until replaced
  std::vector<fs::path> states;
  std::vector<eval::RunStateInfo> infos;
  for (const auto& d : a.dirs) {
    const fs::path f = fs::is_directory(d) ? fs::path(d) / eval::kRunStateFile : fs::path(d);
    if (!fs::exists(f))
      throw InputError(d + ": no " + std::string(eval::kRunStateFile) + " (not a qeval run --out folder)");
    states.push_back(f);
    infos.push_back(eval::read_run_state_info(f));
    if (infos.back().key != infos.front().key)
      throw InputError(f.string() + " is of another run than " + states.front().string() +
                       " (config, models, prompts or qeval version differ)");
  }
  eval::RunSpec spec = eval::parse_run_config(infos.front().spec_json, states.front());
  spec.source = infos.front().source;  // the shards' config, as their reports name it
  if (!a.gate.empty()) spec.gate = a.gate;
  const eval::Gate gate = spec.gate.empty() ? eval::Gate{} : eval::load_gate(spec.gate, eval::GateMetrics::kRun);
  const auto driver = eval::make_run_driver(spec);
  auto variants = eval::build_variants(spec, *driver, /*progress=*/true);
  const std::string key = eval::run_key(spec, *driver, variants);
  if (key != infos.front().key)
    throw InputError("the shards ran on other models, prompts or recipes than those found now (run key " +
                     infos.front().key + ", now " + key + "); rerun them or restore the files");
  eval::EvaluatorOptions options;
  eval::RunResult result = eval::start_run(spec, *driver, std::move(variants), options);
  for (std::size_t k = 0; k < states.size(); ++k) {
    std::vector<char> before = result.done;
    eval::merge_run_state(states[k], key, *driver, result);
    for (std::size_t i = 0; i < result.done.size(); ++i)
      if (result.done[i] && !before[i]) copy_images(states[k].parent_path(), out, result.units[i]);
  }
  std::size_t missing = 0;
  std::string first_missing;
  for (std::size_t i = 0; i < result.done.size(); ++i)
    if (!result.done[i]) {
      if (!missing) first_missing = driver->unit(i).id;
      ++missing;
    }
  if (missing)
    throw InputError(
        fmt::format("{} of {} units are in none of the given folders (the first: {}); merge every "
                    "shard's --out",
                    missing, result.done.size(), first_missing));
  eval::save_run_state(out / eval::kRunStateFile, result, *driver, key, infos.front().spec_json, spec.source);
  eval::ReportContext rc = report_context(ctx);
  reports::RunReport report = eval::build_run_report(spec, *driver, result, rc);
  take_quantization(report, a.dirs);
  eval::apply_run_gate(gate, report);
  reports::write_run_report(report, out);
  fmt::print("{}", reports::render_summary_text(report, out, base::stdout_columns()));
  return report.gate.passed ? base::kExitPass : base::kExitGateFailed;
}

Runner add_merge(CLI::App& app) {
  auto a = std::make_shared<MergeArgs>();
  auto* cmd =
      app.add_subcommand("merge",
                         "Combine the --out folders of `qeval run --shard I/N` runs (same config) into the report a\n"
                         "single run gives, bit for bit: report.json, report.html, junit.xml, the images and a merged\n"
                         "run-state.msgpack under --out. docs/run-config.md shows a Slurm job array and a Kubernetes\n"
                         "indexed Job. Exit: 0 gate passed, 1 gate failed, 2 bad input (a folder of another run, a\n"
                         "missing shard, overlapping shards).");
  cmd->add_option("dirs", a->dirs, "the shards' --out folders (or their run-state.msgpack)")->required();
  cmd->add_option("--out", a->out, "output folder (default qeval-run)");
  cmd->add_option("--gate", a->gate, "gate file (docs/gate.md); default: the shards' config's");
  return [a](const Context& ctx) { return run_merge(*a, ctx); };
}

const bool kRegistered = register_command(11, add_merge);

}  // namespace
}  // namespace qeval::cli
