// JUnit XML of gate checks, for CI systems that display test results.
#pragma once

#include <string>
#include <string_view>

#include "reports/compare_report_model.h"

namespace qeval::reports {

// One <testcase> per check; classname "gate" or "gate.<variant>" when the check names a variant;
// a failed check carries its threshold, value and detail in the failure message.
std::string render_gate_junit(const GateSection& gate, std::string_view suite_name, double elapsed_s);

}  // namespace qeval::reports
