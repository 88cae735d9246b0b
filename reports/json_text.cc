// Readable JSON text (see json_text.h).
#include "reports/json_text.h"

#include <algorithm>
#include <cmath>

namespace qeval::reports {

namespace {

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
      out += nlohmann::json(item.key()).dump();
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
    out += j.dump();
  }
}

}  // namespace

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
