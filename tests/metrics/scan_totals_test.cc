// Statistics from a pass's totals (metrics/scan_totals.h) against ActivationStats' own pass: the
// totals as kernels/scan_totals.h defines them (bins, histogram sampling) give the same counts,
// clipping, absmax and histogram, and the moments and errors to ~1e-7. A device computes such
// totals (kernels/cuda/scan.h; tests/gpu/cuda_scan_test.cc compares it with the host directly).
#include "metrics/scan_totals.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace qeval::metrics {
namespace {

using kernels::ScanTotals;

// The totals of x (against ref when not null) by kernels/scan_totals.h's definitions, one element
// at a time.
ScanTotals host_totals(const std::vector<float>& x, const std::vector<float>* ref, float clip) {
  ScanTotals s;
  const std::int64_t n = std::int64_t(x.size());
  const bool sample = n >= ScanTotals::kSampleFrom;
  const std::uint32_t clip_bits = std::bit_cast<std::uint32_t>(std::abs(clip));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(x[std::size_t(i)]) & 0x7fffffffu;
    s.plain &= u < (std::uint32_t(60 + 127) << 23);
    if (u >= 0x7f800000u) {
      (u == 0x7f800000u ? s.inf : s.nan) += 1;
      continue;
    }
    ++s.finite;
    const std::int64_t chunk = i / ScanTotals::kChunk;
    if (!sample || ((std::uint32_t(chunk / ScanTotals::kBlock) * ScanTotals::kHashMultiplier) >> 29) ==
                       std::uint32_t(chunk % ScanTotals::kBlock)) {
      const int b = std::clamp(int(u >> 20) - ((127 - 32) << 3) + 1, 0, ScanTotals::kBins - 1);
      ++s.hist[std::size_t(b)];
    }
    s.max_bits = std::max(s.max_bits, u);
    s.clipped += u > clip_bits;
    const double d = x[std::size_t(i)];
    s.sum += d;
    s.sum_sq += d * d;
    if (ref) {
      const double e = d - double((*ref)[std::size_t(i)]);
      s.err_sq += e * e;
      s.err_max = std::max(s.err_max, std::abs(e));
    }
  }
  return s;
}

std::vector<float> values(std::size_t n, unsigned seed, bool odd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.3f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  if (odd && n > 100) {
    v[3] = std::numeric_limits<float>::quiet_NaN();
    v[50] = std::numeric_limits<float>::infinity();
    v[51] = -std::numeric_limits<float>::infinity();
    v[77] = 3e19f;  // finite, beyond 2^60: not plain
    v[78] = 1e-40f;  // denormal: bin 0
    v[n - 1] = -7e5f;
  }
  return v;
}

void expect_same_statistics(const ActivationStats& a, const ActivationStats& b) {
  EXPECT_EQ(a.count, b.count);
  EXPECT_EQ(a.nan, b.nan);
  EXPECT_EQ(a.inf, b.inf);
  EXPECT_EQ(a.clipped, b.clipped);
  EXPECT_EQ(a.calls, b.calls);
  EXPECT_EQ(a.absmax, b.absmax);
  EXPECT_TRUE(a.abs_hist == b.abs_hist);
  EXPECT_EQ(a.abs_hist.total(), b.abs_hist.total());
  EXPECT_NEAR(a.sum.value(), b.sum.value(), 1e-6 * std::max(1.0, std::abs(b.sum_sq.value())));
  EXPECT_NEAR(a.sum_sq.value(), b.sum_sq.value(), 1e-6 * b.sum_sq.value());
}

TEST(ScanTotals, AddedAsTheHostPassAddsTheSameValues) {
  // Below and above the histogram's sampling threshold, a tail chunk, non-finite and huge values.
  for (const std::size_t n : {std::size_t(1), std::size_t(300), std::size_t(8191), std::size_t(8192),
                              std::size_t(100003)}) {
    for (const bool odd : {false, true}) {
      SCOPED_TRACE(testing::Message() << n << (odd ? " with NaN/Inf/huge" : ""));
      const std::vector<float> x = values(n, unsigned(n), odd);
      ActivationStats host, totals;
      const std::optional<double> e1 = host.add(x.data(), std::int64_t(n), 2.5f);
      const std::optional<double> e2 = add_scan(totals, host_totals(x, nullptr, 2.5f));
      expect_same_statistics(totals, host);
      ASSERT_EQ(e1.has_value(), e2.has_value());
      if (e1) {
        EXPECT_NEAR(*e2, *e1, 1e-6 * *e1);
      }
    }
  }
}

TEST(ScanTotals, ErrorAgainstAReferenceAsAddWithError) {
  const std::size_t n = 50000;
  const std::vector<float> ref = values(n, 1, false);
  std::vector<float> test = ref;
  std::mt19937 rng(2);
  std::normal_distribution<float> noise(0.0f, 0.01f);
  for (auto& x : test) x += noise(rng);
  ActivationStats ra, ha, ta;
  const double energy = *ra.add(ref.data(), std::int64_t(n));
  ErrorStats he, te;
  const TensorError h = add_with_error(ha, he, test.data(), ref.data(), energy, std::int64_t(n), 1.0f);
  const TensorError t = add_scan_with_error(ta, te, host_totals(test, &ref, 1.0f), energy, std::int64_t(n));
  expect_same_statistics(ta, ha);
  EXPECT_EQ(t.count, h.count);
  EXPECT_NEAR(t.sum_err_sq, h.sum_err_sq, 1e-5 * h.sum_err_sq);
  EXPECT_NEAR(*t.sqnr_db, *h.sqnr_db, 1e-4);
  EXPECT_NEAR(t.max_abs, h.max_abs, 1e-6 * h.max_abs);
  EXPECT_NEAR(*te.sqnr_db(), *he.sqnr_db(), 1e-4);
  EXPECT_NEAR(*te.cosine(), *he.cosine(), 1e-9);

  // Test values that are not all finite need both tensors (tensor_error): refused, nothing added.
  std::vector<float> bad = test;
  bad[10] = std::numeric_limits<float>::infinity();
  ActivationStats ba;
  ErrorStats be;
  EXPECT_THROW(add_scan_with_error(ba, be, host_totals(bad, &ref, 1.0f), energy, std::int64_t(n)),
               std::invalid_argument);
  EXPECT_EQ(ba.calls, 0u);
  EXPECT_EQ(be.calls, 0u);
}

}  // namespace
}  // namespace qeval::metrics
