// What a quantized model costs and what TensorRT will make of it, estimated from its graph: the
// share of parameters and multiply-accumulates its Q/DQ quantize, its weight bytes, and a speed
// class from the `qeval lint` rules (docs/compare-recipes.md).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "eval/exec/graph.h"
#include "eval/exec/session.h"
#include "eval/quant/lint.h"

namespace qeval::eval::quant {

// One Conv/ConvTranspose/MatMul/Gemm (or ONNX Runtime's integer form of one: QLinearConv,
// ConvInteger, QLinearMatMul, MatMulInteger, QGemm; op_type says which): its weight parameters (0
// for a product of two activations) and multiply-accumulates per call (nullopt when a shape it
// needs is unknown).
struct ComputeCost {
  std::string name, op_type;
  std::int64_t params = 0;
  std::optional<double> macs;
};

// The compute nodes of `graph` with their costs. `shapes` maps value names (graph inputs and node
// outputs) to the shapes one call of the model produces (e.g. recorded while it ran); weights are
// the graph's initializers.
std::vector<ComputeCost> compute_costs(const Graph& graph, const std::map<std::string, Shape>& shapes);

// Bytes of a model's initializers as an engine stores them: quantized weights (int8, float8) at one
// byte an element, float initializers at the precision's width (fp32 4, fp16/bf16 2), anything
// else at its own element size.
std::int64_t weight_bytes(const Graph& graph, Precision precision);

// What a TensorRT engine built from a quantized graph is expected to run like, against an FP16
// engine of the same model. Ordered from best to worst.
enum class SpeedClass {
  kFaster,       // most of the compute in fused INT8/FP8 kernels, nothing in the lint rules against it
  kAboutFp16,    // the quantized share of the compute is small, or the quantization is weight-only
  kSlowerRisk,   // INT8 attention TensorRT cannot fuse, or Q/DQ pairs it runs as separate kernels
  kUnsupported,  // the engine cannot be built as quantized for the target (FP8 below sm89)
};
const char* speed_class_name(SpeedClass c);  // "faster", "about-fp16", "slower-risk", "unsupported"

struct SpeedEstimate {
  SpeedClass speed = SpeedClass::kAboutFp16;
  std::vector<std::string> reasons;  // the rules and counts behind it, one line each
};

// Quantized MACs share at or above which a graph counts as mostly quantized.
inline constexpr double kMostlyQuantizedMacShare = 0.5;

// The speed class from a lint report of the graph (for the target it was linted for) and the share
// of the model's MACs in nodes lint reports as quantized (nullopt: unknown shapes).
SpeedEstimate estimate_speed(const LintReport& lint, std::optional<double> quantized_mac_share);

}  // namespace qeval::eval::quant
