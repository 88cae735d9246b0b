// Activation statistics: one pass per tensor with integer bin keys taken from the float's bits.
#include "metrics/activation_stats.h"
#include "metrics/scan_totals.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

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

void LogAbsHistogram::add_counts(int first, std::span<const std::uint64_t> counts) {
  int lo = first, hi = first + int(counts.size()) - 1;
  while (lo <= hi && counts[std::size_t(lo - first)] == 0) ++lo;
  while (hi >= lo && counts[std::size_t(hi - first)] == 0) --hi;
  if (hi < lo) return;
  if (low_.empty()) {
    first_ = lo;
    low_.assign(std::size_t(hi - lo + 1), 0);
    high_.clear();
  } else if (const int last = first_ + int(low_.size()) - 1; lo < first_ || hi > last) {
    // Grown to the new span plus an octave of room, not to double the capacity: pooled cells
    // (thousands per run) widen a few bins at a time.
    const int new_first = std::min(lo, first_), new_last = std::max(hi, last);
    const std::size_t n = std::size_t(new_last - new_first + 1);
    auto regrow = [&](std::vector<std::uint32_t>& v) {
      if (v.empty()) return;
      if (new_first == first_ && n <= v.capacity()) {
        v.resize(n, 0);
        return;
      }
      std::vector<std::uint32_t> grown;
      grown.reserve(n + kSubBins);
      grown.assign(n, 0);
      std::copy(v.begin(), v.end(), grown.begin() + (first_ - new_first));
      v = std::move(grown);
    };
    regrow(low_);
    regrow(high_);
    first_ = new_first;
  }
  // In locals (members written through pointers would be re-read every bin: a uint32 store may
  // alias first_, a uint64 count total_).
  const std::uint64_t* in = counts.data() + (lo - first);
  const std::size_t at = std::size_t(lo - first_), n = std::size_t(hi - lo + 1);
  std::uint64_t added = 0;
  for (std::size_t k = 0; k < n; ++k) added += in[k];
  if (high_.empty() && added <= 0xffffffffu && total_ + added <= 0xffffffffu) {
    // No bin can pass 32 bits (none holds more than the total): a plain add the compiler
    // vectorises (pooling ~50k histograms a run goes through here).
    std::uint32_t* low = low_.data() + at;
    for (std::size_t k = 0; k < n; ++k) low[k] += std::uint32_t(in[k]);
    total_ += added;
    return;
  }
  std::size_t k = 0;
  if (high_.empty()) {
    std::uint32_t* low = low_.data() + at;
    for (; k < n; ++k) {
      const std::uint64_t sum = std::uint64_t(low[k]) + in[k];
      if (sum >> 32) break;  // the first count past 32 bits: high halves from here on
      low[k] = std::uint32_t(sum);
    }
    if (k < n) high_.assign(low_.size(), 0);
  }
  std::uint32_t* low = low_.data() + at;
  std::uint32_t* high = high_.data() + at;
  for (; k < n; ++k) {
    const std::uint64_t sum = std::uint64_t(low[k]) + in[k];  // the carry: what passes 32 bits
    low[k] = std::uint32_t(sum);
    high[k] += std::uint32_t(sum >> 32);
  }
  total_ += added;
}

void LogAbsHistogram::merge(const LogAbsHistogram& other) {
  if (other.low_.empty()) return;
  std::array<std::uint64_t, kBins> c;
  for (std::size_t i = 0; i < other.bins(); ++i) c[i] = other.at(i);
  add_counts(other.first_, std::span<const std::uint64_t>(c.data(), other.bins()));
}

void LogAbsHistogram::clear() {
  low_.clear();
  high_.clear();
  first_ = 0;
  total_ = 0;
}

std::uint64_t LogAbsHistogram::count(int bin) const {
  if (bin < first_ || bin >= first_ + int(low_.size())) return 0;
  return at(std::size_t(bin - first_));
}

std::vector<std::uint64_t> LogAbsHistogram::counts() const {
  std::vector<std::uint64_t> c(bins());
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = at(i);
  return c;
}

void LogAbsHistogram::prefetch() const {
  const char* p = reinterpret_cast<const char*>(low_.data());
  for (std::size_t off = 0; off < low_.size() * sizeof(std::uint32_t); off += 64) __builtin_prefetch(p + off, 1);
}

bool LogAbsHistogram::operator==(const LogAbsHistogram& o) const {
  if (first_ != o.first_ || bins() != o.bins() || total_ != o.total_) return false;
  for (std::size_t i = 0; i < bins(); ++i)
    if (at(i) != o.at(i)) return false;
  return true;
}

LogAbsHistogram LogAbsHistogram::from_counts(int first, const std::vector<std::uint64_t>& counts) {
  LogAbsHistogram h;
  if (first < 0 || first + int(counts.size()) > kBins)
    throw std::invalid_argument("LogAbsHistogram: bins out of range");
  h.first_ = first;
  h.low_.reserve(counts.size());
  for (std::uint64_t c : counts) {
    h.low_.push_back(std::uint32_t(c));
    if (c >> 32 && h.high_.empty()) h.high_.assign(counts.size(), 0);
    h.total_ += c;
  }
  if (!h.high_.empty())
    for (std::size_t i = 0; i < counts.size(); ++i) h.high_[i] = std::uint32_t(counts[i] >> 32);
  if (h.total_ == 0) h.clear();
  return h;
}

std::optional<double> LogAbsHistogram::quantile(double q, double absmax) const {
  if (total_ == 0) return std::nullopt;
  q = std::clamp(q, 0.0, 1.0);
  const double target = q * double(total_);
  // The lowest non-empty bin whose count with everything below reaches the target (the counts are
  // integers: the sums are exact either way). High quantiles (the report's p99.9) lie in the top
  // few bins: walked down from the total there, up from zero otherwise.
  std::size_t pick = low_.size();
  std::uint64_t upto = 0;  // count of the bins up to and including `pick`
  if (q > 0.5) {
    std::uint64_t cum = total_;
    for (std::size_t i = low_.size(); i-- > 0 && double(cum) >= target;) {
      const std::uint64_t c = at(i);
      if (c == 0) continue;
      pick = i, upto = cum;
      cum -= c;
    }
  } else {
    for (std::size_t i = 0; i < low_.size(); ++i) {
      const std::uint64_t c = at(i);
      if (c == 0) continue;
      upto += c;
      if (double(upto) >= target) {
        pick = i;
        break;
      }
    }
  }
  if (pick == low_.size()) return absmax;
  const auto c = double(at(pick));
  const double below = double(upto) - c;
  const int bin = first_ + int(pick);
  const double lo = bin_lower(bin);
  const double hi = std::max(lo, std::min(bin_upper(bin), absmax));
  const double frac = std::clamp((target - below) / c, 0.0, 1.0);
  return std::min(lo + (hi - lo) * frac, std::max(absmax, lo));
}

// The pass over one tensor: 16 float lanes (GCC vector extensions: AVX-512 or AVX2 here, scalar code
// on narrower targets). Lane l of a block takes element l of each of its 16-element chunks, and the
// scalar path (chunks with a NaN, an infinity or a magnitude >= 2^60, and the tail) keeps its own
// double sums: the result does not depend on the vector width. Float lanes sum at most kBlock
// chunks, then go to double lanes.
typedef float F32x16 __attribute__((vector_size(64)));
typedef std::uint32_t U32x16 __attribute__((vector_size(64)));
typedef std::int32_t I32x16 __attribute__((vector_size(64)));
typedef float F32x8 __attribute__((vector_size(32)));
typedef double F64x8 __attribute__((vector_size(64)));

namespace {

constexpr int kVec = 16;
constexpr int kBlock = 8;
constexpr std::uint32_t kAbs = 0x7fffffffu;
// Beyond 2^60 a sum of kBlock squares could overflow float: such chunks take the scalar path.
constexpr std::uint32_t kBigBits = std::uint32_t(60 + 127) << kMantissaBits;
constexpr int kCopies = 4;  // histogram copies: repeated bins do not wait on each other's stores

// The bits of |clip_amax| (a NaN range clips nothing).
inline std::uint32_t clip_bits_of(float clip_amax) {
  return std::isnan(clip_amax) ? kInfBits : std::bit_cast<std::uint32_t>(std::abs(clip_amax));
}

// Per-thread histogram scratch, all zeros between calls (a call clears the bins it touched).
thread_local std::uint32_t t_hist[kCopies][LogAbsHistogram::kBins];

// Which chunk of block b (kBlock chunks of 16 elements) a sampled tensor puts in its histogram: the
// top bits of a multiplicative hash of b, so the choice has no period a tensor's layout (channels,
// rows) could align with.
inline std::uint32_t sampled_position(std::int64_t b) {
  return (std::uint32_t(b) * kernels::ScanTotals::kHashMultiplier) >> 29;
}

inline void widen_add(F64x8& lo, F64x8& hi, const F32x16& v) {
#ifdef __AVX512F__
  // One conversion per half (GCC's generic form takes an extract, a conversion and an insert per
  // quarter): the same values. The zero-masked form with a full mask compiles to the plain
  // instruction; the unmasked one made GCC 12 warn of its undefined pass-through operand.
  auto widen = [](const F32x8& half) {
    __m256 h;
    std::memcpy(&h, &half, sizeof h);
    const __m512d w = _mm512_maskz_cvtps_pd(__mmask8(0xff), h);
    F64x8 d;
    std::memcpy(&d, &w, sizeof d);
    return d;
  };
  lo += widen(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7));
  hi += widen(__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
#else
  lo += __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), F64x8);
  hi += __builtin_convertvector(__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15), F64x8);
#endif
}

inline double lane_sum(const F64x8& lo, const F64x8& hi) {
  double t = 0;
  for (int l = 0; l < 8; ++l) t += lo[l];
  for (int l = 0; l < 8; ++l) t += hi[l];
  return t;
}

// What one pass saw.
struct Scan {
  std::uint64_t finite = 0, nan = 0, inf = 0, clipped = 0;
  std::uint32_t max_bits = 0;
  double sum = 0, sum_sq = 0;
  double err_sq = 0, err_max = 0;  // against the reference: pairs where both are finite
  bool plain = true;               // every value finite and below 2^60 (add_with_error's condition on a reference)
  int lo = LogAbsHistogram::kBins, hi = -1;  // histogram bins touched
};

// Elements [i0, i0 + m) one at a time (doubles).
void scan_scalar(const float* x, const float* r, std::int64_t i0, int m, bool hist, std::uint32_t clip_bits, Scan& s) {
  for (int l = 0; l < m; ++l) {
    const float v = x[i0 + l];
    const std::uint32_t u = std::bit_cast<std::uint32_t>(v) & kAbs;
    s.plain &= u < kBigBits;
    if (u >= kInfBits) {
      (u == kInfBits ? s.inf : s.nan) += 1;
      continue;
    }
    ++s.finite;
    if (hist) {
      const int b = bin_of_bits(u);
      ++t_hist[l % kCopies][b];
      s.lo = std::min(s.lo, b);
      s.hi = std::max(s.hi, b);
    }
    s.max_bits = std::max(s.max_bits, u);
    s.clipped += u > clip_bits;
    const double d = v;
    s.sum += d;
    s.sum_sq += d * d;
    if (r) {  // finite: add_with_error's condition on the reference
      const double e = d - double(r[i0 + l]);
      s.err_sq += e * e;
      s.err_max = std::max(s.err_max, std::abs(e));
    }
  }
}

inline void histogram_chunk(const U32x16& u, I32x16& bmin, I32x16& bmax) {
  I32x16 b = (I32x16)(u >> kKeyShift) - std::int32_t(kMinKey) + 1;
  b = b < 0 ? 0 : b;
  b = b > LogAbsHistogram::kBins - 1 ? LogAbsHistogram::kBins - 1 : b;
  bmin = b < bmin ? b : bmin;
  bmax = b > bmax ? b : bmax;
  std::uint32_t k[kVec];  // unsigned (b >= 0 here): an index needs no sign extension
  std::memcpy(k, &b, sizeof k);
  for (int l = 0; l < kVec; ++l) ++t_hist[l % kCopies][k[l]];
}

inline U32x16 abs_bits(const float* p) {
  U32x16 u;
  std::memcpy(&u, p, sizeof u);
  return u & kAbs;
}

// max(m, |v|) per lane as the bits of non-negative floats (m holds such bits). A NaN in v may be
// skipped (AVX-512's range op returns m then): callers find NaNs another way.
inline U32x16 max_abs_bits(const U32x16& m, const F32x16& v) {
#ifdef __AVX512DQ__
  // One op (the larger magnitude, its sign cleared) for an and and an unsigned max.
  __m512 a, b;
  std::memcpy(&a, &m, sizeof a);
  std::memcpy(&b, &v, sizeof b);
  const __m512 r = _mm512_range_ps(a, b, 0x0B);
  U32x16 out;
  std::memcpy(&out, &r, sizeof out);
  return out;
#else
  U32x16 u;
  std::memcpy(&u, &v, sizeof u);
  u &= kAbs;
  return m > u ? m : u;
#endif
}

// Whether a lane of v is >= t (one compare into a mask register with AVX-512).
inline bool any_at_least(const U32x16& v, std::uint32_t t) {
#ifdef __AVX512F__
  __m512i w;
  std::memcpy(&w, &v, sizeof w);
  return _mm512_cmpge_epu32_mask(w, _mm512_set1_epi32(int(t))) != 0;
#else
  std::uint32_t m = 0;
  for (int l = 0; l < kVec; ++l) m = std::max(m, v[l]);
  return m >= t;
#endif
}

// Moves the histogram scratch's bins [lo, hi] to h (and clears them).
void move_counts(int lo, int hi, LogAbsHistogram& h) {
  if (hi < lo) return;
  std::array<std::uint64_t, LogAbsHistogram::kBins> dense;
  static_assert(kCopies == 4);
  for (int b = lo; b <= hi; ++b)  // vectorised: the copies apart, then cleared
    dense[std::size_t(b - lo)] =
        std::uint64_t(t_hist[0][b]) + t_hist[1][b] + std::uint64_t(t_hist[2][b]) + t_hist[3][b];
  for (auto& copy : t_hist) std::fill(copy + lo, copy + hi + 1, 0u);
  h.add_counts(lo, std::span<const std::uint64_t>(dense.data(), std::size_t(hi - lo + 1)));
}

// Adds a pass's counts, moments and absmax (T: Scan or kernels::ScanTotals), not its histogram.
template <class T>
void add_pass(ActivationStats& a, const T& s) {
  a.count += s.finite;
  a.nan += s.nan;
  a.inf += s.inf;
  a.clipped += s.clipped;
  ++a.calls;
  a.sum += s.sum;
  a.sum_sq += s.sum_sq;
  a.absmax = std::max(a.absmax, std::bit_cast<float>(s.max_bits));
}

// Adds a pass to the statistics and clears the histogram scratch it used.
void commit(ActivationStats& a, const Scan& s) {
  add_pass(a, s);
  move_counts(s.lo, s.hi, a.abs_hist);
}

// Blocks of kBlock chunks: moments, absmax and clipping over every chunk, then the histogram over
// every chunk or, in a sampled tensor, over one chunk per block at a hashed position. A block is
// first summed as if all its values were finite and below 2^60; when one is not (its maximum bits
// say so, or its sum of squares is not finite: a NaN or an infinity reaches it), the block is done
// again on the scalar path. The reference `r` (kError) is plain: its own
// pass found every value finite and below 2^60.
//
// A pass takes the tensor in consecutive pieces (feed), each but the last a multiple of kBlock
// chunks long: blocks and the sampled positions are counted from the tensor's start and the lanes
// carry over, so any such split gives the same bits as one piece. The histogram counts gather in
// the thread's scratch until the Scan is committed.
template <bool kError, bool kClip>
struct Pass {
  Scan s;
  bool sample = false;
  std::uint32_t clip_bits = kInfBits;
  std::int64_t done = 0;  // elements fed so far
  F64x8 s0 = {}, s1 = {}, sq0 = {}, sq1 = {}, ee0 = {}, ee1 = {};
  U32x16 maxv = {}, clipv = {};
  U32x16 fmx = {};  // max |d| as bits: finite non-negative floats order as their bit patterns
  I32x16 bmin = LogAbsHistogram::kBins + I32x16{}, bmax = -1 + I32x16{};
  std::uint64_t clean = 0;

  Pass(std::int64_t n, std::uint32_t clip) : sample(n >= ActivationStats::kHistogramSampleFrom), clip_bits(clip) {}

  void feed(const float* x, const float* r, std::int64_t n) {
    // The lanes in locals for the loop (members would be stored every block).
    F64x8 l_s0 = s0, l_s1 = s1, l_sq0 = sq0, l_sq1 = sq1, l_ee0 = ee0, l_ee1 = ee1;
    U32x16 l_maxv = maxv, l_clipv = clipv, l_fmx = fmx;
    I32x16 l_bmin = bmin, l_bmax = bmax;
    const std::int64_t base = done / kVec;  // chunks before this piece (a multiple of kBlock)
    const std::int64_t chunks = n / kVec;
    for (std::int64_t c0 = 0; c0 < chunks; c0 += kBlock) {
      const int m = int(std::min<std::int64_t>(kBlock, chunks - c0));
      const int pick = sample ? int(sampled_position((base + c0) / kBlock)) : -1;
      const float* xb = x + c0 * kVec;
      const float* rb = kError ? r + c0 * kVec : nullptr;
      // Two interleaved sets of accumulators (even and odd chunks): a chain of dependent adds per
      // set is half as long, and the sets meet (in float) before the block goes to double.
      F32x16 fs[2] = {}, fsq[2] = {}, fee[2] = {};
      U32x16 top[2] = {}, bclip[2] = {}, bmx[2] = {};
      auto chunk = [&](int j, int a) {
        F32x16 v;
        std::memcpy(&v, xb + j * kVec, sizeof v);
        if constexpr (kClip) {
          const U32x16 u = abs_bits(xb + j * kVec);
          top[a] = top[a] > u ? top[a] : u;
          bclip[a] -= (U32x16)(u > clip_bits);
        } else {
          top[a] = max_abs_bits(top[a], v);  // may skip a NaN: the squares' sum catches it
        }
        fs[a] += v;
        fsq[a] += v * v;
        if constexpr (kError) {
          F32x16 w;
          std::memcpy(&w, rb + j * kVec, sizeof w);  // finite and below 2^60: add_with_error's condition
          const F32x16 d = v - w;
          fee[a] += d * d;
          // max(|d|) as bits (d is finite: both sides are below 2^60), one range op with AVX-512.
          bmx[a] = max_abs_bits(bmx[a], d);
        }
      };
      int j = 0;
      for (; j + 1 < m; j += 2) {
        chunk(j, 0);
        chunk(j + 1, 1);
      }
      if (j < m) chunk(j, 0);
      const U32x16 block_top = top[0] > top[1] ? top[0] : top[1];
      const F32x16 block_sq = fsq[0] + fsq[1];
      U32x16 sq_bits;  // not finite when the block holds a NaN or an infinity (they propagate there)
      std::memcpy(&sq_bits, &block_sq, sizeof sq_bits);
      if (any_at_least(block_top, kBigBits) || any_at_least(sq_bits, kInfBits)) [[unlikely]] {
        for (int k = 0; k < m; ++k)
          scan_scalar(x, rb ? r : nullptr, (c0 + k) * kVec, kVec, !sample || k == pick, clip_bits, s);
        continue;
      }
      l_maxv = l_maxv > block_top ? l_maxv : block_top;
      l_clipv += bclip[0] + bclip[1];
      l_fmx = l_fmx > bmx[0] ? l_fmx : bmx[0];
      l_fmx = l_fmx > bmx[1] ? l_fmx : bmx[1];
      widen_add(l_s0, l_s1, fs[0] + fs[1]);
      widen_add(l_sq0, l_sq1, block_sq);
      if constexpr (kError) widen_add(l_ee0, l_ee1, fee[0] + fee[1]);
      clean += std::uint64_t(m) * kVec;
      if (sample) {
        if (pick < m) histogram_chunk(abs_bits(xb + pick * kVec), l_bmin, l_bmax);
      } else {
        for (int k = 0; k < m; ++k) histogram_chunk(abs_bits(xb + k * kVec), l_bmin, l_bmax);
      }
    }
    // The tail (the tensor's last piece only): a partial chunk at its place in its block.
    if (chunks * kVec < n) {
      const std::int64_t c = base + chunks;
      const bool hist = !sample || sampled_position(c / kBlock) == std::uint32_t(c % kBlock);
      scan_scalar(x, kError ? r : nullptr, chunks * kVec, int(n - chunks * kVec), hist, clip_bits, s);
    }
    s0 = l_s0, s1 = l_s1, sq0 = l_sq0, sq1 = l_sq1, ee0 = l_ee0, ee1 = l_ee1;
    maxv = l_maxv, clipv = l_clipv, fmx = l_fmx;
    bmin = l_bmin, bmax = l_bmax;
    done += n;
  }

  // Moves the histogram counts gathered so far to h: the scratch is free for another pass.
  void flush_histogram(LogAbsHistogram& h) {
    for (int l = 0; l < kVec; ++l) {
      s.lo = std::min(s.lo, int(bmin[l]));
      s.hi = std::max(s.hi, int(bmax[l]));
    }
    move_counts(s.lo, s.hi, h);
    bmin = LogAbsHistogram::kBins + I32x16{};
    bmax = -1 + I32x16{};
    s.lo = LogAbsHistogram::kBins;
    s.hi = -1;
  }

  Scan finish() {
    s.finite += clean;
    s.sum += lane_sum(s0, s1);
    s.sum_sq += lane_sum(sq0, sq1);
    s.err_sq += lane_sum(ee0, ee1);
    for (int l = 0; l < kVec; ++l) {
      s.max_bits = std::max(s.max_bits, maxv[l]);
      s.clipped += clipv[l];
      s.err_max = std::max(s.err_max, double(std::bit_cast<float>(fmx[l])));
      s.lo = std::min(s.lo, int(bmin[l]));
      s.hi = std::max(s.hi, int(bmax[l]));
    }
    return s;
  }
};

template <bool kError, bool kClip>
Scan scan_with(const float* x, const float* r, std::int64_t n, std::uint32_t clip_bits) {
  Pass<kError, kClip> p(n, clip_bits);
  p.feed(x, r, n);
  return p.finish();
}

// scan_with for a clip threshold or none (+inf: no compare per element; finite values never pass
// it, and the scalar path still counts them right).
template <bool kError>
Scan scan(const float* x, const float* r, std::int64_t n, float clip_amax) {
  const std::uint32_t clip_bits = clip_bits_of(clip_amax);
  return clip_bits >= kInfBits ? scan_with<kError, false>(x, r, n, clip_bits)
                               : scan_with<kError, true>(x, r, n, clip_bits);
}

}  // namespace

std::optional<double> ActivationStats::add(const float* x, std::int64_t n, float clip_amax) {
  const Scan s = scan<false>(x, nullptr, n, clip_amax);
  commit(*this, s);
  return s.plain ? std::optional<double>(s.sum_sq) : std::nullopt;
}

TensorError add_with_error(ActivationStats& act, ErrorStats& err, const float* test, const float* ref,
                           double ref_sum_sq, std::int64_t n, float clip_amax) {
  const Scan s = scan<true>(test, ref, n, clip_amax);
  commit(act, s);
  const TensorError e =
      s.nan || s.inf ? tensor_error(ref, test, n) : error_from_energies(n, ref_sum_sq, s.sum_sq, s.err_sq, s.err_max);
  err.add(e, n);
  return e;
}

// A pass fed in pieces (StreamedError: against a reference; StreamedStats: alone): the clipping
// or the plain pass, its histogram counts moved out of the thread's scratch after each piece.
template <bool kError>
struct PiecewisePass {
  Pass<kError, false> plain;
  Pass<kError, true> clip;
  bool clipping;
  LogAbsHistogram hist;
  PiecewisePass(std::int64_t n, std::uint32_t clip_bits)
      : plain(n, clip_bits), clip(n, clip_bits), clipping(clip_bits < kInfBits) {}

  // A new pass over n elements in `state` (made or reused, keeping its histogram's storage).
  template <class S>
  static void start(std::unique_ptr<S>& state, std::int64_t n, float clip_amax) {
    if (!state) {
      state = std::make_unique<S>(n, clip_bits_of(clip_amax));
      return;
    }
    LogAbsHistogram kept = std::move(state->hist);  // its storage, for the next pass
    kept.clear();
    *state = S(n, clip_bits_of(clip_amax));
    state->hist = std::move(kept);
  }
  void feed(const float* x, const float* ref, std::int64_t count) {
    if (clipping) {
      clip.feed(x, ref, count);
      clip.flush_histogram(hist);
    } else {
      plain.feed(x, ref, count);
      plain.flush_histogram(hist);
    }
  }
  Scan finish() { return clipping ? clip.finish() : plain.finish(); }
  // Adds a finished pass to `act` (its histogram scratch is empty: the counts are in hist).
  void commit_to(ActivationStats& act, const Scan& s) {
    commit(act, s);
    act.abs_hist.merge(hist);
  }
};

struct StreamedError::State : PiecewisePass<true> {
  using PiecewisePass::PiecewisePass;
};

StreamedError::StreamedError() = default;
StreamedError::~StreamedError() = default;
StreamedError::StreamedError(StreamedError&&) noexcept = default;
StreamedError& StreamedError::operator=(StreamedError&&) noexcept = default;

void StreamedError::start(std::int64_t n, float clip_amax) {
  n_ = n;
  PiecewisePass<true>::start(state_, n, clip_amax);
}

void StreamedError::feed(const float* test, const float* ref, std::int64_t count) { state_->feed(test, ref, count); }

std::optional<TensorError> StreamedError::finish(ActivationStats& act, ErrorStats& err, double ref_sum_sq) {
  const Scan s = state_->finish();
  if (s.nan || s.inf) return std::nullopt;
  state_->commit_to(act, s);
  const TensorError e = error_from_energies(n_, ref_sum_sq, s.sum_sq, s.err_sq, s.err_max);
  err.add(e, n_);
  return e;
}

struct StreamedStats::State : PiecewisePass<false> {
  using PiecewisePass::PiecewisePass;
};

StreamedStats::StreamedStats() = default;
StreamedStats::~StreamedStats() = default;
StreamedStats::StreamedStats(StreamedStats&&) noexcept = default;
StreamedStats& StreamedStats::operator=(StreamedStats&&) noexcept = default;

void StreamedStats::start(std::int64_t n, float clip_amax) { PiecewisePass<false>::start(state_, n, clip_amax); }

void StreamedStats::feed(const float* x, std::int64_t count) { state_->feed(x, nullptr, count); }

std::optional<double> StreamedStats::finish(ActivationStats& act) {
  const Scan s = state_->finish();
  state_->commit_to(act, s);
  return s.plain ? std::optional<double>(s.sum_sq) : std::nullopt;
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

void ActivationStats::clear() {
  count = nan = inf = clipped = calls = 0;
  sum.clear();
  sum_sq.clear();
  absmax = 0;
  abs_hist.clear();
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

void ActivationStats::add_clipped(const float* x, std::int64_t n, std::span<const float> channel_clip_amax) {
  const std::int64_t k = std::int64_t(channel_clip_amax.size());
  if (k == 0) return;
  const float* t = channel_clip_amax.data();
  std::uint64_t total = 0;
  for (std::int64_t i = 0; i < n; i += k) {
    const std::int64_t m = std::min(k, n - i);
    std::uint32_t row = 0;  // a row of one element per channel: vectorised, no branch
    for (std::int64_t c = 0; c < m; ++c) {
      const std::uint32_t u = std::bit_cast<std::uint32_t>(x[i + c]) & kAbs;
      row += (u < kInfBits) & (std::bit_cast<float>(u) > t[c]);
    }
    total += row;
  }
  clipped += total;
}

void ActivationStats::add_clipped(const float* x, std::int64_t n, float clip_amax) {
  const std::uint32_t clip_bits = clip_bits_of(clip_amax);
  std::uint64_t total = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(x[i]) & kAbs;
    total += (u < kInfBits) & (u > clip_bits);
  }
  clipped += total;
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

void ErrorStats::clear() {
  count = nonfinite = calls = cosine_calls = 0;
  ref_sq.clear();
  err_sq.clear();
  cosine_sum.clear();
  max_abs = 0;
}

std::optional<double> ErrorStats::sqnr_db() const {
  if (diverged()) return -std::numeric_limits<double>::infinity();
  if (count == 0) return std::nullopt;
  const double e = err_sq.value(), r = ref_sq.value();
  if (e == 0) return std::numeric_limits<double>::infinity();
  if (r == 0) return std::nullopt;
  return 10.0 * std::log10(r / e);
}

std::optional<double> ErrorStats::rel_l2() const {
  if (diverged()) return std::numeric_limits<double>::infinity();
  const double r = ref_sq.value();
  if (count == 0 || r == 0) return std::nullopt;
  return std::sqrt(err_sq.value() / r);
}

std::optional<double> ErrorStats::cosine() const {
  if (cosine_calls == 0 || diverged()) return std::nullopt;
  return cosine_sum.value() / double(cosine_calls);
}

// ---- totals of a pass made elsewhere (metrics/scan_totals.h) ------------------------------------

static_assert(kernels::ScanTotals::kBins == LogAbsHistogram::kBins);
static_assert(kernels::ScanTotals::kSampleFrom == ActivationStats::kHistogramSampleFrom);
static_assert(kernels::ScanTotals::kChunk == kVec && kernels::ScanTotals::kBlock == kBlock);

std::optional<double> add_scan(ActivationStats& act, const kernels::ScanTotals& s) {
  add_pass(act, s);
  act.abs_hist.add_counts(0, s.hist);
  return s.plain ? std::optional<double>(s.sum_sq) : std::nullopt;
}

TensorError add_scan_with_error(ActivationStats& act, ErrorStats& err, const kernels::ScanTotals& s,
                                double ref_sum_sq, std::int64_t n) {
  if (s.nan || s.inf) throw std::invalid_argument("add_scan_with_error: the test values are not all finite");
  add_scan(act, s);
  const TensorError e = error_from_energies(n, ref_sum_sq, s.sum_sq, s.err_sq, s.err_max);
  err.add(e, n);
  return e;
}

TensorError error_from_scan(const kernels::ScanTotals& s) {
  const std::int64_t bad = std::int64_t(s.nan + s.inf);
  TensorError e = error_from_energies(std::int64_t(s.finite), s.ref_sq, s.sum_sq, s.err_sq, s.err_max);
  e.nonfinite_test = bad;
  e.first_nonfinite = s.first_nonfinite;
  if (bad) set_diverged(e, bad);
  return e;
}

}  // namespace qeval::metrics
