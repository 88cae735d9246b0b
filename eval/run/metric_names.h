// The metric names a single model judged per output reports (docs/run-config.md "outputs"): what a
// gate may name, listed in docs/gate.md (a test keeps that list equal to this code's).
#pragma once

#include <string>
#include <vector>

#include "eval/run/run_config.h"
#include "reports/run_report_model.h"

namespace qeval::eval {

// The metrics of one judged output `name` of `kind`, in report order: "<name>.sqnr_db", ...,
// "<name>.nonfinite".
std::vector<reports::MetricInfo> output_metric_infos(const std::string& name, OutputKind kind);

}  // namespace qeval::eval
