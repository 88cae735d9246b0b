// The image-metric interface: one metric a file, found by name through the registry (libvmaf style).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/tensor.h"
#include "metrics/metric_def.h"

namespace qeval::metrics {

// SSIM conventions differ in window, covariance normalisation and pre-scaling; reports name the one
// used, because the same pair scores differently under each.
enum class SsimConvention {
  kWang,            // Wang et al. 2004: 11x11 Gaussian sigma 1.5, population covariance
  kMatlab,          // Wang's ssim.m: as kWang after box-filter downsampling by round(min(H,W)/256)
  kSkimageDefault,  // scikit-image defaults: 7x7 uniform window, sample covariance
};
std::string_view ssim_convention_name(SsimConvention c);
// Parses "wang" | "matlab" | "skimage-default"; nullopt otherwise.
std::optional<SsimConvention> parse_ssim_convention(std::string_view name);

// Options every image metric sees.
struct ImageMetricOptions {
  double peak = 255.0;  // data range: 255 for 8-bit, 65535 for 16-bit images
  SsimConvention ssim_convention = SsimConvention::kWang;
};

// One named value a metric produced. `value` is empty when the metric does not apply (too small an
// image) or is unbounded (PSNR of identical images); `note` says which.
struct MetricValue {
  std::string key;  // e.g. "psnr_db", "ssim"
  std::optional<double> value;
  std::vector<std::optional<double>> per_channel;  // empty when the metric has no per-channel form
  std::string note;
};

// Images are planar float32 tensors [C, H, W] holding the raw sample values on [0, peak].
class ImageMetric {
 public:
  virtual ~ImageMetric() = default;
  virtual std::string_view name() const = 0;
  // The keys compute() appends, in that order, with their identity (the registry lists them).
  virtual std::vector<MetricDef> defs() const = 0;
  // key -> how it is computed under `options`, for reports; default: each def's `definition`
  // (keys without one are not listed).
  virtual std::vector<std::pair<std::string, std::string>> conventions(const ImageMetricOptions& options) const;
  // Appends this metric's values to `out`. `ref` and `test` have the same shape (checked by callers).
  virtual void compute(const Tensor& ref, const Tensor& test, const ImageMetricOptions& options,
                       std::vector<MetricValue>& out) const = 0;
};

// The registry: every image metric qeval knows, in report order (registry.cc: one line a metric).
const std::vector<std::unique_ptr<ImageMetric>>& image_metrics();
// nullptr when no metric has that name.
const ImageMetric* find_image_metric(std::string_view name);

// Throws std::invalid_argument unless both tensors are float32 [C, H, W] of the same shape.
void check_image_pair(const Tensor& ref, const Tensor& test);

}  // namespace qeval::metrics
