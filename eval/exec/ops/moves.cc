#include "eval/exec/ops/moves.h"

#include <algorithm>
#include <iterator>

namespace qeval::eval {

bool selects_elements(const Node& node) {
  static const char* kOps[] = {"Transpose", "Slice",   "Expand",       "Tile",         "Pad",
                               "Gather",    "Reshape", "Squeeze",      "Unsqueeze",    "Flatten",
                               "Identity",  "Trilu",   "DepthToSpace", "SpaceToDepth", "GatherElements"};
  return node.domain.empty() &&
         std::any_of(std::begin(kOps), std::end(kOps), [&](const char* o) { return node.op_type == o; });
}

bool keeps_element_order(const Node& node) {
  static const char* kOps[] = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"};
  return node.domain.empty() &&
         std::any_of(std::begin(kOps), std::end(kOps), [&](const char* o) { return node.op_type == o; });
}

bool moves_elements(const Node& node) {
  return selects_elements(node) || (node.domain.empty() && (node.op_type == "Concat" || node.op_type == "Split"));
}

}  // namespace qeval::eval
