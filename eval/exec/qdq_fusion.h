// Q/DQ fusion: finds Conv, MatMul and Gemm nodes whose float inputs are DequantizeLinear of int8
// values (an activation from QuantizeLinear, a constant int8 weight), the pattern TensorRT fuses,
// and rewrites each into the same node (same name, same outputs) of domain "qeval.int8" that runs
// int8 x int8 -> int32 exactly and rescales, instead of accumulating dequantized floats.
#pragma once

#include <string>
#include <vector>

#include "eval/exec/graph.h"

namespace qeval::eval::quant {

inline constexpr const char* kFusedDomain = "qeval.int8";

struct FusedNode {
  std::string name;                  // the Conv/MatMul/Gemm node, kept
  std::string op_type;               // its op type, kept
  std::vector<std::string> removed;  // DequantizeLinear nodes no longer run (all their readers fused)
};

struct QdqFusion {
  std::vector<Node> nodes;  // the graph's nodes, rewritten; same order
  std::vector<FusedNode> fused;
};

// The fused inputs of a rewritten node, in this order (omitted optional ones are ""):
//   Conv:   x_q, x_scale, x_zero_point, w_q, w_scale, w_zero_point, B
//   MatMul: a_q, a_scale, a_zero_point, b_q, b_scale, b_zero_point
//   Gemm:   a_q, a_scale, a_zero_point, b_q, b_scale, b_zero_point, C
// Attributes are the original node's. A node is fused only when every condition is known from the
// graph alone: both DQ inputs are int8/uint8 (a QuantizeLinear's output, DynamicQuantizeLinear's,
// or an int8 initializer / graph input), the activation scale is one value, the weight scale one
// value or one per output channel (Conv: axis 0; MatMul: the last axis; Gemm: the N axis), no
// blocked scales, Gemm without transA. Anything else (float8, int16, per-axis activations) runs as
// written: DQ to float, then the float op.
QdqFusion fuse_qdq(const Graph& graph);

}  // namespace qeval::eval::quant
