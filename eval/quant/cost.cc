// Costs of compute nodes, engine weight bytes and the speed class (see cost.h).
#include "eval/quant/cost.h"

#include <fmt/format.h>

#include <set>
#include <unordered_map>
#include <unordered_set>

namespace qeval::eval::quant {

namespace {

// The constant weight behind a node input: an initializer, or one read by a DequantizeLinear (the
// quantized graph stores weights pre-quantized behind their DQ).
const Tensor* weight_of(const Graph& g, const std::unordered_map<std::string, const Node*>& producer,
                        const std::string& value) {
  if (auto it = g.initializers.find(value); it != g.initializers.end()) return &it->second;
  auto p = producer.find(value);
  if (p == producer.end() || p->second->op_type != "DequantizeLinear" || p->second->inputs.empty()) return nullptr;
  auto it = g.initializers.find(p->second->inputs[0]);
  return it == g.initializers.end() ? nullptr : &it->second;
}

const Shape* shape_of(const std::map<std::string, Shape>& shapes, const std::string& value) {
  auto it = shapes.find(value);
  return it == shapes.end() ? nullptr : &it->second;
}

}  // namespace

std::vector<ComputeCost> compute_costs(const Graph& g, const std::map<std::string, Shape>& shapes) {
  std::unordered_map<std::string, const Node*> producer;
  for (const Node& n : g.nodes)
    for (const auto& o : n.outputs)
      if (!o.empty()) producer[o] = &n;
  std::vector<ComputeCost> out;
  for (const Node& n : g.nodes) {
    // ONNX Runtime's integer forms count as the op they compute, their weight at its own slot.
    std::string op = n.op_type;
    std::size_t wi = 1;
    if (op == "QLinearConv") op = "Conv", wi = 3;
    else if (op == "ConvInteger") op = "Conv";
    else if (op == "QLinearMatMul") op = "MatMul", wi = 3;
    else if (op == "MatMulInteger") op = "MatMul";
    else if (op == "QGemm") op = "Gemm", wi = 3;
    if (op != "Conv" && op != "ConvTranspose" && op != "MatMul" && op != "Gemm") continue;
    if (n.inputs.size() <= wi || n.outputs.empty()) continue;
    ComputeCost c{n.name, n.op_type, 0, std::nullopt};
    const Tensor* w = weight_of(g, producer, n.inputs[wi]);
    if (w) c.params = w->numel();
    const Shape* y = shape_of(shapes, n.outputs[0]);
    const Shape* a = shape_of(shapes, n.inputs[0]);
    const Shape* b = w ? &w->shape() : shape_of(shapes, n.inputs[wi]);
    if (op == "Conv") {
      // Each output element reads Cin/group x kernel weights: W is [Cout, Cin/group, k...].
      if (y && w && w->rank() >= 1 && w->dim(0) > 0) c.macs = double(shape_numel(*y)) * double(w->numel() / w->dim(0));
    } else if (op == "ConvTranspose") {
      // Each input element scatters into Cout/group x kernel outputs: W is [Cin, Cout/group, k...].
      if (a && w && w->rank() >= 1 && w->dim(0) > 0) c.macs = double(shape_numel(*a)) * double(w->numel() / w->dim(0));
    } else if (op == "MatMul") {
      std::optional<std::int64_t> k;
      if (a && !a->empty()) k = a->back();
      else if (b && b->size() >= 2) k = (*b)[b->size() - 2];
      if (y && k) c.macs = double(shape_numel(*y)) * double(*k);
    } else {  // Gemm: Y[M, N] = A'[M, K] B'[K, N]
      std::optional<std::int64_t> k;
      if (b && b->size() == 2) k = n.get_int("transB", 0) ? (*b)[1] : (*b)[0];
      else if (a && a->size() == 2) k = n.get_int("transA", 0) ? (*a)[0] : (*a)[1];
      if (y && k) c.macs = double(shape_numel(*y)) * double(*k);
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::int64_t weight_bytes(const Graph& g, Precision precision) {
  std::unordered_set<std::string> used;
  for (const Node& n : g.nodes)
    for (const auto& i : n.inputs)
      if (!i.empty()) used.insert(i);
  for (const auto& o : g.outputs) used.insert(o.name);
  const std::int64_t float_bytes = precision == Precision::kFp32 ? 4 : 2;
  std::int64_t bytes = 0;
  for (const auto& [name, t] : g.initializers) {
    if (!used.count(name)) continue;  // a rewrite may leave the float original of a quantized weight
    const DType d = t.dtype();
    const bool is_float = d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16;
    bytes += t.numel() * (is_float ? float_bytes : std::int64_t(dtype_size(d)));
  }
  return bytes;
}

const char* speed_class_name(SpeedClass c) {
  switch (c) {
    case SpeedClass::kFaster: return "faster";
    case SpeedClass::kAboutFp16: return "about-fp16";
    case SpeedClass::kSlowerRisk: return "slower-risk";
    case SpeedClass::kUnsupported: return "unsupported";
  }
  return "?";
}

SpeedEstimate estimate_speed(const LintReport& lint, std::optional<double> quantized_mac_share) {
  std::map<std::string, int> by_rule;  // warnings and errors only
  for (const auto& f : lint.findings)
    if (f.severity != Severity::kInfo) ++by_rule[f.rule];
  auto count = [&](const char* rule) {
    auto it = by_rule.find(rule);
    return it == by_rule.end() ? 0 : it->second;
  };
  SpeedEstimate e;
  const int quantized = lint.count(ComputeState::kQuantized);
  const int weight_only = lint.count(ComputeState::kWeightOnly);
  const int total = int(lint.nodes.size());
  double share = 0;
  if (quantized_mac_share) {
    share = *quantized_mac_share;
    e.reasons.push_back(fmt::format("{:.0f}% of the multiply-accumulates in {} quantized Conv/MatMul/Gemm of {}",
                                    100 * share, quantized, total));
  } else {
    share = total ? double(quantized) / double(total) : 0.0;
    e.reasons.push_back(
        fmt::format("{} of {} Conv/MatMul/Gemm quantized (shapes unknown: node share)", quantized, total));
  }
  if (count("fp8-target")) {
    e.speed = SpeedClass::kUnsupported;
    e.reasons.push_back(fmt::format("fp8-target: FP8 Q/DQ on sm{} (FP8 needs sm89 or later)", lint.target_sm));
    return e;
  }
  const int attention = count("attention-int8") + count("attention-int8-placement");
  // Q/DQ pairs TensorRT executes as separate kernels: they cost time and buy nothing.
  int standalone = 0;
  std::string standalone_rules;
  for (const char* rule : {"activation-only", "qdq-no-int8-op", "shared-dq", "one-input-quantized", "mixed-formats"})
    if (int n = count(rule)) {
      standalone += n;
      standalone_rules += fmt::format("{}{} {}", standalone_rules.empty() ? "" : ", ", rule, n);
    }
  if (attention) {
    e.speed = SpeedClass::kSlowerRisk;
    e.reasons.push_back(
        fmt::format("attention-int8: {} INT8 attention matmul(s) TensorRT's fused MHA does not take "
                    "(unfused INT8 attention can be slower than FP16)",
                    attention));
  }
  if (standalone) {
    e.reasons.push_back("Q/DQ left unfused (" + standalone_rules + ")");
    if (share < kMostlyQuantizedMacShare) e.speed = SpeedClass::kSlowerRisk;
  }
  if (weight_only)
    e.reasons.push_back(fmt::format("weight-only: {} GEMM(s) with only the weight quantized", weight_only));
  if (count("weight-only"))
    e.reasons.push_back(
        fmt::format("weight-only: {} node(s) with no weight-only kernel on this target", count("weight-only")));
  if (e.speed == SpeedClass::kSlowerRisk) return e;
  e.speed = share >= kMostlyQuantizedMacShare ? SpeedClass::kFaster : SpeedClass::kAboutFp16;
  return e;
}

}  // namespace qeval::eval::quant
