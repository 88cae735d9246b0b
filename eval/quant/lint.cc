// TensorRT lint of Q/DQ graphs: Q/DQ parameters as TensorRT's ONNX parser reads them, fusion of
// Q/DQ into Conv/MatMul/Gemm, INT8 fused-MHA constraints, and the quantized/high-precision count.
#include "eval/quant/lint.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <regex>
#include <set>
#include <unordered_map>

#include "eval/exec/onnx_import.h"
#include "eval/exec/ops/op.h"
#include "eval/exec/session.h"
#include "eval/quant/recipe.h"
#include "kernels/error.h"
#include "kernels/numeric.h"

namespace qeval::eval::quant {

const char* severity_name(Severity s) {
  switch (s) {
    case Severity::kInfo: return "note";
    case Severity::kWarning: return "warning";
    case Severity::kError: return "error";
  }
  return "?";
}

const char* compute_state_name(ComputeState s) {
  switch (s) {
    case ComputeState::kQuantized: return "quantized";
    case ComputeState::kWeightOnly: return "weight_only";
    case ComputeState::kHighPrecision: return "high_precision";
  }
  return "?";
}

const char* reason_name(HighPrecisionReason r) {
  switch (r) {
    case HighPrecisionReason::kNone: return "";
    case HighPrecisionReason::kNotSelected: return "not_selected";
    case HighPrecisionReason::kExcluded: return "excluded";
    case HighPrecisionReason::kUnfusable: return "unfusable";
  }
  return "?";
}

int parse_target(const std::string& text) {
  static const std::map<std::string, int> targets{{"sm75", 75}, {"sm80", 80}, {"sm86", 86}, {"sm89", 89}, {"sm90", 90}};
  auto it = targets.find(text);
  if (it == targets.end()) throw InputError("--target '" + text + "': expected one of sm75, sm80, sm86, sm89, sm90");
  return it->second;
}

namespace {

constexpr int kFp8MinSm = 89;             // FP8 tensor cores: Ada (sm89) and Hopper (sm90)
constexpr int kWeightOnlyGemmMinSm = 80;  // weight-only GEMM kernels: Ampere and later
constexpr std::int64_t kInt8MhaMaxSequence = 512;

bool is_quantize(const Node& n) {
  return (n.domain.empty() && n.op_type == "QuantizeLinear") ||
         (n.domain == "trt" && n.op_type == "TRT_FP8QuantizeLinear");
}
bool is_dequantize(const Node& n) {
  return (n.domain.empty() && n.op_type == "DequantizeLinear") ||
         (n.domain == "trt" && n.op_type == "TRT_FP8DequantizeLinear");
}
bool is_compute(const Node& n) {
  return n.domain.empty() &&
         (n.op_type == "Conv" || n.op_type == "ConvTranspose" || n.op_type == "MatMul" || n.op_type == "Gemm");
}

// What a dequantized activation may flow through before reaching the op that consumes it.
const std::set<std::string>& forward_through_ops() {
  static const std::set<std::string> s{"Reshape",  "Transpose", "Squeeze", "Unsqueeze", "Flatten",
                                       "Identity", "Slice",     "Split",   "Concat"};
  return s;
}
// Ops with an INT8 implementation in TensorRT: the weighted ops and batched matmuls (Q/DQ fusion),
// Add (the residual add fused into a convolution), pooling and the activations onnx-tensorrt's
// operator matrix lists with INT8.
const std::set<std::string>& int8_ops() {
  static const std::set<std::string> s{"Conv",          "ConvTranspose", "MatMul",    "Gemm",
                                       "Add",           "AveragePool",   "MaxPool",   "GlobalAveragePool",
                                       "GlobalMaxPool", "GlobalLpPool",  "LpPool",    "Relu",
                                       "LeakyRelu",     "PRelu",         "Clip",      "Sigmoid",
                                       "Tanh",          "HardSigmoid",   "HardSwish", "Elu",
                                       "Selu",          "Softplus",      "Softsign",  "ThresholdedRelu",
                                       "Round",         "Sign",          "Pad",       "Gather",
                                       "Reshape",       "Transpose",     "Squeeze",   "Unsqueeze",
                                       "Flatten",       "Identity",      "Slice",     "Split",
                                       "Concat"};
  return s;
}

std::string quant_type_name(DType t) {
  switch (t) {
    case DType::kFloat8E4M3FN: return "fp8_e4m3fn";
    case DType::kFloat8E5M2: return "fp8_e5m2";
    case DType::kFloat8E4M3FNUZ: return "fp8_e4m3fnuz";
    case DType::kFloat8E5M2FNUZ: return "fp8_e5m2fnuz";
    default: return std::string(dtype_name(t));
  }
}
bool tensorrt_quant_type(DType t) { return t == DType::kInt8 || t == DType::kFloat8E4M3FN; }

// Producer/consumer index of the Q/DQ graph.
struct Index {
  explicit Index(const Graph& graph) : g(graph) {
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
      for (const auto& o : g.nodes[i].outputs)
        if (!o.empty()) producer[o] = i;
      for (const auto& in : g.nodes[i].inputs)
        if (!in.empty()) consumers[in].push_back(i);
    }
  }
  std::optional<std::size_t> producer_of(const std::string& v) const {
    auto it = producer.find(v);
    if (it == producer.end()) return std::nullopt;
    return it->second;
  }
  const std::vector<std::size_t>& consumers_of(const std::string& v) const {
    static const std::vector<std::size_t> none;
    auto it = consumers.find(v);
    return it == consumers.end() ? none : it->second;
  }
  bool constant(const std::string& v) const { return !v.empty() && g.initializers.count(v) > 0; }

  const Graph& g;
  std::unordered_map<std::string, std::size_t> producer;
  std::unordered_map<std::string, std::vector<std::size_t>> consumers;
};

// The element type a Q/DQ node converts to or from, as TensorRT's ONNX parser decides it: the trt
// FP8 ops are E4M3; otherwise the zero point's type (Q: output_dtype from opset 21), the quantized
// input's type for a DQ, and INT8 when nothing says (ONNX's default would be uint8).
DType qdq_type(const Index& ix, const Node& n, int depth = 0) {
  if (n.domain == "trt") return DType::kFloat8E4M3FN;
  if (is_quantize(n) && n.opset >= 21 && n.get_int("output_dtype", 0) != 0)
    return dtype_from_onnx(static_cast<int>(n.get_int("output_dtype", 0)), n.describe());
  if (n.has_input(2) && ix.constant(n.inputs[2])) return ix.g.initializers.at(n.inputs[2]).dtype();
  if (is_dequantize(n) && n.has_input(0)) {
    const std::string& x = n.inputs[0];
    if (ix.constant(x)) return ix.g.initializers.at(x).dtype();
    if (auto p = ix.producer_of(x); p && is_quantize(ix.g.nodes[*p]) && depth == 0)
      return qdq_type(ix, ix.g.nodes[*p], depth + 1);
    for (const auto& in : ix.g.inputs)
      if (in.name == x) return in.dtype;
  }
  return DType::kInt8;
}

// "3 of 64 values are non-zero (first: 5)", or "" when every value is zero (float8 -0 counts as 0).
std::string nonzero_values(const Tensor& zp) {
  const std::size_t size = dtype_size(zp.dtype());
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(zp.raw());
  const bool fp8 = zp.dtype() == DType::kFloat8E4M3FN || zp.dtype() == DType::kFloat8E5M2;
  std::int64_t count = 0;
  std::string first;
  for (std::int64_t e = 0; e < zp.numel(); ++e) {
    const std::uint8_t* b = bytes + static_cast<std::size_t>(e) * size;
    bool nonzero = false;
    if (fp8) nonzero = (b[0] & 0x7F) != 0;
    else
      for (std::size_t k = 0; k < size; ++k) nonzero = nonzero || b[k] != 0;
    if (!nonzero) continue;
    if (count++ == 0) {
      switch (zp.dtype()) {
        case DType::kInt8: first = std::to_string(zp.data<std::int8_t>()[e]); break;
        case DType::kUInt8: first = std::to_string(zp.data<std::uint8_t>()[e]); break;
        case DType::kInt16: first = std::to_string(zp.data<std::int16_t>()[e]); break;
        case DType::kUInt16: first = std::to_string(zp.data<std::uint16_t>()[e]); break;
        case DType::kInt32: first = std::to_string(zp.data<std::int32_t>()[e]); break;
        case DType::kFloat8E4M3FN: first = fmt::format("{:g}", to_float(float8_e4m3fn{b[0]})); break;
        case DType::kFloat8E5M2: first = fmt::format("{:g}", to_float(float8_e5m2{b[0]})); break;
        default: first = fmt::format("code 0x{:02x}", b[0]);
      }
    }
  }
  if (count == 0) return "";
  return fmt::format("{} of {} value{} non-zero (first: {})", count, zp.numel(), zp.numel() == 1 ? " is" : "s are",
                     first);
}

// One Q or DQ node's parameters.
struct QdqParams {
  DType type = DType::kInt8;
  enum class Granularity { kPerTensor, kPerAxis, kBlocked } granularity = Granularity::kPerTensor;
  bool axis_given = false;
  std::int64_t axis = 1;
  std::string zero_point;      // its name
  std::string nonzero;         // nonzero_values() of a constant zero point
  bool on_activation = false;  // quantizes a run-time value (not a weight)
};

// How a node input is fed through Q/DQ: its DequantizeLinear, possibly behind reshapes/transposes.
struct Trace {
  std::size_t dq = 0;
  std::optional<std::size_t> q;  // the QuantizeLinear feeding the DQ
  bool direct = true;            // the DQ feeds the input itself (no data movement between)
  bool weight = false;           // the quantized value is an initializer
  std::string weight_name;
};

std::optional<Trace> trace_dq(const Index& ix, const std::string& value) {
  std::string v = value;
  bool direct = true;
  for (int depth = 0; depth < 6; ++depth) {
    const auto p = ix.producer_of(v);
    if (!p) return std::nullopt;
    const Node& n = ix.g.nodes[*p];
    if (is_dequantize(n)) {
      Trace t;
      t.dq = *p;
      t.direct = direct;
      const std::string& x = n.inputs[0];
      if (ix.constant(x)) {
        t.weight = true;
        t.weight_name = x;
      } else if (auto q = ix.producer_of(x); q && is_quantize(ix.g.nodes[*q])) {
        t.q = *q;
        if (ix.constant(ix.g.nodes[*q].inputs[0])) {
          t.weight = true;
          t.weight_name = ix.g.nodes[*q].inputs[0];
        }
      }
      return t;
    }
    // Ops TensorRT moves a DQ forward / a Q backward across without changing values.
    if (!n.moves_data_only() || !n.has_input(0)) return std::nullopt;
    v = n.inputs[0];
    direct = false;
  }
  return std::nullopt;
}

// The graph with every Q/DQ removed (consumers read the Q's input, or the quantized initializer)
// and the SmoothQuant pre-scale Muls too (a Mul by a constant read only by QuantizeLinear: qeval's
// and ModelOpt's exports put one before activation quantizers), i.e. the FP32 graph the export came
// from, for the structural classification of select.cc. Initializers keep only their rank: that
// and being constant is all classify_nodes looks at, and copying a large model's weights is costly.
struct FloatView {
  Graph graph;
  std::vector<std::size_t> original;  // view node -> node index in the Q/DQ graph
};

bool is_pre_quant_scale(const Index& ix, const Node& n) {
  if (!n.domain.empty() || n.op_type != "Mul" || n.input_count() != 2 || n.outputs.size() != 1) return false;
  if (ix.constant(n.inputs[0]) == ix.constant(n.inputs[1])) return false;
  const auto& readers = ix.consumers_of(n.outputs[0]);
  return !readers.empty() &&
         std::all_of(readers.begin(), readers.end(), [&](std::size_t c) { return is_quantize(ix.g.nodes[c]); });
}

FloatView float_view(const Index& ix) {
  const Graph& g = ix.g;
  FloatView v;
  v.graph.source = g.source;
  v.graph.opsets = g.opsets;
  v.graph.inputs = g.inputs;
  v.graph.outputs = g.outputs;
  for (const auto& [name, t] : g.initializers)
    v.graph.initializers.emplace(name, Tensor(DType::kFloat32, Shape(static_cast<std::size_t>(t.rank()), 1)));
  std::unordered_map<std::string, std::string> alias;
  auto resolve = [&](std::string s) {
    for (auto it = alias.find(s); it != alias.end(); it = alias.find(s)) s = it->second;
    return s;
  };
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if ((is_quantize(n) || is_dequantize(n)) && n.has_input(0) && !n.outputs.empty() && !n.outputs[0].empty()) {
      alias[n.outputs[0]] = resolve(n.inputs[0]);
      continue;
    }
    if (is_pre_quant_scale(ix, n)) {
      alias[n.outputs[0]] = resolve(ix.constant(n.inputs[0]) ? n.inputs[1] : n.inputs[0]);
      continue;
    }
    Node c = n;
    for (auto& in : c.inputs)
      if (!in.empty()) in = resolve(in);
    v.graph.nodes.push_back(std::move(c));
    v.original.push_back(i);
  }
  return v;
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

class Linter {
 public:
  Linter(const Graph& g, const LintOptions& o) : g_(g), o_(o), ix_(g) {
    for (const auto& entry : o_.input_shapes) {  // no structured binding: clang 14 cannot capture one
      const std::string& name = entry.first;
      if (std::none_of(g_.inputs.begin(), g_.inputs.end(), [&](const ValueInfo& v) { return v.name == name; }))
        throw InputError(g_.source + ": --shape " + name + ": the model has no input named '" + name + "'");
    }
  }

  LintReport run() {
    LintReport r;
    r.model = g_.source;
    r.target_sm = o_.target_sm;
    check_qdq_nodes();
    check_operator_format();
    check_compute_nodes();
    check_dq_consumers();
    summarize_int8_attention();
    if (qdq_count_ == 0 && !has_qoperator_)
      add("no-qdq", Severity::kInfo, std::nullopt, {},
          "the model has no QuantizeLinear/DequantizeLinear nodes: TensorRT builds it in FP16/FP32 "
          "(explicit quantization needs Q/DQ)",
          "export a quantized model (qeval calibrate --out DIR writes DIR/quantized.onnx)");
    std::stable_sort(findings_.begin(), findings_.end(),
                     [](const LintFinding& a, const LintFinding& b) { return a.severity > b.severity; });
    r.findings = std::move(findings_);
    r.nodes = std::move(nodes_);
    r.qdq_nodes = qdq_count_;
    return r;
  }

 private:
  const Node& node(std::size_t i) const { return g_.nodes[i]; }

  void add(const std::string& rule, Severity severity, std::optional<std::size_t> n, std::vector<std::string> related,
           std::string message, std::string fix) {
    LintFinding f;
    f.rule = rule;
    f.severity = severity;
    if (n) {
      f.node = node(*n).name;
      f.op_type = node(*n).op_type;
    }
    f.related = std::move(related);
    f.message = std::move(message);
    f.fix = std::move(fix);
    findings_.push_back(std::move(f));
  }

  // ---- parameters of every Q/DQ node ----------------------------------------------------------

  void check_qdq_nodes() {
    std::vector<std::size_t> fp8;
    for (std::size_t i = 0; i < g_.nodes.size(); ++i) {
      const Node& n = node(i);
      if (!is_quantize(n) && !is_dequantize(n)) continue;
      ++qdq_count_;
      QdqParams p;
      p.type = qdq_type(ix_, n);
      if (n.has_input(1) && ix_.constant(n.inputs[1])) {
        const Tensor& scale = g_.initializers.at(n.inputs[1]);
        if (scale.numel() > 1)
          p.granularity = n.get_int("block_size", 0) > 0 || scale.rank() >= 2 ? QdqParams::Granularity::kBlocked
                                                                              : QdqParams::Granularity::kPerAxis;
      }
      p.axis_given = n.has("axis");
      p.axis = n.get_int("axis", 1);
      if (n.has_input(2)) {
        p.zero_point = n.inputs[2];
        if (ix_.constant(p.zero_point)) p.nonzero = nonzero_values(g_.initializers.at(p.zero_point));
      }
      if (is_quantize(n)) {
        p.on_activation = n.has_input(0) && !ix_.constant(n.inputs[0]);
      } else {
        const std::string& x = n.has_input(0) ? n.inputs[0] : std::string();
        const auto q = ix_.producer_of(x);
        p.on_activation = !ix_.constant(x) && !(q && is_quantize(node(*q)) && ix_.constant(node(*q).inputs[0]));
      }
      params_[i] = p;

      // A DQ fed by a Q shares its findings with that Q: report each problem once, on the Q.
      std::optional<std::size_t> pair_q;
      if (is_dequantize(n) && n.has_input(0))
        if (auto q = ix_.producer_of(n.inputs[0]); q && is_quantize(node(*q))) pair_q = *q;
      auto reported_on_pair = [&](const std::string& rule) { return pair_q && errors_[*pair_q].count(rule) > 0; };
      auto related = [&]() -> std::vector<std::string> {
        std::vector<std::string> v;
        if (pair_q) v.push_back(node(*pair_q).name);
        if (is_quantize(n) && !n.outputs.empty())
          for (std::size_t c : ix_.consumers_of(n.outputs[0])) v.push_back(node(c).name);
        return v;
      };

      if (!tensorrt_quant_type(p.type)) {
        errors_[i].insert("unsupported-type");
        if (!reported_on_pair("unsupported-type")) {
          std::string why = "TensorRT's Q/DQ layers quantize to INT8 or FP8 E4M3 only";
          if (p.type == DType::kUInt8)
            why +=
                " (its ONNX parser rejects UINT8 data and reads a UINT8 zero point as INT8, which "
                "changes the quantized range)";
          add("unsupported-type", Severity::kError, i, related(),
              fmt::format("quantizes to {}: {}", quant_type_name(p.type), why),
              "re-export with int8 (symmetric, zero point 0) or float8e4m3fn Q/DQ");
        }
      }
      if (!p.nonzero.empty()) {
        errors_[i].insert("zero-point");
        if (!reported_on_pair("zero-point"))
          add("zero-point", Severity::kError, i, related(),
              fmt::format("zero point '{}': {}; TensorRT only supports symmetric quantization (zero point 0)",
                          p.zero_point, p.nonzero),
              "re-quantize symmetrically: scale = amax / 127 (INT8) or amax / 448 (FP8), zero point 0");
      }
      if (p.on_activation && p.granularity != QdqParams::Granularity::kPerTensor) {
        errors_[i].insert("activation-per-channel");
        if (!reported_on_pair("activation-per-channel"))
          add("activation-per-channel", Severity::kError, i, related(),
              fmt::format("{} scales on an activation ('{}'): TensorRT quantizes activations per tensor only",
                          p.granularity == QdqParams::Granularity::kPerAxis ? "per-axis" : "blocked", n.inputs[0]),
              "use one scale for the tensor (per-channel scales belong on weights, along the output channels)");
      }
      if (p.type == DType::kFloat8E4M3FN) fp8.push_back(i);
    }
    if (fp8.empty()) return;
    std::vector<std::string> more;
    for (std::size_t k = 1; k < fp8.size(); ++k) more.push_back(node(fp8[k]).name);
    const std::string what = fmt::format("{} Q/DQ node{} use FP8 E4M3", fp8.size(), fp8.size() == 1 ? "" : "s");
    if (o_.target_sm == 0) {
      add("fp8-target", Severity::kInfo, fp8[0], more,
          what + ": TensorRT runs FP8 on sm89 (Ada) and sm90 (Hopper) and later only",
          "pass --target to check the GPU you build for");
    } else if (o_.target_sm < kFp8MinSm) {
      for (std::size_t i : fp8) errors_[i].insert("fp8-target");
      add("fp8-target", Severity::kError, fp8[0], more,
          fmt::format("{}: sm{} has no FP8 tensor cores; TensorRT supports FP8 from sm89 (Ada) and sm90 "
                      "(Hopper)",
                      what, o_.target_sm),
          "build this FP8 model for sm89/sm90, or quantize with an INT8 recipe (e.g. recipes/int8-level3.json) "
          "for this GPU");
    }
  }

  // ONNX Runtime's operator-oriented quantization (QOperator format): no TensorRT importer.
  void check_operator_format() {
    static const std::set<std::string> qoperator{"QLinearConv",
                                                 "QLinearMatMul",
                                                 "ConvInteger",
                                                 "MatMulInteger",
                                                 "DynamicQuantizeLinear",
                                                 "QLinearAdd",
                                                 "QLinearMul",
                                                 "QLinearSigmoid",
                                                 "QLinearLeakyRelu",
                                                 "QLinearAveragePool",
                                                 "QLinearGlobalAveragePool",
                                                 "QLinearConcat",
                                                 "QLinearSoftmax",
                                                 "QGemm",
                                                 "QAttention",
                                                 "DynamicQuantizeMatMul"};
    for (std::size_t i = 0; i < g_.nodes.size(); ++i) {
      const Node& n = node(i);
      if ((!n.domain.empty() && n.domain != "com.microsoft") || !qoperator.count(n.op_type)) continue;
      has_qoperator_ = true;
      add("qoperator-format", Severity::kError, i, {},
          n.op_type +
              " is ONNX Runtime's operator-oriented quantization: TensorRT's ONNX parser has no "
              "importer for it (TensorRT reads quantization as QuantizeLinear/DequantizeLinear only)",
          "re-quantize in QDQ format (ONNX Runtime's quantize_static with QuantFormat.QDQ, ModelOpt, or qeval "
          "calibrate), symmetric and with INT8 weights per output channel");
    }
  }

  // ---- Conv / MatMul / Gemm --------------------------------------------------------------------

  struct Operand {
    std::size_t input = 0;
    bool weight = false;
    std::optional<Trace> trace;
  };

  // Rules with error severity on the Q/DQ nodes of an operand (they keep TensorRT from fusing it).
  std::set<std::string> operand_errors(const Operand& op) {
    std::set<std::string> s;
    if (!op.trace) return s;
    for (const auto& r : errors_[op.trace->dq]) s.insert(r);
    if (op.trace->q)
      for (const auto& r : errors_[*op.trace->q]) s.insert(r);
    return s;
  }

  std::vector<std::string> qdq_names(const std::vector<Operand>& ops) const {
    std::vector<std::string> v;
    for (const auto& op : ops) {
      if (!op.trace) continue;
      if (op.trace->q) v.push_back(node(*op.trace->q).name);
      v.push_back(node(op.trace->dq).name);
    }
    return v;
  }

  // The output-channel axis of weight input `input` of compute node n (weight of rank `rank`), or
  // -1 when there is no single one to check.
  static int expected_weight_axis(const Node& n, std::size_t input, int rank) {
    if (input != 1) return -1;
    if (n.op_type == "Conv") return 0;
    if (n.op_type == "ConvTranspose") return 1;
    if (n.op_type == "MatMul") return rank - 1;
    if (n.op_type == "Gemm") return n.get_int("transB", 0) != 0 ? 0 : 1;
    return -1;
  }

  void check_compute_nodes() {
    const FloatView view = float_view(ix_);
    const std::vector<QuantTarget> classes = classify_nodes(view.graph);
    const std::regex defaults(kDefaultExclusionPattern);
    const bool diffusers_unet = is_diffusers_unet(view.graph);  // where the defaults apply
    for (std::size_t j = 0; j < view.graph.nodes.size(); ++j) {
      const std::size_t i = view.original[j];
      const Node& n = node(i);
      if (!is_compute(n)) continue;
      const Node& vn = view.graph.nodes[j];
      LintNode ln;
      ln.name = n.name;
      ln.op_type = n.op_type;
      ln.category = classes[j].category;

      std::vector<Operand> ops;
      std::string weight_name;
      for (std::size_t k = 0; k < 2 && k < n.inputs.size(); ++k) {
        if (!n.has_input(k)) continue;
        Operand op;
        op.input = k;
        op.weight = view.graph.initializers.count(vn.inputs[k]) > 0;
        op.trace = trace_dq(ix_, n.inputs[k]);
        if (op.weight) weight_name = vn.inputs[k];
        ops.push_back(op);
      }
      std::set<std::string> blockers;
      std::vector<const Operand*> quantized, plain;
      for (const auto& op : ops) (op.trace ? quantized : plain).push_back(&op);
      std::set<DType> types;
      for (const Operand* op : quantized) {
        const DType t = params_.at(op->trace->dq).type;
        if (!types.count(t)) ln.format += (ln.format.empty() ? "" : "+") + quant_type_name(t);
        types.insert(t);
        for (const auto& r : operand_errors(*op)) blockers.insert(r);
        if (op->weight) check_weight_axis(i, *op, blockers);
      }
      const bool has_weight = std::any_of(ops.begin(), ops.end(), [](const Operand& o) { return o.weight; });

      if (quantized.empty()) {
        const bool excluded =
            category_level(ln.category) > 0 && diffusers_unet &&
            (std::regex_search(n.name, defaults) || (!weight_name.empty() && std::regex_search(weight_name, defaults)));
        ln.reason = excluded ? HighPrecisionReason::kExcluded : HighPrecisionReason::kNotSelected;
      } else if (has_weight && plain.size() == 1 && !plain[0]->weight) {
        weight_only(i, ln, ops, blockers);
      } else if (!plain.empty()) {
        partial(i, ln, ops, has_weight, blockers);
      } else if (types.size() > 1 && std::all_of(types.begin(), types.end(), tensorrt_quant_type)) {
        blockers.insert("mixed-formats");
        add("mixed-formats", Severity::kWarning, i, qdq_names(ops),
            fmt::format("its operands are quantized to different types ({}); TensorRT has no kernel "
                        "multiplying {} and runs the node in high precision",
                        ln.format, ln.format),
            "quantize both operands to the same type");
      }
      if (!quantized.empty() && ln.reason == HighPrecisionReason::kNone && ln.state != ComputeState::kWeightOnly) {
        if (blockers.empty()) {
          ln.state = ComputeState::kQuantized;
          if (types.size() == 1 && *types.begin() == DType::kInt8 &&
              (ln.category == NodeCategory::kAttentionQK || ln.category == NodeCategory::kAttentionAV))
            check_int8_attention(i, ln.category, ops);
        } else {
          ln.reason = HighPrecisionReason::kUnfusable;
        }
      }
      if (ln.reason == HighPrecisionReason::kUnfusable && ln.detail.empty())
        ln.detail = join(std::vector<std::string>(blockers.begin(), blockers.end()));
      nodes_.push_back(ln);
    }
    // Why the rest are not quantized, relative to the highest level the graph quantizes.
    double graph_level = 0;
    for (const auto& ln : nodes_)
      if (ln.state != ComputeState::kHighPrecision) graph_level = std::max(graph_level, category_level(ln.category));
    for (auto& ln : nodes_) {
      const double level = category_level(ln.category);
      if (ln.reason == HighPrecisionReason::kExcluded)
        ln.detail = "its name matches the TensorRT diffusion demo's default exclusions";
      if (ln.reason != HighPrecisionReason::kNotSelected) continue;
      if (level == 0)
        ln.detail = fmt::format("category {}: no quantization level includes it", category_name(ln.category));
      else if (graph_level == 0)
        ln.detail = fmt::format("category {} (level {}); the graph quantizes no Conv/MatMul/Gemm",
                                category_name(ln.category), level_string(level));
      else
        ln.detail = fmt::format("category {} (level {}); the graph's quantized nodes go up to level {}",
                                category_name(ln.category), level_string(level), level_string(graph_level));
    }
  }

  void check_weight_axis(std::size_t i, const Operand& op, std::set<std::string>& blockers) {
    const QdqParams& p = params_.at(op.trace->dq);
    if (p.granularity != QdqParams::Granularity::kPerAxis || !op.trace->direct || !op.trace->weight) return;
    const Node& n = node(i);
    const int rank = g_.initializers.at(op.trace->weight_name).rank();
    const int expected = expected_weight_axis(n, op.input, rank);
    if (expected < 0) return;
    const std::int64_t axis = p.axis < 0 ? p.axis + rank : p.axis;
    if (p.axis_given && axis == expected) return;
    blockers.insert("weight-axis");
    const std::string layout = n.op_type == "Conv"            ? "[out, in, kH, kW]"
                               : n.op_type == "ConvTranspose" ? "[in, out, kH, kW]"
                               : n.op_type == "MatMul"        ? "[K, N]"
                                                              : (expected == 0 ? "[N, K] (transB=1)" : "[K, N]");
    const std::string declared =
        p.axis_given ? fmt::format("axis {}", axis)
                     : "no axis attribute (ONNX reads axis 1, TensorRT's ONNX parser axis 0: they disagree)";
    add("weight-axis", Severity::kError, i, {node(op.trace->dq).name},
        fmt::format("weight '{}' {} is quantized per channel with {}; TensorRT takes per-channel weight "
                    "scales along the output channels only (axis {})",
                    op.trace->weight_name, layout, declared, expected),
        fmt::format("quantize the weight per output channel (axis={} on '{}'), or per tensor", expected,
                    node(op.trace->dq).name));
  }

  void weight_only(std::size_t i, LintNode& ln, const std::vector<Operand>& ops, std::set<std::string>& blockers) {
    const Node& n = node(i);
    if (n.op_type == "Conv" || n.op_type == "ConvTranspose") {
      blockers.insert("weight-only");
      ln.reason = HighPrecisionReason::kUnfusable;
      add("weight-only", Severity::kWarning, i, qdq_names(ops),
          "only the weight is quantized: TensorRT has no weight-only convolution kernels (weight-only "
          "quantization is for GEMMs), so it dequantizes the weight at build time and runs the "
          "convolution in FP16/FP32: no INT8 speed-up, and the weight keeps its rounding error",
          fmt::format("quantize the activation input too (a Q/DQ pair on '{}'), or drop the weight's DQ", n.inputs[0]));
      return;
    }
    if (o_.target_sm != 0 && o_.target_sm < kWeightOnlyGemmMinSm) {
      blockers.insert("weight-only");
      ln.reason = HighPrecisionReason::kUnfusable;
      add("weight-only", Severity::kWarning, i, qdq_names(ops),
          fmt::format("only the weight is quantized: weight-only GEMM kernels need sm80 (Ampere) or later; on "
                      "sm{} TensorRT dequantizes the weight at build time and runs the GEMM in FP16",
                      o_.target_sm),
          fmt::format("quantize the activation input too (a Q/DQ pair on '{}') for an INT8 GEMM", n.inputs[0]));
      return;
    }
    ln.state = ComputeState::kWeightOnly;
    add("weight-only", Severity::kInfo, i, qdq_names(ops),
        "only the weight is quantized: a weight-only GEMM (weights stored quantized, FP16 math); it saves "
        "memory, not compute",
        fmt::format("quantize the activation input too (a Q/DQ pair on '{}') for an INT8/FP8 GEMM", n.inputs[0]));
  }

  void partial(std::size_t i, LintNode& ln, const std::vector<Operand>& ops, bool has_weight,
               std::set<std::string>& blockers) {
    const Node& n = node(i);
    ln.reason = HighPrecisionReason::kUnfusable;
    std::vector<std::string> missing;
    for (const auto& op : ops)
      if (!op.trace) missing.push_back(fmt::format("input {} '{}'", op.input, n.inputs[op.input]));
    if (has_weight) {
      blockers.insert("activation-only");
      add("activation-only", Severity::kWarning, i, qdq_names(ops),
          fmt::format("the activation is quantized but the weight {} is not: TensorRT fuses Q/DQ into a "
                      "Conv/MatMul/Gemm only when all its inputs are quantized, so the node runs in high "
                      "precision and the Q/DQ pair only adds rounding error",
                      join(missing)),
          "quantize the weight too (per output channel), or remove the activation's Q/DQ pair");
    } else {
      blockers.insert("one-input-quantized");
      add("one-input-quantized", Severity::kWarning, i, qdq_names(ops),
          fmt::format("one operand is quantized, {} is not: TensorRT runs the matmul in high precision "
                      "(it fuses Q/DQ only when both operands are quantized)",
                      join(missing)),
          "quantize both operands (level 4 quantizes both inputs of the attention matmuls), or neither");
    }
  }

  // ---- INT8 attention and TensorRT's fused MHA -------------------------------------------------

  const std::map<std::string, ValueMeta>* metas() {
    if (metas_tried_) return metas_ ? &*metas_ : nullptr;
    metas_tried_ = true;
    std::set<std::string> unsupported;
    for (const auto& n : g_.nodes)
      if (!find_op(n.domain, n.op_type, n.opset))
        unsupported.insert((n.domain.empty() ? "" : n.domain + "::") + n.op_type);
    if (!unsupported.empty()) {
      add("attention-shapes", Severity::kWarning, std::nullopt, {},
          "the INT8 attention checks were skipped: qeval cannot infer shapes through " +
              join(std::vector<std::string>(unsupported.begin(), unsupported.end())),
          "check the attention sequence lengths and head sizes by hand (INT8 fused MHA: head size 16, 32 "
          "or 64, sequence lengths <= 512)");
      return nullptr;
    }
    std::map<std::string, Shape> shapes;
    const std::map<std::string, Shape> sdxl = sdxl_shapes();
    std::vector<std::string> sdxl_taken;
    for (const auto& in : g_.inputs) {
      if (auto it = o_.input_shapes.find(in.name); it != o_.input_shapes.end()) {
        shapes[in.name] = it->second;
        continue;
      }
      const bool fixed =
          in.has_shape && std::all_of(in.dims.begin(), in.dims.end(), [](std::int64_t d) { return d >= 0; });
      if (fixed) {
        shapes[in.name] = in.dims;
        continue;
      }
      if (auto it = sdxl.find(in.name); it != sdxl.end()) {
        shapes[in.name] = it->second;
        sdxl_taken.push_back(in.name + "=" + shape_to_string(it->second));
        continue;
      }
      std::string dims = "[";
      for (std::size_t d = 0; d < in.dims.size(); ++d)
        dims += (d ? ", " : "") +
                (in.dims[d] >= 0 ? std::to_string(in.dims[d]) : (in.dim_params[d].empty() ? "?" : in.dim_params[d]));
      throw InputError(g_.source + ": the INT8 attention checks need concrete shapes, and input '" + in.name + "' is " +
                       (in.has_shape ? dims + "]" : "of unknown shape") + ": pass --shape " + in.name +
                       "=D0,D1,... (repeatable, as for qeval infer)");
    }
    if (!sdxl_taken.empty())
      add("sdxl-shapes", Severity::kInfo, std::nullopt, {},
          "an SDXL UNet (inputs text_embeds and time_ids) with dynamic inputs: the attention checks take SDXL's "
          "1024x1024 generation with classifier-free guidance: " +
              join(sdxl_taken, ", "),
          "pass --shape NAME=D0,D1,... to lint another resolution or batch");
    SessionOptions plain;
    plain.integer_qdq = false;  // keep every DQ output: the attention operands are DQ outputs
    Session session(g_, plain);
    metas_ = session.infer_metas(shapes);
    return &*metas_;
  }

  void check_int8_attention(std::size_t i, NodeCategory category, const std::vector<Operand>& ops) {
    const Node& n = node(i);
    const auto* m = metas();
    if (m) {
      const auto ia = m->find(n.inputs[0]), ib = m->find(n.inputs[1]);
      const Shape a = ia == m->end() ? Shape{} : ia->second.shape;
      const Shape b = ib == m->end() ? Shape{} : ib->second.shape;
      if (a.size() >= 2 && b.size() >= 2) {
        std::int64_t head, s_q, s_kv;
        if (category == NodeCategory::kAttentionQK) {  // [.., S_q, H] x [.., H, S_kv]
          head = a.back();
          s_q = a[a.size() - 2];
          s_kv = b.back();
        } else {  // [.., S_q, S_kv] x [.., S_kv, H]
          head = b.back();
          s_q = a[a.size() - 2];
          s_kv = b[b.size() - 2];
        }
        std::vector<std::string> why;
        if (head != 16 && head != 32 && head != 64)
          why.push_back(fmt::format("head size {} is not 16, 32 or 64", head));
        if (s_q > kInt8MhaMaxSequence || s_kv > kInt8MhaMaxSequence)
          why.push_back(fmt::format("sequence length {} exceeds {}", std::max(s_q, s_kv), kInt8MhaMaxSequence));
        if (!why.empty()) {
          unfused_attention_.push_back({s_q, s_kv, head});
          add("attention-int8", Severity::kWarning, i, qdq_names(ops),
              fmt::format("INT8 attention {} (S_q {}, S_kv {}, head size {}): {}; TensorRT's INT8 fused MHA "
                          "kernel takes head sizes 16/32/64 and sequence lengths <= 512 only, so this attention "
                          "runs as separate INT8 matmuls and softmax and can be slower than FP16 fused MHA",
                          category == NodeCategory::kAttentionQK ? "BMM1 (Q K^T)" : "BMM2 (P V)", s_q, s_kv, head,
                          join(why, " and ")),
              "keep this attention's batched matmuls in FP16 (a level-3 recipe, or exclude them), or use FP8 "
              "attention on sm89/sm90");
        }
      }
    }
    if (category != NodeCategory::kAttentionAV) return;
    if (!reaches_quantize(n.outputs[0], 6))
      add("attention-int8-placement", Severity::kWarning, i, qdq_names(ops),
          "the output of this INT8 BMM2 is not quantized: TensorRT generates its INT8 fused MHA only with "
          "Q/DQ before BMM1, after the softmax and after BMM2",
          "quantize the attention output (the input of the output projection, which level 3 and up do), or "
          "keep the attention in FP16");
  }

  // SDXL's shapes at 1024x1024 with classifier-free guidance (batch 2): 128x128 latents, 77 tokens;
  // the widths are the graph's where it fixes them, else SDXL base's (2048-wide context, 1280-wide
  // pooled embedding). Empty unless the graph is an SDXL UNet (sample, encoder_hidden_states,
  // text_embeds, time_ids).
  std::map<std::string, Shape> sdxl_shapes() const {
    auto input = [&](const std::string& name) { return find_value(g_.inputs, name); };
    const ValueInfo *sample = input("sample"), *context = input("encoder_hidden_states"),
                    *pooled = input("text_embeds"), *time_ids = input("time_ids");
    if (!sample || !context || !pooled || !time_ids) return {};
    auto dim = [](const ValueInfo* v, std::size_t d, std::int64_t fallback) {
      return v->has_shape && d < v->dims.size() && v->dims[d] > 0 ? v->dims[d] : fallback;
    };
    std::map<std::string, Shape> s = {{"sample", {2, dim(sample, 1, 4), 128, 128}},
                                      {"encoder_hidden_states", {2, 77, dim(context, 2, 2048)}},
                                      {"text_embeds", {2, dim(pooled, 1, 1280)}},
                                      {"time_ids", {2, 6}}};
    if (const ValueInfo* t = input("timestep"); t && t->has_shape && t->dims.size() == 1) s["timestep"] = {2};
    return s;
  }

  // One finding that says which quantization level avoids TensorRT's INT8-slower-than-FP16 case.
  void summarize_int8_attention() {
    if (unfused_attention_.empty()) return;
    std::set<std::int64_t> lengths, heads;
    for (const auto& a : unfused_attention_) {
      lengths.insert(std::max(a.s_q, a.s_kv));
      heads.insert(a.head);
    }
    std::vector<std::string> ls, hs;
    for (auto it = lengths.rbegin(); it != lengths.rend(); ++it) ls.push_back(std::to_string(*it));
    for (std::int64_t h : heads) hs.push_back(std::to_string(h));
    add("attention-int8-level", Severity::kWarning, std::nullopt, {},
        fmt::format("{} INT8 attention matmuls cannot use TensorRT's INT8 fused MHA (longest sequences {}; head "
                    "sizes {}): they run unfused and the INT8 engine can be slower than FP16 (NVIDIA/TensorRT#3724, "
                    "SDXL at 1024x1024: 4096 and 1024 tokens, head size 64). Quantization level 4 (attention "
                    "matmuls in INT8) causes it; level 3 does not",
                    unfused_attention_.size(), join(ls, ", "), join(hs, ", ")),
        "quantize at level 3 (recipes/int8-level3.json: convolutions and linear layers in INT8, the attention "
        "matmuls in FP16 where TensorRT fuses them), or level 4 in FP8 on sm89/sm90 (recipes/fp8-level4.json)");
  }

  // Whether value v reaches a QuantizeLinear through data movement and scaling by constants.
  bool reaches_quantize(const std::string& v, int depth) const {
    if (depth == 0) return false;
    for (std::size_t c : ix_.consumers_of(v)) {
      const Node& n = node(c);
      if (is_quantize(n)) return true;
      const bool scale_by_constant = n.domain.empty() && (n.op_type == "Mul" || n.op_type == "Div") &&
                                     n.input_count() == 2 && (ix_.constant(n.inputs[0]) || ix_.constant(n.inputs[1]));
      if (n.moves_data_only() || scale_by_constant)
        for (const auto& o : n.outputs)
          if (!o.empty() && reaches_quantize(o, depth - 1)) return true;
    }
    return false;
  }

  // ---- where dequantized activations go ---------------------------------------------------------

  void consumers_through(const std::string& v, int depth, std::vector<std::size_t>& out) const {
    for (std::size_t c : ix_.consumers_of(v)) {
      const Node& n = node(c);
      if (depth > 0 && n.domain.empty() && forward_through_ops().count(n.op_type)) {
        for (const auto& o : n.outputs)
          if (!o.empty()) consumers_through(o, depth - 1, out);
        continue;
      }
      if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
    }
  }

  void check_dq_consumers() {
    for (std::size_t i = 0; i < g_.nodes.size(); ++i) {
      const Node& n = node(i);
      if (!is_dequantize(n) || !params_.at(i).on_activation || n.outputs.empty()) continue;
      std::vector<std::size_t> consumers;
      consumers_through(n.outputs[0], 4, consumers);
      std::vector<std::string> int8, high;
      for (std::size_t c : consumers) {
        const Node& cn = node(c);
        const bool capable =
            is_quantize(cn) || is_dequantize(cn) || (cn.domain.empty() && int8_ops().count(cn.op_type));
        (capable ? int8 : high).push_back(fmt::format("{} ({})", cn.name, cn.op_type));
      }
      if (high.empty()) continue;
      std::vector<std::string> related;
      if (auto q = ix_.producer_of(n.inputs[0]); q && is_quantize(node(*q))) related.push_back(node(*q).name);
      for (std::size_t c : consumers) related.push_back(node(c).name);
      if (int8.empty())
        add("qdq-no-int8-op", Severity::kWarning, i, related,
            fmt::format("the dequantized value only feeds {}, which {} no INT8 implementation in TensorRT: the "
                        "Q/DQ pair fuses into nothing and runs as a quantize and a dequantize that only add "
                        "rounding error",
                        join(high), high.size() == 1 ? "has" : "have"),
            "remove this Q/DQ pair, or move it to the input of the Conv/MatMul/Gemm that follows");
      else
        add("shared-dq", Severity::kWarning, i, related,
            fmt::format("the dequantized value feeds {} consumers: {} can fuse the DQ, {} cannot; TensorRT "
                        "keeps a separate dequantize for the latter, which then compute on INT8-rounded values",
                        consumers.size(), join(int8), join(high)),
            "give the Conv/MatMul/Gemm its own Q/DQ pair and let the other consumers read the unquantized "
            "tensor (one quantizer per consumer input, as qeval and ModelOpt export)");
    }
  }

  const Graph& g_;
  const LintOptions& o_;
  Index ix_;
  int qdq_count_ = 0;
  bool has_qoperator_ = false;
  std::unordered_map<std::size_t, QdqParams> params_;
  std::unordered_map<std::size_t, std::set<std::string>> errors_;  // error rules per Q/DQ node
  std::vector<LintFinding> findings_;
  std::vector<LintNode> nodes_;
  bool metas_tried_ = false;
  struct UnfusedAttention {
    std::int64_t s_q, s_kv, head;
  };
  std::vector<UnfusedAttention> unfused_attention_;  // INT8 attention matmuls the fused MHA does not take
  std::optional<std::map<std::string, ValueMeta>> metas_;
};

}  // namespace

LintReport lint_graph(const Graph& graph, const LintOptions& options) { return Linter(graph, options).run(); }

// ---- the report -----------------------------------------------------------------------------------

int LintReport::count(Severity s) const {
  return static_cast<int>(
      std::count_if(findings.begin(), findings.end(), [&](const LintFinding& f) { return f.severity == s; }));
}
int LintReport::count(ComputeState s) const {
  return static_cast<int>(std::count_if(nodes.begin(), nodes.end(), [&](const LintNode& n) { return n.state == s; }));
}
int LintReport::count(HighPrecisionReason r) const {
  return static_cast<int>(std::count_if(nodes.begin(), nodes.end(), [&](const LintNode& n) {
    return n.state == ComputeState::kHighPrecision && n.reason == r;
  }));
}

namespace {

struct CategoryRow {
  int total = 0, quantized = 0, weight_only = 0, not_selected = 0, excluded = 0, unfusable = 0;
};

std::map<NodeCategory, CategoryRow> category_rows(const std::vector<LintNode>& nodes) {
  std::map<NodeCategory, CategoryRow> rows;
  for (const auto& n : nodes) {
    CategoryRow& r = rows[n.category];
    ++r.total;
    if (n.state == ComputeState::kQuantized) ++r.quantized;
    else if (n.state == ComputeState::kWeightOnly) ++r.weight_only;
    else if (n.reason == HighPrecisionReason::kExcluded) ++r.excluded;
    else if (n.reason == HighPrecisionReason::kUnfusable) ++r.unfusable;
    else ++r.not_selected;
  }
  return rows;
}

std::map<std::string, int> format_counts(const std::vector<LintNode>& nodes) {
  std::map<std::string, int> formats;
  for (const auto& n : nodes)
    if (n.state != ComputeState::kHighPrecision) ++formats[n.format];
  return formats;
}

}  // namespace

nlohmann::ordered_json LintReport::to_json() const {
  using json = nlohmann::ordered_json;
  json j;
  j["schema_version"] = 1;
  j["model"] = model;
  j["target"] = target_sm ? json("sm" + std::to_string(target_sm)) : json(nullptr);
  j["counts"] = {
      {"error", count(Severity::kError)}, {"warning", count(Severity::kWarning)}, {"note", count(Severity::kInfo)}};
  json fs = json::array();
  for (const auto& f : findings)
    fs.push_back({{"rule", f.rule},
                  {"severity", severity_name(f.severity)},
                  {"node", f.node},
                  {"op_type", f.op_type},
                  {"related", f.related},
                  {"message", f.message},
                  {"fix", f.fix}});
  j["findings"] = fs;
  json by_category = json::array();
  for (const auto& [c, r] : category_rows(nodes))
    by_category.push_back({{"category", category_name(c)},
                           {"total", r.total},
                           {"quantized", r.quantized},
                           {"weight_only", r.weight_only},
                           {"not_selected", r.not_selected},
                           {"excluded", r.excluded},
                           {"unfusable", r.unfusable}});
  json formats = json::object();
  for (const auto& [f, k] : format_counts(nodes)) formats[f] = k;
  j["summary"] = {{"qdq_nodes", qdq_nodes},
                  {"compute_nodes", nodes.size()},
                  {"quantized", count(ComputeState::kQuantized)},
                  {"weight_only", count(ComputeState::kWeightOnly)},
                  {"high_precision", count(ComputeState::kHighPrecision)},
                  {"not_selected", count(HighPrecisionReason::kNotSelected)},
                  {"excluded", count(HighPrecisionReason::kExcluded)},
                  {"unfusable", count(HighPrecisionReason::kUnfusable)},
                  {"formats", formats},
                  {"by_category", by_category}};
  json ns = json::array();
  for (const auto& n : nodes)
    ns.push_back({{"name", n.name},
                  {"op_type", n.op_type},
                  {"category", category_name(n.category)},
                  {"state", compute_state_name(n.state)},
                  {"format", n.format},
                  {"reason", reason_name(n.reason)},
                  {"detail", n.detail}});
  j["nodes"] = ns;
  return j;
}

std::string LintReport::to_text(std::size_t max_per_rule) const {
  std::string s =
      fmt::format("qeval lint: {} ({})\n", model, target_sm ? fmt::format("target sm{}", target_sm) : "no --target");
  const int e = count(Severity::kError), w = count(Severity::kWarning), n = count(Severity::kInfo);
  s += fmt::format("{} Q/DQ nodes; {} error{}, {} warning{}, {} note{}\n", qdq_nodes, e, e == 1 ? "" : "s", w,
                   w == 1 ? "" : "s", n, n == 1 ? "" : "s");
  std::map<std::string, std::size_t> shown, hidden;
  for (const auto& f : findings) {
    if (shown[f.rule]++ >= max_per_rule) {
      ++hidden[f.rule];
      continue;
    }
    s += fmt::format("\n{:<8}{}  {}\n", severity_name(f.severity), f.rule,
                     f.node.empty() ? std::string("(graph)") : fmt::format("{} ({})", f.node, f.op_type));
    s += "  " + f.message + "\n";
    if (!f.related.empty()) {
      const std::size_t k = std::min<std::size_t>(f.related.size(), 6);
      std::vector<std::string> head(f.related.begin(), f.related.begin() + static_cast<std::ptrdiff_t>(k));
      s += "  nodes: " + join(head) +
           (f.related.size() > head.size() ? fmt::format(" (+{} more)", f.related.size() - head.size()) : "") + "\n";
    }
    s += "  fix: " + f.fix + "\n";
  }
  for (const auto& [rule, k] : hidden)
    s += fmt::format("\n... {} more '{}' finding{} (all of them in --json)\n", k, rule, k == 1 ? "" : "s");

  s += fmt::format("\nConv/MatMul/Gemm: {} nodes: {} quantized", nodes.size(), count(ComputeState::kQuantized));
  const auto formats = format_counts(nodes);
  if (!formats.empty()) {
    std::vector<std::string> parts;
    for (const auto& [f, k] : formats) parts.push_back(fmt::format("{} {}", f, k));
    s += " (" + join(parts) + ")";
  }
  s += fmt::format(", {} weight-only, {} high precision ({} not selected, {} excluded, {} unfusable)\n",
                   count(ComputeState::kWeightOnly), count(ComputeState::kHighPrecision),
                   count(HighPrecisionReason::kNotSelected), count(HighPrecisionReason::kExcluded),
                   count(HighPrecisionReason::kUnfusable));
  for (auto reason :
       {HighPrecisionReason::kNotSelected, HighPrecisionReason::kExcluded, HighPrecisionReason::kUnfusable}) {
    std::vector<std::string> names;
    for (const auto& node : nodes)
      if (node.state == ComputeState::kHighPrecision && node.reason == reason) names.push_back(node.name);
    if (names.empty()) continue;
    const std::size_t k = std::min<std::size_t>(names.size(), 4);
    s += fmt::format("  {}: {}{}\n", reason_name(reason),
                     join(std::vector<std::string>(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(k))),
                     names.size() > k ? fmt::format(" (+{} more)", names.size() - k) : "");
  }
  if (!nodes.empty()) {
    s += fmt::format("  {:<16}{:>7}{:>11}{:>13}{:>14}{:>10}{:>11}\n", "category", "nodes", "quantized", "weight-only",
                     "not-selected", "excluded", "unfusable");
    for (const auto& [c, r] : category_rows(nodes))
      s += fmt::format("  {:<16}{:>7}{:>11}{:>13}{:>14}{:>10}{:>11}\n", category_name(c), r.total, r.quantized,
                       r.weight_only, r.not_selected, r.excluded, r.unfusable);
  }
  return s;
}

}  // namespace qeval::eval::quant
