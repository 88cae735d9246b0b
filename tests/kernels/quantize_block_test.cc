// kernels::quantize_block (the vector per-tensor quantizer of fused chains and QuantizeLinear)
// against quantize_to element by element: every float bit pattern in a stride, halfway cases,
// saturation, infinities and NaN, for int8 and uint8, several scales and zero points, every tail.
#include <gtest/gtest.h>

#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/numeric.h"
#include "kernels/quantize_block.h"

namespace qeval::kernels {
namespace {

template <class T>
void expect_same_bytes(const std::vector<float>& x, float scale, std::int32_t zero_point) {
  std::vector<T> got(x.size() + 1, T(0x5a));
  quantize_block(x.data(), got.data(), std::int64_t(x.size()), scale, zero_point);
  for (std::size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(int(got[i]), int(quantize_to<T>(x[i], scale, zero_point)))
        << "x " << x[i] << " (bits " << std::bit_cast<std::uint32_t>(x[i]) << ") scale " << scale << " zero point "
        << zero_point;
  EXPECT_EQ(got.back(), T(0x5a));  // nothing written past n
}

TEST(QuantizeBlock, GivesQuantizeToBytesOnEveryKindOfValue) {
  std::vector<float> x;
  for (std::uint64_t b = 0; b < (std::uint64_t(1) << 32); b += 65521)
    x.push_back(std::bit_cast<float>(std::uint32_t(b)));
  for (int i = -600; i <= 600; ++i) x.push_back(float(i) * 0.5f);  // halves: ties to even
  for (float v : {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(), 127.5f, -128.5f, 255.5f,
                  1e9f, -1e9f})
    x.push_back(v);
  for (float scale : {1.0f, 0.5f, 0.0123f, 3.7e-5f, 250.0f}) {
    expect_same_bytes<std::int8_t>(x, scale, 0);
    expect_same_bytes<std::int8_t>(x, scale, -7);
    expect_same_bytes<std::uint8_t>(x, scale, 128);
    expect_same_bytes<std::uint8_t>(x, scale, 3);
    if (HasFatalFailure()) return;
  }
  // Every length up to a few vectors (masked tails).
  for (std::size_t n = 0; n < 50; ++n) {
    std::vector<float> part(x.begin() + 1000, x.begin() + 1000 + std::ptrdiff_t(n));
    expect_same_bytes<std::int8_t>(part, 0.25f, 1);
    expect_same_bytes<std::uint8_t>(part, 0.25f, 100);
  }
}

// The integer saturation path (clamp to +-2^30, convert, add the zero point, saturating narrowing)
// at its edges: the extreme zero points of each type, quotients around 2^23, 2^24, 2^30 and 2^31
// of both signs, and degenerate scales (tiny, huge, negative, zero, infinite: infinities, NaN
// and zero quotients).
TEST(QuantizeBlock, SaturatesLikeQuantizeToAtExtremeZeroPointsAndQuotients) {
  std::vector<float> x;
  for (float m : {8388607.5f,    8388608.0f,    8388609.0f,    16777215.0f,   16777216.0f,   16777218.0f,
                  1073741760.0f, 1073741824.0f, 1073741952.0f, 2147483520.0f, 2147483648.0f, 4294967296.0f,
                  1e30f,         126.5f,        127.5f,        128.5f,        254.5f,        255.5f,
                  256.5f,        0.49999997f,   0.5f,          1.5f})
    for (float sign : {1.0f, -1.0f}) x.push_back(sign * m);
  for (float v : {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min(), 3.0f, -3.0f})
    x.push_back(v);
  for (float scale : {1.0f, 0.75f, 1e-30f, 1e30f, -0.5f, 0.0f, std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::denorm_min()}) {
    for (std::int32_t z : {-128, -1, 0, 1, 127}) expect_same_bytes<std::int8_t>(x, scale, z);
    for (std::int32_t z : {0, 1, 128, 254, 255}) expect_same_bytes<std::uint8_t>(x, scale, z);
    if (HasFatalFailure()) return;
  }
}

// The division's bytes where any shortcut (a multiplication by 1 / scale: tried, slower on Zen 4)
// would round otherwise: values within a few ulps of every half-integer quotient (and of integers)
// for scales that are not powers of two, calibrated-looking ones among them, and dense random
// activations; under every rounding mode; whole vectors and tails.
TEST(QuantizeBlock, GivesTheDivisionsBytesNearEveryHalfIntegerQuotient) {
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::vector<float> scales{0.1f, 0.3f, 1.0f / 3.0f, 0.0123f, 3.7e-5f, 0.0078740157f, 7.0f, 1.1754944e-38f * 3.0f};
  for (int i = 0; i < 24; ++i) scales.push_back(std::ldexp(mantissa(rng), int(rng() % 40) - 30));
  for (float scale : scales) {
    std::vector<float> x;
    for (int k = -140; k <= 270; ++k)
      for (float frac : {0.5f, 0.0f}) {
        float v = (float(k) + frac) * scale;
        float below = v, above = v;
        x.push_back(v);
        for (int u = 0; u < 6; ++u) {
          below = std::nextafter(below, -INFINITY);
          above = std::nextafter(above, INFINITY);
          x.push_back(below);
          x.push_back(above);
        }
      }
    std::normal_distribution<float> act(0.0f, 40.0f * scale);
    for (int i = 0; i < 4000; ++i) x.push_back(act(rng));
    for (int mode : {FE_TONEAREST, FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO}) {
      std::fesetround(mode);
      expect_same_bytes<std::int8_t>(x, scale, 0);
      expect_same_bytes<std::int8_t>(x, scale, 5);
      expect_same_bytes<std::uint8_t>(x, scale, 128);
      std::fesetround(FE_TONEAREST);
      if (HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace qeval::kernels
