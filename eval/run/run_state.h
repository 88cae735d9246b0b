// A run's state on disk (<out>/run-state.msgpack): the units finished, their samples and the
// pooled statistics, with the key of everything that changes results. A rerun into the same
// folder skips the units it holds; `--shard I/N` leaves one per shard; `qeval merge` adds shards'
// states into one report. Pooled statistics are exact (eval/run/evaluator.h), so any split gives
// the bits of a single run.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "eval/run/evaluator.h"

namespace qeval::eval {

inline constexpr const char* kRunStateFile = "run-state.msgpack";

// The config as JSON in docs/run-config.md's format with absolute paths: parse_run_config reads it
// back to the same RunSpec.
std::string run_spec_json(const RunSpec& spec);

// Fingerprint of what changes the numbers: the resolved config (but the gate, which only judges
// them, and the count, which only says how many units there are: a state of a smaller count is
// reused by a larger one, unit by unit, see run_state_fits), the prompt or input set, every
// variant's graphs (so a recipe's calibration too) and the qeval version.
std::string run_key(const RunSpec& spec, const RunDriver& driver, const std::vector<BuiltVariant>& variants);

// A unit as a state records it: its id, and its contents when the driver gives them.
std::string unit_uid(const RunDriver& driver, std::size_t index);

struct RunStateInfo {
  std::string key, spec_json, tool_version;
  std::string source;  // the config file the run was given ("" for the default run)
  std::size_t total_units = 0;
  std::vector<std::size_t> done;
  std::vector<std::string> done_uids;  // unit_uid of each done unit
  double elapsed_s = 0;                // the time of every run that added to the state
};

// Writes the state atomically: a reader (or a rerun after kill -9) sees the previous state or
// this one, never a torn file. Its elapsed time is result.elapsed_before_s + result.elapsed_s.
void save_run_state(const std::filesystem::path& file, const RunResult& result, const RunDriver& driver,
                    const std::string& key, const std::string& spec_json, const std::filesystem::path& source);
// The header alone (for qeval merge, which needs the config before it can build the variants).
// InputError naming the file when it cannot be read or is not a run state (truncated, damaged).
RunStateInfo read_run_state_info(const std::filesystem::path& file);
// "" when the state's finished units are units of this run (the same ids and contents at the
// same indices: what lets a larger --count reuse them); else why not.
std::string run_state_fits(const RunStateInfo& info, const RunDriver& driver);
// Adds a saved state's units, statistics and elapsed time (into.elapsed_before_s) to `into`, a
// result started for the same config. InputError naming the file when its key differs from
// `key`, its units are not this run's (run_state_fits) or its layers disagree, or one of its units
// is already in `into` (overlapping shards).
void merge_run_state(const std::filesystem::path& file, const std::string& key, const RunDriver& driver,
                     RunResult& into);

// The units of shard I of N (1-based I): a contiguous block of the units in order.
std::vector<std::size_t> shard_units(std::size_t units, int shard, int shards);
// Parses "I/N" (1 <= I <= N); InputError otherwise.
std::pair<int, int> parse_shard(const std::string& text);

}  // namespace qeval::eval
