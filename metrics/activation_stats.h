// Streaming statistics of activation tensors and of their error against a reference, built to be
// pooled over calls, samples, threads and shards: moments, absmax, an |x| histogram on fixed
// logarithmic bins (so histograms add exactly, in any order), percentiles from it, non-finite
// counts, clipping against a threshold; pooled error energies (SQNR, relative L2), mean cosine.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "metrics/exact_sum.h"
#include "metrics/tensor_error.h"

namespace qeval::metrics {

// |x| on fixed bins: kSubBins per octave (the top mantissa bits of float32) from 2^kMinExp up to
// 2^kMaxExp; bin 0 holds smaller magnitudes (zeros, denormals), the last bin larger finite ones.
// A bin is at most 1/8 = 12.5% wide relative to its lower edge (quantiles interpolate inside it).
class LogAbsHistogram {
 public:
  static constexpr int kSubBins = 8;
  static constexpr int kMinExp = -32, kMaxExp = 32;
  static constexpr int kBins = 2 + (kMaxExp - kMinExp) * kSubBins;

  // The bin of a finite |x| (sign ignored).
  static int bin_of(float x);
  static double bin_lower(int bin);  // 0 for bin 0
  static double bin_upper(int bin);  // +inf for the last bin

  // Adds counts of bins first, first + 1, ... (counts.size() bins).
  void add_counts(int first, std::span<const std::uint64_t> counts);
  void merge(const LogAbsHistogram& other);
  std::uint64_t total() const { return total_; }
  std::uint64_t count(int bin) const;
  // The q-quantile (q in [0, 1]) of |x|: the value below which a share q of the elements lies,
  // linear inside the bin that holds it; `absmax` (the true maximum) bounds the last occupied bin.
  // nullopt when empty.
  std::optional<double> quantile(double q, double absmax) const;
  // Occupied bins only: at(i) is the count of bin first() + i, i < bins().
  int first() const { return first_; }
  std::size_t bins() const { return low_.size(); }
  std::uint64_t at(std::size_t i) const { return low_[i] | (high_.empty() ? 0 : std::uint64_t(high_[i]) << 32); }
  std::vector<std::uint64_t> counts() const;  // at(0), at(1), ...
  void prefetch() const;                      // asks for the counts' cache lines, to be added to soon
  void clear();                               // empty, keeping the storage
  // Rebuilds from first()/counts() (e.g. when read back from a cache).
  static LogAbsHistogram from_counts(int first, const std::vector<std::uint64_t>& counts);
  bool operator==(const LogAbsHistogram& o) const;

 private:
  // Counts in two halves: a run pools ~50k histograms (per layer, step and variant) whose bins
  // seldom pass 2^32, so the high halves exist only once one does (~0.5 KB a histogram, not 1).
  int first_ = 0;
  std::vector<std::uint32_t> low_;
  std::vector<std::uint32_t> high_;  // empty, or one per bin
  std::uint64_t total_ = 0;
};

// Statistics of one tensor's values, pooled over calls. Moments, absmax and the histogram are over
// finite elements; NaN and +-inf are counted apart.
//
// Cost and precision (this runs on every node output of `qeval run`): one pass, 16 float lanes;
// each lane sums at most 8 terms in float before they go to double, so the moments carry a relative
// error of ~1e-7 at worst (printed statistics have 4-6 digits). Tensors of at least
// kHistogramSampleFrom (8192) elements put a fixed 1/8 of their 16-element blocks in the histogram (blocks
// picked by a hash of their index, so no channel or row period aliases with the choice); every other
// statistic (count, absmax, moments, clipping, non-finite counts) sees every element. The histogram's
// total is then the sampled count, and quantiles are those of the sample.
struct ActivationStats {
  static constexpr std::int64_t kHistogramSampleFrom = 8192;

  std::uint64_t count = 0;  // finite elements
  std::uint64_t nan = 0, inf = 0;
  std::uint64_t clipped = 0;  // finite elements with |x| > the clip threshold given to add()
  std::uint64_t calls = 0;    // tensors added
  ExactSum sum, sum_sq;       // exact over calls: pooling in any order gives the same bits
  float absmax = 0;
  LogAbsHistogram abs_hist;

  // `clip_amax`: elements beyond it count as clipped (+inf: none). Returns the call's sum of x^2
  // when every element was finite and below 2^60 (what add_with_error needs of a reference), else
  // nullopt.
  std::optional<double> add(const float* x, std::int64_t n, float clip_amax = std::numeric_limits<float>::infinity());
  // Counts the elements beyond their channel's threshold as clipped (only that): the clip range of
  // a quantizer behind a per-channel scaling (SmoothQuant's pre-scale Mul), thresholds per channel
  // of the last axis (x is [..., thresholds.size()]); add() the statistics with no threshold.
  void add_clipped(const float* x, std::int64_t n, std::span<const float> channel_clip_amax);
  // Counts the finite elements beyond `clip_amax` as clipped (only that).
  void add_clipped(const float* x, std::int64_t n, float clip_amax);
  // Adds `other` to this; the result does not depend on the order of merges.
  void merge(const ActivationStats& other);
  void clear();  // no values, keeping the storage

  std::uint64_t nonfinite() const { return nan + inf; }
  std::optional<double> mean() const;
  std::optional<double> stddev() const;  // population standard deviation
  // The q-quantile of |x| from the histogram; q >= 1 is absmax (exact, also for a sampled histogram).
  std::optional<double> abs_quantile(double q) const {
    if (q >= 1 && count) return double(absmax);
    return abs_hist.quantile(q, absmax);
  }
  std::optional<double> clip_rate() const;  // clipped / count
  bool operator==(const ActivationStats&) const = default;
};

// Error of a test tensor against a reference, pooled over calls: SQNR and relative L2 from the
// summed energies, cosine as the mean of the per-call cosines, max-abs as the maximum.
struct ErrorStats {
  std::uint64_t count = 0;      // elements compared (finite on both sides)
  std::uint64_t nonfinite = 0;  // elements where either side was NaN/Inf
  std::uint64_t calls = 0;
  ExactSum ref_sq, err_sq;
  ExactSum cosine_sum;
  std::uint64_t cosine_calls = 0;  // calls with a defined cosine
  double max_abs = 0;              // +inf once a call diverged (the reference finite, the test not)

  // `e` = tensor_error(ref, test) over `elements` values.
  void add(const TensorError& e, std::int64_t elements);
  void merge(const ErrorStats& other);
  void clear();  // nothing compared, keeping the storage

  // A call's test tensor was non-finite where the reference was finite: the error is unbounded.
  // (Kept as max_abs = +inf, which finite pairs of floats never give, so logs and the run state
  // carry it with no field of their own.)
  bool diverged() const { return max_abs == std::numeric_limits<double>::infinity(); }
  // 10 log10(ref_sq / err_sq); +inf when the error is zero; -inf when diverged; nullopt when
  // nothing was compared or the reference is all zeros with a non-zero error.
  std::optional<double> sqnr_db() const;
  // sqrt(err_sq / ref_sq); +inf when diverged; nullopt when ref_sq is 0
  std::optional<double> rel_l2() const;
  std::optional<double> cosine() const;  // mean per-call cosine; nullopt when diverged
  bool operator==(const ErrorStats&) const = default;
};

// One pass over a test tensor and the reference's same tensor: adds `test` to `act` (as
// act.add(test, n, clip_amax)) and its error against `ref` to `err` (as err.add(tensor_error(ref,
// test, n), n)). `ref_sum_sq`: the sum of ref^2, what ActivationStats::add returned for the
// reference's call; only a reference for which it returned one (every value finite and below 2^60)
// may be given. The error energies then carry add()'s precision (~1e-7 relative); the cosine
// comes from the energies ((|r|^2 + |t|^2 - |r - t|^2) / (2 |r| |t|)), accurate where r and t are
// close. When the test tensor holds a NaN or an infinity, the error is tensor_error's.
// Returns the error it added.
TensorError add_with_error(ActivationStats& act, ErrorStats& err, const float* test, const float* ref,
                           double ref_sum_sq, std::int64_t n, float clip_amax = std::numeric_limits<float>::infinity());

// add_with_error over a test tensor that comes in consecutive pieces (a fused kernel's
// intermediate, never written whole), against the reference's whole tensor: the same statistics, to
// the bit, when every piece but the last holds a multiple of kPiece elements.
class StreamedError {
 public:
  static constexpr std::int64_t kPiece = 128;
  StreamedError();
  ~StreamedError();
  StreamedError(StreamedError&&) noexcept;
  StreamedError& operator=(StreamedError&&) noexcept;
  // A pass over `n` elements; the clip threshold as add_with_error's.
  void start(std::int64_t n, float clip_amax = std::numeric_limits<float>::infinity());
  // The next `count` elements: test[0..count) against ref[0..count) (ref points at the same offset
  // of the reference's tensor, which holds finite values below 2^60 as add_with_error's).
  void feed(const float* test, const float* ref, std::int64_t count);
  // Once all n have come: adds to `act` and `err` what add_with_error would have and returns the
  // error; nullopt, adding nothing, when the test tensor held a NaN or an infinity (tensor_error
  // then needs the whole tensors).
  std::optional<TensorError> finish(ActivationStats& act, ErrorStats& err, double ref_sum_sq);

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::int64_t n_ = 0;
};

// ActivationStats::add over a tensor that comes in consecutive pieces (a reference's fused
// intermediate, never written whole): the same statistics and the same returned energy, to the
// bit, when every piece but the last holds a multiple of kPiece elements.
class StreamedStats {
 public:
  static constexpr std::int64_t kPiece = 128;
  StreamedStats();
  ~StreamedStats();
  StreamedStats(StreamedStats&&) noexcept;
  StreamedStats& operator=(StreamedStats&&) noexcept;
  void start(std::int64_t n, float clip_amax = std::numeric_limits<float>::infinity());
  void feed(const float* x, std::int64_t count);  // the next `count` elements
  // Once all n have come: adds to `act` what add() would have and returns what add() would have.
  std::optional<double> finish(ActivationStats& act);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace qeval::metrics
