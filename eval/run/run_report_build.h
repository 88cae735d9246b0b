// From a run's merged result to the report model (reports/run_report_model.h), and the gate over it.
#pragma once

#include <filesystem>
#include <string>

#include "eval/run/evaluator.h"
#include "eval/run/gate.h"
#include "reports/run_report_model.h"

namespace qeval::eval {

class CallShapes;  // eval/run/compare_recipes.h

struct ReportContext {
  std::string tool_version, created_utc, command_line;
  int threads = 0;
  std::string device = "cpu";  // the models' backend (Backend::name)
  std::string shard;  // "" or "I/N"
  // false: the model, input and export fingerprints stay empty (they hash every weight and the
  // input set; triage builds a report per search step and reads only its metrics and gate).
  bool fingerprints = true;
  // The shapes one call of each model ran with (recorded by the reference's node hook), for the
  // MACs of Variant::quantization; null: MACs unknown (parameters and nodes are still counted).
  const CallShapes* shapes = nullptr;
};

// Fills every part of the report but the gate (RunResult's layer cells are read, not consumed).
reports::RunReport build_run_report(const RunSpec& spec, const RunDriver& driver, const RunResult& result,
                                    const ReportContext& context);

// The gate over a report: the sample checks per compared variant (a check naming a variant only
// for it), the layer checks on each variant's layer table, the non-finite budget. Fills
// report.gate and each SampleResult's failed_checks. InputError when a check names a variant the
// run does not have.
void apply_run_gate(const Gate& gate, reports::RunReport& report);

// What `qeval run` and `qeval merge` end with: the report built and gated, report.json/html and
// junit.xml written under out_dir, the one-screen summary on stdout. Returns the exit code (0 the
// gate passed, 1 it failed).
int write_run_outputs(const RunSpec& spec, const RunDriver& driver, const RunResult& result, const Gate& gate,
                      const ReportContext& context, const std::filesystem::path& out_dir);

}  // namespace qeval::eval
