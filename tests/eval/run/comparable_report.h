// A run report without what legitimately differs between runs of the same config: times, the
// command line, threads, the shard, how many units were read back (`resume`). Shared by the
// shard, merge and resume tests.
#pragma once

#include <filesystem>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace qeval::testing {

inline nlohmann::json comparable_report(const std::filesystem::path& report) {
  nlohmann::json r = read_json(report);
  for (const char* k : {"created_utc", "elapsed_s", "command_line", "resume"}) r.erase(k);
  r["config"].erase("threads");
  r["config"].erase("shard");
  for (auto& v : r["variants"]) v["summary"]["timings"] = nlohmann::json::array();
  for (auto& s : r["samples"])
    for (auto& x : s["results"]) x.erase("elapsed_ms");
  return r;
}

}  // namespace qeval::testing
