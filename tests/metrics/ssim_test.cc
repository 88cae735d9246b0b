// SSIM kernel properties: fast vs reference on odd shapes, determinism across thread counts, edges.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include "metrics/ms_ssim.h"
#include "metrics/ssim.h"
#include "test_util.h"

namespace qeval::metrics {
namespace {

using testing::random_planes;

TEST(SsimWindow, GaussianMatchesScipyKernel) {
  SsimWindow w = gaussian_window(11, 1.5);
  ASSERT_EQ(w.size(), 11);
  double sum = 0;
  for (double t : w.taps) sum += t;
  EXPECT_NEAR(sum, 1.0, 1e-15);
  // scipy.ndimage._gaussian_kernel1d(1.5, 0, 5)[5] and [0]
  EXPECT_NEAR(w.taps[5], 0.26601172486179, 1e-12);
  EXPECT_NEAR(w.taps[0], 0.00102838008447, 1e-12);
  EXPECT_DOUBLE_EQ(w.cov_norm, 1.0);
  EXPECT_DOUBLE_EQ(uniform_window(7).cov_norm, 49.0 / 48.0);
}

TEST(Ssim, IdenticalImagesScoreOne) {
  Tensor a = random_planes(3, 40, 53, 1);
  for (auto conv : {SsimConvention::kWang, SsimConvention::kMatlab, SsimConvention::kSkimageDefault})
    EXPECT_NEAR(*ssim(a, a, conv, 255).ssim, 1.0, 1e-7);
  EXPECT_NEAR(*ms_ssim(random_planes(1, 170, 180, 2), random_planes(1, 170, 180, 2), 255).ms_ssim, 1.0, 1e-7);
}

// Odd widths exercise the vector tails; heights that are not multiples of the strip size exercise
// the last strip.
TEST(Ssim, FastPathMatchesReferenceOnOddShapes) {
  const int shapes[][2] = {{11, 11}, {12, 37}, {33, 11}, {65, 97}, {100, 129}, {7, 300}};
  unsigned seed = 10;
  for (auto [h, w] : shapes) {
    for (bool smooth : {true, false}) {
      Tensor a = random_planes(2, h, w, seed++, smooth), b = random_planes(2, h, w, seed++, smooth);
      for (auto conv : {SsimConvention::kWang, SsimConvention::kSkimageDefault}) {
        auto fast = ssim(a, b, conv, 255), ref = ssim_reference(a, b, conv, 255);
        ASSERT_EQ(fast.ssim.has_value(), ref.ssim.has_value()) << h << "x" << w;
        if (ref.ssim) {
          EXPECT_NEAR(*fast.ssim, *ref.ssim, 2e-7) << h << "x" << w;
        }
      }
    }
  }
}

// Flat regions far from the image mean are where single-precision moments cancel worst: half the
// image near black, half near white, with faint noise (small variance, large mean offset).
TEST(Ssim, FlatRegionsFarFromTheMeanStayAccurate) {
  for (auto [peak, amp] : {std::pair{255.0, 2}, {65535.0, 2}, {255.0, 0}, {255.0, 1}}) {
    Tensor a(DType::kFloat32, {1, 256, 256}), b(DType::kFloat32, {1, 256, 256});
    std::mt19937 rng(3);
    std::uniform_int_distribution<int> n(-amp, amp);
    const float scale = float(peak / 255.0);
    for (int y = 0; y < 256; ++y)
      for (int x = 0; x < 256; ++x) {
        float base = ((x / 32 + y / 32) % 2) ? 250.0f : 4.0f;
        a.data<float>()[y * 256 + x] = (base + float(n(rng))) * scale;
        b.data<float>()[y * 256 + x] = (base + float(n(rng))) * scale;
      }
    auto fast = ssim(a, b, SsimConvention::kWang, peak);
    auto ref = ssim_reference(a, b, SsimConvention::kWang, peak);
    EXPECT_NEAR(*fast.ssim, *ref.ssim, 1e-7) << "peak " << peak << " noise " << amp;
  }
}

TEST(Ssim, SixteenBitScaleGivesTheSameScoreAsEightBit) {
  Tensor a = random_planes(1, 64, 64, 3), b = random_planes(1, 64, 64, 4);
  Tensor a16 = a, b16 = b;
  for (auto* t : {&a16, &b16})
    for (float& v : t->span<float>()) v *= 257.0f;
  EXPECT_NEAR(*ssim(a, b, SsimConvention::kWang, 255).ssim, *ssim(a16, b16, SsimConvention::kWang, 65535).ssim, 1e-6);
}

TEST(Ssim, ResultDoesNotDependOnThreadCount) {
  Tensor a = random_planes(3, 300, 211, 5), b = random_planes(3, 300, 211, 6);
  double one, many;
  {
    tbb::global_control c(tbb::global_control::max_allowed_parallelism, 1);
    one = *ssim(a, b, SsimConvention::kWang, 255).ssim;
  }
  many = *ssim(a, b, SsimConvention::kWang, 255).ssim;
  EXPECT_EQ(one, many);  // bitwise: fixed strips, fixed summation order
}

TEST(Ssim, TooSmallIsNotApplicableWithReason) {
  Tensor a = random_planes(3, 10, 40, 7);
  auto r = ssim(a, a, SsimConvention::kWang, 255);
  EXPECT_FALSE(r.ssim.has_value());
  EXPECT_NE(r.note.find("smaller than the 11x11 SSIM window"), std::string::npos) << r.note;
  EXPECT_TRUE(ssim(a, a, SsimConvention::kSkimageDefault, 255).ssim.has_value());  // 7x7 fits
}

TEST(Ssim, MatlabDownsampleFactorRoundsHalfAwayFromZero) {
  EXPECT_EQ(matlab_downsample_factor(100, 1000), 1);
  EXPECT_EQ(matlab_downsample_factor(383, 500), 1);
  EXPECT_EQ(matlab_downsample_factor(384, 500), 2);  // 1.5 -> 2
  EXPECT_EQ(matlab_downsample_factor(640, 640), 3);  // 2.5 -> 3
  EXPECT_EQ(matlab_downsample_factor(1024, 768), 3);
}

TEST(Ssim, BoxDownsampleFollowsImfilterSymmetricSame) {
  // 1 x 5 row, f = 2: outputs average (0,1), (2,3), (4,4 mirrored).
  std::vector<float> row = {0, 2, 4, 6, 8};
  int h = 0, w = 0;
  auto out = box_downsample({row.data(), 1, 5}, 2, &h, &w);
  ASSERT_EQ(h, 1);
  ASSERT_EQ(w, 3);
  EXPECT_FLOAT_EQ(out[0], (0 + 2 + 0 + 2) / 4.0f);
  EXPECT_FLOAT_EQ(out[1], (4 + 6 + 4 + 6) / 4.0f);
  EXPECT_FLOAT_EQ(out[2], 8.0f);
  // f = 3: centre 2 (1-based) -> inputs i-1 .. i+1, first one mirrored: (0 + 0 + 2) / 3 on a row.
  auto out3 = box_downsample({row.data(), 1, 5}, 3, &h, &w);
  ASSERT_EQ(w, 2);
  EXPECT_FLOAT_EQ(out3[0], (0 + 0 + 2) / 3.0f);
  EXPECT_FLOAT_EQ(out3[1], (4 + 6 + 8) / 3.0f);
}

TEST(MsSsim, NotApplicableBelow161Pixels) {
  Tensor small = random_planes(1, 160, 300, 8);
  auto r = ms_ssim(small, small, 255);
  EXPECT_FALSE(r.ms_ssim.has_value());
  EXPECT_NE(r.note.find("161"), std::string::npos);
  Tensor ok = random_planes(1, 161, 161, 9);
  EXPECT_TRUE(ms_ssim(ok, ok, 255).ms_ssim.has_value());
}

TEST(MsSsim, DecreasesWithDistortion) {
  Tensor a = random_planes(1, 200, 200, 11, true);
  Tensor b = a, c = a;
  std::mt19937 rng(1);
  std::normal_distribution<float> n(0, 1);
  for (float& v : b.span<float>()) v = std::clamp(std::round(v + 3 * n(rng)), 0.0f, 255.0f);
  for (float& v : c.span<float>()) v = std::clamp(std::round(v + 20 * n(rng)), 0.0f, 255.0f);
  double mb = *ms_ssim(a, b, 255).ms_ssim, mc = *ms_ssim(a, c, 255).ms_ssim;
  EXPECT_LT(mb, 1.0);
  EXPECT_LT(mc, mb);
}

TEST(Ssim, ConventionNamesRoundTrip) {
  for (auto c : {SsimConvention::kWang, SsimConvention::kMatlab, SsimConvention::kSkimageDefault})
    EXPECT_EQ(parse_ssim_convention(ssim_convention_name(c)), c);
  EXPECT_FALSE(parse_ssim_convention("gaussian").has_value());
}

}  // namespace
}  // namespace qeval::metrics
