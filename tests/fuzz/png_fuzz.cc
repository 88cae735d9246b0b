// libFuzzer target: arbitrary bytes through the image decoder (seeded with PNG files: the corpus
// steers it to libpng's paths) end in an image or an InputError naming the decoder's reason.
// Build and run: scripts/fuzz.sh (docs/fuzzing.md).
#include <cstddef>
#include <cstdint>
#include <span>

#include "datasets/image_io.h"
#include "kernels/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto image = qeval::datasets::decode_image(std::span(data, size), "fuzz.png");
    if (image.channels() < 1 || image.channels() > 4 || (image.bit_depth != 8 && image.bit_depth != 16))
      __builtin_trap();
  } catch (const qeval::InputError&) {
  }
  return 0;
}
