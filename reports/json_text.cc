// Readable JSON text (see json_text.h).
#include "reports/json_text.h"

#include <algorithm>
#include <cmath>

#include "base/utf8.h"

namespace qeval::reports {

namespace {

nlohmann::json with_valid_utf8(const nlohmann::json& j) {
  if (j.is_string()) return base::escape_invalid_utf8(j.get_ref<const std::string&>());
  if (j.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& e : j) out.push_back(with_valid_utf8(e));
    return out;
  }
  if (j.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& item : j.items()) out[base::escape_invalid_utf8(item.key())] = with_valid_utf8(item.value());
    return out;
  }
  return j;
}

void dump(const nlohmann::json& j, int depth, std::string& out) {
  auto newline = [&](int d) {
    out += '\n';
    out.append(std::size_t(d), ' ');
  };
  if (j.is_object() && !j.empty()) {
    out += '{';
    bool first = true;
    for (const auto& item : j.items()) {
      if (!first) out += ',';
      first = false;
      newline(depth + 1);
      out += dump_json_utf8_safe(nlohmann::json(item.key()));
      out += ": ";
      dump(item.value(), depth + 1, out);
    }
    newline(depth);
    out += '}';
  } else if (j.is_array() && !j.empty() &&
             std::any_of(j.begin(), j.end(), [](const auto& e) { return e.is_structured(); })) {
    out += '[';
    for (std::size_t i = 0; i < j.size(); ++i) {
      if (i) out += ',';
      newline(depth + 1);
      dump(j[i], depth + 1, out);
    }
    newline(depth);
    out += ']';
  } else {
    out += dump_json_utf8_safe(j);
  }
}

}  // namespace

std::string dump_json_utf8_safe(const nlohmann::json& j, int indent) {
  try {
    return j.dump(indent);
  } catch (const nlohmann::json::type_error& e) {
    if (e.id != 316) throw;  // 316: invalid UTF-8
    return with_valid_utf8(j).dump(indent);
  }
}

std::string dump_json_readable(const nlohmann::json& j) {
  std::string out;
  dump(j, 0, out);
  out += '\n';
  return out;
}

nlohmann::json special_number(double v) {
  if (std::isnan(v)) return nullptr;
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

nlohmann::json special_number(std::optional<double> v) { return v ? special_number(*v) : nlohmann::json(nullptr); }

}  // namespace qeval::reports
