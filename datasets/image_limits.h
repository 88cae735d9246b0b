// The pixel limit of image decoding (docs/compare-images.md "Limits").
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "datasets/image_io.h"

namespace qeval::datasets {

// The most pixels (width x height) an image may have: checked against the file's header before
// anything of the image's size is allocated (a 74-byte PNG may claim 20000 x 20000 and cost 1.2 GB
// before failing). Default 8192 x 8192 = 67,108,864; the environment variable QEVAL_MAX_PIXELS (a
// positive whole number) overrides it for every command that reads images.
inline constexpr std::uint64_t kDefaultMaxPixels = 8192ull * 8192ull;
inline constexpr const char* kMaxPixelsVariable = "QEVAL_MAX_PIXELS";

// kDefaultMaxPixels or QEVAL_MAX_PIXELS; InputError naming the variable when it is not a positive
// whole number.
std::uint64_t max_image_pixels();

// decode_image (image_io.h, which uses max_image_pixels()) with an explicit limit.
Image decode_image(std::span<const std::uint8_t> bytes, const std::string& name_for_errors, std::uint64_t max_pixels);

}  // namespace qeval::datasets
