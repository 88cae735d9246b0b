// PSNR over planar images, with sums in double so that large images lose nothing.
#include "metrics/psnr.h"

#include <cmath>

#include "metrics/metric_registry.h"
#include "metrics/tensor_error.h"

namespace qeval::metrics {

std::optional<double> psnr_db_from_mse(double mse, double peak) {
  if (mse == 0.0) return std::nullopt;
  return 10.0 * std::log10(peak * peak / mse);
}

namespace {
// Sum of squared differences of the BT.601 luma of two RGB planes sets.
double luma_sse(const float* r0, const float* g0, const float* b0, const float* r1, const float* g1, const float* b1,
                std::int64_t n) {
  constexpr int kLanes = 8;
  double acc[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      double d = 0.299 * (double(r0[i + l]) - r1[i + l]) + 0.587 * (double(g0[i + l]) - g1[i + l]) +
                 0.114 * (double(b0[i + l]) - b1[i + l]);
      acc[l] += d * d;
    }
  }
  double total = 0;
  for (; i < n; ++i) {
    double d = 0.299 * (double(r0[i]) - r1[i]) + 0.587 * (double(g0[i]) - g1[i]) + 0.114 * (double(b0[i]) - b1[i]);
    total += d * d;
  }
  for (double a : acc) total += a;
  return total;
}
}  // namespace

PsnrResult psnr(const Tensor& ref, const Tensor& test, double peak) {
  check_image_pair(ref, test);
  const std::int64_t channels = ref.dim(0);
  const std::int64_t plane = ref.dim(1) * ref.dim(2);
  const float* a = ref.data<float>();
  const float* b = test.data<float>();

  PsnrResult r;
  double total_sse = 0;
  for (std::int64_t c = 0; c < channels; ++c) {
    double sse = sum_squared_difference(a + c * plane, b + c * plane, plane);
    total_sse += sse;
    r.channel_mse.push_back(plane ? sse / double(plane) : 0.0);
    r.channel_psnr_db.push_back(psnr_db_from_mse(r.channel_mse.back(), peak));
  }
  r.mse = ref.numel() ? total_sse / double(ref.numel()) : 0.0;
  r.psnr_db = psnr_db_from_mse(r.mse, peak);
  // Luma comes from the colour planes only: an alpha plane being compared does not enter it.
  if (channels >= 3) {
    r.luma_mse =
        plane ? luma_sse(a, a + plane, a + 2 * plane, b, b + plane, b + 2 * plane, plane) / double(plane) : 0.0;
  } else {
    r.luma_mse = r.channel_mse.empty() ? 0.0 : r.channel_mse[0];
  }
  r.luma_psnr_db = psnr_db_from_mse(r.luma_mse, peak);
  return r;
}

std::vector<MetricDef> PsnrMetric::defs() const {
  return {{.key = keys::kPsnrDb,
           .label = "PSNR dB",
           .unit = "dB",
           .decimals = 2,
           .unbounded_when_identical = true,
           .headline = true,
           .summarized = true,
           .definition = "10 log10(peak^2 / MSE), MSE pooled over all pixels and channels"},
          {.key = keys::kPsnrYDb,
           .label = "PSNR-Y dB",
           .unit = "dB",
           .decimals = 2,
           .unbounded_when_identical = true,
           .summarized = true,
           .definition = "PSNR on BT.601 luma Y = 0.299 R + 0.587 G + 0.114 B (full range)"},
          {.key = keys::kMse, .label = "MSE", .unit = "sample levels^2", .higher_is_better = false}};
}

void PsnrMetric::compute(const Tensor& ref, const Tensor& test, const ImageMetricOptions& options,
                         std::vector<MetricValue>& out) const {
  PsnrResult r = psnr(ref, test, options.peak);
  const char* identical = "identical: PSNR is unbounded";
  out.push_back({keys::kPsnrDb, r.psnr_db, r.channel_psnr_db, r.psnr_db ? "" : identical});
  out.push_back({keys::kPsnrYDb, r.luma_psnr_db, {}, r.luma_psnr_db ? "" : identical});
  out.push_back({keys::kMse, r.mse, {}, ""});
}

std::unique_ptr<ImageMetric> make_psnr_metric() { return std::make_unique<PsnrMetric>(); }

}  // namespace qeval::metrics
