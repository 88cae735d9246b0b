// Output images of a unit: the difference heatmap is on one fixed scale (8-bit levels), so a
// variant 1/255 off looks dark and one 75/255 off looks bright, whatever else is in the image.
#include <gtest/gtest.h>

#include <algorithm>

#include "datasets/image_io.h"
#include "eval/run/outputs.h"
#include "reports/heatmap.h"

namespace qeval::eval {
namespace {

datasets::Rgb8 flat(int value) {
  datasets::Rgb8 img{32, 32, 3, {}};
  img.pixels.assign(32 * 32 * 3, std::uint8_t(value));
  return img;
}

// The brightest heatmap pixel's colour sum (R + G + B).
int brightest(const std::vector<std::uint8_t>& png) {
  const datasets::Image img = datasets::decode_image(png, "heatmap");
  const float* p = img.planes.data<float>();
  const std::size_t plane = std::size_t(img.width()) * std::size_t(img.height());
  int best = 0;
  for (std::size_t i = 0; i < plane; ++i) best = std::max(best, int(p[i] + p[plane + i] + p[2 * plane + i]));
  return best;
}

TEST(RunOutputs, DifferenceHeatmapsShareOneFixedScale) {
  const datasets::Rgb8 ref = flat(100);
  VariantOutcome near, far;
  image_outcome(ref, flat(101), false, {}, "u", "fp16", near);  // 1/255 everywhere
  image_outcome(ref, flat(175), false, {}, "u", "int8", far);   // 75/255 everywhere
  ASSERT_FALSE(near.heatmap_png.empty());
  ASSERT_FALSE(far.heatmap_png.empty());
  // 1/255 is 1/32 of the scale: near black (a per-image scale drew it at full brightness).
  EXPECT_LT(brightest(near.heatmap_png), 60);
  // 75/255 is beyond the scale: the ramp's brightest colour.
  std::uint8_t top[3];
  reports::ramp_color(1.0f, top);
  EXPECT_EQ(brightest(far.heatmap_png), top[0] + top[1] + top[2]);
  // Both captions name the same scale and their own largest difference.
  EXPECT_NE(near.heatmap_legend.find("largest 1 of 255 (fixed scale: bright >= 32)"), std::string::npos)
      << near.heatmap_legend;
  EXPECT_NE(far.heatmap_legend.find("largest 75 of 255 (fixed scale: bright >= 32)"), std::string::npos)
      << far.heatmap_legend;
}

}  // namespace
}  // namespace qeval::eval
