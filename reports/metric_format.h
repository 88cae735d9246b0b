// How reports show a metric's value: the registry's display format (metrics/metric_def.h).
#pragma once

#include <string>
#include <string_view>

#include "metrics/metric_def.h"

namespace qeval::reports {

// A finite value with the metric's decimals ("31.20", "0.98765"), or 4 significant digits ("0.0123")
// for a metric without fixed decimals. A value that is not exactly 1 but would print as 1 ("1",
// "1.00000") gets the significant digits (6 or more) that tell it from 1: 0.99997, 0.999999 (for 0.9999993).
std::string format_metric(const metrics::MetricDef& def, double value);
// The same for a key the registry resolves (qualified keys too: "logits.sqnr_db", "acc_cosine");
// 4 significant digits for any other key.
std::string format_metric(std::string_view key, double value);

}  // namespace qeval::reports
