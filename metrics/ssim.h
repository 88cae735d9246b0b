// SSIM (Wang et al. 2004) under the named conventions: a fast float kernel and a double reference.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kernels/tensor.h"
#include "metrics/image_metric.h"

namespace qeval::metrics {

// A separable, normalised SSIM window and the statistics normalisation that goes with it.
struct SsimWindow {
  std::vector<double> taps;  // 1-D weights, odd length, summing to 1
  double cov_norm = 1.0;     // N/(N-1) for sample covariance, 1 for population covariance
  int size() const { return static_cast<int>(taps.size()); }
};
// Gaussian window as scipy.ndimage/MATLAB fspecial build it: exp(-x^2 / (2 sigma^2)), normalised.
SsimWindow gaussian_window(int size, double sigma);
// size x size uniform window with sample covariance (scikit-image's default).
SsimWindow uniform_window(int size);
SsimWindow window_for(SsimConvention convention);

// Mean SSIM and mean contrast-structure term over the valid region of one plane pair.
struct SsimPlaneResult {
  double ssim = 0;
  double cs = 0;
};

// A plane: h x w float samples, rows contiguous.
struct PlaneView {
  const float* data;
  int height;
  int width;
};

// Fast path: float moments on mean-centred samples (the centring keeps E[x^2] - mu^2 from
// cancelling), double accumulation of the map, row strips in parallel with a fixed strip size so
// the result does not depend on the thread count. Requires height, width >= window size.
SsimPlaneResult ssim_plane(PlaneView x, PlaneView y, const SsimWindow& window, double peak);
// Reference path: whole-plane double-precision filtering, as scikit-image computes it.
SsimPlaneResult ssim_plane_reference(PlaneView x, PlaneView y, const SsimWindow& window, double peak);

// MATLAB ssim.m pre-scaling factor: max(1, round(min(H, W) / 256)).
int matlab_downsample_factor(int height, int width);
// MATLAB imfilter(img, ones(f)/f^2, 'symmetric', 'same') followed by img(1:f:end, 1:f:end).
std::vector<float> box_downsample(PlaneView x, int f, int* out_height, int* out_width);

struct SsimResult {
  std::optional<double> ssim;  // mean over channels; empty when not applicable
  std::vector<double> per_channel;
  std::string note;  // why it is not applicable
};
// ref/test: float32 [C, H, W] on [0, peak].
SsimResult ssim(const Tensor& ref, const Tensor& test, SsimConvention convention, double peak);
// The same through ssim_plane_reference (for tests and for checking the fast path).
SsimResult ssim_reference(const Tensor& ref, const Tensor& test, SsimConvention convention, double peak);

class SsimMetric final : public ImageMetric {
 public:
  std::string_view name() const override { return "ssim"; }
  std::vector<MetricDef> defs() const override;
  std::vector<std::pair<std::string, std::string>> conventions(const ImageMetricOptions& options) const override;
  void compute(const Tensor& ref, const Tensor& test, const ImageMetricOptions& options,
               std::vector<MetricValue>& out) const override;
};

}  // namespace qeval::metrics
