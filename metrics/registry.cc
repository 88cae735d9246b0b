// The image-metric registry: adding a metric is one file plus one line here.
#include <stdexcept>

#include "metrics/image_metric.h"
#include "metrics/ms_ssim.h"
#include "metrics/psnr.h"
#include "metrics/ssim.h"

namespace qeval::metrics {

const std::vector<std::unique_ptr<ImageMetric>>& image_metrics() {
  static const std::vector<std::unique_ptr<ImageMetric>> metrics = [] {
    std::vector<std::unique_ptr<ImageMetric>> m;
    m.push_back(std::make_unique<PsnrMetric>());
    m.push_back(std::make_unique<SsimMetric>());
    m.push_back(std::make_unique<MsSsimMetric>());
    return m;
  }();
  return metrics;
}

const ImageMetric* find_image_metric(std::string_view name) {
  for (const auto& m : image_metrics())
    if (m->name() == name) return m.get();
  return nullptr;
}

void check_image_pair(const Tensor& ref, const Tensor& test) {
  if (ref.dtype() != DType::kFloat32 || test.dtype() != DType::kFloat32 || ref.rank() != 3)
    throw std::invalid_argument("image metrics need float32 [C, H, W] tensors, got " +
                                std::string(dtype_name(ref.dtype())) + " " +
                                shape_to_string(ref.shape()));
  if (ref.shape() != test.shape())
    throw std::invalid_argument("image shapes differ: reference " + shape_to_string(ref.shape()) +
                                " vs test " + shape_to_string(test.shape()));
}

}  // namespace qeval::metrics
