// Calibration statistics: |x| histogram, entropy and MSE amax searches, per-step amax reduction.
#include "metrics/calibration.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace qeval::metrics {

AbsHistogram::AbsHistogram(int num_bins) : num_bins_(num_bins) {
  if (num_bins < 1) throw std::invalid_argument("AbsHistogram: num_bins must be >= 1");
}

void AbsHistogram::collect(std::span<const float> values) {
  double batch_max = 0;
  for (float v : values) {
    const double a = std::fabs(static_cast<double>(v));
    if (a > batch_max) batch_max = a;  // NaN compares false: ignored
  }
  if (width_ == 0) {
    if (batch_max == 0) {
      for (float v : values) zeros_ += v == 0 ? 1 : 0;
      return;
    }
    width_ = batch_max / num_bins_;
    if (!std::isfinite(width_)) {
      // An infinite first maximum leaves no scale to bin on: use the finite values' max.
      double finite_max = 0;
      for (float v : values)
        if (std::isfinite(v)) finite_max = std::max(finite_max, std::fabs(static_cast<double>(v)));
      if (finite_max == 0) return;
      width_ = finite_max / num_bins_;
      batch_max = finite_max;
    }
    counts_.assign(static_cast<std::size_t>(num_bins_), 0.0);
    counts_[0] += zeros_;
    zeros_ = 0;
  }
  if (std::isfinite(batch_max) && batch_max > counts_.size() * width_) {
    const auto bins = static_cast<std::size_t>(std::ceil(batch_max / width_));
    counts_.resize(std::max(bins, counts_.size()), 0.0);
  }
  max_ = std::max(max_, std::isfinite(batch_max) ? batch_max : max_);
  const std::size_t last = counts_.size() - 1;
  for (float v : values) {
    const double a = std::fabs(static_cast<double>(v));
    if (std::isnan(a)) continue;
    const double pos = a / width_;
    const std::size_t idx = pos >= static_cast<double>(last) ? last : static_cast<std::size_t>(pos);
    counts_[idx] += 1;
  }
}

std::vector<double> AbsHistogram::edges() const {
  std::vector<double> e(counts_.size() + 1);
  for (std::size_t i = 0; i < e.size(); ++i) e[i] = static_cast<double>(i) * width_;
  return e;
}

double entropy_amax(std::span<const double> counts, std::span<const double> edges, int num_bits, int stride,
                    int start_bin) {
  if (counts.size() < 2 || edges.size() != counts.size() + 1)
    throw std::invalid_argument("entropy_amax: needs >= 2 bins and one more edge than bins");
  std::vector<double> bins(counts.begin(), counts.end());
  bins[0] = bins[1];  // zeros dominate after ReLU-like ops; TensorRT's calibrator drops them so
  const std::size_t n = bins.size();
  const int nq = 1 << (num_bits - 1);
  std::vector<double> suffix(n + 1, 0.0);  // sum of bins[i:]
  for (std::size_t i = n; i-- > 0;) suffix[i] = suffix[i + 1] + bins[i];

  std::vector<double> density_counts(static_cast<std::size_t>(nq));
  std::vector<int> bucket_size(static_cast<std::size_t>(nq));
  std::vector<int> bucket;
  std::vector<double> space(static_cast<std::size_t>(nq) + 1);
  double best = std::numeric_limits<double>::infinity();
  std::size_t best_i = static_cast<std::size_t>(start_bin);
  bool any = false;
  for (std::size_t i = static_cast<std::size_t>(start_bin); i <= n; i += static_cast<std::size_t>(stride)) {
    // numpy.linspace(0, i, nq + 1): k * (i / nq), the last point exactly i.
    const double step = static_cast<double>(i) / nq;
    for (int k = 0; k <= nq; ++k) space[static_cast<std::size_t>(k)] = k * step;
    space[static_cast<std::size_t>(nq)] = static_cast<double>(i);
    bucket.assign(i, -1);
    std::fill(density_counts.begin(), density_counts.end(), 0.0);
    std::fill(bucket_size.begin(), bucket_size.end(), 0);
    int k = 0;
    for (std::size_t j = 0; j < i; ++j) {
      // numpy.digitize(j, space) - 1: the k with space[k] <= j < space[k + 1].
      while (k + 1 <= nq && space[static_cast<std::size_t>(k + 1)] <= static_cast<double>(j)) ++k;
      if (bins[j] == 0) continue;
      bucket[j] = k;
      density_counts[static_cast<std::size_t>(k)] += bins[j];
      bucket_size[static_cast<std::size_t>(k)]++;
    }
    for (int q = 0; q < nq; ++q)
      if (bucket_size[static_cast<std::size_t>(q)])
        density_counts[static_cast<std::size_t>(q)] /= bucket_size[static_cast<std::size_t>(q)];
    // P: bins[:i] with the clipped mass in the last bin; Q: the quantized spread. KL as
    // scipy.stats.entropy (both normalised; p > 0 where q == 0 gives inf).
    double p_sum = 0, q_sum = 0;
    for (std::size_t j = 0; j < i; ++j) {
      p_sum += j + 1 == i ? bins[j] + suffix[i] : bins[j];
      q_sum += bucket[j] >= 0 ? density_counts[static_cast<std::size_t>(bucket[j])] : 0.0;
    }
    double kl = 0;
    for (std::size_t j = 0; j < i; ++j) {
      const double p = (j + 1 == i ? bins[j] + suffix[i] : bins[j]) / p_sum;
      const double q = (bucket[j] >= 0 ? density_counts[static_cast<std::size_t>(bucket[j])] : 0.0) / q_sum;
      if (p > 0) kl += q > 0 ? p * std::log(p / q) : std::numeric_limits<double>::infinity();
    }
    if (!any || kl <= best) {  // <=: the last minimum wins
      best = kl;
      best_i = i;
      any = true;
    }
  }
  if (!any) return edges.back();
  return edges[best_i];
}

double fake_quant_int8(double x, double amax) {
  const double scale = 127.0 / amax;
  const double q = std::clamp(std::nearbyint(x * scale), -127.0, 127.0);
  return q / scale;
}

double mse_amax(std::span<const double> counts, std::span<const double> edges, int stride, int start_bin,
                const std::function<double(double, double)>& fake_quant) {
  if (counts.empty() || edges.size() != counts.size() + 1)
    throw std::invalid_argument("mse_amax: needs one more edge than bins");
  const std::size_t n = counts.size();
  std::vector<double> centers(n);
  for (std::size_t i = 0; i < n; ++i) centers[i] = (edges[i] + edges[i + 1]) / 2;
  double best = std::numeric_limits<double>::infinity();
  std::size_t best_i = n - 1;
  for (std::size_t i = static_cast<std::size_t>(start_bin); i < n; i += static_cast<std::size_t>(stride)) {
    const double amax = centers[i];
    double err = 0;
    for (std::size_t j = 0; j < n; ++j) {
      const double d = fake_quant(centers[j], amax) - centers[j];
      err += d * d * counts[j];
    }
    if (err < best) {  // <: the first minimum wins (numpy.argmin)
      best = err;
      best_i = i;
    }
  }
  return centers[best_i];
}

void StepAmaxCollector::collect(int step, double amax) {
  auto [it, inserted] = steps_.try_emplace(step);
  Step& s = it->second;
  if (inserted) {
    s.min = s.max = amax;
  } else {
    s.min = std::min(s.min, amax);
    s.max = std::max(s.max, amax);
  }
  s.sum += amax;
  s.count++;
}

double StepAmaxCollector::overall_max() const {
  double m = 0;
  for (const auto& [t, s] : steps_) m = std::max(m, s.max);
  return m;
}

double StepAmaxCollector::percentile_amax(int total_steps, double percentile, CollectMethod method) const {
  const int up_lim = std::max(1, static_cast<int>(total_steps * percentile));
  std::vector<double> per_step;
  for (const auto& [t, s] : steps_) {
    if (t < 0 || t >= up_lim) continue;
    switch (method) {
      case CollectMethod::kMinMean: per_step.push_back(s.sum / static_cast<double>(s.count)); break;
      case CollectMethod::kGlobalMin: per_step.push_back(s.min); break;
      case CollectMethod::kMeanMax:
      case CollectMethod::kMinMax: per_step.push_back(s.max); break;
    }
  }
  if (per_step.empty()) return 0;
  if (method == CollectMethod::kMeanMax) {
    double sum = 0;
    for (double v : per_step) sum += v;
    return sum / static_cast<double>(per_step.size());
  }
  return *std::min_element(per_step.begin(), per_step.end());
}

}  // namespace qeval::metrics
