// The data a `qeval run` report holds: plain values, independent of how they were produced.
//
// The evaluator fills a RunReport; reports/run_report.h turns it into report.json (and back),
// report.html, junit.xml and the stdout summary. Nothing here knows of models or pipelines.
//
// Per-layer data is columnar (one float vector per statistic) so that hundreds of nodes x 20 steps
// x several variants stay compact in memory, in report.json and in report.html. In every float
// column NaN means "not measured"; +-inf are real values (SQNR of identical tensors is +inf).
// Statistics are over the finite elements of a tensor: non-finite elements are counted in the
// `nonfinite` column and located by RunReport::nonfinite, never averaged in.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "metrics/image_metric.h"
#include "reports/compare_report_model.h"
#include "reports/report_header.h"

namespace qeval::reports {

inline constexpr const char* kRunReportSchemaVersion = "1.1";

inline constexpr float kNotMeasured = std::numeric_limits<float>::quiet_NaN();

// A file the run depended on, identified by its content.
struct Artifact {
  std::string name;         // short name shown in reports, e.g. "tiny-sd", "int8-level3"
  std::string path;         // as given; empty for built-in defaults
  std::string fingerprint;  // "fnv1a64:<hex>" of the content (docs/report.md says of what, per artifact)
  bool operator==(const Artifact&) const = default;
};

struct RunConfig {
  std::string pipeline;  // "txt2img" | "segmentation" | "single-model"
  Artifact model;
  Artifact inputs;                      // the prompt set (txt2img) or image set
  std::optional<Artifact> calibration;  // calibration prompts/images, when a recipe needs scales
  std::string reference_variant;        // name of the variant every other one is compared to
  std::string scheduler;                // txt2img only
  int steps = 0;                        // denoising steps; 0 when the pipeline has none
  std::vector<std::uint64_t> seeds;
  int threads = 0;
  std::string device = "cpu";  // where the models executed: "cpu" or "cuda:N" (qeval --device)
  std::string shard;           // "" for a whole run, else "I/N" (1-based)
  std::vector<std::pair<std::string, std::string>> settings;  // the rest of the config, as given
};

enum class VariantKind {
  kPrecision,  // the reference graph run in another precision (fp16, bf16)
  kRecipe,     // the reference graph quantized by a recipe (formats, scales)
  kOnnx,       // a separate ONNX file (e.g. a Q/DQ export) matched node by node to the reference
};
std::string_view variant_kind_name(VariantKind k);  // "precision" | "recipe" | "onnx"
std::optional<VariantKind> parse_variant_kind(std::string_view s);

// A node of either graph that could not be matched across a reference and a separate ONNX variant.
// A node a recipe variant could have quantized and left in float, and why.
struct UnquantizedNode {
  std::string model, name, op;
  std::string reason;  // e.g. "recipe level 3 < 4 (attention QK^T)", "default exclusion (...)"
  bool operator==(const UnquantizedNode&) const = default;
};

struct UnmatchedNode {
  std::string side;  // "reference" | "variant": the graph the node belongs to
  std::string name, op;
  std::string reason;  // e.g. "no node with this name; structure differs (3 inputs vs 2)"
  bool operator==(const UnmatchedNode&) const = default;
};

struct VariantSummary {
  std::size_t samples = 0;          // samples this variant ran
  std::size_t errors = 0;           // samples where it failed (SampleResult::error)
  std::vector<SummaryRow> metrics;  // image/mask metrics vs the reference over samples
  // Named timings, unit in the name: "wall_s", "ms_per_sample", "ms_per_step", ...
  std::vector<std::pair<std::string, double>> timings;
};

// What a variant quantizes of one model, over the reference model's compute nodes (Conv,
// ConvTranspose, MatMul, Gemm) as `qeval compare-recipes` counts them. "Quantized" means the share
// of multiply-accumulates (MACs) run in a quantized format; parameters and nodes go beside it.
struct ModelQuantization {
  std::string model;
  std::size_t compute_nodes = 0, quantized_nodes = 0;
  std::int64_t params = 0, quantized_params = 0;  // float weights of the model / of quantized nodes
  std::optional<double> macs, quantized_macs;     // per call; none when the shapes were not recorded
  std::optional<double> mac_share() const {
    if (!macs || !quantized_macs || *macs <= 0) return std::nullopt;
    return *quantized_macs / *macs;
  }
  std::optional<double> param_share() const {
    if (params <= 0) return std::nullopt;
    return double(quantized_params) / double(params);
  }
  bool operator==(const ModelQuantization&) const = default;
};

struct Variant {
  std::string name;  // unique, e.g. "fp16", "int8-l3"
  VariantKind kind = VariantKind::kPrecision;
  std::string precision;           // of the nodes a recipe leaves alone: "fp32" | "fp16" | "bf16"
  std::optional<Artifact> recipe;  // kind == kRecipe
  std::optional<Artifact> onnx;    // kind == kOnnx
  bool reference = false;
  std::size_t total_nodes = 0;      // compute nodes of the graph(s) run
  std::size_t quantized_nodes = 0;  // of which run in a quantized format
  // kind == kOnnx: how the variant's nodes were matched to the reference's, and what was not.
  std::size_t matched_by_name = 0, matched_by_output = 0, matched_by_structure = 0;
  std::vector<UnmatchedNode> unmatched;
  VariantSummary summary;
  // kind == kRecipe: every quantizable node the recipe left in float, with the reason.
  std::vector<UnquantizedNode> unquantized;
  // Per model of the pipeline: what the variant quantizes (empty when not computed, e.g. a report
  // read from a version before it existed).
  std::vector<ModelQuantization> quantization;
  std::optional<double> quantized_share() const {
    if (total_nodes == 0) return std::nullopt;
    return double(quantized_nodes) / double(total_nodes);
  }
};

// How a metric is shown: label and direction (for colouring and ranking).
struct MetricInfo {
  std::string key;    // e.g. "psnr_db", "ssim", "ms_ssim", "mask_iou", "boundary_f", "logit_rel_l2"
  std::string label;  // e.g. "PSNR dB"
  bool higher_is_better = true;
  bool operator==(const MetricInfo&) const = default;
};

// An image written next to the report (path) and/or embedded in report.html (png).
struct ImageRef {
  std::string path;               // relative to the report folder; empty when not written
  std::vector<std::uint8_t> png;  // thumbnail for report.html; not stored in report.json
  bool empty() const { return path.empty() && png.empty(); }
};

// One variant's result on one sample.
struct SampleResult {
  std::string variant;
  std::string error;       // empty when the variant ran and was compared
  bool identical = false;  // output bit-identical to the reference's (PSNR unbounded)
  // Against the reference; empty for the reference itself. MetricValue conventions: no value with
  // a note when not applicable or unbounded.
  std::vector<metrics::MetricValue> metrics;
  ImageRef image;              // this variant's output (image, or mask overlay for segmentation)
  ImageRef heatmap;            // |reference - output|; none for the reference
  std::string heatmap_legend;  // what black and bright mean, e.g. "black 0, bright >= 12.5"
  ImageRef heatmap_amplified;  // the same at reports::kAmplifiedGain (report.html's toggle); may be none
  double elapsed_ms = 0;
  std::vector<std::string> failed_checks;  // per-sample gate bounds this result missed
  bool ok() const { return error.empty(); }
  const metrics::MetricValue* metric(std::string_view key) const {
    for (const auto& m : metrics)
      if (m.key == key) return &m;
    return nullptr;
  }
};

// One (prompt, seed) or one input image.
struct SampleRow {
  std::string id;      // unique and stable across shards, e.g. "p003-s42"
  std::string prompt;  // the prompt, or the input image's name for segmentation
  std::optional<std::uint64_t> seed;
  std::vector<SampleResult> results;  // one per variant, in RunReport::variants order
  const SampleResult* result(std::string_view variant) const {
    for (const auto& r : results)
      if (r.variant == variant) return &r;
    return nullptr;
  }
};

// A node whose output is observed.
struct LayerInfo {
  std::string name, op;
  std::string component;  // the model it belongs to, e.g. "unet", "vae_decoder"; may be empty
  bool operator==(const LayerInfo&) const = default;
};

// Statistics per cell, one column per statistic. A column is empty (not measured at all) or holds
// one value per cell; NaN marks single cells that were not measured.
struct LayerColumns {
  // Error of this variant's node output against the reference's (absent for the reference):
  // accumulated = both variants ran end to end; local = the node got the reference's inputs.
  std::vector<float> acc_sqnr_db, acc_cosine, acc_rel_l2, acc_max_abs;
  std::vector<float> local_sqnr_db, local_cosine, local_rel_l2, local_max_abs;
  // This variant's own activations (drift across timesteps, ranges vs calibration).
  std::vector<float> absmax, p99_9, mean, std, nonfinite;
  std::vector<float> clip_rate;  // share of elements beyond the calibrated range (recipe variants)
};

struct LayerColumnInfo {
  const char* key;  // JSON key
  std::vector<float> LayerColumns::*column;
  const char* label;
  bool higher_is_better;
};
// Every column, in report order.
inline constexpr LayerColumnInfo kLayerColumns[] = {
    {"acc_sqnr_db", &LayerColumns::acc_sqnr_db, "acc SQNR dB", true},
    {"acc_cosine", &LayerColumns::acc_cosine, "acc cosine", true},
    {"acc_rel_l2", &LayerColumns::acc_rel_l2, "acc rel L2", false},
    {"acc_max_abs", &LayerColumns::acc_max_abs, "acc max |err|", false},
    {"local_sqnr_db", &LayerColumns::local_sqnr_db, "local SQNR dB", true},
    {"local_cosine", &LayerColumns::local_cosine, "local cosine", true},
    {"local_rel_l2", &LayerColumns::local_rel_l2, "local rel L2", false},
    {"local_max_abs", &LayerColumns::local_max_abs, "local max |err|", false},
    {"absmax", &LayerColumns::absmax, "absmax", false},
    {"p99_9", &LayerColumns::p99_9, "p99.9 |x|", false},
    {"mean", &LayerColumns::mean, "mean", false},
    {"std", &LayerColumns::std, "std", false},
    {"nonfinite", &LayerColumns::nonfinite, "non-finite", false},
    {"clip_rate", &LayerColumns::clip_rate, "clip rate", false},
};

// The value of cell i, NaN when the column or the cell was not measured.
inline float cell(const std::vector<float>& column, std::size_t i) {
  return i < column.size() ? column[i] : kNotMeasured;
}

// One variant's per-layer table, pooled over samples (and steps): rows are RunReport::layers.
// Pooling: errors from summed signal/noise energies over all samples and steps (SQNR, rel L2),
// mean cosine, max of max-abs, absmax and p99.9; mean/std over all elements; nonfinite summed;
// clip rate over all elements.
struct LayerTable {
  std::string variant;
  std::size_t samples = 0;                // (prompt, seed) runs pooled: lets a shard merge weight its rows
  LayerColumns stats;                     // one value per layer
  std::vector<std::string> format;        // per layer: "int8", "fp8_e4m3", ... ; "" = not quantized
  std::vector<float> calib_amax;          // per layer: the calibrated range; NaN when none
  std::vector<float> out_of_range_steps;  // per layer: steps whose absmax exceeded calib_amax
};

// One variant's layer x timestep table: cell (row r, step s) at index r * steps + s, where rows are
// Timesteps::layers (indices into RunReport::layers) and steps are Timesteps::t.
struct StepTable {
  std::string variant;
  LayerColumns stats;
};

struct Timesteps {
  std::string component;              // the model run once per step, e.g. "unet"
  std::string mode;                   // "teacher-forced" (both variants get the reference latent) | "free-running"
  std::vector<double> t;              // the scheduler's timestep value at each step, in run order
  std::vector<std::uint32_t> layers;  // rows of every StepTable: indices into RunReport::layers
  std::vector<StepTable> tables;      // one per variant
  std::size_t steps() const { return t.size(); }
};

// A per-step error series of one quantity (e.g. the UNet's noise prediction or the latent).
struct StepCurve {
  std::string variant;
  std::string quantity;        // "noise_pred", "latent", ...
  std::string metric;          // "sqnr_db" | "rel_l2" | "cosine" | "max_abs"
  std::string mode;            // "teacher-forced" | "free-running"
  std::vector<double> values;  // one per step (NaN = not measured)
};

// Activation histogram of one layer's output: `counts.size()` equal bins over [lo, hi).
struct Histogram {
  std::string variant;
  std::uint32_t layer = 0;  // index into RunReport::layers
  int step = -1;            // index into Timesteps::t; -1 = all steps pooled
  double lo = 0, hi = 0;
  std::vector<std::uint64_t> counts;
  std::uint64_t below = 0, above = 0;  // finite values outside [lo, hi)
  bool operator==(const Histogram&) const = default;
};

// The first non-finite value a variant produced, in (sample, step, topological node) order.
struct NonFiniteEvent {
  std::string variant;
  std::string sample;  // SampleRow::id
  int step = -1;       // -1 when the node is not in the stepped component
  std::string node, op;
  std::uint64_t nan_count = 0, inf_count = 0;  // in that node output
  std::string model;                           // the pipeline's model ("vae_decoder", "unet", ...)
  bool operator==(const NonFiniteEvent&) const = default;
};

struct RunReport : ReportHeader {
  double elapsed_s = 0;  // the whole run: a resumed run's earlier parts included
  // Units read back from saved states (a resumed run; qeval merge: every unit) and the time the
  // runs that saved them took (part of elapsed_s).
  std::size_t reused_units = 0;
  double elapsed_before_s = 0;
  RunConfig config;
  std::vector<MetricInfo> metrics;  // the sample metrics, in display order
  std::vector<Variant> variants;    // the reference among them (Variant::reference)
  std::vector<SampleRow> samples;
  std::vector<LayerInfo> layers;
  std::vector<LayerTable> layer_tables;  // one per variant that was observed
  Timesteps timesteps;                   // empty when the pipeline has no steps
  std::vector<StepCurve> step_curves;
  std::vector<Histogram> histograms;  // the evaluator picks which layers (e.g. the worst)
  std::vector<NonFiniteEvent> nonfinite;
  GateSection gate;  // checks name their variant (GateCheckRow::variant)

  const Variant* variant(std::string_view name) const {
    for (const auto& v : variants)
      if (v.name == name) return &v;
    return nullptr;
  }
  const Variant* reference() const {
    for (const auto& v : variants)
      if (v.reference) return &v;
    return nullptr;
  }
  const LayerTable* layer_table(std::string_view variant) const {
    for (const auto& t : layer_tables)
      if (t.variant == variant) return &t;
    return nullptr;
  }
  const StepTable* step_table(std::string_view variant) const {
    for (const auto& t : timesteps.tables)
      if (t.variant == variant) return &t;
    return nullptr;
  }
};

// Recomputes every variant's summary.metrics and sample/error counts from the samples (what
// `qeval merge` does after concatenating shards). Identical outputs count as unbounded for
// metrics without a value; not-applicable values are counted, never averaged.
void summarize_samples(RunReport& report);

}  // namespace qeval::reports
