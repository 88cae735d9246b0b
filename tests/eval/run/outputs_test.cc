// Output images of a unit: the difference heatmap is on one fixed scale (8-bit levels), so a
// variant 1/255 off looks dark and one 75/255 off looks bright, whatever else is in the image.
#include <gtest/gtest.h>

#include <algorithm>

#include "datasets/image_io.h"
#include "eval/run/compare_images.h"
#include "eval/run/outputs.h"
#include "reports/compare_report.h"
#include "reports/heatmap.h"
#include "test_util.h"

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

// The amplified view: the same differences at gain 8, so FP16's 1/255 lights up (8/32 of the ramp)
// where the fixed scale keeps it dark; written beside the fixed-scale heatmap.
TEST(RunOutputs, AmplifiedHeatmapSaysItsGainAndShowsSmallDifferences) {
  const datasets::Rgb8 ref = flat(100);
  VariantOutcome near;
  testing::ScratchDir dir("outputs-x8");
  image_outcome(ref, flat(101), false, dir.path(), "u", "fp16", near);
  ASSERT_FALSE(near.heatmap_x8_png.empty());
  EXPECT_GT(brightest(near.heatmap_x8_png), brightest(near.heatmap_png) + 60);
  std::uint8_t eighth[3];
  reports::ramp_color(1.0f / 4.0f, eighth);  // 1 level at bright >= 4
  EXPECT_EQ(brightest(near.heatmap_x8_png), eighth[0] + eighth[1] + eighth[2]);
  EXPECT_EQ(near.heatmap_x8_path, "images/u/fp16_diff_x8.png");
  EXPECT_TRUE(std::filesystem::exists(dir / near.heatmap_x8_path));
  EXPECT_EQ(amplified_legend(1), "largest 1 of 255 (x8: bright >= 4)");
}

// compare-images draws its heatmaps on the run report's fixed scale (it scaled each pair to its
// own 99.9th percentile): a 1-level pair stays dark, a 75-level pair is bright; 16-bit pairs are
// measured in 8-bit levels of the peak.
TEST(RunOutputs, CompareImagesHeatmapsUseTheSameFixedScale) {
  testing::ScratchDir dir("compare-images-fixed-scale");
  datasets::Rgb8 base = flat(100);
  testing::write_bytes(dir / "ref/near.png", datasets::encode_png(base));
  testing::write_bytes(dir / "test/near.png", datasets::encode_png(flat(101)));
  testing::write_bytes(dir / "ref/far.png", datasets::encode_png(base));
  testing::write_bytes(dir / "test/far.png", datasets::encode_png(flat(175)));
  CompareImagesOptions options;
  options.ref_dir = dir / "ref";
  options.test_dir = dir / "test";
  const auto r = run_compare_images(options, Gate{}, false);
  ASSERT_EQ(r.worst.size(), 2u);
  for (const auto& strip : r.worst) {
    const bool is_near = strip.name == "near.png";
    EXPECT_EQ(strip.heatmap_legend, is_near ? "largest 1 of 255 (fixed scale: bright >= 32)"
                                            : "largest 75 of 255 (fixed scale: bright >= 32)");
    EXPECT_EQ(strip.heatmap_x8_legend,
              is_near ? "largest 1 of 255 (x8: bright >= 4)" : "largest 75 of 255 (x8: bright >= 4)");
    if (is_near) EXPECT_LT(brightest(strip.heatmap_png), 60);  // was full brightness (its own p99.9)
    else {
      std::uint8_t top[3];
      reports::ramp_color(1.0f, top);
      EXPECT_EQ(brightest(strip.heatmap_png), top[0] + top[1] + top[2]);
    }
    EXPECT_FALSE(strip.heatmap_x8_png.empty());
  }
  // The HTML: one labelled legend and the toggle, no per-pair scale.
  const std::string html = reports::render_html(r);
  EXPECT_NE(html.find("class=\"gain-toggle\""), std::string::npos);
  EXPECT_NE(html.find("aria-label=\"colour scale 0 to 32 of 255\""), std::string::npos);
  EXPECT_EQ(html.find("p99.9"), std::string::npos);
}

}  // namespace
}  // namespace qeval::eval
