// libFuzzer target: arbitrary text as a gate file (docs/gate.md), read as compare-images and as
// `qeval run` read it, ends in a Gate or an InputError naming the file and key.
// Build and run: scripts/fuzz.sh (docs/fuzzing.md).
#include <cstddef>
#include <cstdint>
#include <string>

#include "eval/run/gate.h"
#include "kernels/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace qeval;
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (auto metrics : {eval::GateMetrics::kKnown, eval::GateMetrics::kRun}) {
    try {
      const eval::Gate gate = eval::parse_gate(text, "fuzz-gate.json", metrics);
      eval::check_gate_metrics(gate, eval::gate_metric_keys());
    } catch (const InputError&) {
    }
  }
  return 0;
}
