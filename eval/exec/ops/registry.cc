// The op registry: every family file contributes its schemas here.
#include <algorithm>
#include <vector>

#include "eval/exec/ops/families.h"
#include "eval/exec/ops/op.h"

namespace qeval::eval {

std::span<const OpSchema> op_schemas() {
  static const std::vector<OpSchema> all = [] {
    std::vector<OpSchema> v;
    for (auto add : kOpFamilies) add(v);
    return v;
  }();
  return all;
}

const OpSchema* find_op(std::string_view domain, std::string_view op_type, int opset) {
  for (const auto& s : op_schemas())
    if (s.domain == domain && s.op_type == op_type && opset >= s.since_version && opset <= s.until_version) return &s;
  return nullptr;
}

std::string unsupported_reason(std::string_view domain, std::string_view op_type, int opset) {
  std::string where = std::string(domain.empty() ? "ai.onnx" : domain) + " opset " + std::to_string(opset);
  std::vector<std::string> ranges;
  for (const auto& s : op_schemas())
    if (s.domain == domain && s.op_type == op_type)
      ranges.push_back(std::to_string(s.since_version) + "-" + std::to_string(s.until_version));
  if (ranges.empty()) return "op " + std::string(op_type) + " (" + where + ") is not supported";
  std::string list;
  for (const auto& r : ranges) list += (list.empty() ? "" : ", ") + r;
  return "op " + std::string(op_type) + " is supported at opsets " + list + ", not " + where;
}

}  // namespace qeval::eval
