// kernels::moments and normalize_rows against the definition they implement, bit for bit: eight
// double accumulators (element i in accumulator i % 8, the tail in accumulator 0), the square's
// add fused, then the fixed pairwise combination; the vector path takes the very same operations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/norm.h"

namespace qeval::kernels {
namespace {

double combine(const double v[8]) { return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])); }

// The definition: the scalar loops norm.cc had before its vector path (GCC fused q += d * d).
void reference_moments(const float* x, std::int64_t n, double* mean, double* variance) {
  double acc[8] = {};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += double(x[i + j]);
  for (; i < n; ++i) acc[0] += double(x[i]);
  const double m = combine(acc) / double(n);
  double a[8] = {}, q[8] = {};
  for (i = 0; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      const double d = double(x[i + j]) - m;
      a[j] += d;
      q[j] = std::fma(d, d, q[j]);
    }
  for (; i < n; ++i) {
    const double d = double(x[i]) - m;
    a[0] += d;
    q[0] = std::fma(d, d, q[0]);
  }
  const double s = combine(a), sq = combine(q);
  *mean = m + s / double(n);
  *variance = std::max(0.0, (sq - s * s / double(n)) / double(n));
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(Moments, FloatRowsGiveTheBitsOfTheEightAccumulatorDefinition) {
  std::mt19937 rng(31);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (std::int64_t n : {1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 96, 192, 511, 512, 1000}) {
    for (float offset : {0.0f, 3.0f, 1000.0f, -1e6f}) {
      std::vector<float> x(static_cast<std::size_t>(n));
      for (auto& v : x) v = offset + d(rng) * 1.7f;
      double mean = 0, var = 0, want_mean = 0, want_var = 0;
      moments(x.data(), n, &mean, &var);
      reference_moments(x.data(), n, &want_mean, &want_var);
      EXPECT_TRUE(same_bits(mean, want_mean))
          << "n " << n << " offset " << offset << ": " << mean << " vs " << want_mean;
      EXPECT_TRUE(same_bits(var, want_var)) << "n " << n << " offset " << offset << ": " << var << " vs " << want_var;
    }
  }
}

TEST(Moments, NormalizedRowsUseTheDefinitionsMoments) {
  std::mt19937 rng(32);
  std::uniform_real_distribution<float> d(-4.0f, 9.0f);
  const std::int64_t rows = 5, n = 72;
  std::vector<float> x(static_cast<std::size_t>(rows * n)), y(x.size()), scale(static_cast<std::size_t>(n)),
      bias(static_cast<std::size_t>(n));
  for (auto& v : x) v = d(rng);
  for (auto& v : scale) v = d(rng);
  for (auto& v : bias) v = d(rng);
  ChannelAffine<float> affine;
  affine.scale = scale.data();
  affine.bias = bias.data();
  affine.channels = n;
  std::vector<double> means(static_cast<std::size_t>(rows)), inv_stds(static_cast<std::size_t>(rows));
  normalize_rows(x.data(), y.data(), rows, n, 1e-5, affine, means.data(), inv_stds.data());
  for (std::int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    reference_moments(x.data() + r * n, n, &m, &v);
    EXPECT_TRUE(same_bits(means[std::size_t(r)], m)) << "row " << r;
    EXPECT_TRUE(same_bits(inv_stds[std::size_t(r)], 1.0 / std::sqrt(v + 1e-5))) << "row " << r;
  }
}

}  // namespace
}  // namespace qeval::kernels
