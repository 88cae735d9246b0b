// A metric's identity: its key, label, unit, direction, what it applies to and how it is shown.
#pragma once

#include <string_view>

namespace qeval::metrics {

// What a metric compares.
enum class MetricScope {
  kImagePair,   // two images [C, H, W] on [0, peak] (compare-images, `qeval run` images)
  kTensorPair,  // two float tensors (model outputs, per-step curves)
  kMask,        // two binary masks (or mask logits and a threshold)
  kCount,       // a count of values (NaN/Inf where the reference is finite)
};

// One metric key as every report, table and gate sees it. Keys are stable names users write in
// gates ("psnr_db"); a qualified key adds a prefix ("output_sqnr_db", "<output>.sqnr_db") and keeps
// the identity of its metric (find_metric).
struct MetricDef {
  std::string_view key = {};    // e.g. "psnr_db"
  std::string_view label = {};  // column heading, e.g. "PSNR dB"
  std::string_view unit = {};   // e.g. "dB"; "" for a score or ratio without one
  bool higher_is_better = true;
  MetricScope scope = MetricScope::kImagePair;
  int decimals = -1;  // tables: fixed digits after the point; -1: 4 significant digits
  // Identical inputs leave it without a value (PSNR, SQNR: 10 log10(x / 0)): gates and summaries
  // read a missing value of an identical sample as +inf. Any other missing value is "not
  // applicable" (docs/gate.md "Rules").
  bool unbounded_when_identical = false;
  // Image pairs: `qeval run` reports it for every output image, and compare-images puts it at the
  // top level of each pair in report.json.
  bool headline = false;
  // Image pairs: compare-images' summary table and a column of its pairs table.
  bool summarized = false;
  std::string_view definition = {};  // how it is computed, for reports' "conventions"; "" = not listed
};

}  // namespace qeval::metrics
