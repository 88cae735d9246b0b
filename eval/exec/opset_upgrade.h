// Raising a graph's ai.onnx opset (7 or later) to a newer one: the rewrites of the ops whose form or
// semantics changed on the way, so the upgraded graph computes what the original did.
#pragma once

#include <string>
#include <vector>

#include "eval/exec/graph.h"

namespace qeval::eval {

// The oldest default-domain opset upgrade_opset accepts. Older forms (BatchNormalization's
// consumed_inputs/is_test, Dropout's is_test, Upsample-1) are not rewritten.
inline constexpr int kOldestUpgradableOpset = 7;

struct OpsetUpgrade {
  int from = 0, to = 0;            // default-domain opset before and after
  int rewritten_nodes = 0;         // nodes whose form changed (not just their opset number)
  std::vector<std::string> notes;  // one line per rewrite: "node 'x' (Upsample): -> Resize (asymmetric, floor)"
};

// Raises the default-domain opset of `graph` to `target` (nothing when it is already there or
// newer). What changes between opsets 7 and `target` for the ops qeval runs:
//   Upsample-7/9, Resize-10 -> Resize (roi "", scales input, asymmetric coordinates; nearest rounds
//     down when enlarging and up when shrinking, as those opsets' node tests and ONNX Runtime do);
//   Resize-11/12 tf_half_pixel_for_nn -> half_pixel with the equivalent nearest_mode (13);
//   Slice starts/ends/axes (10), TopK k (10), Clip min/max (11), Pad pads/value (11), Dropout ratio
//     (12), Split split, Squeeze/Unsqueeze axes, ReduceSum axes (13), other Reduce* axes (18):
//     attribute -> initializer input;
//   Split without sizes -> num_outputs (18);
//   BatchNormalization: spatial dropped (9; spatial=0 becomes Sub/Mul/Add with the per-activation
//     statistics, which must be constants), training outputs rejected (14);
//   Softmax/LogSoftmax (13): the 2-D coercion kept as Flatten -> Softmax(-1) -> Reshape unless the
//     axis is the last one.
// Throws InputError for a graph below opset 7 ("opset 7 or later"), UnsupportedError (naming the
// node, op type and opset) for a node whose old meaning the target cannot express.
// `need` says what the target is for, in messages ("to insert INT8 Q/DQ nodes").
OpsetUpgrade upgrade_opset(Graph& graph, int target, const std::string& need = "");

}  // namespace qeval::eval
