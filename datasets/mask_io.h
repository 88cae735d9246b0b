// Binary masks in and out of image files: uint8 [H, W] tensors, 1 = foreground.
#pragma once

#include <filesystem>

#include "datasets/image_io.h"
#include "kernels/tensor.h"

namespace qeval::datasets {

// Reads a mask image (PNG or JPEG, any bit depth): a gray image, or a color one whose color
// channels are equal at every pixel (alpha is ignored). Any non-zero sample is foreground.
// Returns uint8 [H, W] of 0/1. Throws InputError naming the file (unreadable, colored pixels).
Tensor load_mask(const std::filesystem::path& path);
// The same from a decoded image; `name_for_errors` names it in errors.
Tensor mask_from_image(const Image& image, const std::string& name_for_errors);

// An 8-bit gray image of a uint8/bool [H, W] mask: 255 where non-zero, else 0 (encode_png writes it).
Rgb8 mask_image(const Tensor& mask);

}  // namespace qeval::datasets
