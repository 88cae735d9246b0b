// compare-images: score a test image set against a reference set, pair by pair, and gate on it.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "datasets/image_io.h"
#include "datasets/image_set.h"
#include "eval/run/gate.h"
#include "metrics/image_metric.h"
#include "reports/compare_report_model.h"

namespace qeval::eval {

enum class AlphaMode { kIgnore, kCompare };

struct CompareImagesOptions {
  std::filesystem::path ref_dir, test_dir;
  metrics::SsimConvention ssim_convention = metrics::SsimConvention::kWang;
  AlphaMode alpha = AlphaMode::kIgnore;
  std::optional<double> peak;  // default: from the bit depth (255 or 65535)
  int worst = 4;               // pairs shown side by side in the HTML report
  int thumbnail_px = 384;      // longest side of the HTML thumbnails
};

// Compares one pair. Never throws for bad input: a missing side, an unreadable file or a size,
// channel or bit-depth mismatch becomes the row's error with its reason.
reports::PairRow compare_pair(const datasets::ImagePairEntry& entry, const CompareImagesOptions& options);

// All pairs, in parallel; rows come back in the entries' order. on_done is called once per pair
// (from worker threads; it must be thread-safe).
std::vector<reports::PairRow> compare_pairs(const std::vector<datasets::ImagePairEntry>& entries,
                                            const CompareImagesOptions& options,
                                            const std::function<void()>& on_done = {});

// The gate's view of the rows: PSNR of identical images is +inf; not-applicable values are empty.
std::vector<GateSample> gate_samples(const std::vector<reports::PairRow>& rows);
std::vector<reports::SummaryRow> summarize_rows(const std::vector<reports::PairRow>& rows);

// Planar [C, H, W] samples on [0, peak] -> 8-bit RGB (or gray) thumbnail, average-pooled by f.
datasets::Rgb8 image_thumbnail(const Tensor& planes, double peak, int f);

// |ref - test| (max over channels, max-pooled by f so that a small defect survives) as a heatmap;
// bright = scale, the p99.9 of the difference (at least one 8-bit level).
struct DifferenceHeatmap {
  datasets::Rgb8 image;
  double scale = 0;
};
DifferenceHeatmap difference_heatmap(const Tensor& ref, const Tensor& test, double peak, int f);

// The `options.worst` compared, non-identical pairs with the lowest SSIM (then PSNR), reloaded
// and rendered as thumbnails with a difference heatmap.
std::vector<reports::ImageStrip> worst_strips(const std::vector<reports::PairRow>& rows,
                                              const CompareImagesOptions& options);

// The whole job short of writing files: pair, compare, gate, summarise. Throws InputError when
// either folder is missing or both hold no image.
reports::CompareImagesReport run_compare_images(const CompareImagesOptions& options, const Gate& gate,
                                                bool show_progress);

}  // namespace qeval::eval
