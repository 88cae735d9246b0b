// The data a compare-images report holds: plain values, independent of how they were computed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "metrics/image_metric.h"
#include "reports/report_header.h"

namespace qeval::reports {

inline constexpr const char* kCompareImagesSchemaVersion = "1.0";

struct PairRow {
  std::string name;                 // relative path shared by both sets
  std::string ref_path, test_path;  // empty when that side is missing
  std::string error;                // empty when the pair was compared
  std::string error_kind;           // missing_ref | missing_test | unreadable | size_mismatch |
                                    // channel_mismatch | bit_depth_mismatch
  int width = 0, height = 0, channels = 0, bit_depth = 0;
  std::string color_type;  // of the reference, e.g. "rgb"
  bool identical = false;
  double max_abs_diff = 0;
  std::vector<metrics::MetricValue> metrics;
  std::vector<std::string> notes;          // e.g. "alpha channel ignored"
  std::vector<std::string> failed_checks;  // per-pair gate thresholds this pair missed
  bool ok() const { return error.empty(); }
  const metrics::MetricValue* metric(const std::string& key) const {
    for (const auto& m : metrics)
      if (m.key == key) return &m;
    return nullptr;
  }
};

struct SummaryRow {
  std::string metric;
  std::size_t count = 0;      // pairs with a finite value
  std::size_t unbounded = 0;  // pairs where the value is +inf (identical images for PSNR)
  std::size_t not_applicable = 0;
  double mean = 0, min = 0, p5 = 0, median = 0, p95 = 0, max = 0;
};

// One metric over samples: +inf counts as unbounded, nullopt as not applicable; both are excluded
// from the finite statistics.
SummaryRow summarize_metric(const std::string& metric, const std::vector<std::optional<double>>& values);

struct GateCheckRow {
  std::string name;  // "ssim mean >= 0.95"
  std::string metric, stat, op;
  double threshold = 0;
  std::optional<double> value;  // empty when it could not be computed; may be +inf (unbounded)
  bool passed = false;
  std::string detail;   // the statistics behind the verdict
  std::string variant;  // qeval run: the variant checked ("" = the run as a whole)
  // false: the run was told not to measure what the check reads (layer and NaN/Inf checks under
  // --no-layers, local-error columns without local error, teacher-forced curves without teacher
  // forcing). Such a check neither passes nor fails: `passed` stays true so it fails nothing, and
  // every summary counts it apart. Last, so that positional initializers of the fields above hold.
  bool measured = true;
};

struct GateSection {
  bool passed = true;
  std::string source;  // gate file, or "default (no --gate: errors only)"
  std::vector<GateCheckRow> checks;
  std::size_t failed() const {
    std::size_t n = 0;
    for (const auto& c : checks) n += !c.passed;
    return n;
  }
  std::size_t not_measured() const {
    std::size_t n = 0;
    for (const auto& c : checks) n += !c.measured;
    return n;
  }
  // Checks that were measured and passed.
  std::size_t passed_count() const { return checks.size() - failed() - not_measured(); }
};

// The pairs shown side by side in the HTML report.
struct ImageStrip {
  std::string name, caption;
  std::vector<std::uint8_t> ref_png, test_png, heatmap_png;
  std::string heatmap_legend;
  // The same differences at reports::kAmplifiedGain (the HTML's amplified view).
  std::vector<std::uint8_t> heatmap_x8_png;
  std::string heatmap_x8_legend;
};

struct CompareImagesReport : ReportHeader {
  std::vector<std::pair<std::string, std::string>> config;       // shown as given
  std::vector<std::pair<std::string, std::string>> conventions;  // metric -> definition
  std::vector<PairRow> pairs;
  std::vector<SummaryRow> summary;
  GateSection gate;
  std::vector<ImageStrip> worst;
  double elapsed_s = 0;
  std::size_t count_errors() const {
    std::size_t n = 0;
    for (const auto& p : pairs) n += !p.ok();
    return n;
  }
};

}  // namespace qeval::reports
