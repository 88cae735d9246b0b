// The `qeval compare-recipes` report: one row per recipe (gate verdict, quality, worst layers, how
// much of the model it quantizes, estimated size and speed class) -> report.json
// (docs/recipe-comparison.schema.json) and a self-contained report.html with charts of quality
// against the quantized share. Plain data: nothing here knows how the numbers were produced.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "reports/report_header.h"
#include "reports/run_report_model.h"

namespace qeval::reports {

inline constexpr const char* kRecipeComparisonSchemaVersion = "1.0";

struct WorstLayer {
  std::string name, op, component;
  double value = 0;  // of RecipeComparison::layer_column (finite, or -inf)
};

struct RecipeRow {
  std::string variant;  // the variant's name in the run (the recipe's name, made unique)
  Artifact recipe;
  std::string format;                         // "int8", "fp8_e4m3", ...
  std::string level;                          // "3", "2.5", ...
  std::string precision;                      // of what the recipe leaves in float: "fp16", ...
  std::vector<std::string> quantized_models;  // the models the recipe rewrote, e.g. "unet"

  bool gate_passed = false;
  std::vector<std::string> failed_checks;  // "name: value" per failed check
  std::size_t samples = 0, errors = 0;
  std::vector<SummaryRow> metrics;  // of the run's sample metrics against the reference
  std::vector<WorstLayer> worst_layers;

  // Over the models any compared recipe rewrote (the same for every row):
  std::size_t compute_nodes = 0, quantized_nodes = 0;   // Conv/MatMul/Gemm
  std::int64_t params_total = 0, params_quantized = 0;  // float parameters; weights of quantized nodes
  std::optional<double> macs_total, macs_quantized;     // per call of each model
  std::int64_t weight_bytes = 0;                        // every model of the pipeline, as the variant stores it
  std::int64_t reference_weight_bytes = 0;              // the same models unquantized, at the variant's precision
  std::string speed_class;                              // "faster" | "about-fp16" | "slower-risk" | "unsupported"
  std::vector<std::string> speed_reasons;
  int lint_errors = 0, lint_warnings = 0;
  std::vector<std::string> lint_rules;  // rule ids of the warnings and errors, with counts
  std::optional<double> calibration_s;
  bool calibration_cache_hit = false;

  std::optional<double> param_share() const {
    if (params_total <= 0) return std::nullopt;
    return double(params_quantized) / double(params_total);
  }
  std::optional<double> mac_share() const {
    if (!macs_total || !macs_quantized || *macs_total <= 0) return std::nullopt;
    return *macs_quantized / *macs_total;
  }
  const SummaryRow* metric(std::string_view key) const {
    for (const auto& m : metrics)
      if (m.metric == key) return &m;
    return nullptr;
  }
};

struct RecipeComparison : ReportHeader {
  double elapsed_s = 0;
  RunConfig config;                 // the run the recipes went through
  std::string reference_precision;  // "fp32", ...
  std::string target;               // "sm89": the TensorRT target the speed classes assume
  std::vector<MetricInfo> metrics;  // the sample metrics, in display order
  std::string quality_metric;       // the key the charts plot (psnr_db, mask_iou, output_sqnr_db)
  std::string layer_column;         // the layer column worst_layers rank by (local_sqnr_db, ...)
  GateSection gate;                 // every check, per variant
  std::vector<RecipeRow> rows;      // in --recipes order
  std::string run_report;           // the full run report, relative to the output folder

  bool any_passed() const {
    for (const auto& r : rows)
      if (r.gate_passed) return true;
    return false;
  }
};

nlohmann::json to_json(const RecipeComparison& report);
std::string render_html(const RecipeComparison& report);
// One screen for stdout: a line per recipe (a block per recipe when the columns would pass `width`).
std::string render_summary_text(const RecipeComparison& report, const std::filesystem::path& out_dir = {},
                                std::size_t width = 100);
// report.html then report.json (its presence means the report is complete), each atomically.
void write_recipe_comparison(const RecipeComparison& report, const std::filesystem::path& out_dir);

}  // namespace qeval::reports
