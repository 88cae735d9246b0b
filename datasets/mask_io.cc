// Binary masks in and out of image files.
#include "datasets/mask_io.h"

#include <string>

#include "kernels/error.h"

namespace qeval::datasets {

Tensor mask_from_image(const Image& image, const std::string& name_for_errors) {
  const int colors = image.color_channels();
  const std::int64_t h = image.height(), w = image.width(), n = h * w;
  const float* p = image.planes.data<float>();
  Tensor mask(DType::kUInt8, {h, w});
  std::uint8_t* m = mask.data<std::uint8_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    for (int c = 1; c < colors; ++c)
      if (p[c * n + i] != p[i])
        throw InputError(name_for_errors + ": not a mask: pixel (x " + std::to_string(i % w) + ", y " +
                         std::to_string(i / w) + ") has different color channels (" + std::to_string(int(p[i])) +
                         " vs " + std::to_string(int(p[c * n + i])) +
                         "); a mask is a gray image (0 = background, anything else = foreground)");
    m[i] = p[i] != 0.0f ? 1 : 0;
  }
  return mask;
}

Tensor load_mask(const std::filesystem::path& path) { return mask_from_image(load_image(path), path.string()); }

Rgb8 mask_image(const Tensor& mask) {
  if (mask.rank() != 2 || (mask.dtype() != DType::kUInt8 && mask.dtype() != DType::kBool))
    throw std::invalid_argument("mask_image: expected a uint8 or bool [H, W] mask, got " +
                                std::string(dtype_name(mask.dtype())) + " " + shape_to_string(mask.shape()));
  Rgb8 img{static_cast<int>(mask.dim(1)), static_cast<int>(mask.dim(0)), 1, {}};
  const auto* m = reinterpret_cast<const std::uint8_t*>(mask.raw());
  img.pixels.resize(static_cast<std::size_t>(mask.numel()));
  for (std::int64_t i = 0; i < mask.numel(); ++i) img.pixels[std::size_t(i)] = m[i] ? 255 : 0;
  return img;
}

}  // namespace qeval::datasets
