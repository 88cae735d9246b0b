// JSON text for files people read: indented objects, arrays of plain values on one line.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace qeval::reports {

// Like json::dump(1), except that an array holding no object or array stays on one line, so a
// column of 8000 numbers is one line rather than 8000. Ends with a newline.
std::string dump_json_readable(const nlohmann::json& j);

// j.dump(indent), with every string (and key) that is not valid UTF-8 written with \xHH escapes
// for its stray bytes (base/utf8.h) instead of the exception nlohmann::json throws: a file name
// that is not UTF-8 must not turn a finished run into an internal error.
std::string dump_json_utf8_safe(const nlohmann::json& j, int indent = -1);

// Numbers that may be non-finite, as the reports write them: null (NaN: not measured / not
// applicable; also an empty optional), "inf", "-inf".
nlohmann::json special_number(double v);
nlohmann::json special_number(std::optional<double> v);

}  // namespace qeval::reports
