// Output images of a unit: metrics, PNG files and thumbnails.
#include "eval/run/outputs.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "eval/compare_images.h"
#include "eval/pipelines/segmentation.h"
#include "reports/files.h"

namespace qeval::eval {

namespace fs = std::filesystem;

std::vector<reports::MetricInfo> image_metric_infos() {
  return {{"psnr_db", "PSNR dB", true}, {"ssim", "SSIM", true}, {"ms_ssim", "MS-SSIM", true}};
}

namespace {

std::string as_string(const std::vector<std::uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

void write_png(const fs::path& out_dir, const fs::path& rel, const std::vector<std::uint8_t>& png) {
  fs::create_directories((out_dir / rel).parent_path());
  reports::write_file_atomic(out_dir / rel, as_string(png));
}

}  // namespace

void image_outcome(const datasets::Rgb8& ref, const datasets::Rgb8& image, bool is_reference, const fs::path& out_dir,
                   const std::string& unit_id, const std::string& variant, VariantOutcome& out, int thumbnail_px) {
  const int channels = image.channels == 1 ? 1 : 3;
  const Tensor planes = segmentation_planes(image, channels, variant);
  const int f = std::max(1, (std::max(image.width, image.height) + thumbnail_px - 1) / thumbnail_px);
  const auto png = datasets::encode_png(image);
  out.thumbnail_png = f == 1 ? png : datasets::encode_png(image_thumbnail(planes, 255.0, f));
  const fs::path dir = fs::path("images") / file_name_for(unit_id);
  if (!out_dir.empty()) {
    out.image_path = (dir / (file_name_for(variant) + ".png")).generic_string();
    write_png(out_dir, out.image_path, png);
  }
  if (is_reference) return;
  const Tensor ref_planes = segmentation_planes(ref, channels, "reference");
  out.identical = ref.pixels == image.pixels;
  metrics::ImageMetricOptions mo;
  mo.peak = 255.0;
  for (const char* name : {"psnr", "ssim", "ms_ssim"}) {
    std::vector<metrics::MetricValue> values;
    metrics::find_image_metric(name)->compute(ref_planes, planes, mo, values);
    for (auto& v : values)
      if (v.key == "psnr_db" || v.key == "ssim" || v.key == "ms_ssim") out.metrics.push_back(std::move(v));
  }
  const DifferenceHeatmap heat = difference_heatmap(ref_planes, planes, 255.0, f);
  out.heatmap_png = datasets::encode_png(heat.image);
  out.heatmap_legend = fmt::format("|diff| max over RGB: black 0, bright >= {:.3g} of 255 (p99.9)", heat.scale);
  if (!out_dir.empty()) {
    out.heatmap_path = (dir / (file_name_for(variant) + "_diff.png")).generic_string();
    write_png(out_dir, out.heatmap_path, out.heatmap_png);
  }
}

}  // namespace qeval::eval
