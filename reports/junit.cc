// JUnit XML of gate checks.
#include "reports/junit.h"

#include <fmt/format.h>

#include "reports/html.h"

namespace qeval::reports {

std::string render_gate_junit(const GateSection& gate, std::string_view suite_name, double elapsed_s) {
  std::string x = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  x += fmt::format("<testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" skipped=\"{}\" time=\"{:.3f}\">\n",
                   html::esc(suite_name), gate.checks.size(), gate.failed(), gate.not_measured(), elapsed_s);
  for (const auto& c : gate.checks) {
    const std::string classname = c.variant.empty() ? "gate" : "gate." + c.variant;
    x += "  <testcase classname=\"" + html::esc(classname) + "\" name=\"" + html::esc(c.name) + "\">";
    if (!c.passed) x += "<failure message=\"" + html::esc(c.detail) + "\"/>";
    else if (!c.measured) x += "<skipped message=\"" + html::esc(c.detail) + "\"/>";
    x += "</testcase>\n";
  }
  x += "</testsuite>\n";
  return x;
}

}  // namespace qeval::reports
