// Image files in and out: 8/16-bit PNG (gray, gray+alpha, RGB, RGBA, palette) and JPEG decoding.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "kernels/tensor.h"

namespace qeval::datasets {

struct Image {
  Tensor planes;      // float32 [C, H, W]: raw sample values (0..255 or 0..65535), alpha last
  int bit_depth = 8;  // 8 or 16
  bool has_alpha = false;
  std::string format;  // "png" or "jpeg"
  int channels() const { return static_cast<int>(planes.dim(0)); }
  int color_channels() const { return channels() - (has_alpha ? 1 : 0); }
  int height() const { return static_cast<int>(planes.dim(1)); }
  int width() const { return static_cast<int>(planes.dim(2)); }
  double peak() const { return bit_depth == 16 ? 65535.0 : 255.0; }
  // "gray", "gray+alpha", "rgb" or "rgba"
  std::string color_type() const;
};

// Decodes by content (signature), not by extension. Palette and low-bit-depth gray are expanded to
// 8 bits; a tRNS chunk becomes an alpha channel. Throws InputError naming the file and the
// decoder's reason (missing, empty, unknown format, CRC error, truncated data, ...).
Image load_image(const std::filesystem::path& path);
Image decode_image(std::span<const std::uint8_t> bytes, const std::string& name_for_errors);

// An 8-bit interleaved image (HWC) ready to encode.
struct Rgb8 {
  int width = 0, height = 0, channels = 3;  // 1 (gray), 3 (RGB) or 4 (RGBA)
  std::vector<std::uint8_t> pixels;
};
std::vector<std::uint8_t> encode_png(const Rgb8& image);

}  // namespace qeval::datasets
