// The qeval command line: parsing, --threads, and the exit codes (0 pass, 1 gate failed, 2 bad
// input, 3 internal). The verbs live in cli/cmd_*.cc and register themselves (cli/command.h).
#include <tbb/global_control.h>
#include <CLI/CLI.hpp>

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>

#include "base/escaped_stdio.h"
#include "base/exit_codes.h"
#include "base/progress.h"
#include "eval/cli/command.h"
#include "eval/cli/device.h"
#include "eval/cli/interrupt.h"
#include "kernels/error.h"
#include "qeval/version.h"

namespace {

std::string join_args(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.find_first_of(" \t\"'") != std::string::npos) a = "'" + a + "'";
    s += (i ? " " : "") + a;
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace qeval;
  base::escape_invalid_utf8_on_stdio();  // a file name that is not UTF-8 prints as \xHH
  CLI::App app{
      "qeval: accuracy and image-quality evaluation for quantized diffusion and vision "
      "models.\n\nExit codes: 0 pass, 1 gate failed, 2 bad input or usage, 3 internal "
      "error.",
      "qeval"};
  app.set_version_flag("--version", std::string("qeval ") + QEVAL_VERSION);
  app.require_subcommand(1);
  app.fallthrough();  // global options (--threads) are accepted after the verb too
  int threads = 0;
  app.add_option("--threads", threads, "worker threads (default: all cores)")->check(cli::whole_number_at_least(0));
  std::string device = "cpu";
  app.add_option("--device", device,
                 "where models execute: cpu, or cuda[:N] for the CUDA backend on GPU N (default 0); nodes the "
                 "GPU has no kernel for run on the CPU; with models of 1 GiB of weights or more, run evaluates 2 units "
                 "at once on a GPU; several GPUs: one process each with run --shard, then merge (docs/gpu.md)")
      ->default_str("cpu");
  std::string progress = "auto";
  app.add_option("--progress", progress,
                 "progress on stderr: auto (a bar on a terminal, else a line every 10 s and per finished unit, "
                 "with counts and ETA), bar, lines, none")
      ->default_str("auto")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            if (base::parse_progress_mode(text)) return {};
            return "'" + text + "' is not a progress mode (expected one of " + std::string(base::kProgressModeNames) +
                   ")";
          },
          "auto|bar|lines|none"));

  std::vector<std::pair<CLI::App*, cli::Runner>> verbs;
  for (const auto& c : cli::registered_commands()) {
    const std::size_t before = app.get_subcommands({}).size();
    cli::Runner run = c.add(app);
    verbs.emplace_back(app.get_subcommands({})[before], std::move(run));
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // No verb parsed: CLI11 says only "A subcommand is required", also for a misspelt verb.
    if (dynamic_cast<const CLI::RequiredError*>(&e) && app.get_subcommands().empty()) {
      std::string names;
      for (const auto& [sub, run] : verbs) names += (names.empty() ? "" : ", ") + sub->get_name();
      const auto rest = app.remaining();
      const auto verb =
          std::find_if(rest.begin(), rest.end(), [](const std::string& a) { return !a.starts_with("-"); });
      if (verb != rest.end())
        std::fprintf(stderr, "qeval: unknown command '%s' (commands: %s; qeval --help describes them)\n", verb->c_str(),
                     names.c_str());
      else
        std::fprintf(stderr, "qeval: a command is required (commands: %s; qeval --help describes them)\n",
                     names.c_str());
      return base::kExitBadInput;
    }
    int code = app.exit(e);  // prints help/version (code 0) or the usage error
    return code == 0 ? base::kExitPass : base::kExitBadInput;
  }

  // Image-sized buffers are allocated and freed for every pair. glibc's default (a threshold that
  // rises to 32 MiB) serves them from the heap, which fragments: resident memory grew by ~50 MB
  // per 1024x1024 pair. A fixed threshold maps each one and returns it when freed.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  // Fixing it also leaves the heap's trim threshold at 128 KiB: every free at the top of the heap
  // gave pages back and the next allocation faulted them in again (qeval run's local error spent
  // ~20 of its ~85 CPU-seconds in the kernel).
  mallopt(M_TRIM_THRESHOLD, 32 << 20);

  std::unique_ptr<tbb::global_control> limit;
  if (threads > 0)
    limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                  static_cast<std::size_t>(threads));
  {
    base::ProgressSettings settings;
    settings.mode = *base::parse_progress_mode(progress);  // checked by the option's validator
    // Tests shorten the lines' period (docs/cli.md); anything but a whole number > 0 is ignored.
    if (const char* ms = std::getenv("QEVAL_PROGRESS_PERIOD_MS")) {
      char* end = nullptr;
      const long v = std::strtol(ms, &end, 10);
      if (end != ms && *end == '\0' && v > 0) settings.period = std::chrono::milliseconds(v);
    }
    base::set_progress_settings(settings);
  }
  const cli::Context context{join_args(argc, argv)};
  for (auto& [sub, run] : verbs)
    if (sub->parsed()) cli::watch_stop_signals(sub->get_name());  // before any other thread starts
  try {
    if (device != "cpu") eval::set_default_backend(cli::backend_for_device(device));
    for (auto& [sub, run] : verbs)
      if (sub->parsed()) return run(context);
  } catch (const InputError& e) {
    std::fprintf(stderr, "qeval: error: %s\n", e.what());
    return base::kExitBadInput;
  } catch (const std::bad_alloc&) {
    // Where no node is to blame (a node's own outputs and scratch say which node): the machine or
    // the device has less memory than the run needs, not a bug.
    std::fprintf(stderr,
                 "qeval: error: out of memory (host or device) outside any node's run: the run needs more than "
                 "this machine has (fewer --threads, fewer variants or a smaller model)\n");
    return base::kExitBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qeval: internal error: %s\n", e.what());
    return base::kExitInternal;
  }
  return base::kExitInternal;
}
