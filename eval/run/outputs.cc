// Output images of a unit: metrics, PNG files and thumbnails.
#include "eval/run/outputs.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "base/files.h"
#include "eval/pipelines/segmentation.h"
#include "eval/run/compare_images.h"
#include "eval/run/metric_names.h"
#include "kernels/pooling.h"
#include "reports/heatmap.h"

namespace qeval::eval {

namespace fs = std::filesystem;

std::vector<reports::MetricInfo> image_metric_infos() {
  std::vector<reports::MetricInfo> out;
  for (const metrics::MetricDef& def : metrics::metric_defs())
    if (def.scope == metrics::MetricScope::kImagePair && def.headline) out.push_back(metric_info(def.key));
  return out;
}

namespace {

std::string as_string(const std::vector<std::uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

void write_png(const fs::path& out_dir, const fs::path& rel, const std::vector<std::uint8_t>& png) {
  fs::create_directories((out_dir / rel).parent_path());
  base::write_file_atomic(out_dir / rel, as_string(png));
}

}  // namespace

FixedScaleHeatmaps fixed_scale_heatmaps(const Tensor& ref, const Tensor& test, double peak, int f) {
  const int c = int(ref.dim(0)), h = int(ref.dim(1)), w = int(ref.dim(2));
  const std::size_t plane = std::size_t(h) * std::size_t(w);
  const float to_255 = peak > 0 ? float(255.0 / peak) : 1.0f;
  std::vector<float> diff(plane, 0.0f);
  const float* a = ref.data<float>();
  const float* b = test.data<float>();
  for (int k = 0; k < c; ++k)
    for (std::size_t p = 0; p < plane; ++p) diff[p] = std::max(diff[p], std::abs(a[k * plane + p] - b[k * plane + p]));
  if (to_255 != 1.0f)
    for (float& d : diff) d *= to_255;
  FixedScaleHeatmaps out;
  out.max_diff_255 = diff.empty() ? 0.0 : double(*std::max_element(diff.begin(), diff.end()));
  int th = 0, tw = 0;
  const auto pooled = kernels::pool_plane(diff.data(), h, w, f, kernels::PoolMode::kMax, &th, &tw);
  out.fixed = datasets::Rgb8{tw, th, 3, reports::heatmap_rgb(pooled, float(reports::kDifferenceScale255))};
  out.amplified = datasets::Rgb8{
      tw, th, 3, reports::heatmap_rgb(pooled, float(reports::kDifferenceScale255 / reports::kAmplifiedGain))};
  return out;
}

std::string fixed_scale_legend(double max_diff_255) {
  return fmt::format("largest {:.3g} of 255 (fixed scale: bright >= {:g})", max_diff_255, reports::kDifferenceScale255);
}

std::string amplified_legend(double max_diff_255) {
  return fmt::format("largest {:.3g} of 255 (x{:g}: bright >= {:g})", max_diff_255, reports::kAmplifiedGain,
                     reports::kDifferenceScale255 / reports::kAmplifiedGain);
}

void image_outcome(const datasets::Rgb8& ref, const datasets::Rgb8& image, bool is_reference, const fs::path& out_dir,
                   const std::string& unit_id, const std::string& variant, VariantOutcome& out, int thumbnail_px) {
  const int channels = image.channels == 1 ? 1 : 3;
  const Tensor planes = image_planes(image, channels, variant);
  const int f = std::max(1, (std::max(image.width, image.height) + thumbnail_px - 1) / thumbnail_px);
  const auto png = datasets::encode_png(image);
  out.thumbnail_png = f == 1 ? png : datasets::encode_png(image_thumbnail(planes, 255.0, f));
  const fs::path dir = fs::path("images") / base::file_name_for(unit_id);
  if (!out_dir.empty()) {
    out.image_path = (dir / (base::file_name_for(variant) + ".png")).generic_string();
    write_png(out_dir, out.image_path, png);
  }
  if (is_reference) return;
  const Tensor ref_planes = image_planes(ref, channels, "reference");
  out.identical = ref.pixels == image.pixels;
  metrics::ImageMetricOptions mo;
  mo.peak = 255.0;
  // The image metrics that report a headline key, and only those keys (image_metric_infos()).
  for (const auto& metric : metrics::image_metrics()) {
    const auto defs = metric->defs();
    if (std::none_of(defs.begin(), defs.end(), [](const metrics::MetricDef& d) { return d.headline; })) continue;
    std::vector<metrics::MetricValue> values;
    metric->compute(ref_planes, planes, mo, values);
    for (auto& v : values) {
      const metrics::MetricDef* def = metrics::find_metric(v.key);
      if (def && def->key == v.key && def->headline) out.metrics.push_back(std::move(v));
    }
  }
  const FixedScaleHeatmaps heat = fixed_scale_heatmaps(ref_planes, planes, 255.0, f);
  out.heatmap_png = datasets::encode_png(heat.fixed);
  out.heatmap_x8_png = datasets::encode_png(heat.amplified);
  out.heatmap_legend = fixed_scale_legend(heat.max_diff_255);
  if (!out_dir.empty()) {
    out.heatmap_path = (dir / (base::file_name_for(variant) + "_diff.png")).generic_string();
    write_png(out_dir, out.heatmap_path, out.heatmap_png);
    out.heatmap_x8_path = (dir / (base::file_name_for(variant) + "_diff_x8.png")).generic_string();
    write_png(out_dir, out.heatmap_x8_path, out.heatmap_x8_png);
  }
}

}  // namespace qeval::eval
