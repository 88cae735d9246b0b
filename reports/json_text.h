// JSON text for files people read: indented objects, arrays of plain values on one line.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace qeval::reports {

// Like json::dump(1), except that an array holding no object or array stays on one line, so a
// column of 8000 numbers is one line rather than 8000. Ends with a newline.
std::string dump_json_readable(const nlohmann::json& j);

}  // namespace qeval::reports
