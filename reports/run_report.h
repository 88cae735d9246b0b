// The `qeval run` report: report.json (docs/report.schema.json) and back, report.html, junit.xml
// and the one-screen stdout summary. docs/report.md says how to read each part.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "reports/run_report_model.h"

namespace qeval::reports {

// report.json's content. ImageRef::png (HTML thumbnails) is not stored; everything else is.
nlohmann::json to_json(const RunReport& report);

// report.json's pieces other reports reuse (the same keys): {"name", "path", "fingerprint"} and
// one metric's summary over samples ({"metric", "count", ..., "mean", ...}; no statistics when
// count is 0).
nlohmann::json artifact_json(const Artifact& a);
nlohmann::json summary_row_json(const SummaryRow& s);

// The inverse of to_json, for `qeval merge` and triage. Accepts any 1.x schema_version (unknown
// keys are ignored: a newer minor version only adds). Throws InputError naming `source`, the key
// path and what was expected, e.g. "out/report.json: variants[2].kind: expected one of ...".
RunReport run_report_from_json(const nlohmann::json& j, const std::string& source);
RunReport read_run_report(const std::filesystem::path& path);

// Self-contained HTML (inline CSS/JS/SVG, images as data: URIs or relative paths, no network).
std::string render_html(const RunReport& report);
// One test case per gate check, grouped by variant.
std::string render_junit(const RunReport& report);
// What `qeval run` prints on stdout: verdict, per-variant summary, failed checks, worst layers,
// first NaN/Inf and where the report is; at most ~24 lines (8 variants). Nothing is cut: the
// variant table becomes a block per variant when its columns would pass `width`, and long lines
// wrap (reports/text_table.h).
std::string render_summary_text(const RunReport& report, const std::filesystem::path& out_dir = {},
                                std::size_t width = 100);

// What is inconsistent in a report the evaluator filled, one line each (empty when it is sound):
// duplicate or unknown variant names, not exactly one reference, a column whose length is neither
// 0 nor the number of cells, layer/step indices out of range, curves of the wrong length.
std::vector<std::string> check_run_report(const RunReport& report);

// Writes report.html, junit.xml and report.json under out_dir (created if needed), each
// atomically; report.json last, so its presence means the report is complete. Throws
// std::logic_error listing check_run_report's findings (an evaluator bug, exit 3) before writing
// anything, and InputError when out_dir cannot be written.
void write_run_report(const RunReport& report, const std::filesystem::path& out_dir);

}  // namespace qeval::reports
