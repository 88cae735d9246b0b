// JSON text for files people read: indented objects, arrays of plain values on one line.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace qeval::reports {

// Like json::dump(1), except that an array holding no object or array stays on one line, so a
// column of 8000 numbers is one line rather than 8000. Ends with a newline.
std::string dump_json_readable(const nlohmann::json& j);

// Numbers that may be non-finite, as the reports write them: null (NaN: not measured / not
// applicable; also an empty optional), "inf", "-inf".
nlohmann::json special_number(double v);
nlohmann::json special_number(std::optional<double> v);

}  // namespace qeval::reports
