// The compare-images report: report.json (versioned schema), report.html, junit.xml.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "reports/compare_report_model.h"

namespace qeval::reports {

nlohmann::json to_json(const CompareImagesReport& report);
// Self-contained HTML: inline CSS/JS, images as data: URIs, no network access.
std::string render_html(const CompareImagesReport& report);
// One test case per gate check, for CI systems that display JUnit results.
std::string render_junit(const CompareImagesReport& report);

// Writes report.json, report.html and junit.xml under out_dir (created if needed), each atomically.
void write_compare_images_report(const CompareImagesReport& report, const std::filesystem::path& out_dir);

// Finite numbers as numbers, anything else as null (JSON has no inf/NaN).
nlohmann::json json_number(std::optional<double> v);

}  // namespace qeval::reports
