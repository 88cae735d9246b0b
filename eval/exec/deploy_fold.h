// What a reduced-precision deployment folds in FP32 before it casts weights (TensorRT's and ONNX
// Runtime's graph optimizers): BatchNormalization into the Conv before it, or into one per-channel
// scale and shift where it stands alone; constant per-channel Mul/Add after a Conv into the Conv. Weights are rounded to FP16/BF16 only after this fold, so a
// BatchNormalization's running variance (PP-OCR's reach 1e8) never meets FP16's range on its own.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "eval/exec/graph.h"

namespace qeval::eval {

struct DeploymentFold {
  std::vector<Node> nodes;                // the nodes given, rewritten; same order, folded ones dropped
  std::map<std::string, Tensor> weights;  // the folded weights (float32), read by the rewritten nodes
  std::size_t into_conv = 0;              // BatchNormalizations folded into their Conv
  std::size_t standalone = 0;             // BatchNormalizations reduced to scale and shift
  std::size_t scales_into_conv = 0;       // Mul/Add by per-channel constants folded into their Conv
};

// Rewrites `nodes` (a graph's, or a session's after Q/DQ fusion) of `graph`:
// - Conv (constant float32 weight and bias) -> BatchNormalization (constant parameters, inference
//   form), where the Conv's output feeds only that node and is no graph output: one Conv with
//   W' = W * s[oc], B' = (B - mean) * s + beta, s = scale / sqrt(var + epsilon), computed in double
//   and stored in float32. The Conv takes the BatchNormalization's name and output: its value is
//   the BatchNormalization's, and observers compare it with that node.
// - any other BatchNormalization with constant parameters: the same node with scale s, bias
//   beta - mean * s, mean 0, variance 1 and epsilon 0 (the same function, parameters in range).
// - then Conv (constant weight and bias, possibly folded above) -> Mul or Add by a constant that is
//   a scalar or one value per output channel ([c,1,1], [1,c,1,1]), where the Conv's output feeds
//   only that node and is no graph output: one Conv with W * s, B * s (Mul) or B + a (Add), in
//   double, stored in float32; it takes the Mul's or Add's name and output. Chains fold in turn.
// Everything else is kept as it is.
// `scales` false: BatchNormalization only (what an exporter's own BN fusion gives, for tests).
DeploymentFold fold_for_deployment(const Graph& graph, const std::vector<Node>& nodes, bool scales = true);

}  // namespace qeval::eval
