// Metric names of `qeval run` reports, from the metric registry.
#include "eval/run/metric_names.h"

namespace qeval::eval {

reports::MetricInfo metric_info(std::string_view key, const std::string& qualifier, char separator) {
  const metrics::MetricDef& def = metrics::metric_def(key);
  if (qualifier.empty()) return {std::string(def.key), std::string(def.label), def.higher_is_better};
  return {qualifier + separator + std::string(def.key), qualifier + " " + std::string(def.label), def.higher_is_better};
}

}  // namespace qeval::eval
