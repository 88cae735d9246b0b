// Elementwise kernels: the threaded broadcast map against the plain odometer walk on many
// broadcasting patterns; the vectorisable erf and sigmoid against double-precision references.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/broadcast.h"
#include "kernels/elementwise.h"
#include "kernels/vector_math.h"

namespace qeval::kernels {
namespace {

// Distance in units in the last place of the float nearest `exact`.
double ulps(float got, double exact) {
  const float e = static_cast<float>(exact);
  double ulp = std::fabs(double(std::nextafter(e, std::numeric_limits<float>::infinity())) - double(e));
  if (e == 0.0f) ulp = std::numeric_limits<float>::denorm_min();
  return std::fabs(double(got) - exact) / ulp;
}

TEST(BroadcastMap, MatchesTheOdometerWalkOnEveryPattern) {
  struct Case {
    Shape a, b;
  };
  const std::vector<Case> cases = {
      {{2, 64, 48, 48}, {2, 64, 48, 48}},  // same shape, threaded over one long row
      {{2, 64, 48, 48}, {64, 1, 1}},       // per-channel (GroupNorm affine)
      {{2, 64, 48, 48}, {1}},              // scalar
      {{}, {3, 5}},                        // rank-0 operand
      {{4096, 64}, {64}},                  // bias over rows (short rows, many of them)
      {{64, 1}, {1, 4096}},                // outer product
      {{3, 1, 5, 1}, {1, 4, 1, 6}},        // alternating broadcast
      {{2, 3, 1, 7}, {2, 1, 4, 7}},
      {{1, 1, 1}, {1, 1, 1}},
      {{0, 4}, {4}},                 // empty
      {{16, 1, 300}, {16, 300, 1}},  // transposed broadcast
  };
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-2, 2);
  for (const auto& c : cases) {
    const Shape out = [&] {
      const std::size_t r = std::max(c.a.size(), c.b.size());
      Shape o(r);
      for (std::size_t i = 0; i < r; ++i) {
        const std::int64_t da = i + c.a.size() >= r ? c.a[i + c.a.size() - r] : 1;
        const std::int64_t db = i + c.b.size() >= r ? c.b[i + c.b.size() - r] : 1;
        o[i] = da == 1 ? db : da;
      }
      return o;
    }();
    std::vector<float> a(std::size_t(std::max<std::int64_t>(1, shape_numel(c.a)))),
        b(std::size_t(std::max<std::int64_t>(1, shape_numel(c.b))));
    for (auto& x : a) x = u(rng);
    for (auto& x : b) x = u(rng);
    const std::size_t n = std::size_t(shape_numel(out));
    std::vector<float> want(n), got(n, std::nanf(""));
    for_each_broadcast(out, c.a, c.b, [&](std::int64_t i, std::int64_t ia, std::int64_t ib) {
      want[std::size_t(i)] = a[std::size_t(ia)] - b[std::size_t(ib)];
    });
    broadcast_map(out, c.a, c.b, a.data(), b.data(), got.data(), [](float x, float y) { return x - y; });
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), n * sizeof(float)))
        << shape_to_string(c.a) << " op " << shape_to_string(c.b);
  }
}

TEST(BroadcastMap, MergesDimensionsTheOperandsWalkTogether) {
  // [N, C, H, W] * [C, 1, 1]: H and W merge into one contiguous run per (n, c) row.
  const BroadcastLoop l = plan_broadcast({2, 64, 8, 8}, {2, 64, 8, 8}, {64, 1, 1});
  EXPECT_EQ(l.inner, 64);
  EXPECT_EQ(l.a_inner, 1);
  EXPECT_EQ(l.b_inner, 0);
  EXPECT_EQ(l.rows, 128);
  // Equal shapes collapse to a single run.
  const BroadcastLoop e = plan_broadcast({2, 3, 4}, {2, 3, 4}, {2, 3, 4});
  EXPECT_TRUE(e.dims.empty());
  EXPECT_EQ(e.inner, 24);
}

TEST(UnaryMap, ThreadedResultEqualsTheLoop) {
  std::vector<float> x(100003), y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i) * 0.001f - 50.0f;
  unary_map(x.data(), y.data(), std::int64_t(x.size()), [](float v) { return v * v + 1.0f; });
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], x[i] * x[i] + 1.0f) << i;
}

TEST(ErfVectorisable, WithinOneAndAQuarterUlpOfTheExactValue) {
  // Every 61st float from 0 to 8 (erf is odd; the sign is copied), plus the special values.
  double worst = 0;
  float worst_x = 0;
  for (std::uint32_t bits = 0; bits < 0x41000000u; bits += 509) {
    float x;
    std::memcpy(&x, &bits, 4);
    const double e = ulps(erf_vectorisable(x), std::erf(double(x)));
    if (e > worst) worst = e, worst_x = x;
  }
  EXPECT_LE(worst, 1.25) << "at x = " << worst_x;
  EXPECT_EQ(erf_vectorisable(-0.5f), -erf_vectorisable(0.5f));
  EXPECT_EQ(erf_vectorisable(100.0f), 1.0f);
  EXPECT_EQ(erf_vectorisable(-std::numeric_limits<float>::infinity()), -1.0f);
  EXPECT_TRUE(std::signbit(erf_vectorisable(-0.0f)));
  EXPECT_TRUE(std::isnan(erf_vectorisable(std::nanf(""))));
}

TEST(SigmoidVectorisable, WithinThreeUlpOfTheExactValue) {
  double worst = 0;
  float worst_x = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.0013f) {
    const double exact = 1.0 / (1.0 + std::exp(-double(x)));
    const double e = ulps(sigmoid_vectorisable(x), exact);
    if (e > worst) worst = e, worst_x = x;
  }
  EXPECT_LE(worst, 3.0) << "at x = " << worst_x;
  EXPECT_EQ(sigmoid_vectorisable(0.0f), 0.5f);
  EXPECT_EQ(sigmoid_vectorisable(std::numeric_limits<float>::infinity()), 1.0f);
  EXPECT_EQ(sigmoid_vectorisable(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isnan(sigmoid_vectorisable(std::nanf(""))));
}

TEST(VectorMath, SixteenLaneFormsGiveTheScalarFormsBits) {
  // Every 509th float bit pattern of both signs (NaNs and infinities included), plus specials.
  std::vector<float> x = {0.0f,
                          -0.0f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::nanf(""),
                          0.921875f,
                          -0.921875f,
                          4.0f,
                          -87.4f,
                          88.5f,
                          1e-30f,
                          -1e-30f};
  for (std::uint64_t bits = 0; bits <= 0xffffffffu; bits += 509) {
    float f;
    const auto b = static_cast<std::uint32_t>(bits);
    std::memcpy(&f, &b, sizeof f);
    x.push_back(f);
  }
  while (x.size() % simd::kLanes) x.push_back(1.0f);
  auto same = [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b)); };
  for (std::size_t i = 0; i < x.size(); i += simd::kLanes) {
    const simd::F32x16 v = simd::load(x.data() + i);
    const simd::F32x16 e = simd::exp(v), r = simd::erf(v), s = simd::sigmoid(v);
    for (int l = 0; l < simd::kLanes; ++l) {
      const float xi = x[i + std::size_t(l)];
      ASSERT_TRUE(same(e[l], exp_vectorisable(xi))) << "exp " << xi;
      ASSERT_TRUE(same(r[l], erf_vectorisable(xi))) << "erf " << xi;
      ASSERT_TRUE(same(s[l], sigmoid_vectorisable(xi))) << "sigmoid " << xi;
    }
  }
}

}  // namespace
}  // namespace qeval::kernels
