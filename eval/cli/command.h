// The command line's verbs. Each verb lives in its own cli/cmd_<verb>.cc: it adds its subcommand
// (options and --help text) and returns the function that runs it, and registers itself with one
// namespace-scope line:
//   const bool kRegistered = qeval::cli::register_command(30, add_infer);
// `order` sorts the verbs in `qeval --help`. main.cc owns parsing, --threads and exit codes.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

namespace qeval::cli {

struct Context {
  std::string command_line;  // argv joined, quoted where needed (goes into reports)
};

// Runs a parsed verb; returns the exit code (base/exit_codes.h). InputError -> 2 is main's job.
using Runner = std::function<int(const Context&)>;
using Adder = Runner (*)(CLI::App& app);

bool register_command(int order, Adder add);

struct RegisteredCommand {
  int order;
  Adder add;
};
const std::vector<RegisteredCommand>& registered_commands();  // sorted by order

std::string utc_now();  // ISO 8601, seconds, 'Z'

// Checks for numeric options that say what is wrong in plain words ("--count: 0 is too small:
// expected a whole number >= 1"). CLI11's PositiveNumber / NonNegativeNumber printed DBL_MAX in
// full as their range, also for "--threads abc".
CLI::Validator whole_number_at_least(std::int64_t min);
CLI::Validator positive_number();  // a real number > 0

// The one option vocabulary (docs/cli.md "Options"): --model FILE, --count N, --out PATH (never
// required: qeval-<verb> by default). An old spelling is kept for a release as an alias: listed in
// --help under "Deprecated spellings", excluded with the new one, and using it prints one line on
// stderr, e.g.
// "qeval calibrate: --limit is deprecated: use --count (same meaning)".
void print_deprecation(const std::string& verb, const std::string& old_spelling, const std::string& new_spelling);
template <typename T>
CLI::Option* add_old_spelling(CLI::App* cmd, CLI::Option* current, const std::string& old_name, T& variable) {
  CLI::Option* old = cmd->add_option(old_name, variable, "deprecated: use " + current->get_name())
                         ->group("Deprecated spellings (still accepted)");
  old->each([verb = cmd->get_name(), old_name, name = current->get_name()](const std::string&) {
    print_deprecation(verb, old_name, name);
  });
  old->excludes(current);
  return old;
}

}  // namespace qeval::cli
