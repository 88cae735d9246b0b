// The header every report opens with (reports/report_header.h).
#include "reports/report_header.h"

#include "reports/html.h"

namespace qeval::reports {

void write_header(nlohmann::json& j, std::string_view schema_version, std::string_view kind, const ReportHeader& h) {
  j["schema_version"] = schema_version;
  j["kind"] = kind;
  j["tool"] = {{"name", "qeval"}, {"version", h.tool_version}};
  j["created_utc"] = h.created_utc;
  j["command_line"] = h.command_line;
}

std::string header_subtitle(const ReportHeader& h) {
  return html::esc(h.created_utc) + " &middot; qeval " + html::esc(h.tool_version) + " &middot; <code>" +
         html::esc(h.command_line) + "</code>";
}

}  // namespace qeval::reports
