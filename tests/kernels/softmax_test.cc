// Row softmax (the kernel the Softmax op and fused attention share): long and short rows against a
// double-precision reference, and the special values (NaN, infinities) that take its slow path.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/softmax.h"

namespace qeval::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(SoftmaxRows, MatchesDoubleReferenceOnLongAndShortRows) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-20.0f, 20.0f);
  // Around the 16- and 32-lane steps and the 256-element float blocks of the sum.
  for (const std::int64_t n : {1, 5, 15, 16, 17, 33, 65, 77, 255, 256, 257, 1000, 4096}) {
    const std::int64_t rows = 3;
    std::vector<float> x(std::size_t(rows * n)), y(x.size()), ly(x.size());
    for (auto& v : x) v = u(rng);
    softmax_rows(x.data(), y.data(), rows, n, false);
    softmax_rows(x.data(), ly.data(), rows, n, true);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * n;
      double m = -INFINITY, s = 0;
      for (std::int64_t i = 0; i < n; ++i) m = std::max(m, double(xr[i]));
      for (std::int64_t i = 0; i < n; ++i) s += std::exp(double(xr[i]) - m);
      for (std::int64_t i = 0; i < n; ++i) {
        const double want = std::exp(double(xr[i]) - m) / s;
        const std::size_t at = std::size_t(r * n + i);
        // exp's 2 ulp, the division's few, and the rounding of x - m (relative to |x - m|).
        const double tolerance = want * (6e-7 + 1.2e-7 * std::fabs(double(xr[i]) - m));
        ASSERT_NEAR(y[at], want, tolerance) << "n " << n << ", row " << r << ", element " << i;
        ASSERT_NEAR(ly[at], double(xr[i]) - m - std::log(s), 8e-6) << "log, n " << n << ", element " << i;
      }
    }
  }
}

TEST(SoftmaxRows, InPlaceGivesTheSameBits) {
  std::mt19937 rng(6);
  std::normal_distribution<float> d(0.0f, 4.0f);
  std::vector<float> x(3 * 300), y(x.size());
  for (auto& v : x) v = d(rng);
  softmax_rows(x.data(), y.data(), 3, 300, false);
  softmax_rows(x.data(), x.data(), 3, 300, false);
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], y[i]) << i;
}

TEST(SoftmaxRows, SpecialValuesFollowTheMath) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Rows long enough for the vector loops and the tail; the special value in both.
  for (const std::int64_t n : {7, 40, 100}) {
    for (const std::int64_t at : {std::int64_t(0), n / 2, n - 1}) {
      std::vector<float> x(static_cast<std::size_t>(n)), y(x.size());
      for (std::int64_t i = 0; i < n; ++i) x[std::size_t(i)] = 0.25f * float(i % 9);
      // A NaN anywhere makes the row NaN; so does +inf (inf - inf).
      for (const float special : {nan, kInf}) {
        x[std::size_t(at)] = special;
        softmax_rows(x.data(), y.data(), 1, n, false);
        for (std::int64_t i = 0; i < n; ++i)
          ASSERT_TRUE(std::isnan(y[std::size_t(i)])) << n << " " << at << " " << special;
      }
      // -inf entries (masked positions) get exactly 0 and the rest still sum to 1.
      x[std::size_t(at)] = -kInf;
      softmax_rows(x.data(), y.data(), 1, n, false);
      double sum = 0;
      for (std::int64_t i = 0; i < n; ++i) sum += y[std::size_t(i)];
      EXPECT_EQ(y[std::size_t(at)], 0.0f);
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
    // A row of -inf alone is 0 / 0.
    std::vector<float> x(static_cast<std::size_t>(n), -kInf), y(x.size());
    softmax_rows(x.data(), y.data(), 1, n, false);
    for (float v : y) ASSERT_TRUE(std::isnan(v));
  }
}

}  // namespace
}  // namespace qeval::kernels
