// MS-SSIM (Wang, Simoncelli, Bovik 2003): five scales, 2x2 average downsampling between them.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "kernels/tensor.h"
#include "metrics/image_metric.h"

namespace qeval::metrics {

inline constexpr std::array<double, 5> kMsSsimWeights = {0.0448, 0.2856, 0.3001, 0.2363, 0.1333};
// The short side an image needs for five scales of an 11x11 window: four ceil-halvings of 161
// leave 11 (161 -> 81 -> 41 -> 21 -> 11).
inline constexpr int kMsSsimMinSide = 161;

struct MsSsimResult {
  std::optional<double> ms_ssim;  // mean over channels; empty when the image is too small
  std::vector<double> per_channel;
  std::string note;
};

// prod_{j<5} max(cs_j, 0)^w_j * max(ssim_5, 0)^w_5 per channel (negative terms clamped, as
// TensorFlow and pytorch-msssim do, instead of Wang's complex powers), mean over channels.
// Wang's msssim.m downsampling: imfilter(ones(2)/4, 'symmetric', 'same'), then every 2nd sample.
MsSsimResult ms_ssim(const Tensor& ref, const Tensor& test, double peak);

class MsSsimMetric final : public ImageMetric {
 public:
  std::string_view name() const override { return "ms_ssim"; }
  std::vector<MetricDef> defs() const override;
  void compute(const Tensor& ref, const Tensor& test, const ImageMetricOptions& options,
               std::vector<MetricValue>& out) const override;
};

}  // namespace qeval::metrics
