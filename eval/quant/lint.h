// `qeval lint`: what a TensorRT build of a Q/DQ ONNX graph will trip over (zero points and axes it
// rejects, FP8 on GPUs without it, placements it cannot fuse, attention its fused MHA kernels do
// not take) and how many Conv/MatMul/Gemm nodes end up quantized. Rules and sources: docs/lint.md.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/exec/graph.h"
#include "eval/quant/select.h"

namespace qeval::eval::quant {

enum class Severity { kInfo, kWarning, kError };
const char* severity_name(Severity s);

struct LintFinding {
  std::string rule;  // stable id, e.g. "zero-point" (docs/lint.md lists them)
  Severity severity = Severity::kWarning;
  std::string node;  // the node the finding is about
  std::string op_type;
  std::vector<std::string> related;  // other nodes involved (its Q/DQ nodes, consumers, more nodes)
  std::string message;
  std::string fix;
};

// Where a Conv/ConvTranspose/MatMul/Gemm ends up in a TensorRT engine.
enum class ComputeState {
  kQuantized,      // every operand behind a Q/DQ TensorRT can fuse: runs in INT8/FP8
  kWeightOnly,     // MatMul/Gemm with only its weight quantized (weight-only GEMM kernels)
  kHighPrecision,  // FP16/FP32
};
enum class HighPrecisionReason {
  kNone,         // (quantized or weight-only)
  kNotSelected,  // no Q/DQ: its category is above the graph's quantization level, or never quantized
  kExcluded,     // no Q/DQ: its name matches the TensorRT diffusion demo's default exclusions
  kUnfusable,    // it has Q/DQ, but placed or typed so that TensorRT cannot fuse them
};
const char* compute_state_name(ComputeState s);
const char* reason_name(HighPrecisionReason r);

struct LintNode {
  std::string name;
  std::string op_type;
  NodeCategory category = NodeCategory::kNone;
  ComputeState state = ComputeState::kHighPrecision;
  std::string format;  // "int8", "fp8_e4m3fn", ... of its quantized operands; "" when none
  HighPrecisionReason reason = HighPrecisionReason::kNone;
  std::string detail;  // why it is high precision (rules, category level)
};

struct LintOptions {
  int target_sm = 0;  // 75, 80, 86, 89, 90; 0: not given (target-dependent rules report notes)
  // Shapes of graph inputs with dynamic dimensions (the attention checks need concrete shapes).
  std::map<std::string, Shape> input_shapes;
};

struct LintReport {
  std::string model;
  int target_sm = 0;
  std::vector<LintFinding> findings;  // errors, then warnings, then notes; graph order within
  std::vector<LintNode> nodes;        // every Conv/ConvTranspose/MatMul/Gemm, in graph order
  int qdq_nodes = 0;                  // QuantizeLinear/DequantizeLinear nodes (trt FP8 ones included)

  int count(Severity s) const;
  int count(ComputeState s) const;
  int count(HighPrecisionReason r) const;
  // {"schema_version": 1, "model", "target", "counts", "findings", "summary", "nodes"}
  nlohmann::ordered_json to_json() const;
  // The human report: findings (at most `max_per_rule` a rule; the JSON has all) and the summary.
  std::string to_text(std::size_t max_per_rule = 10) const;
};

// "sm75", "sm80", "sm86", "sm89", "sm90" -> 75 ...; InputError listing the valid targets otherwise.
int parse_target(const std::string& text);

// Lints a graph (loaded with or without the executor's op support). Throws InputError when the
// attention checks need shapes that a dynamic input lacks (naming the input and --shape), or when
// the given shapes do not fit the graph.
LintReport lint_graph(const Graph& graph, const LintOptions& options);

}  // namespace qeval::eval::quant
