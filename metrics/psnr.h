// PSNR: pooled over all channels, per channel, and on BT.601 luma.
#pragma once

#include <optional>
#include <vector>

#include "kernels/tensor.h"
#include "metrics/image_metric.h"

namespace qeval::metrics {

// 10 log10(peak^2 / mse); nullopt when mse == 0 (identical signals: PSNR is unbounded).
std::optional<double> psnr_db_from_mse(double mse, double peak);

struct PsnrResult {
  double mse = 0;                   // pooled over every pixel and channel
  std::vector<double> channel_mse;  // one per channel
  // On Y = 0.299 R + 0.587 G + 0.114 B (full range) of channels 0..2; with fewer than 3 channels,
  // Y is channel 0 (gray).
  double luma_mse = 0;
  std::optional<double> psnr_db;
  std::vector<std::optional<double>> channel_psnr_db;
  std::optional<double> luma_psnr_db;
};

// ref/test: float32 [C, H, W].
PsnrResult psnr(const Tensor& ref, const Tensor& test, double peak);

class PsnrMetric final : public ImageMetric {
 public:
  std::string_view name() const override { return "psnr"; }
  std::vector<MetricDef> defs() const override;
  void compute(const Tensor& ref, const Tensor& test, const ImageMetricOptions& options,
               std::vector<MetricValue>& out) const override;
};

}  // namespace qeval::metrics
