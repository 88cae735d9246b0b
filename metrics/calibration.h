// Activation-range statistics for quantization calibration (pure statistics, no models): the |x|
// histogram and the amax searches over it (KL divergence as TensorRT's entropy calibrator, MSE as
// pytorch-quantization), and ModelOpt's per-denoising-step percentile calibrator.
#pragma once

#include <functional>
#include <map>
#include <span>
#include <vector>

namespace qeval::metrics {

// Histogram of |x| over [0, num_bins * width]. The first batch with a non-zero maximum fixes the
// bin width (max / num_bins); later batches with larger values append bins of the same width
// (pytorch-quantization's HistogramCalibrator). Value v lands in bin floor(v / width), the largest
// value of the range in the last bin. NaNs are ignored; +-inf is counted in the last bin.
class AbsHistogram {
 public:
  explicit AbsHistogram(int num_bins = 2048);
  void collect(std::span<const float> values);
  bool empty() const { return counts_.empty() && zeros_ == 0; }
  const std::vector<double>& counts() const { return counts_; }
  double width() const { return width_; }
  std::vector<double> edges() const;  // counts().size() + 1 values, i * width
  double max_value() const { return max_; }

 private:
  int num_bins_;
  double width_ = 0;
  double max_ = 0;
  double zeros_ = 0;  // zeros seen before the width was known
  std::vector<double> counts_;
};

// The amax minimising KL(P || Q) between the histogram clipped at a candidate bin i (outliers
// folded into the last kept bin) and its quantization to 2^(num_bits-1) levels, for i from
// start_bin in steps of `stride`; ties go to the larger i. Returns edges[i]. This is TensorRT's
// entropy calibration as pytorch-quantization's _compute_amax_entropy writes it.
double entropy_amax(std::span<const double> counts, std::span<const double> edges, int num_bits = 8, int stride = 1,
                    int start_bin = 128);

// Fake quantization of x >= 0 with the given amax: round(x * 127 / amax) clamped, scaled back.
double fake_quant_int8(double x, double amax);

// The bin centre c_i (i >= start_bin, step stride) minimising sum_j counts_j (q(c_j; c_i) - c_j)^2,
// with q = `fake_quant` (int8 by default); ties go to the smaller i (pytorch-quantization's
// _compute_amax_mse).
double mse_amax(std::span<const double> counts, std::span<const double> edges, int stride = 1, int start_bin = 128,
                const std::function<double(double, double)>& fake_quant = fake_quant_int8);

// How ModelOpt's diffusion PercentileCalibrator reduces per-call amax values: over the calls of one
// step (first word) and then over the first steps (second word).
enum class CollectMethod {
  kMinMean,    // mean per step, then min over steps
  kMeanMax,    // max per step, then mean over steps
  kGlobalMin,  // min per step, then min over steps
  kMinMax,     // max per step, then min over steps
};

// Per-step amax values of one tensor across calibration calls.
class StepAmaxCollector {
 public:
  struct Step {
    double sum = 0, min = 0, max = 0;
    long count = 0;
  };
  void collect(int step, double amax);
  const std::map<int, Step>& steps() const { return steps_; }
  bool empty() const { return steps_.empty(); }
  double overall_max() const;  // max over every call
  // The percentile calibrator's amax: steps 0 .. max(1, int(total_steps * percentile)) - 1 are
  // reduced with `method` (steps never seen are skipped). ModelOpt's code divides the min-mean sum
  // by total_steps rather than by the calls per step; qeval takes the mean (they agree when the
  // calibration set has as many batches as there are steps). Returns 0 when no counted step was seen.
  double percentile_amax(int total_steps, double percentile, CollectMethod method) const;

 private:
  std::map<int, Step> steps_;
};

}  // namespace qeval::metrics
