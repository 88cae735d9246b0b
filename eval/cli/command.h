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

}  // namespace qeval::cli
