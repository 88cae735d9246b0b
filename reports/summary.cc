// Summaries of per-sample metrics (shared by compare-images and qeval run reports).
#include <cmath>

#include "metrics/metric_registry.h"
#include "metrics/stats.h"
#include "reports/compare_report_model.h"
#include "reports/run_report_model.h"

namespace qeval::reports {

SummaryRow summarize_metric(const std::string& metric, const std::vector<std::optional<double>>& values) {
  SummaryRow s;
  s.metric = metric;
  std::vector<double> finite;
  finite.reserve(values.size());
  for (const auto& v : values) {
    if (!v || std::isnan(*v)) {
      ++s.not_applicable;
    } else if (std::isinf(*v)) {
      ++s.unbounded;
    } else {
      finite.push_back(*v);
    }
  }
  if (auto sum = metrics::summarize(finite)) {
    s.count = sum->count;
    s.mean = sum->mean;
    s.min = sum->min;
    s.p5 = sum->p5;
    s.median = sum->median;
    s.p95 = sum->p95;
    s.max = sum->max;
  }
  return s;
}

std::string_view variant_kind_name(VariantKind k) {
  switch (k) {
    case VariantKind::kPrecision: return "precision";
    case VariantKind::kRecipe: return "recipe";
    case VariantKind::kOnnx: return "onnx";
  }
  return "precision";
}

std::optional<VariantKind> parse_variant_kind(std::string_view s) {
  for (auto k : {VariantKind::kPrecision, VariantKind::kRecipe, VariantKind::kOnnx})
    if (variant_kind_name(k) == s) return k;
  return std::nullopt;
}

void summarize_samples(RunReport& report) {
  for (auto& variant : report.variants) {
    VariantSummary& sum = variant.summary;
    sum.samples = sum.errors = 0;
    sum.metrics.clear();
    std::vector<const SampleResult*> results;
    for (const auto& sample : report.samples)
      if (const auto* r = sample.result(variant.name)) {
        ++sum.samples;
        if (!r->ok()) {
          ++sum.errors;
          continue;
        }
        results.push_back(r);
      }
    if (variant.reference) continue;
    for (const auto& info : report.metrics) {
      const metrics::MetricDef* def = metrics::find_metric(info.key);
      std::vector<std::optional<double>> values;
      values.reserve(results.size());
      for (const auto* r : results) {
        const auto* m = r->metric(info.key);
        // +inf for an unbounded value (PSNR of equal images), none for not applicable.
        values.push_back(m ? metrics::counted_value(def, m->value, r->identical) : std::nullopt);
      }
      sum.metrics.push_back(summarize_metric(info.key, values));
    }
  }
}

}  // namespace qeval::reports
