// libFuzzer target: arbitrary bytes as a .npy file end in a tensor or an InputError; a tensor that
// parses is written back (np.save's format) and must parse to the same shape, type and bytes.
// Build and run: scripts/fuzz.sh (docs/fuzzing.md).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "datasets/npy.h"
#include "kernels/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace qeval;
  Tensor t;
  try {
    t = datasets::parse_npy(std::span(data, size), "fuzz.npy");
  } catch (const InputError&) {
    return 0;
  }
  const std::vector<std::uint8_t> bytes = datasets::serialize_npy(t);
  const Tensor back = datasets::parse_npy(bytes, "fuzz.npy (written back)");
  if (back.dtype() != t.dtype() || back.shape() != t.shape() || back.nbytes() != t.nbytes() ||
      (t.nbytes() && std::memcmp(back.raw(), t.raw(), t.nbytes()) != 0))
    __builtin_trap();
  return 0;
}
