// What every report opens with (compare-images, run, triage, compare-recipes): which qeval made
// it, when, from which command line. One struct the four report models derive from, one JSON
// writer and one HTML subtitle.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace qeval::reports {

struct ReportHeader {
  std::string tool_version;
  std::string created_utc;  // ISO 8601
  std::string command_line;
};

// Sets the header keys of a JSON report: schema_version, kind, tool {name, version}, created_utc,
// command_line.
void write_header(nlohmann::json& j, std::string_view schema_version, std::string_view kind, const ReportHeader& h);

// "created &middot; qeval version &middot; <code>command</code>", escaped, for a report's subtitle.
std::string header_subtitle(const ReportHeader& h);

}  // namespace qeval::reports
