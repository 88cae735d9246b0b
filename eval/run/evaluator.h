// `qeval run`'s engine. A variant is a set of sessions built from (graph per model, SessionOptions):
// a precision variant is the reference's graphs under other options, a recipe variant is another
// graph (the reference with Q/DQ inserted), an export variant is another file. The unit of parallel
// work is one (prompt, seed) or one image, inside which every variant runs in lockstep with the
// reference (step by step for diffusion) so that per-layer error compares the same call. Units
// run in parallel (TBB, one set of sessions per worker) and are merged as they finish: every pooled
// statistic is an exact sum, a maximum or a histogram count, so the result is identical for any
// thread count and order.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "eval/exec/graph.h"
#include "eval/quant/calibrate.h"
#include "eval/quant/recipe.h"
#include "eval/quant/select.h"
#include "eval/run/metric_names.h"
#include "eval/run/observe.h"
#include "eval/run/pipeline_kind.h"
#include "eval/run/run_config.h"
#include "metrics/activation_stats.h"
#include "metrics/image_metric.h"
#include "reports/run_report_model.h"

namespace qeval::eval {

// A variant ready to run: a graph per model and the options its sessions get.
struct BuiltVariant {
  VariantSpec spec;
  reports::VariantKind kind = reports::VariantKind::kPrecision;
  SessionOptions options;
  // Models whose sessions run in another precision than options.precision (RunDriver::model_precision).
  std::map<std::string, Precision> model_precision;
  std::map<std::string, std::shared_ptr<const Graph>> graphs;  // every model of the pipeline
  // Models whose graph is an export listing its nodes in another order than the reference's: the
  // reference's order (reference_order, eval/run/node_match.h), so that the variant's lockstep
  // calls keep the reference's values waiting only for nodes about to run. Made once, at build.
  std::map<std::string, std::shared_ptr<const std::vector<std::string>>> node_order;
  SessionOptions options_for(const std::string& model) const {
    SessionOptions o = options;
    if (auto it = model_precision.find(model); it != model_precision.end()) o.precision = it->second;
    if (auto it = node_order.find(model); it != node_order.end()) o.node_order = it->second;
    return o;
  }
  std::optional<reports::Artifact> recipe, onnx;
  std::optional<reports::Artifact> calibration;  // recipe variants: the calibration set
  bool calibration_cache_hit = false;
  double calibration_s = 0;
  std::vector<reports::UnquantizedNode> unquantized;  // recipe variants: what the recipe left in float
};

// The per-sample metric every driver reports beside its own: output values that are NaN/Inf where
// the reference's are finite (the gate fails a sample that has any, unless it allows them).
// (Spelled from constants, not looked up: it is initialised before main, when the registry may not be.)
inline const std::string kOutputNonfiniteMetric = std::string(kPooledOutputs) + "_" + metrics::keys::kNonfinite;
inline reports::MetricInfo output_nonfinite_info() { return metric_info(metrics::keys::kNonfinite, kPooledOutputs); }

// One variant's result on one unit.
struct VariantOutcome {
  std::string error;                          // empty when it ran
  std::vector<metrics::MetricValue> metrics;  // against the reference; empty for the reference
  bool identical = false;
  double elapsed_ms = 0;
  std::string image_path, heatmap_path;                  // relative to the output folder; "" when not written
  std::vector<std::uint8_t> thumbnail_png, heatmap_png;  // for report.html
  std::string heatmap_legend;
  // The same differences amplified (reports::kAmplifiedGain); empty from a run state saved before it.
  std::string heatmap_x8_path;
  std::vector<std::uint8_t> heatmap_x8_png;
};

// Error of one quantity per step (e.g. the UNet's noise prediction, teacher-forced).
struct StepSeries {
  std::string quantity, mode;
  std::vector<metrics::ErrorStats> steps;
};

// One report row: a (prompt, seed), or one point prompt of an image.
struct SampleOutcome {
  std::string id, prompt;
  std::optional<std::uint64_t> seed;
  std::vector<VariantOutcome> variants;  // BuiltVariant order
};

struct UnitOutcome {
  std::vector<SampleOutcome> samples;           // txt2img: one; segmentation: the image's prompts
  std::vector<std::vector<StepSeries>> series;  // per variant (empty for the reference)
  UnitObservation layers;                       // empty cells when layers are not observed
};

struct UnitInfo {
  std::string id;  // txt2img: the sample's id; segmentation: the image
  // What the unit computes where `id` alone does not say it (segmentation: the indices of its
  // image's prompts, which a larger count may add to); "" otherwise. A saved unit is reused only
  // when id and contents are those of the unit at its index now.
  std::string contents;
};

// What a unit's driver gets from the evaluator.
struct UnitContext {
  const std::vector<BuiltVariant>* variants = nullptr;
  std::size_t reference = 0;
  const RunObservation* observation = nullptr;  // null when layers are not observed
  LocalSessions* local = nullptr;
  Capture* capture = nullptr;
  ObservedNodes* nodes = nullptr;  // the worker's: kept across its units
  bool teacher_forced = false;
  // Observed model calls of the variants run together, node by node (run_lockstep), where the
  // driver can; false: one after the other, the reference's values copied (the same results).
  bool interleave = true;
  // The variants catch up after every this many reference nodes: 1 (the fastest); larger makes the
  // capture hold and take over values the reference releases first (tests exercise that path).
  std::size_t lockstep_window = 1;
  std::filesystem::path out_dir;  // images go under out_dir/images; empty: not written
  std::function<void()> tick;     // progress: called ticks_per_unit() times per unit
};

// Per worker: whatever a driver keeps between units (sessions per variant).
struct DriverThread {
  virtual ~DriverThread() = default;
};

// What a driver says about its run, for reports and the layer space (report metadata): filled
// once, when it loads.
struct RunDescription {
  std::string name;                          // the pipeline's, e.g. "tiny-sd"
  reports::Artifact inputs;                  // the prompt or input set
  std::vector<reports::MetricInfo> metrics;  // per sample, in report order
  std::string stepped_model;                 // "" when no model runs per step
  std::vector<double> timesteps;             // of the stepped model's calls
  std::string scheduler;                     // "" when none
  int steps = 0;
  std::vector<std::pair<std::string, std::string>> settings;  // the report's config.settings, first
};

// Loading: the graphs of the pipeline's models (PipelineKind::models) and of a variant's exports.
class PipelineGraphs {
 public:
  virtual ~PipelineGraphs() = default;
  virtual std::shared_ptr<const Graph> reference_graph(const std::string& model) const = 0;
  // The graphs of a variant with its own exports (pipeline.json variants or separate ONNX files);
  // models it does not replace keep the reference's graph object.
  virtual std::map<std::string, std::shared_ptr<const Graph>> variant_graphs(const VariantSpec& spec) const = 0;
};

// Recipe calibration: the data a recipe variant is calibrated on. Selecting, calibrating (cached)
// and applying are the same for every kind: apply_pipeline_recipe (eval/run/recipe_variant.h).
struct CalibrationData {
  reports::Artifact artifact;       // the report's name for it and its path (the fingerprint is the set's)
  std::vector<std::string> models;  // the models a recipe may quantize, in call order; empty: none
  // The calibration set of one of them, made once the recipe selects nodes in it.
  std::function<std::unique_ptr<quant::CalibrationSet>(const std::string& model)> set;
};
class CalibrationSource {
 public:
  virtual ~CalibrationSource() = default;
  // For `variant` (a recipe variant) of `run`: InputError when the run names no calibration data
  // and the pipeline has none. The default: no models (recipe variants are unsupported).
  virtual CalibrationData calibration_data(const VariantSpec& variant, const RunSpec& run, bool progress) const;
};

// Unit execution: the units and how one runs with every variant.
class UnitRunner {
 public:
  virtual ~UnitRunner() = default;
  virtual std::size_t units() const = 0;
  virtual UnitInfo unit(std::size_t index) const = 0;
  virtual int ticks_per_unit() const { return 1; }
  virtual std::unique_ptr<DriverThread> make_thread(const std::vector<BuiltVariant>& variants) const = 0;
  virtual void run_unit(std::size_t index, DriverThread& thread, const UnitContext& context,
                        UnitOutcome& out) const = 0;
};

// One loaded pipeline as the evaluator sees it: its kind, its description and the three concerns
// a driver implements (eval/run/<kind>_driver.cc, registered in eval/run/pipeline_kind.cc).
class RunDriver : public PipelineGraphs, public CalibrationSource, public UnitRunner {
 public:
  const PipelineKind& kind() const { return kind_; }
  const RunDescription& description() const { return description_; }
  // This pipeline's models, in call order: the kind's, or fewer (an SD pipeline has no text_encoder_2).
  const std::vector<std::string>& models() const { return pipeline_models_.empty() ? kind_.models : pipeline_models_; }
  // The precision `model` runs in for `variant`: its "model_precision", else the variant's
  // precision; a driver may change the default (txt2img: an SDXL VAE with force_upcast in FP32).
  virtual Precision model_precision(const VariantSpec& variant, const std::string& model) const;

 protected:
  explicit RunDriver(const PipelineKind& kind) : kind_(kind) {}
  RunDescription description_;                // the driver's constructor fills it
  std::vector<std::string> pipeline_models_;  // the constructor may set it; empty: the kind's

 private:
  const PipelineKind& kind_;
};

// The driver for a run's pipeline, loaded by its kind (loads the models and the prompt or input
// set). InputError for what the spec names but cannot be read.
std::unique_ptr<RunDriver> make_run_driver(const RunSpec& spec);

// Units run at once on a device backend when EvaluatorOptions::workers is 0 and the reference's
// models hold at least kDeviceLargeModelBytes of weights (run_units says why); one when observed.
inline constexpr int kDeviceWorkers = 2;
inline constexpr std::size_t kDeviceLargeModelBytes = std::size_t(1) << 30;

struct EvaluatorOptions {
  std::filesystem::path out_dir;       // images go here; empty: nothing written
  bool progress = false;               // progress on stderr (base/progress.h: bar or lines, per --progress)
  std::string progress_label = "run";  // "run: 3/8 units, 2 variants, ..."
  int workers = 0;                     // parallel units (0: TBB's concurrency; see kDeviceWorkers)
  std::vector<std::size_t> units;      // the units to run (a shard); empty: all
  // Called (under the merge lock) after every unit is merged, and once at the end: where the run
  // state is saved so that a rerun skips finished units. RunResult::elapsed_s is current then.
  std::function<void(const struct RunResult&)> checkpoint;
  // Polled before each unit: true makes every worker stop once its current unit is merged
  // (SIGINT/SIGTERM); run_units then returns with the rest not done.
  std::function<bool()> stop;
  bool interleave = true;           // UnitContext::interleave
  std::size_t lockstep_window = 1;  // UnitContext::lockstep_window
};

// observe.full_tensors' index under <out>/tensors/ (RunResult::write_tensor_index).
inline constexpr const char* kTensorIndexFile = "index.json";

// The merged result of a run, before it becomes a report.
struct RunResult {
  std::vector<BuiltVariant> variants;
  std::size_t reference = 0;
  std::vector<UnitOutcome> units;  // unit order; layer cells moved out into `layers`
  std::vector<char> done;          // per unit: finished (run now or read back from a saved state)
  std::size_t reused = 0;          // units read back from a saved state
  double elapsed_before_s = 0;     // the time of the runs that saved those states
  RunObservation observation;      // layers (may be empty)
  std::vector<LayerCells> layers;  // per variant, pooled over units
  std::vector<std::optional<NonFiniteHit>> first_nonfinite;  // per variant, of the lowest unit
  std::vector<std::vector<StepSeries>> series;               // per variant, pooled over units
  double elapsed_s = 0;  // this process's part (run_units); the whole run's is elapsed_before_s + this
  // observe.full_tensors: rewrites <out>/tensors/index.json (which node and tensor went to which
  // file, shape, dtype) when tensors were written since the last call; run_units calls it after each
  // unit. Empty when no tensors are kept.
  std::function<void()> write_tensor_index;
};

// Builds the variants of `spec` for `driver` (recipe variants are calibrated here, or read from the
// calibration cache).
std::vector<BuiltVariant> build_variants(const RunSpec& spec, const RunDriver& driver, bool progress = false);

// An empty result for these variants: the observation (layers, matching) and nothing done.
RunResult start_run(const RunSpec& spec, const RunDriver& driver, std::vector<BuiltVariant> variants,
                    const EvaluatorOptions& options);
// Runs the units of options.units (all when empty) that are not done yet, in parallel, merging
// each into `result` as it finishes. Every pooled statistic is exact (integer counts, maxima,
// exact sums), so the result is the same whatever the order, the thread count or the grouping.
void run_units(const RunSpec& spec, const RunDriver& driver, RunResult& result, const EvaluatorOptions& options);
// Adds one finished unit to a result (InputError when it is already there). Its layer cells go to
// `recycle` (to be cleared, their storage kept for the worker's next unit) when given.
void merge_unit(RunResult& result, std::size_t index, UnitOutcome&& unit, UnitObservation* recycle = nullptr);
// start_run + run_units.
RunResult evaluate(const RunSpec& spec, const RunDriver& driver, std::vector<BuiltVariant> variants,
                   const EvaluatorOptions& options);

}  // namespace qeval::eval
