// Metric values as text, in the format the metric registry gives each metric.
#include "reports/metric_format.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>

#include "metrics/metric_registry.h"

namespace qeval::reports {

namespace {

// A value that is not 1 never prints as 1 ("1", "1.00000"): cosine, SSIM, IoU of a near-perfect
// variant sit at 0.99997, which 4 significant digits (or 5 decimals of 0.999997) round to 1 and a
// reader takes for "identical". Such values get the significant digits that tell them from 1 (at
// least 6): 0.99997, 0.999999 (for 0.9999993).
std::string not_rounded_to_one(std::string text, double value) {
  if (value == 1.0 || !std::isfinite(value) || std::strtod(text.c_str(), nullptr) != 1.0) return text;
  for (int digits = 6; digits <= 17; ++digits) {
    text = fmt::format("{:.{}g}", value, digits);
    if (std::strtod(text.c_str(), nullptr) != 1.0) break;
  }
  return text;
}

}  // namespace

std::string format_metric(const metrics::MetricDef& def, double value) {
  if (def.decimals >= 0) return not_rounded_to_one(fmt::format("{:.{}f}", value, def.decimals), value);
  return not_rounded_to_one(fmt::format("{:.4g}", value), value);
}

std::string format_metric(std::string_view key, double value) {
  if (const metrics::MetricDef* def = metrics::find_metric(key)) return format_metric(*def, value);
  return not_rounded_to_one(fmt::format("{:.4g}", value), value);
}

}  // namespace qeval::reports
