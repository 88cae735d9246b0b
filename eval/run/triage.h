// `qeval triage`: which quantized nodes of a recipe variant break the gate, and the smallest set to
// keep in high precision so that it passes. Ranks the variant's quantized nodes by local error
// and by sensitivity (the output metric with only that node quantized, and with only that node
// kept), then searches: a ranked greedy fallback verified by re-running (grow in rank order until
// the gate passes, then drop what is not needed), against Polygraphy-style prefix bisection over
// the topological and the ranked order. docs/triage.md.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "eval/quant/recipe.h"
#include "eval/run/gate.h"
#include "eval/run/run_config.h"
#include "reports/run_report_model.h"
#include "reports/triage_report_model.h"

namespace qeval::eval {

struct TriageOptions {
  std::string variant;      // the recipe variant to triage (a name in spec.variants)
  std::string metric;       // ranking metric; "" = the gate's first check's, else the pipeline's first
  bool sensitivity = true;  // rank by per-node runs (2 per node); false: by local error only
  std::size_t batch = 12;   // configurations evaluated together (one reference pass)
  bool progress = false;    // progress lines on stderr
  int workers = 0;          // parallel units (0: TBB's concurrency)
};

struct TriageOutcome {
  reports::TriageReport report;
  quant::Recipe override_recipe;  // the variant's recipe keeping report.kept() in high precision
  bool passed = false;            // the chosen set passes the gate
};

// A variant's metric as its report states it: the mean over the samples where it is finite; +inf
// when every sample was unbounded (outputs identical to the reference's); nullopt when none was
// measured. Triage reads the variant as given, the ranking runs and the searches by this one rule.
std::optional<double> variant_metric(const reports::RunReport& report, const std::string& variant,
                                     const std::string& metric);

// InputError (exit 2) for an unknown variant, the reference itself, a variant without a recipe, a
// gate that names no metric the pipeline has, an unknown --metric.
TriageOutcome run_triage(const RunSpec& spec, const Gate& gate, const TriageOptions& options);

}  // namespace qeval::eval
