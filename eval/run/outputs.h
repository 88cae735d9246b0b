// What a unit keeps of each variant's output image: the image metrics against the reference's,
// the PNGs under <out>/images/<unit>/ and thumbnails for report.html.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "base/file_names.h"
#include "datasets/image_io.h"
#include "eval/run/evaluator.h"

namespace qeval::eval {

// The metrics `qeval run` reports for images, in registry order: the headline image-pair metrics
// (metrics::MetricDef::headline).
std::vector<reports::MetricInfo> image_metric_infos();

// |ref - test| in 8-bit levels (planes on [0, peak]; max over channels, max-pooled by f so that a
// small defect survives the thumbnail) on the reports' fixed scale (reports::kDifferenceScale255)
// and amplified by reports::kAmplifiedGain; also the largest difference in 8-bit levels. Shared by
// `qeval run` and compare-images so that both reports draw one scale.
struct FixedScaleHeatmaps {
  datasets::Rgb8 fixed, amplified;
  double max_diff_255 = 0;
};
FixedScaleHeatmaps fixed_scale_heatmaps(const Tensor& ref, const Tensor& test, double peak, int f);
// The captions of those heatmaps: "largest 86 of 255 (fixed scale: bright >= 32)", "... x8: bright >= 4".
std::string fixed_scale_legend(double max_diff_255);
std::string amplified_legend(double max_diff_255);

// Fills `out` for `image` (8-bit) against `ref`: metrics and identical (none for the reference
// itself), the PNG and, for other variants, a difference heatmap, written under
// out_dir/images/<unit_id>/ when out_dir is set; thumbnails at most `thumbnail_px` wide.
void image_outcome(const datasets::Rgb8& ref, const datasets::Rgb8& image, bool is_reference,
                   const std::filesystem::path& out_dir, const std::string& unit_id, const std::string& variant,
                   VariantOutcome& out, int thumbnail_px = 128);

}  // namespace qeval::eval
