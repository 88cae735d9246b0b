// Which node of a variant's graph is which node of the reference's graph, so that per-layer error
// works across a precision variant (the same graph), a recipe (the reference plus Q/DQ nodes) and a
// separate export (a Q/DQ ONNX file next to the FP16 one). Quantization plumbing (Quantize/
// DequantizeLinear in any form, SmoothQuant pre-scale Muls) is set aside; the remaining nodes are
// matched by name, output tensor or structure. Also: the nodes to re-run for a node's local error.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "eval/exec/graph.h"

namespace qeval::eval {

// QuantizeLinear / DequantizeLinear (ONNX or ModelOpt's trt FP8 forms) and the pre-scale Mul of
// SmoothQuant that a recipe inserts ("<node>/input_quantizer/Mul"), and ONNX Runtime's
// DynamicQuantizeLinear (its dynamic INT8 form: it feeds ConvInteger / MatMulInteger).
bool is_quantization_plumbing(const Node& node);

// Nodes that run on quantized values: not plumbing themselves, reading a DequantizeLinear (or
// DynamicQuantizeLinear) output, and ONNX Runtime's QLinear* ops.
std::size_t count_quantized_nodes(const Graph& graph);

struct UnmatchedNodeInfo {
  std::string side;  // "reference" | "variant"
  std::string name, op;
  std::string reason;
};

struct NodeMatch {
  std::vector<int> ref_of_variant;  // per variant node: the reference node's index, -1 for none
  std::vector<int> variant_of_ref;  // per reference node: the variant node's index, -1 for none
  std::size_t by_name = 0, by_output = 0, by_structure = 0;  // nodes matched by each method
  std::size_t plumbing = 0;     // variant nodes set aside: quantization plumbing, unmatched float Casts,
                                // the rest of a layer's rewritten form (ConvInteger behind a matched Mul,
                                // a Conv before the BatchNormalization matched to a folded Conv, the
                                // chain of a decomposed LayerNormalization)
  std::vector<char> set_aside;  // per variant node: one of those (local runs include them)
  std::vector<UnmatchedNodeInfo> unmatched;
};

// The same graph object matches itself node for node. Otherwise each non-plumbing variant node is
// matched, in this order, to the reference node (1) of the same name and op type, (2) that produces
// the tensor of the same name as its first output (ONNX Runtime's dynamic INT8 form keeps a Conv's
// output name on the node that ends its rewrite), (3) of the same structure: op type, attributes,
// weight shapes and the structure of everything upstream, with quantization plumbing and float
// Casts looked through (a second export of the network with other node and tensor names).
// The forms exporters and runtimes give one layer count as that layer: Conv + BatchNormalization
// and the folded Conv, Conv + Mul / Add by scalar or per-output-channel constants and the folded
// Conv (ONNX Runtime's ConvMulFusion / ConvAddFusion), MatMul + Add and Gemm (transB or a
// transposed constant), a decomposed LayerNormalization (ReduceMean, Sub, Pow, ReduceMean, Add,
// Sqrt, Div, Mul, Add) and the one op, QLinearConv / QLinearMatMul and the float op. The node computing the whole layer
// matches the node that ends the other export's form (the folded Conv the BatchNormalization); the other nodes of a
// form are set aside on the variant's side (local runs include them) and listed on the reference's ("folded into
// <node>", "part of decomposed LayerNormalization <node>"). Everything else is listed unmatched with the reason
// (Constant nodes excepted: they are values).
NodeMatch match_nodes(const Graph& reference, const Graph& variant);

// The scale and zero point of an 8-bit quantized tensor: names of scalar initializers of the graph
// (zero_point "" when the node has none: uint8 zero).
struct QuantParams {
  std::string scale, zero_point;
  bool operator==(const QuantParams&) const = default;
};

// Values of `graph` held as quantized integers: in ONNX Runtime's QOperator form the outputs of
// QuantizeLinear and of the QLinear ops (QLinearConv, QLinearMatMul, com.microsoft's QLinearAdd,
// QLinearMul, QLinearConcat, QLinearSigmoid, ...) with their y_scale / y_zero_point, and what ops
// that move or select values make of them (MaxPool, Reshape, Transpose, Resize, Slice, Concat of one
// scale, ...: the same scale). nullopt: an integer tensor with no stored scale (ConvInteger's and
// MatMulInteger's int32 accumulators, a scale computed at run time).
std::unordered_map<std::string, std::optional<QuantParams>> quantized_values(const Graph& graph);

// What to re-run for the local error of variant node `node`: the node and the plumbing that feeds
// it (a quantized conv's input QuantizeLinear -> DequantizeLinear and weight DequantizeLinear), in
// topological order, and for each value they read from outside (not an initializer) the reference
// value holding the same data (the output of the matched reference node, or the same graph input).
// ONNX Runtime's QOperator form holds those values quantized where the reference holds floats: the
// reference's value is quantized on the way in with the scale and zero point of the node that reads
// it (a QLinearConv's x_scale / x_zero_point, a DequantizeLinear's), and a quantized output is
// dequantized with its own (a QLinear op's y_scale / y_zero_point) before the comparison.
struct LocalPlan {
  std::vector<std::size_t> nodes;                             // variant node indices
  std::vector<std::pair<std::string, std::string>> inputs;    // variant value -> reference value
  std::vector<std::pair<std::string, QuantParams>> quantize;  // inputs the variant holds quantized
  std::optional<QuantParams> dequantize;                      // the node's output is quantized
  std::string error;  // why there is no plan (e.g. an input whose producer has no match); "" if ok
  bool ok() const { return error.empty(); }
};

// The graph a local run executes: the plan's nodes (extract_subgraph, inputs of `input_types`),
// with a QuantizeLinear before each input of plan.quantize that is fed a float (the node's readers
// read its output) and a DequantizeLinear after the node's output when plan.dequantize is set;
// its outputs are the last node's (the compared one's).
// `compared`: the node whose first output is compared with the reference's (the node itself, or
// that DequantizeLinear).
struct LocalGraph {
  Graph graph;
  std::string compared;
};
LocalGraph local_graph(const Graph& variant, const LocalPlan& plan, const std::map<std::string, DType>& input_types);
// Values of `graph` held in float16 or bfloat16 (an FP16 export: float16 weights, Cast to float16 at
// its inputs), by static propagation: a Cast's `to`, a narrow initializer, or a node with a narrow
// float input (ONNX type constraints tie a node's float inputs and outputs to one type). Local error
// feeds such a value its declared type, so that the reference's FP32 value is rounded on the way in
// as the export itself would hold it. Values not listed are float32 or not float.
std::unordered_map<std::string, DType> narrow_float_values(const Graph& graph);

// One plan per variant node (plumbing and unmatched nodes get an error).
std::vector<LocalPlan> plan_local_runs(const Graph& reference, const Graph& variant, const NodeMatch& match);

// `variant`'s node names in a topological order that follows the reference's (for
// SessionOptions::node_order): a node matched to reference node r comes as soon as its inputs allow
// after the nodes matched to reference nodes before r; plumbing and other unmatched nodes come just
// before their first matched reader (after their inputs when nothing matched reads them); ties keep
// the variant's own order. A lockstep call (eval/run/observe.h) steps a variant only to nodes whose
// counterparts the reference has run, and the reference's values wait for their comparisons
// meanwhile: ONNX Runtime's quint8 ISNet lists a side output's conv right after the encoder where
// the FP16 export has it last, so the reference held every decoder activation until the end of the
// call (bench/README.md). Empty when the variant's own order already follows (or is the reference).
std::vector<std::string> reference_order(const Graph& variant, const Graph& reference);

}  // namespace qeval::eval
