// Metric values as text, in the format the metric registry gives each metric.
#include "reports/metric_format.h"

#include <fmt/format.h>

#include "metrics/metric_registry.h"

namespace qeval::reports {

std::string format_metric(const metrics::MetricDef& def, double value) {
  if (def.decimals >= 0) return fmt::format("{:.{}f}", value, def.decimals);
  return fmt::format("{:.4g}", value);
}

std::string format_metric(std::string_view key, double value) {
  if (const metrics::MetricDef* def = metrics::find_metric(key)) return format_metric(*def, value);
  return fmt::format("{:.4g}", value);
}

}  // namespace qeval::reports
