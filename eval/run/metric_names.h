// The metric names `qeval run` reports: registry metrics (metrics/metric_registry.h), qualified by
// what they judge ("output_sqnr_db" pooled over outputs, "logits.sqnr_db" per output, docs/run-config.md
// "outputs"): what a gate may name, listed in docs/gate.md (a test keeps that list equal to this code's).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "eval/run/run_config.h"
#include "metrics/metric_registry.h"
#include "reports/run_report_model.h"

namespace qeval::eval {

// The qualifier of metrics pooled over every (judged) output: "output_sqnr_db", "output_nonfinite".
inline constexpr char kPooledOutputs[] = "output";

// A registered metric as a report lists it, its label and direction from the registry; with a
// qualifier the key and label say what it judges: metric_info(kSqnrDb, "logit") is
// {"logit_sqnr_db", "logit SQNR dB", true}, metric_info(kSqnrDb, "o", '.') {"o.sqnr_db", "o SQNR dB", true}.
reports::MetricInfo metric_info(std::string_view key, const std::string& qualifier = {}, char separator = '_');

// The metrics of one judged output `name` of `kind`, in report order: "<name>.sqnr_db", ...,
// "<name>.nonfinite".
std::vector<reports::MetricInfo> output_metric_infos(const std::string& name, OutputKind kind);

}  // namespace qeval::eval
