// libFuzzer target: arbitrary text as a `qeval run` config (docs/run-config.md) ends in a RunSpec
// or an InputError naming the file and key. The config sits at the source tree's root, so the
// seeds' relative paths (models/tiny-sd, recipes/..., prompts/...) name shipped files.
// Build and run: scripts/fuzz.sh (docs/fuzzing.md).
#include <cstddef>
#include <cstdint>
#include <string>

#include "eval/run/run_config.h"
#include "kernels/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace qeval;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    eval::parse_run_config(text, std::string(QEVAL_SOURCE_DIR) + "/fuzz-run.json");
  } catch (const InputError&) {
  }
  return 0;
}
