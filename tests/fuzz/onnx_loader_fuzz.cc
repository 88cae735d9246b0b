// libFuzzer target: arbitrary bytes through the ONNX loader and op construction must end in a
// model or an InputError, never a crash. Build: cmake -DQEVAL_FUZZ=ON with clang (docs in
// bench/README.md).
#include <cstddef>
#include <cstdint>
#include <span>

#include "eval/onnx_import.h"
#include "eval/session.h"
#include "kernels/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    qeval::eval::Graph g = qeval::eval::parse_onnx(std::span(data, size), "fuzz.onnx", "/nonexistent");
    qeval::eval::Session session(g);
  } catch (const qeval::InputError&) {
  }
  return 0;
}
