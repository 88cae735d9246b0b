// Gates: thresholds on summary statistics of per-sample metrics, with every verdict explained.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "metrics/metric_registry.h"
#include "metrics/stats.h"
#include "reports/compare_report_model.h"

namespace qeval::eval {

struct Bound {
  std::optional<double> min, max;  // inclusive: value >= min, value <= max
};

struct GateCheck {
  std::string metric;  // a registered key (metrics/metric_registry.h), qualified in `qeval run`
  std::string stat;    // "mean", "min", "p5", ...
  metrics::StatSpec spec;
  Bound bound;
  std::string variant;  // qeval run: only this variant ("" = every variant compared)
};

// qeval run: a threshold on a per-layer statistic (a report.json layer column, pooled over samples
// and steps), summarised over the layers, e.g. {"column": "acc_sqnr_db", "stat": "min", "min": 10},
// optionally over the layers whose name matches "nodes".
struct LayerGateCheck {
  std::string column;  // "acc_sqnr_db", "local_sqnr_db", "acc_cosine", ...
  std::string stat;
  metrics::StatSpec spec;
  Bound bound;
  std::string variant;
  // Only the layers whose node name this regular expression (ECMAScript) finds a match in; "" = all.
  std::string nodes;
};

// qeval run on a diffusion pipeline: a threshold on a per-step error curve (e.g. the UNet's noise
// prediction teacher-forced), summarised over the steps: {"quantity": "noise_pred", "mode":
// "teacher-forced", "metric": "sqnr_db", "stat": "mean", "min": 20}.
struct StepGateCheck {
  std::string quantity = "noise_pred", mode = "teacher-forced", metric = metrics::keys::kSqnrDb;
  std::string stat;
  metrics::StatSpec spec;
  Bound bound;
  std::string variant;
};

struct Gate {
  std::string source = "default (no --gate given): fails only on pairs that could not be compared";
  std::vector<GateCheck> checks;
  std::map<std::string, Bound> per_pair;  // a pair outside any of these bounds is a failed pair
  double max_failed_pair_share = 0.0;     // share of compared pairs allowed to fail per_pair
  std::size_t max_errors = 0;             // pairs allowed to be missing, unreadable or mismatched
  // qeval run only:
  std::vector<LayerGateCheck> layer_checks;
  std::vector<StepGateCheck> step_checks;
  std::optional<std::uint64_t> max_nonfinite;  // NaN/Inf node outputs allowed per variant
  // Where the reference is finite and a variant is not (GateSample::nonfinite, a layer's NaN/Inf
  // beyond the reference's), every check over it fails unless this is set: a score computed over
  // the values that happened to stay finite must never pass a release.
  bool allow_nonfinite = false;
};

// Layer columns a layer check may name (reports::kLayerColumns' keys).
const std::vector<std::string>& gate_layer_columns();

// Metric keys a compare-images gate may name: the registry's image-pair metrics.
const std::vector<std::string>& gate_metric_keys();

// Metrics a step check may name: the registry's tensor-pair metrics.
const std::vector<std::string>& gate_step_metrics();

// Which metric names a gate file may use where it is parsed.
enum class GateMetrics {
  kKnown,  // gate_metric_keys() (compare-images)
  kRun,    // any name: `qeval run` checks them against the run's own metrics (apply_run_gate), which
           // include per-output keys such as "logits.sqnr_db" that no fixed list can hold
};

// Parses a gate file (documented in docs/gate.md). Unknown keys, unknown metrics or statistics and
// missing bounds are errors (a typo must not turn a check off). Throws InputError naming the file
// and the offending field.
Gate load_gate(const std::filesystem::path& path, GateMetrics metrics = GateMetrics::kKnown);
Gate parse_gate(const std::string& json_text, const std::string& source, GateMetrics metrics = GateMetrics::kKnown);

// Throws InputError (naming the gate file and the check) when a check or per-pair bound names a
// metric not in `known`, listing them.
void check_gate_metrics(const Gate& gate, const std::vector<std::string>& known);

// One sample (image pair) as the gate sees it, values as metrics::counted_value reads them: +inf
// for an unbounded value (PSNR of identical images), nullopt for not applicable.
struct GateSample {
  std::string name;
  bool error = false;
  std::string error_text;
  std::map<std::string, std::optional<double>> values;
  // Output values that are NaN/Inf where the reference's are finite (0 for image pairs, which
  // cannot hold them).
  std::uint64_t nonfinite = 0;
};

struct GateOutcome {
  reports::GateSection section;
  // failed_checks[i]: the per-pair bounds sample i missed (empty when it passed or had an error).
  std::vector<std::vector<std::string>> failed_checks;
};

GateOutcome evaluate_gate(const Gate& gate, const std::vector<GateSample>& samples);

}  // namespace qeval::eval
