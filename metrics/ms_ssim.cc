// MS-SSIM on top of the SSIM plane kernel.
#include "metrics/ms_ssim.h"

#include <algorithm>
#include <cmath>

#include "metrics/metric_registry.h"
#include "metrics/ssim.h"

namespace qeval::metrics {

MsSsimResult ms_ssim(const Tensor& ref, const Tensor& test, double peak) {
  check_image_pair(ref, test);
  const int channels = static_cast<int>(ref.dim(0));
  const int h = static_cast<int>(ref.dim(1)), w = static_cast<int>(ref.dim(2));
  const SsimWindow window = gaussian_window(11, 1.5);
  MsSsimResult result;
  // Five scales need the short side to stay >= 11 after four ceil-halvings.
  int sh = h, sw = w;
  for (int j = 1; j < 5; ++j) sh = (sh + 1) / 2, sw = (sw + 1) / 2;
  if (std::min(sh, sw) < window.size()) {
    result.note = "needs at least " + std::to_string(kMsSsimMinSide) +
                  " px on the short side for 5 scales (11x11 window after four 2x downsamplings); image is " +
                  std::to_string(w) + "x" + std::to_string(h);
    return result;
  }
  const std::size_t plane = std::size_t(h) * w;
  double total = 0;
  for (int c = 0; c < channels; ++c) {
    // Scale 1 reads the input planes; the coarser scales live in x_small / y_small.
    PlaneView x{ref.data<float>() + c * plane, h, w}, y{test.data<float>() + c * plane, h, w};
    std::vector<float> x_small, y_small;
    double value = 1.0;
    for (std::size_t scale = 0; scale < kMsSsimWeights.size(); ++scale) {
      SsimPlaneResult r = ssim_plane(x, y, window, peak);
      const bool last = scale + 1 == kMsSsimWeights.size();
      value *= std::pow(std::max(last ? r.ssim : r.cs, 0.0), kMsSsimWeights[scale]);
      if (last) break;
      int nh = 0, nw = 0;
      x_small = box_downsample(x, 2, &nh, &nw);
      y_small = box_downsample(y, 2, &nh, &nw);
      x = {x_small.data(), nh, nw};
      y = {y_small.data(), nh, nw};
    }
    result.per_channel.push_back(value);
    total += value;
  }
  result.ms_ssim = total / channels;
  return result;
}

std::vector<MetricDef> MsSsimMetric::defs() const {
  return {{.key = keys::kMsSsim,
           .label = "MS-SSIM",
           .decimals = 5,
           .headline = true,
           .summarized = true,
           .definition = "Wang 2003, 5 scales, weights 0.0448/0.2856/0.3001/0.2363/0.1333, 2x2 average "
                         "downsampling, negative terms clamped to 0; mean over channels; needs >= 161 px on the "
                         "short side"}};
}

void MsSsimMetric::compute(const Tensor& ref, const Tensor& test, const ImageMetricOptions& options,
                           std::vector<MetricValue>& out) const {
  MsSsimResult r = ms_ssim(ref, test, options.peak);
  std::vector<std::optional<double>> channels(r.per_channel.begin(), r.per_channel.end());
  out.push_back({keys::kMsSsim, r.ms_ssim, std::move(channels), r.note});
}

std::unique_ptr<ImageMetric> make_ms_ssim_metric() { return std::make_unique<MsSsimMetric>(); }

}  // namespace qeval::metrics
