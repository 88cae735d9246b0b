// The `qeval triage` report: triage.json, triage.html (self-contained) and the stdout summary.
// docs/triage.md says how to read them.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "reports/triage_report_model.h"

namespace qeval::reports {

nlohmann::json to_json(const TriageReport& report);
std::string render_html(const TriageReport& report);
// Verdict, the searches side by side, the worst nodes; at most ~24 lines.
std::string render_summary_text(const TriageReport& report, const std::filesystem::path& out_dir = {},
                                std::size_t width = 100);  // long lines wrap at `width`

// Writes triage.html and triage.json (last) under out_dir, each atomically. InputError when
// out_dir cannot be written.
void write_triage_report(const TriageReport& report, const std::filesystem::path& out_dir);

}  // namespace qeval::reports
