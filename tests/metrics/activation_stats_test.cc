#include "metrics/activation_stats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace qeval::metrics {
namespace {

using H = LogAbsHistogram;

std::vector<float> gaussian(std::size_t n, double sd, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.5f, float(sd));
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(LogAbsHistogram, BinEdgesRoundTrip) {
  for (int b = 1; b < H::kBins - 1; ++b) {
    const double lo = H::bin_lower(b), hi = H::bin_upper(b);
    ASSERT_LT(lo, hi);
    EXPECT_EQ(H::bin_of(float(lo)), b) << lo;
    EXPECT_EQ(H::bin_of(-float(lo)), b);
    EXPECT_EQ(H::bin_of(std::nextafter(float(hi), 0.0f)), b);
    EXPECT_LE(hi / lo - 1.0, 1.0 / H::kSubBins + 1e-12);  // <= 12.5% wide
  }
  EXPECT_EQ(H::bin_of(0.0f), 0);
  EXPECT_EQ(H::bin_of(1e-30f), 0);
  EXPECT_EQ(H::bin_of(1e30f), H::kBins - 1);
  EXPECT_EQ(H::bin_lower(H::bin_of(1.0f)), 1.0);
  EXPECT_EQ(H::bin_lower(H::bin_of(1.5f)), 1.5);
}

TEST(ActivationStats, MomentsAndPercentilesMatchExactValues) {
  const auto v = gaussian(100001, 3.0, 1);
  ActivationStats s;
  s.add(v.data(), std::int64_t(v.size()));
  double sum = 0, sq = 0, amax = 0;
  for (float x : v) sum += x, sq += double(x) * x, amax = std::max(amax, double(std::abs(x)));
  const double mean = sum / double(v.size());
  EXPECT_EQ(s.count, v.size());
  // Float lanes of at most 8 terms, then double: ~1e-7 relative at worst, far less in practice.
  EXPECT_NEAR(*s.mean(), mean, 1e-8 * std::abs(mean));
  EXPECT_NEAR(*s.stddev(), std::sqrt(sq / double(v.size()) - mean * mean), 1e-8);
  EXPECT_EQ(s.absmax, float(amax));
  std::vector<double> a;
  for (float x : v) a.push_back(std::abs(double(x)));
  std::sort(a.begin(), a.end());
  for (double q : {0.5, 0.9, 0.99, 0.999}) {
    const double exact = a[std::size_t(q * double(a.size() - 1))];
    // Inside the bin holding the exact value: within one bin width.
    EXPECT_NEAR(*s.abs_quantile(q), exact, exact / H::kSubBins) << q;
  }
  EXPECT_EQ(*s.abs_quantile(1.0), amax);
  EXPECT_EQ(s.clipped, 0u);
  EXPECT_EQ(*s.clip_rate(), 0.0);
}

TEST(ActivationStats, CountsNonFiniteApartAndClips) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> v = {1, -2, nan, inf, -inf, 3, 0, 10};
  ActivationStats s;
  s.add(v.data(), std::int64_t(v.size()), 2.5f);
  EXPECT_EQ(s.count, 5u);
  EXPECT_EQ(s.nan, 1u);
  EXPECT_EQ(s.inf, 2u);
  EXPECT_EQ(s.nonfinite(), 3u);
  EXPECT_EQ(s.clipped, 2u);  // 3 and 10
  EXPECT_DOUBLE_EQ(*s.mean(), 12.0 / 5);
  EXPECT_EQ(s.absmax, 10.0f);
  EXPECT_EQ(s.abs_hist.total(), 5u);
  EXPECT_DOUBLE_EQ(*s.clip_rate(), 0.4);
}

TEST(ActivationStats, MergeOfPartsEqualsWholeAndHistogramsAddExactly) {
  const auto v = gaussian(4099, 0.01, 2);
  ActivationStats whole, a, b, b_then_a;
  whole.add(v.data(), 4099);
  a.add(v.data(), 1000);
  b.add(v.data() + 1000, 3099);
  b_then_a = b;
  b_then_a.merge(a);
  a.merge(b);
  EXPECT_EQ(a.abs_hist, whole.abs_hist);
  EXPECT_EQ(b_then_a.abs_hist, whole.abs_hist);
  EXPECT_EQ(a.count, whole.count);
  EXPECT_EQ(a.absmax, whole.absmax);
  EXPECT_EQ(a.calls, 2u);
  EXPECT_NEAR(a.sum, whole.sum, 1e-7 * std::abs(whole.sum));
  EXPECT_NEAR(a.sum_sq, whole.sum_sq, 1e-7 * whole.sum_sq);
  EXPECT_EQ(a.sum, b_then_a.sum);  // pooled in either order: the same bits
  EXPECT_EQ(a.sum_sq, b_then_a.sum_sq);
  // Round trip through the occupied bins.
  EXPECT_EQ(H::from_counts(whole.abs_hist.first(), whole.abs_hist.counts()), whole.abs_hist);
}

// Counts are kept in 32-bit halves: a bin that passes 2^32 - 1 (by adding, merging or reading back)
// keeps its exact count, in either order, and the others theirs.
TEST(LogAbsHistogram, CountsPastThirtyTwoBits) {
  const std::uint64_t big = 0xffffffffull;
  H a, b;
  const std::vector<std::uint64_t> near_full = {big, 7}, more = {3, 1, 5};
  a.add_counts(100, near_full);
  EXPECT_EQ(a.count(100), big);
  a.add_counts(99, more);  // widens the span to the left as it carries
  EXPECT_EQ(a.first(), 99);
  ASSERT_EQ(a.bins(), 3u);
  EXPECT_EQ(a.count(99), 3u);
  EXPECT_EQ(a.count(100), big + 1);
  EXPECT_EQ(a.count(101), 12u);
  EXPECT_EQ(a.total(), big + 7 + 9);
  b.add_counts(99, more);
  b.add_counts(100, near_full);
  EXPECT_EQ(a, b);
  const std::vector<std::uint64_t> huge = {std::uint64_t(5) << 40};
  H c;
  c.add_counts(101, huge);
  c.merge(a);
  a.merge(c);  // a twice plus huge, c once plus huge: not equal, but each exact
  EXPECT_EQ(c.count(101), (std::uint64_t(5) << 40) + 12);
  EXPECT_EQ(a.count(100), 2 * (big + 1));
  EXPECT_EQ(a.count(101), (std::uint64_t(5) << 40) + 24);
  EXPECT_NE(a, c);
  EXPECT_EQ(H::from_counts(a.first(), a.counts()), a);
  EXPECT_EQ(H::from_counts(99, {3, big + 1, 12}), b);
  // The median of b lies in bin 100, which holds nearly all of it.
  EXPECT_GE(*b.quantile(0.5, 1e9), H::bin_lower(100));
  EXPECT_LT(*b.quantile(0.5, 1e9), H::bin_upper(100));
}

// Quantiles above the median are found walking down from the top, the rest walking up: both give
// the bin and the interpolation of one cumulative walk from zero (written out here), empty bins at
// the ends and inside included.
TEST(LogAbsHistogram, QuantileFromEitherEndMatchesAWalkFromZero) {
  const std::vector<std::uint64_t> counts = {0, 7, 0, 0, 1, 300, 2, 0, 0, 1, 0};
  const H h = H::from_counts(90, counts);
  const double absmax = H::bin_lower(99) * 1.01;
  auto walk = [&](double q) {
    double total = 0;
    for (auto c : counts) total += double(c);
    const double target = q * total;
    double below = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      const auto c = double(counts[i]);
      if (c == 0) continue;
      if (below + c >= target) {
        const int bin = 90 + int(i);
        const double lo = H::bin_lower(bin), hi = std::max(lo, std::min(H::bin_upper(bin), absmax));
        return std::min(lo + (hi - lo) * std::clamp((target - below) / c, 0.0, 1.0), std::max(absmax, lo));
      }
      below += c;
    }
    return absmax;
  };
  for (double q : {0.0, 0.01, 0.02, 0.3, 0.5, 0.5000001, 0.9, 0.97, 0.9967, 0.99677, 0.999, 0.99999, 1.0})
    EXPECT_EQ(*h.quantile(q, absmax), walk(q)) << q;
  for (double k : {7.0, 8.0, 9.0, 308.0, 309.0, 310.0})  // targets on a bin's upper edge
    EXPECT_EQ(*h.quantile(k / 311, absmax), walk(k / 311)) << k;
  EXPECT_GE(*h.quantile(0.999, absmax), H::bin_lower(99));  // the top bin's single count
  EXPECT_LT(*h.quantile(0.99, absmax), H::bin_lower(96));
}

// A large tensor puts one 16-element chunk per 128 elements in its histogram; everything else sees
// every element. Laid out [tokens, 512 channels] with one outlier channel (as SmoothQuant's
// targets are): the sampled p99.9 stays within a bin of the exact one, since the hashed choice of
// chunks does not align with the channel period.
TEST(ActivationStats, LargeTensorsSampleTheHistogramOnlyAndKeepTheTail) {
  const std::size_t tokens = 256, channels = 512, n = tokens * channels;
  auto v = gaussian(n, 1.0, 4);
  for (std::size_t t = 0; t < tokens; ++t) v[t * channels + 37] *= 40.0f;  // one channel of outliers
  ASSERT_GE(std::int64_t(n), ActivationStats::kHistogramSampleFrom);
  ActivationStats s;
  s.add(v.data(), std::int64_t(n), 3.0f);
  std::uint64_t clipped = 0;
  double amax = 0;
  for (float x : v) clipped += std::abs(x) > 3.0f, amax = std::max(amax, double(std::abs(x)));
  EXPECT_EQ(s.count, n);
  EXPECT_EQ(s.clipped, clipped);
  EXPECT_EQ(s.absmax, float(amax));
  EXPECT_EQ(s.abs_hist.total(), n / 8);
  EXPECT_EQ(*s.abs_quantile(1.0), amax);
  std::vector<double> a;
  for (float x : v) a.push_back(std::abs(double(x)));
  std::sort(a.begin(), a.end());
  for (double q : {0.5, 0.99, 0.999}) {
    const double exact = a[std::size_t(q * double(a.size() - 1))];
    EXPECT_NEAR(*s.abs_quantile(q), exact, exact / H::kSubBins) << q;
  }
  // Below the threshold every element is in the histogram.
  ActivationStats small;
  small.add(v.data(), ActivationStats::kHistogramSampleFrom - 1);
  EXPECT_EQ(small.abs_hist.total(), std::uint64_t(ActivationStats::kHistogramSampleFrom - 1));
}

// The one-pass statistics + error of a variant give add()'s statistics and tensor_error's error
// (to add()'s precision), and fall back to tensor_error when a value is not finite.
TEST(ActivationStats, AddWithErrorAgreesWithAddAndTensorError) {
  for (std::size_t n : {std::size_t(1000), std::size_t(40000)}) {
    const auto r = gaussian(n, 2.0, 5);
    auto t = r;
    for (std::size_t i = 0; i < n; ++i) t[i] += 1e-3f * float(int(i % 11) - 5);
    ActivationStats ref_act, act, expected_act;
    const double ref_energy = *ref_act.add(r.data(), std::int64_t(n));
    ErrorStats err, expected_err;
    add_with_error(act, err, t.data(), r.data(), ref_energy, std::int64_t(n), 2.5f);
    expected_act.add(t.data(), std::int64_t(n), 2.5f);
    expected_err.add(tensor_error(r.data(), t.data(), std::int64_t(n)), std::int64_t(n));
    EXPECT_EQ(act.count, expected_act.count);
    EXPECT_EQ(act.clipped, expected_act.clipped);
    EXPECT_EQ(act.absmax, expected_act.absmax);
    EXPECT_EQ(act.abs_hist, expected_act.abs_hist);
    EXPECT_EQ(act.sum, expected_act.sum);
    EXPECT_NEAR(*err.sqnr_db(), *expected_err.sqnr_db(), 1e-5);
    EXPECT_NEAR(*err.rel_l2(), *expected_err.rel_l2(), 1e-6 * *expected_err.rel_l2());
    EXPECT_NEAR(1 - *err.cosine(), 1 - *expected_err.cosine(), 1e-6 * (1 - *expected_err.cosine()) + 1e-12);
    EXPECT_NEAR(err.max_abs, expected_err.max_abs, 1e-6 * expected_err.max_abs);
    EXPECT_EQ(err.count, expected_err.count);
  }
  // Identical tensors: no error at all, cosine exactly 1.
  const auto r = gaussian(5000, 1.0, 6);
  ActivationStats ra, ta;
  ErrorStats same;
  add_with_error(ta, same, r.data(), r.data(), *ra.add(r.data(), 5000), 5000);
  EXPECT_TRUE(std::isinf(*same.sqnr_db()));
  EXPECT_EQ(*same.cosine(), 1.0);
  // A NaN in the variant: counted, and the error is tensor_error's over the finite pairs.
  auto t = r;
  t[123] = std::numeric_limits<float>::quiet_NaN();
  ActivationStats na;
  ErrorStats with_nan;
  add_with_error(na, with_nan, t.data(), r.data(), *ra.add(r.data(), 5000), 5000);
  EXPECT_EQ(na.nan, 1u);
  EXPECT_EQ(with_nan.nonfinite, 1u);
  EXPECT_EQ(with_nan.count, 4999u);
  // Such a tensor is no reference for the one-pass error: add() gives no energy for it, nor for one
  // with a value beyond 2^60 (its squares could overflow float lanes).
  ActivationStats other;
  EXPECT_FALSE(other.add(t.data(), 5000));
  auto huge = r;
  huge[4000] = 3e18f;
  EXPECT_FALSE(other.add(huge.data(), 5000));
  // A huge but finite value in the variant: its block goes the double way, the error stays exact.
  ActivationStats ha;
  ErrorStats with_huge;
  add_with_error(ha, with_huge, huge.data(), r.data(), *ra.add(r.data(), 5000), 5000);
  const TensorError exact = tensor_error(r.data(), huge.data(), 5000);
  EXPECT_NEAR(with_huge.err_sq, exact.sum_err_sq, 1e-6 * exact.sum_err_sq);
  EXPECT_EQ(ha.absmax, 3e18f);
}

// Thresholds per channel of the last axis (a quantizer behind SmoothQuant's per-channel scale):
// an element counts as clipped beyond its own channel's threshold; non-finite values never do.
// A streamed pass (pieces of multiples of kPiece, as a fused kernel hands its intermediates over)
// gives add_with_error's bits whatever the split; a NaN makes it give up and add nothing.
TEST(StreamedError, SameBitsAsOnePassWhateverThePieces) {
  std::mt19937 rng(11);
  for (const std::int64_t n : {std::int64_t(1000), std::int64_t(8192 + 37), std::int64_t(70000)}) {
    const auto ref = gaussian(std::size_t(n), 2.0, 3);
    auto test = ref;
    for (auto& x : test) x += 0.01f * std::normal_distribution<float>(0, 1)(rng);
    test[std::size_t(n / 2)] = 3e18f;  // a block on the scalar path (beyond 2^60)
    ActivationStats reference_act;
    const double ref_sq = *reference_act.add(ref.data(), n);
    for (const float clip : {std::numeric_limits<float>::infinity(), 1.5f}) {
      ActivationStats want_act;
      ErrorStats want_err;
      const TensorError want = add_with_error(want_act, want_err, test.data(), ref.data(), ref_sq, n, clip);
      StreamedError streamed;
      for (int split = 0; split < 3; ++split) {  // one object, several passes: start() resets it
        streamed.start(n, clip);
        std::int64_t at = 0;
        while (at < n) {
          const std::int64_t pieces = std::uniform_int_distribution<std::int64_t>(1, split == 0 ? 1 : 40)(rng);
          const std::int64_t count = std::min(n - at, pieces * StreamedError::kPiece);
          streamed.feed(test.data() + at, ref.data() + at, count);
          at += count;
        }
        ActivationStats act;
        ErrorStats err;
        const auto got = streamed.finish(act, err, ref_sq);
        ASSERT_TRUE(got.has_value());
        EXPECT_TRUE(act == want_act) << "n " << n << " clip " << clip << " split " << split;
        EXPECT_TRUE(err == want_err) << "n " << n << " clip " << clip << " split " << split;
        EXPECT_EQ(got->sum_err_sq, want.sum_err_sq);
        EXPECT_EQ(act.abs_hist.total(), want_act.abs_hist.total());
      }
    }
    test[std::size_t(n / 3)] = std::numeric_limits<float>::quiet_NaN();
    StreamedError streamed;
    streamed.start(n);
    streamed.feed(test.data(), ref.data(), n);
    ActivationStats act;
    ErrorStats err;
    EXPECT_FALSE(streamed.finish(act, err, ref_sq).has_value());
    EXPECT_EQ(act.calls, 0u);
    EXPECT_EQ(err.calls, 0u);
  }
}

TEST(ActivationStats, PerChannelClippingCountsEachElementAgainstItsChannel) {
  const std::size_t channels = 37, rows = 101;
  auto v = gaussian(channels * rows, 2.0, 7);
  v[5] = std::numeric_limits<float>::infinity();
  v[77] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> t(channels);
  for (std::size_t c = 0; c < channels; ++c) t[c] = 0.5f + 0.1f * float(c);
  std::uint64_t want = 0;
  for (std::size_t i = 0; i < v.size(); ++i) want += std::isfinite(v[i]) && std::abs(v[i]) > t[i % channels];
  ActivationStats s;
  EXPECT_FALSE(s.add(v.data(), std::int64_t(v.size())));  // not plain: no energy
  EXPECT_EQ(s.clipped, 0u);
  s.add_clipped(v.data(), std::int64_t(v.size()), std::span<const float>(t));
  EXPECT_EQ(s.clipped, want);
  EXPECT_GT(want, 100u);
}

TEST(ActivationStats, EmptyHasNoStatistics) {
  ActivationStats s;
  EXPECT_FALSE(s.mean());
  EXPECT_FALSE(s.stddev());
  EXPECT_FALSE(s.abs_quantile(0.999));
  EXPECT_FALSE(s.clip_rate());
}

TEST(ExactSum, CorrectlyRoundedWhateverTheOrderOrGrouping) {
  // math.fsum's documented cases.
  ExactSum tenth;
  for (int i = 0; i < 10; ++i) tenth += 0.1;
  EXPECT_EQ(tenth.value(), 1.0);
  ExactSum cancel;
  for (double x : {1e100, 1.0, -1e100, 1e-100, 1e50, -1.0, -1e50}) cancel += x;
  EXPECT_EQ(cancel.value(), 1e-100);
  ExactSum tie;  // 2^53 + 1 + 2^-60: the tie breaks upward because of the tiny term
  for (double x : {9007199254740992.0, 1.0, std::ldexp(1.0, -60)}) tie += x;
  EXPECT_EQ(tie.value(), 9007199254740994.0);
  // Random terms of mixed magnitude: any order, any grouping, the same bits.
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> terms;
  for (int i = 0; i < 2000; ++i) terms.push_back(std::ldexp(u(rng), int(rng() % 80) - 40));
  ExactSum forward, pieces[3];
  for (double t : terms) forward += t;
  std::shuffle(terms.begin(), terms.end(), rng);
  for (std::size_t i = 0; i < terms.size(); ++i) pieces[i % 3] += terms[i];
  pieces[2].merge(pieces[0]);
  pieces[1].merge(pieces[2]);
  EXPECT_EQ(forward.value(), pieces[1].value());
  EXPECT_EQ(ExactSum::from_parts(forward.partials(), 0).value(), forward.value());
  ExactSum inf;
  inf += 1.0;
  inf += std::numeric_limits<double>::infinity();
  EXPECT_TRUE(std::isinf(inf.value()));
}

TEST(ExactSum, ManyPartialsSurviveCopyMoveAndClear) {
  // 21 terms 2^(100 k) overlap nowhere: 21 partials (beyond the inline ones), then all but 2^0
  // cancel exactly.
  ExactSum wide;
  for (int k = -10; k <= 10; ++k) wide += std::ldexp(1.0, 100 * k);
  EXPECT_EQ(wide.partials().size(), 21u);
  ExactSum copy = wide, moved_from = wide;
  const ExactSum moved = std::move(moved_from);
  for (ExactSum* s : {&wide, &copy})
    for (int k = -10; k <= 10; ++k)
      if (k != 0) *s += -std::ldexp(1.0, 100 * k);
  EXPECT_EQ(wide.value(), 1.0);
  EXPECT_EQ(copy.value(), 1.0);
  EXPECT_EQ(moved.partials().size(), 21u);
  ExactSum twice = moved;
  twice.merge(twice);  // itself: doubles every partial
  EXPECT_EQ(twice.value(), 2 * moved.value());
  ExactSum small(0.5);
  small = moved;  // inline storage takes a heap-sized copy
  EXPECT_EQ(small.value(), moved.value());
  small.clear();
  EXPECT_EQ(small.value(), 0.0);
  small += 0.25;
  EXPECT_EQ(small.value(), 0.25);
}

TEST(ErrorStats, SingleCallAgreesWithTensorErrorAndPoolsEnergies) {
  const auto r = gaussian(1000, 1.0, 3);
  auto t = r;
  for (std::size_t i = 0; i < t.size(); ++i) t[i] += 0.01f * float(i % 7) - 0.03f;
  const TensorError e = tensor_error(r.data(), t.data(), 1000);
  ErrorStats s;
  s.add(e, 1000);
  EXPECT_DOUBLE_EQ(*s.sqnr_db(), *e.sqnr_db);
  EXPECT_DOUBLE_EQ(*s.rel_l2(), *e.rel_l2);
  EXPECT_DOUBLE_EQ(*s.cosine(), *e.cosine);
  EXPECT_EQ(s.max_abs, e.max_abs);
  // Pooled over two calls: energies add (a call with 4x the error energy).
  auto t2 = r;
  for (std::size_t i = 0; i < t2.size(); ++i) t2[i] += 2 * (t[i] - r[i]);
  const TensorError e2 = tensor_error(r.data(), t2.data(), 1000);
  s.add(e2, 1000);
  EXPECT_NEAR(*s.sqnr_db(), 10 * std::log10(2 * e.sum_ref_sq / (e.sum_err_sq + e2.sum_err_sq)), 1e-12);
  EXPECT_NEAR(*s.cosine(), (*e.cosine + *e2.cosine) / 2, 1e-15);
  EXPECT_EQ(s.calls, 2u);
}

TEST(ErrorStats, IdenticalIsInfiniteAndNonFiniteIsCounted) {
  std::vector<float> r = {1, 2, 3, std::numeric_limits<float>::quiet_NaN()};
  std::vector<float> t = {1, 2, 3, 4};
  ErrorStats s;
  s.add(tensor_error(r.data(), t.data(), 4), 4);
  EXPECT_EQ(s.count, 3u);
  EXPECT_EQ(s.nonfinite, 1u);
  EXPECT_TRUE(std::isinf(*s.sqnr_db()));
  EXPECT_EQ(*s.rel_l2(), 0.0);
  ErrorStats none;
  EXPECT_FALSE(none.sqnr_db());
}

}  // namespace
}  // namespace qeval::metrics
