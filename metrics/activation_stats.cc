// Activation statistics: one pass per tensor with integer bin keys taken from the float's bits.
#include "metrics/activation_stats.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>

namespace qeval::metrics {

namespace {

constexpr int kMantissaBits = 23;
constexpr int kSubBits = 3;  // log2(kSubBins)
static_assert((1 << kSubBits) == LogAbsHistogram::kSubBins);
constexpr std::uint32_t kKeyShift = kMantissaBits - kSubBits;
// Key (|x| bits >> kKeyShift) of 2^kMinExp, and of 2^kMaxExp.
constexpr std::uint32_t kMinKey = std::uint32_t(LogAbsHistogram::kMinExp + 127) << kSubBits;
constexpr std::uint32_t kMaxKey = std::uint32_t(LogAbsHistogram::kMaxExp + 127) << kSubBits;
constexpr std::uint32_t kInfBits = 0x7f800000u;

inline int bin_of_bits(std::uint32_t abs_bits) {
  const std::uint32_t key = abs_bits >> kKeyShift;
  if (key < kMinKey) return 0;
  if (key >= kMaxKey) return LogAbsHistogram::kBins - 1;
  return int(key - kMinKey) + 1;
}

constexpr int kLanes = 8;

}  // namespace

int LogAbsHistogram::bin_of(float x) { return bin_of_bits(std::bit_cast<std::uint32_t>(x) & 0x7fffffffu); }

double LogAbsHistogram::bin_lower(int bin) {
  if (bin <= 0) return 0.0;
  if (bin >= kBins - 1) return std::ldexp(1.0, kMaxExp);
  const int k = bin - 1;
  return std::ldexp(1.0 + double(k % kSubBins) / kSubBins, kMinExp + k / kSubBins);
}

double LogAbsHistogram::bin_upper(int bin) {
  if (bin >= kBins - 1) return std::numeric_limits<double>::infinity();
  return bin_lower(bin + 1);
}

void LogAbsHistogram::add_dense(const std::uint64_t* dense) {
  int lo = kBins, hi = -1;
  for (int b = 0; b < kBins; ++b)
    if (dense[b]) {
      lo = std::min(lo, b);
      hi = b;
    }
  if (hi < 0) return;
  if (counts_.empty()) {
    first_ = lo;
    counts_.assign(std::size_t(hi - lo + 1), 0);
  } else {
    const int last = first_ + int(counts_.size()) - 1;
    if (lo < first_) {
      counts_.insert(counts_.begin(), std::size_t(first_ - lo), 0);
      first_ = lo;
    }
    if (hi > last) counts_.resize(counts_.size() + std::size_t(hi - last), 0);
  }
  for (int b = lo; b <= hi; ++b) {
    counts_[std::size_t(b - first_)] += dense[b];
    total_ += dense[b];
  }
}

void LogAbsHistogram::merge(const LogAbsHistogram& other) {
  if (other.counts_.empty()) return;
  std::array<std::uint64_t, kBins> dense{};
  for (std::size_t i = 0; i < other.counts_.size(); ++i) dense[std::size_t(other.first_) + i] = other.counts_[i];
  add_dense(dense.data());
}

std::uint64_t LogAbsHistogram::count(int bin) const {
  if (bin < first_ || bin >= first_ + int(counts_.size())) return 0;
  return counts_[std::size_t(bin - first_)];
}

LogAbsHistogram LogAbsHistogram::from_counts(int first, std::vector<std::uint64_t> counts) {
  LogAbsHistogram h;
  if (first < 0 || first + int(counts.size()) > kBins) throw std::invalid_argument("LogAbsHistogram: bins out of range");
  h.first_ = first;
  h.counts_ = std::move(counts);
  for (auto c : h.counts_) h.total_ += c;
  if (h.total_ == 0) h.counts_.clear(), h.first_ = 0;
  return h;
}

std::optional<double> LogAbsHistogram::quantile(double q, double absmax) const {
  if (total_ == 0) return std::nullopt;
  q = std::clamp(q, 0.0, 1.0);
  const double target = q * double(total_);
  double below = 0;
  for (std::size_t i = 0; i < counts_.size(); ++i) {
    const auto c = double(counts_[i]);
    if (c == 0) continue;
    if (below + c >= target || i + 1 == counts_.size()) {
      const int bin = first_ + int(i);
      const double lo = bin_lower(bin);
      const double hi = std::max(lo, std::min(bin_upper(bin), absmax));
      const double frac = std::clamp((target - below) / c, 0.0, 1.0);
      return std::min(lo + (hi - lo) * frac, std::max(absmax, lo));
    }
    below += c;
  }
  return absmax;
}

// Eight float lanes at a time (GCC vector extensions: AVX-512/AVX2 here, scalar code on narrower
// targets). Lane l of every chunk accumulates into sum lane l, as the scalar tail does: the
// result does not depend on the vector width.
typedef float F8 __attribute__((vector_size(32)));
typedef std::uint32_t U8 __attribute__((vector_size(32)));
typedef std::int32_t I8 __attribute__((vector_size(32)));
typedef double D8 __attribute__((vector_size(64)));

void ActivationStats::add(const float* x, std::int64_t n, float clip_amax) {
  constexpr int kCopies = 4;  // histogram copies: repeated bins do not wait on each other's stores
  std::uint32_t hist[kCopies][LogAbsHistogram::kBins] = {};
  D8 s = {}, sq = {};
  U8 maxv = {}, clipv = {};
  std::uint32_t max_bits = std::bit_cast<std::uint32_t>(absmax);
  const std::uint32_t clip_bits =
      std::isnan(clip_amax) ? kInfBits : std::bit_cast<std::uint32_t>(std::abs(clip_amax));
  std::uint64_t finite = 0, nans = 0, infs = 0, clip = 0;
  auto one = [&](int lane, float v) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(v) & 0x7fffffffu;
    if (u >= kInfBits) {
      (u == kInfBits ? infs : nans) += 1;
      return;
    }
    ++finite;
    ++hist[lane % kCopies][bin_of_bits(u)];
    max_bits = std::max(max_bits, u);
    clip += u > clip_bits;
    const double d = v;
    s[lane] += d;
    sq[lane] += d * d;
  };
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    F8 v;
    std::memcpy(&v, x + i, sizeof v);
    U8 u;
    std::memcpy(&u, &v, sizeof u);
    u &= 0x7fffffffu;
    const U8 nonfinite = u >= kInfBits;
    std::uint64_t any[4];
    std::memcpy(any, &nonfinite, sizeof any);
    if (any[0] | any[1] | any[2] | any[3]) {
      for (int l = 0; l < kLanes; ++l) one(l, x[i + l]);
      continue;
    }
    maxv = maxv > u ? maxv : u;
    clipv -= (U8)(u > clip_bits);
    const D8 d = __builtin_convertvector(v, D8);
    s += d;
    sq += d * d;
    I8 b = (I8)(u >> kKeyShift) - std::int32_t(kMinKey) + 1;
    b = b < 0 ? 0 : b;
    b = b > LogAbsHistogram::kBins - 1 ? LogAbsHistogram::kBins - 1 : b;
    for (int l = 0; l < kLanes; ++l) ++hist[l % kCopies][b[l]];
    finite += kLanes;
  }
  for (; i < n; ++i) one(0, x[i]);
  double ts = 0, tsq = 0;
  for (int l = 0; l < kLanes; ++l) {
    ts += s[l];
    tsq += sq[l];
    max_bits = std::max(max_bits, maxv[l]);
    clip += clipv[l];
  }
  std::array<std::uint64_t, LogAbsHistogram::kBins> dense{};
  for (int c = 0; c < kCopies; ++c)
    for (int b = 0; b < LogAbsHistogram::kBins; ++b) dense[std::size_t(b)] += hist[c][b];
  count += finite;
  nan += nans;
  inf += infs;
  clipped += clip;
  ++calls;
  sum += ts;
  sum_sq += tsq;
  absmax = std::bit_cast<float>(max_bits);
  abs_hist.add_dense(dense.data());
}

void ActivationStats::merge(const ActivationStats& o) {
  count += o.count;
  nan += o.nan;
  inf += o.inf;
  clipped += o.clipped;
  calls += o.calls;
  sum.merge(o.sum);
  sum_sq.merge(o.sum_sq);
  absmax = std::max(absmax, o.absmax);
  abs_hist.merge(o.abs_hist);
}

std::optional<double> ActivationStats::mean() const {
  if (count == 0) return std::nullopt;
  return sum.value() / double(count);
}

std::optional<double> ActivationStats::stddev() const {
  if (count == 0) return std::nullopt;
  const double m = sum.value() / double(count);
  return std::sqrt(std::max(0.0, sum_sq.value() / double(count) - m * m));
}

void ActivationStats::add(const float* x, std::int64_t n, std::span<const float> channel_clip_amax) {
  add(x, n);
  const std::int64_t k = std::int64_t(channel_clip_amax.size());
  if (k == 0) return;
  for (std::int64_t i = 0; i < n; i += k) {
    const std::int64_t m = std::min(k, n - i);
    for (std::int64_t c = 0; c < m; ++c) {
      const float a = std::abs(x[i + c]);
      clipped += std::isfinite(a) && a > channel_clip_amax[std::size_t(c)];
    }
  }
}

std::optional<double> ActivationStats::clip_rate() const {
  if (count == 0) return std::nullopt;
  return double(clipped) / double(count);
}

void ErrorStats::add(const TensorError& e, std::int64_t elements) {
  count += std::uint64_t(e.count);
  nonfinite += std::uint64_t(elements - e.count);  // either side NaN/Inf: not compared
  ++calls;
  ref_sq += e.sum_ref_sq;
  err_sq += e.sum_err_sq;
  if (e.cosine) {
    cosine_sum += *e.cosine;
    ++cosine_calls;
  }
  max_abs = std::max(max_abs, e.max_abs);
}

void ErrorStats::merge(const ErrorStats& o) {
  count += o.count;
  nonfinite += o.nonfinite;
  calls += o.calls;
  ref_sq.merge(o.ref_sq);
  err_sq.merge(o.err_sq);
  cosine_sum.merge(o.cosine_sum);
  cosine_calls += o.cosine_calls;
  max_abs = std::max(max_abs, o.max_abs);
}

std::optional<double> ErrorStats::sqnr_db() const {
  if (count == 0) return std::nullopt;
  const double e = err_sq.value(), r = ref_sq.value();
  if (e == 0) return std::numeric_limits<double>::infinity();
  if (r == 0) return std::nullopt;
  return 10.0 * std::log10(r / e);
}

std::optional<double> ErrorStats::rel_l2() const {
  const double r = ref_sq.value();
  if (count == 0 || r == 0) return std::nullopt;
  return std::sqrt(err_sq.value() / r);
}

std::optional<double> ErrorStats::cosine() const {
  if (cosine_calls == 0) return std::nullopt;
  return cosine_sum.value() / double(cosine_calls);
}

}  // namespace qeval::metrics
