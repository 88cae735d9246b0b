// Node matching across a reference graph and a variant's graph.
#include "eval/run/node_match.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <optional>
#include <queue>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "eval/exec/session.h"

namespace qeval::eval {

namespace {

struct Producer {
  std::size_t node = 0, output = 0;
};

std::unordered_map<std::string, Producer> producers(const Graph& g) {
  std::unordered_map<std::string, Producer> out;
  for (std::size_t i = 0; i < g.nodes.size(); ++i)
    for (std::size_t k = 0; k < g.nodes[i].outputs.size(); ++k)
      if (!g.nodes[i].outputs[k].empty()) out[g.nodes[i].outputs[k]] = {i, k};
  return out;
}

bool is_graph_input(const Graph& g, const std::string& name) {
  return std::any_of(g.inputs.begin(), g.inputs.end(), [&](const ValueInfo& v) { return v.name == name; });
}

}  // namespace

bool is_quantization_plumbing(const Node& n) {
  const std::string& op = n.op_type;
  if (op == "QuantizeLinear" || op == "DequantizeLinear" || op == "TRT_FP8QuantizeLinear" ||
      op == "TRT_FP8DequantizeLinear" || op == "DynamicQuantizeLinear")
    return true;
  return op == "Mul" && n.name.find("_quantizer/") != std::string::npos;
}

std::size_t count_quantized_nodes(const Graph& g) {
  const auto producer = producers(g);
  std::size_t count = 0;
  for (const Node& n : g.nodes) {
    if (is_quantization_plumbing(n)) continue;
    // ONNX Runtime's QOperator form: QLinearConv, QLinearMatMul (and com.microsoft's QLinearAdd,
    // ...) run on quantized values whatever feeds them.
    if (n.op_type.rfind("QLinear", 0) == 0) {
      ++count;
      continue;
    }
    count += std::any_of(n.inputs.begin(), n.inputs.end(), [&](const std::string& in) {
      auto p = producer.find(in);
      if (p == producer.end()) return false;
      const std::string& op = g.nodes[p->second.node].op_type;
      // ONNX Runtime's dynamic INT8 form: the quantized tensor, not its scale or zero point.
      if (op == "DynamicQuantizeLinear") return p->second.output == 0;
      return op == "DequantizeLinear" || op == "TRT_FP8DequantizeLinear";
    });
  }
  return count;
}

namespace {

// A Cast between float types (an FP16 export's casts at its inputs and outputs): the same value.
bool is_float_cast(const Node& n) {
  if (n.op_type != "Cast") return false;
  const std::int64_t to = n.get_int("to", 0);
  return to == 1 || to == 10 || to == 11 || to == 16;  // float, float16, double, bfloat16
}

// The float op an ONNX Runtime QOperator node computes (QLinearConv -> Conv, com.microsoft's
// QLinearAdd -> Add, QLinearGlobalAveragePool -> GlobalAveragePool, QGemm -> Gemm, ...), or empty.
std::string qoperator_float_op(const Node& n) {
  if (n.op_type.rfind("QLinear", 0) == 0 && n.op_type.size() > 7) return n.op_type.substr(7);
  if (n.op_type == "QGemm") return "Gemm";
  return {};
}

// Two nodes of one name compute the same layer: the same op, or a QOperator node and its float op.
bool same_layer_op(const Node& ref, const Node& var) {
  if (ref.op_type == var.op_type && ref.domain == var.domain) return true;
  return ref.domain.empty() && qoperator_float_op(var) == ref.op_type;
}

// The inputs of a QOperator node that carry its data (not the scales and zero points): what its
// float op reads. Every input for any other node.
std::vector<std::string> data_inputs(const Node& n) {
  const std::string& op = n.op_type;
  if (qoperator_float_op(n).empty()) return n.inputs;
  std::vector<std::size_t> slots;
  if (op == "QLinearConcat")
    for (std::size_t k = 2; k < n.inputs.size(); k += 3) slots.push_back(k);
  else if (op == "QLinearConv" || op == "QLinearMatMul" || op == "QLinearAdd" || op == "QLinearMul" ||
           op == "QLinearWhere" || op == "QGemm")
    slots = {0, 3};
  else slots = {0};
  std::vector<std::string> out;
  for (std::size_t k : slots)
    if (k < n.inputs.size()) out.push_back(n.inputs[k]);
  return out;
}

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}
std::uint64_t hash_str(std::uint64_t h, const std::string& s) { return mix(h, std::hash<std::string>{}(s)); }

// The forms one layer takes in different exports. Each is recognised at the node that produces the
// layer's value (its end): Conv -> BatchNormalization ends at the BatchNormalization, MatMul -> Add
// (a bias) at the Add, Conv -> Mul / Add by constants at the last Mul or Add, a decomposed
// LayerNormalization at its last node. The other nodes of the form are its inner nodes: their values
// exist in this export only.
enum class Form : std::uint8_t { kNone, kConvBatchNorm, kMatMulAdd, kConvScale, kLayerNorm };

struct FormEnd {
  Form form = Form::kNone;
  int layer = -1;              // Conv+BN, Conv+Mul/Add: the Conv; MatMul+Add: the MatMul
  std::string x, gamma, beta;  // LayerNormalization: its input, scale and bias ("" if none)
  bool adds = false;           // Conv+Mul/Add: an Add is among them (the folded Conv has a bias)
};
struct LayerForms {
  std::vector<int> end_of;    // per node: the end of the form it is an inner node of, -1 for none
  std::vector<FormEnd> ends;  // per node: the form it ends (kNone for none)
};

const char* form_name(Form f) {
  switch (f) {
    case Form::kConvBatchNorm: return "Conv + BatchNormalization";
    case Form::kMatMulAdd: return "MatMul + Add";
    case Form::kConvScale: return "Conv + Mul/Add by a constant";
    case Form::kLayerNorm: return "decomposed LayerNormalization";
    default: return "";
  }
}

// How many node inputs (and graph outputs) read each value.
std::unordered_map<std::string, std::size_t> reader_counts(const Graph& g) {
  std::unordered_map<std::string, std::size_t> readers;
  for (const Node& n : g.nodes)
    for (const auto& in : n.inputs)
      if (!in.empty()) ++readers[in];
  for (const auto& o : g.outputs) ++readers[o.name];
  return readers;
}

// The shape of the constant that value `v` holds, looking through quantization plumbing (a weight's
// DequantizeLinear, ModelOpt's Q -> DQ of a float weight), float Casts, Identity (the torch
// exporter's shared weights) and a 2-D Transpose (a MatMul's weight stored as Gemm's transB keeps
// it). nullopt if `v` is computed from activations.
std::optional<Shape> constant_shape(const Graph& g, const std::unordered_map<std::string, Producer>& prod,
                                    const std::string& v, int depth = 0) {
  if (v.empty()) return std::nullopt;
  if (auto w = g.initializers.find(v); w != g.initializers.end()) return w->second.shape();
  auto p = prod.find(v);
  if (p == prod.end() || depth > 8) return std::nullopt;
  const Node& n = g.nodes[p->second.node];
  if (n.inputs.empty()) return std::nullopt;
  if (is_quantization_plumbing(n) || is_float_cast(n) || n.op_type == "Identity")  // torch's shared weights
    return constant_shape(g, prod, n.inputs[0], depth + 1);
  if (n.op_type == "Transpose") {
    auto s = constant_shape(g, prod, n.inputs[0], depth + 1);
    if (!s || s->size() != 2) return std::nullopt;
    const auto perm = n.get_ints("perm", {1, 0});
    if (perm != std::vector<std::int64_t>{1, 0}) return std::nullopt;
    return Shape{(*s)[1], (*s)[0]};
  }
  return std::nullopt;
}

LayerForms find_layer_forms(const Graph& g) {
  LayerForms f;
  f.end_of.assign(g.nodes.size(), -1);
  f.ends.assign(g.nodes.size(), FormEnd{});
  const auto prod = producers(g);
  const auto readers = reader_counts(g);
  auto read_by = [&](const std::string& v) {
    auto it = readers.find(v);
    return it == readers.end() ? std::size_t(0) : it->second;
  };
  auto is_const = [&](const std::string& v) { return constant_shape(g, prod, v).has_value(); };
  // The node producing `v` as its first output, if it is of type `op` and `v` has `reads` readers.
  auto node_of = [&](const std::string& v, const char* op, std::size_t reads = 1) -> int {
    auto p = prod.find(v);
    if (p == prod.end() || p->second.output != 0) return -1;
    const Node& n = g.nodes[p->second.node];
    if (n.op_type != op || !n.domain.empty() || read_by(v) != reads) return -1;
    return int(p->second.node);
  };
  // Of a binary node with one constant operand: the other operand ("" if neither or both).
  auto non_constant_operand = [&](const Node& n) -> std::string {
    if (n.inputs.size() != 2) return "";
    const bool c0 = is_const(n.inputs[0]), c1 = is_const(n.inputs[1]);
    if (c0 == c1) return "";
    return c0 ? n.inputs[1] : n.inputs[0];
  };
  // A longer form takes over a shorter one it contains (the Div of a LayerNormalization without
  // affine part, then the Mul of gamma, then the Add of beta).
  auto claim = [&](std::size_t end, FormEnd info, const std::vector<int>& inner) {
    f.ends[end] = std::move(info);
    for (int i : inner) {
      f.end_of[std::size_t(i)] = int(end);
      if (f.ends[std::size_t(i)].form == Form::kNone) continue;
      f.ends[std::size_t(i)] = FormEnd{};
      for (int& e : f.end_of)
        if (e == i) e = int(end);
    }
  };
  for (std::size_t e = 0; e < g.nodes.size(); ++e) {
    const Node& n = g.nodes[e];
    if (!n.domain.empty() || n.inputs.empty()) continue;
    if (n.op_type == "BatchNormalization" && n.inputs.size() >= 5 &&
        std::all_of(n.inputs.begin() + 1, n.inputs.begin() + 5, [&](const std::string& v) { return is_const(v); })) {
      const int conv = node_of(n.inputs[0], "Conv");
      if (conv >= 0 && is_const(g.nodes[std::size_t(conv)].inputs.at(1)))
        claim(e, {Form::kConvBatchNorm, conv, {}, {}, {}}, {conv});
      continue;
    }
    if (n.op_type == "Add") {
      const std::string x = non_constant_operand(n);
      const int mm = x.empty() ? -1 : node_of(x, "MatMul");
      if (mm >= 0) {
        const auto w = constant_shape(g, prod, g.nodes[std::size_t(mm)].inputs.at(1));
        const auto b = constant_shape(g, prod, n.inputs[0] == x ? n.inputs[1] : n.inputs[0]);
        if (w && w->size() == 2 && b && shape_numel(*b) == (*w)[1]) {
          claim(e, {Form::kMatMulAdd, mm, {}, {}, {}}, {mm});
          continue;
        }
      }
    }
    // A Conv followed by Muls and Adds by a constant, scalar or per output channel ([C, 1, 1],
    // [1, C, 1, 1]): what ONNX Runtime's ConvMulFusion / ConvAddFusion and exporters fold into the
    // Conv's weights and bias. Each Mul or Add extends the form of the node it reads. (Not a
    // SmoothQuant pre-scale Mul: plumbing of the next layer.)
    if ((n.op_type == "Mul" || n.op_type == "Add") && !is_quantization_plumbing(n)) {
      const std::string x = non_constant_operand(n);
      int conv = x.empty() ? -1 : node_of(x, "Conv");
      int inner = conv;
      bool adds = n.op_type == "Add";
      if (conv < 0 && !x.empty())
        if (auto p = prod.find(x); p != prod.end() && p->second.output == 0 && read_by(x) == 1 &&
                                   f.ends[p->second.node].form == Form::kConvScale) {
          inner = int(p->second.node);
          conv = f.ends[p->second.node].layer;
          adds = adds || f.ends[p->second.node].adds;
        }
      if (conv >= 0) {
        const Node& cn = g.nodes[std::size_t(conv)];
        const auto w = cn.inputs.size() >= 2 ? constant_shape(g, prod, cn.inputs[1]) : std::nullopt;
        const auto c = constant_shape(g, prod, n.inputs[0] == x ? n.inputs[1] : n.inputs[0]);
        // Scalar, or per output channel: right-aligned to the output's rank, C at axis 1, 1 elsewhere.
        bool per_channel = w && w->size() >= 3 && c && c->size() <= w->size();
        if (per_channel && shape_numel(*c) != 1)
          for (std::size_t k = 0, lead = w->size() - c->size(); k < w->size(); ++k)
            per_channel = per_channel && (k < lead ? 1 : (*c)[k - lead]) == (k == 1 ? (*w)[0] : 1);
        if (per_channel) {
          FormEnd info{Form::kConvScale, conv, {}, {}, {}};
          info.adds = adds;
          claim(e, std::move(info), {inner});
          continue;
        }
      }
    }
    // LayerNormalization as the torch exporter writes it below opset 17: ReduceMean -> Sub ->
    // Pow 2 (or Mul by itself) -> ReduceMean -> Add eps -> Sqrt -> Div -> Mul gamma -> Add beta
    // (the affine part optional).
    if (n.op_type == "Add" || n.op_type == "Mul" || n.op_type == "Div") {
      std::vector<int> inner;
      FormEnd info{Form::kLayerNorm, -1, {}, {}, {}};
      auto other = [](const Node& b, const std::string& x) { return b.inputs[0] == x ? b.inputs[1] : b.inputs[0]; };
      int div = int(e);
      if (n.op_type != "Div") {
        std::string a = non_constant_operand(n);
        if (a.empty()) continue;
        (n.op_type == "Add" ? info.beta : info.gamma) = other(n, a);
        if (n.op_type == "Add") {
          const int mul = node_of(a, "Mul");
          if (mul < 0) {  // no gamma: the Add's other operand is the Div
            div = node_of(a, "Div");
          } else {
            inner.push_back(mul);
            const Node& mn = g.nodes[std::size_t(mul)];
            a = non_constant_operand(mn);
            if (a.empty()) continue;
            info.gamma = other(mn, a);
            div = node_of(a, "Div");
          }
        } else {
          div = node_of(a, "Div");
        }
        if (div < 0) continue;
        inner.push_back(div);
      }
      const Node& dn = g.nodes[std::size_t(div)];
      if (dn.inputs.size() != 2) continue;
      const std::string& d = dn.inputs[0];
      const int sqrt = node_of(dn.inputs[1], "Sqrt");
      if (sqrt < 0) continue;
      const int add_eps = node_of(g.nodes[std::size_t(sqrt)].inputs[0], "Add");
      if (add_eps < 0) continue;
      const std::string v = non_constant_operand(g.nodes[std::size_t(add_eps)]);
      const int var = v.empty() ? -1 : node_of(v, "ReduceMean");
      if (var < 0) continue;
      const std::string& p = g.nodes[std::size_t(var)].inputs[0];
      int pow = node_of(p, "Pow");
      std::size_t d_reads = 2;
      if (pow >= 0) {
        const Node& pn = g.nodes[std::size_t(pow)];
        if (pn.inputs.size() != 2 || pn.inputs[0] != d || !is_const(pn.inputs[1])) continue;
      } else {
        pow = node_of(p, "Mul");
        if (pow < 0 || g.nodes[std::size_t(pow)].inputs != std::vector<std::string>{d, d}) continue;
        d_reads = 3;
      }
      const int sub = node_of(d, "Sub", d_reads);
      if (sub < 0 || g.nodes[std::size_t(sub)].inputs.size() != 2) continue;
      const Node& sn = g.nodes[std::size_t(sub)];
      const int mean = node_of(sn.inputs[1], "ReduceMean");
      if (mean < 0 || g.nodes[std::size_t(mean)].inputs.at(0) != sn.inputs[0]) continue;
      for (int i : {sqrt, add_eps, var, pow, sub, mean}) inner.push_back(i);
      info.x = sn.inputs[0];
      claim(e, std::move(info), inner);
    }
  }
  return f;
}

// A structural signature per node (Weisfeiler-Lehman style, in topological order): op type, domain,
// attributes, the shapes of its weights and the signatures of the nodes that produce its inputs,
// looking through quantization plumbing and float casts to the value they carry. Names play no
// part, so two exports of one network that differ only in node and tensor names give equal
// signatures node for node. Shapes are those of the weights, not their types (an FP16 export's
// weights match the FP32 ones).
//
// One layer's forms share one signature, that of the value it computes: a Conv (plain, QLinearConv,
// or followed by a BatchNormalization it could be folded into: a Conv with a bias) by its
// attributes, input and weight shape; a linear layer (Gemm, MatMul by a constant, MatMul + Add of a
// bias, QLinearMatMul) by its input, K, N and whether it has a bias, a Gemm's transB and a
// MatMul's transposed constant alike; a LayerNormalization (one op or decomposed) by its input and
// the shapes of its scale and bias. The inner nodes of a form (the Conv before its
// BatchNormalization, the MatMul before its Add, a decomposed LayerNormalization's chain) get a
// signature of their own, marked, so that they match only the same inner node of another export.
std::vector<std::uint64_t> structural_signatures(const Graph& g, const LayerForms& forms) {
  const auto prod = producers(g);
  std::vector<std::uint64_t> sig(g.nodes.size(), 0);
  // The signature of value `v` as an input: through plumbing (its data input) to the producer.
  std::function<std::uint64_t(const std::string&, int)> value_sig = [&](const std::string& v, int depth) {
    if (v.empty()) return std::uint64_t(1);
    if (auto w = g.initializers.find(v); w != g.initializers.end()) {
      std::uint64_t h = 2;
      for (auto d : w->second.shape()) h = mix(h, std::uint64_t(d));
      return h;
    }
    auto p = prod.find(v);
    if (p == prod.end()) {  // a graph input: by position
      for (std::size_t k = 0; k < g.inputs.size(); ++k)
        if (g.inputs[k].name == v) return mix(3, k);
      return std::uint64_t(4);
    }
    const Node& n = g.nodes[p->second.node];
    if (depth < 8 && !n.inputs.empty() && (is_quantization_plumbing(n) || is_float_cast(n)))
      return value_sig(n.inputs[0], depth + 1);
    if (n.op_type == "Constant") {
      std::uint64_t h = 5;
      if (const Tensor* t = n.get_tensor("value"))
        for (auto d : t->shape()) h = mix(h, std::uint64_t(d));
      return h;
    }
    return mix(sig[p->second.node], p->second.output);
  };
  auto shape_sig = [&](std::uint64_t h, const std::string& v) {
    if (v.empty()) return mix(h, 1);
    const auto s = constant_shape(g, prod, v);
    if (!s) return mix(h, 2);
    h = mix(h, 3 + s->size());
    for (auto d : *s) h = mix(h, std::uint64_t(d));
    return h;
  };
  auto attributes_sig = [](std::uint64_t h, const Node& n) {
    for (const auto& [name, a] : n.attributes) {  // std::map: a fixed order
      h = hash_str(h, name);
      switch (a.kind) {
        case Attribute::Kind::kInt: h = mix(h, std::uint64_t(a.i)); break;
        case Attribute::Kind::kFloat: h = mix(h, std::hash<float>{}(a.f)); break;
        case Attribute::Kind::kString: h = hash_str(h, a.s); break;
        case Attribute::Kind::kInts:
          for (auto v : a.ints) h = mix(h, std::uint64_t(v));
          break;
        case Attribute::Kind::kFloats:
          for (auto v : a.floats) h = mix(h, std::hash<float>{}(v));
          break;
        case Attribute::Kind::kStrings:
          for (const auto& v : a.strings) h = hash_str(h, v);
          break;
        default: break;
      }
    }
    return h;
  };
  auto conv_sig = [&](const Node& conv, const std::string& x, const std::string& w, bool bias) {
    std::uint64_t h = attributes_sig(hash_str(0, "qeval.layer.Conv"), conv);
    return mix(shape_sig(mix(h, value_sig(x, 0)), w), bias ? 1 : 0);
  };
  // x @ W (+ b) with W of [K, N].
  auto linear_sig = [&](const std::string& x, std::int64_t k, std::int64_t n, bool bias) {
    std::uint64_t h = mix(hash_str(0, "qeval.layer.Linear"), value_sig(x, 0));
    return mix(mix(mix(h, std::uint64_t(k)), std::uint64_t(n)), bias ? 1 : 0);
  };
  auto layer_norm_sig = [&](const std::string& x, const std::string& scale, const std::string& bias) {
    std::uint64_t h = mix(hash_str(0, "qeval.layer.LayerNormalization"), value_sig(x, 0));
    return shape_sig(shape_sig(h, scale), bias);
  };
  auto matrix = [&](const std::string& v) -> std::optional<Shape> {
    auto s = constant_shape(g, prod, v);
    if (!s || s->size() != 2) return std::nullopt;
    return s;
  };
  // The signature of node `i` as a layer of its own (nullopt: a node of no layer form).
  auto layer_sig = [&](std::size_t i) -> std::optional<std::uint64_t> {
    const Node& n = g.nodes[i];
    if (n.op_type == "QGemm" && n.inputs.size() >= 4 && n.get_int("transA", 0) == 0 &&
        n.get_float("alpha", 1.0f) == 1.0f)  // ONNX Runtime's com.microsoft QGemm: a Gemm
      if (const auto w = matrix(n.inputs[3])) {
        const bool t = n.get_int("transB", 0) != 0;
        return linear_sig(n.inputs[0], (*w)[t ? 1 : 0], (*w)[t ? 0 : 1], n.has_input(6));
      }
    if (!n.domain.empty()) return std::nullopt;
    const FormEnd& end = forms.ends[i];
    switch (end.form) {
      case Form::kConvBatchNorm: {
        const Node& conv = g.nodes[std::size_t(end.layer)];
        return conv_sig(conv, conv.inputs[0], conv.inputs[1], true);
      }
      case Form::kMatMulAdd: {
        const Node& mm = g.nodes[std::size_t(end.layer)];
        const auto w = matrix(mm.inputs[1]);
        return linear_sig(mm.inputs[0], (*w)[0], (*w)[1], true);
      }
      case Form::kConvScale: {
        const Node& conv = g.nodes[std::size_t(end.layer)];
        return conv_sig(conv, conv.inputs[0], conv.inputs[1], conv.has_input(2) || end.adds);
      }
      case Form::kLayerNorm: return layer_norm_sig(end.x, end.gamma, end.beta);
      default: break;
    }
    const std::string& op = n.op_type;
    if (op == "Conv" && n.inputs.size() >= 2) return conv_sig(n, n.inputs[0], n.inputs[1], n.has_input(2));
    if (op == "QLinearConv" && n.inputs.size() >= 4) return conv_sig(n, n.inputs[0], n.inputs[3], n.has_input(8));
    if (op == "MatMul" && n.inputs.size() == 2)
      if (const auto w = matrix(n.inputs[1])) return linear_sig(n.inputs[0], (*w)[0], (*w)[1], false);
    if (op == "QLinearMatMul" && n.inputs.size() >= 4)
      if (const auto w = matrix(n.inputs[3])) return linear_sig(n.inputs[0], (*w)[0], (*w)[1], false);
    if (op == "Gemm" && n.inputs.size() >= 2 && n.get_int("transA", 0) == 0 && n.get_float("alpha", 1.0f) == 1.0f &&
        n.get_float("beta", 1.0f) == 1.0f)
      if (const auto w = matrix(n.inputs[1])) {
        const bool t = n.get_int("transB", 0) != 0;
        return linear_sig(n.inputs[0], (*w)[t ? 1 : 0], (*w)[t ? 0 : 1], n.has_input(2));
      }
    if (op == "LayerNormalization" && n.inputs.size() >= 2)
      return layer_norm_sig(n.inputs[0], n.inputs[1], n.has_input(2) ? n.inputs[2] : "");
    return std::nullopt;
  };
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    std::uint64_t h = 0;
    if (const auto layer = layer_sig(i)) {
      h = *layer;
    } else if (const std::string op = qoperator_float_op(n); !op.empty()) {
      // A QOperator node by its float op (domain ai.onnx), the attributes they share and its data
      // inputs: ORT's QLinearSoftmax adds `opset`, QLinearGlobalAveragePool `channels_last`.
      Node plain = n;
      plain.attributes.erase("opset");
      if (n.op_type == "QLinearGlobalAveragePool" && n.get_int("channels_last", 0) == 0)
        plain.attributes.erase("channels_last");
      h = attributes_sig(hash_str(hash_str(0, op), ""), plain);
      for (const auto& in : data_inputs(n)) h = mix(h, value_sig(in, 0));
    } else {
      h = attributes_sig(hash_str(hash_str(0, n.op_type), n.domain), n);
      for (const auto& in : n.inputs) h = mix(h, value_sig(in, 0));
    }
    if (forms.end_of[i] >= 0) h = mix(h, 0x1a2b3c4d5e6f7081ull);  // an inner node
    sig[i] = h;
  }
  return sig;
}

bool is_layer(const Node& n) { return n.op_type != "Constant"; }

// Why a reference Relu / Clip has no counterpart in a Q/DQ variant whose quantizer removed it: its
// input's producer is matched to a variant node whose output goes straight into a QuantizeLinear
// (whose saturation clips instead). Empty otherwise.
std::string absorbed_by_quantize(const Graph& ref, const Graph& var, const NodeMatch& m, const Node& act) {
  const auto ref_prod = producers(ref);
  auto p = ref_prod.find(act.inputs[0]);
  if (p == ref_prod.end() || m.variant_of_ref[p->second.node] < 0) return {};
  const Node& v = var.nodes[std::size_t(m.variant_of_ref[p->second.node])];
  if (v.outputs.empty()) return {};
  for (const Node& q : var.nodes)
    if (q.op_type == "QuantizeLinear" && !q.inputs.empty() && q.inputs[0] == v.outputs[0])
      return "absorbed into the QuantizeLinear of " + v.op_type + " " + v.name +
             "'s output (ONNX Runtime's quantizer removes it; the Q/DQ saturates instead)";
  return {};
}

// Per node: every input is an initializer or computed from initializers only.
std::vector<char> computes_constant(const Graph& g) {
  std::vector<char> out(g.nodes.size(), 0);
  std::unordered_set<std::string> constant;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    bool all = n.input_count() > 0;
    for (const auto& in : n.inputs)
      if (!in.empty() && !g.initializers.count(in) && !constant.count(in)) all = false;
    if (!all) continue;
    out[i] = 1;
    for (const auto& o : n.outputs) constant.insert(o);
  }
  return out;
}

}  // namespace

NodeMatch match_nodes(const Graph& ref, const Graph& var) {
  NodeMatch m;
  m.ref_of_variant.assign(var.nodes.size(), -1);
  m.variant_of_ref.assign(ref.nodes.size(), -1);
  m.set_aside.assign(var.nodes.size(), 0);
  if (&ref == &var) {
    for (std::size_t i = 0; i < ref.nodes.size(); ++i) m.ref_of_variant[i] = m.variant_of_ref[i] = int(i);
    m.by_name = ref.nodes.size();
    return m;
  }
  auto link = [&](std::size_t v, std::size_t r) {
    m.ref_of_variant[v] = int(r);
    m.variant_of_ref[r] = int(v);
  };
  // Why a node of the variant could not be matched by name (kept for the report when nothing
  // else matches it either).
  std::vector<std::string> name_miss(var.nodes.size());

  // 1. By node name (and the same op type, or a QOperator node and its float op).
  std::unordered_map<std::string, std::size_t> ref_by_name;
  for (std::size_t i = 0; i < ref.nodes.size(); ++i) ref_by_name.emplace(ref.nodes[i].name, i);
  for (std::size_t i = 0; i < var.nodes.size(); ++i) {
    const Node& n = var.nodes[i];
    if (is_quantization_plumbing(n)) {
      ++m.plumbing;
      m.set_aside[i] = 1;
      continue;
    }
    auto it = n.name.empty() ? ref_by_name.end() : ref_by_name.find(n.name);
    if (it == ref_by_name.end()) {
      name_miss[i] = "no reference node of this name";
      continue;
    }
    const Node& r = ref.nodes[it->second];
    if (!same_layer_op(r, n)) {
      name_miss[i] = "the reference node of this name is a " + r.op_type;
      continue;
    }
    if (m.variant_of_ref[it->second] >= 0) continue;  // a second node of the same name: keep the first
    link(i, it->second);
    ++m.by_name;
  }

  // 2. By output tensor name: the value a node produces keeps its name through exporters that
  // rename nodes, and through ONNX Runtime's dynamic INT8 form, where a Conv becomes
  // DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul (-> Add) and the last node produces the
  // Conv's output tensor. The two nodes compute the same value, whatever their op types.
  std::unordered_map<std::string, std::size_t> ref_by_output;
  for (std::size_t i = 0; i < ref.nodes.size(); ++i)
    if (m.variant_of_ref[i] < 0 && !ref.nodes[i].outputs.empty() && is_layer(ref.nodes[i]))
      ref_by_output.emplace(ref.nodes[i].outputs[0], i);
  for (std::size_t i = 0; i < var.nodes.size(); ++i) {
    const Node& n = var.nodes[i];
    if (m.ref_of_variant[i] >= 0 || is_quantization_plumbing(n) || !is_layer(n) || n.outputs.empty()) continue;
    auto it = ref_by_output.find(n.outputs[0]);
    // A QOperator node writes the quantized tensor under the name ONNX Runtime's quantizer gives it:
    // the float tensor's name + "_QuantizeLinear_Output" (QDQ format, kept by the optimizer's
    // QLinear rewrite) or + "_quantized" (QOperator format).
    if (it == ref_by_output.end() && !qoperator_float_op(n).empty())
      for (const std::string suffix : {"_QuantizeLinear_Output", "_quantized"}) {
        const std::string& o = n.outputs[0];
        if (o.size() > suffix.size() && o.compare(o.size() - suffix.size(), suffix.size(), suffix) == 0)
          if (it = ref_by_output.find(o.substr(0, o.size() - suffix.size())); it != ref_by_output.end()) break;
      }
    if (it == ref_by_output.end() || m.variant_of_ref[it->second] >= 0) continue;
    link(i, it->second);
    ++m.by_output;
  }

  // A layer in one form in one export and folded in the other, matched by name or output at its
  // first node (a folded Conv keeps the Conv's name): the value to compare is the whole layer's,
  // so the node that computes it all is matched to the node that ends the other's form.
  const LayerForms ref_forms = find_layer_forms(ref), var_forms = find_layer_forms(var);
  auto foldable = [](const LayerForms& f, int end) {
    const Form form = f.ends[std::size_t(end)].form;
    return form == Form::kConvBatchNorm || form == Form::kMatMulAdd || form == Form::kConvScale;
  };
  for (std::size_t r = 0; r < ref.nodes.size(); ++r) {
    const int end = ref_forms.end_of[r], v = m.variant_of_ref[r];
    if (end < 0 || v < 0 || !foldable(ref_forms, end) || m.variant_of_ref[std::size_t(end)] >= 0 ||
        var_forms.end_of[std::size_t(v)] >= 0)
      continue;
    m.variant_of_ref[r] = -1;
    link(std::size_t(v), std::size_t(end));
  }
  for (std::size_t v = 0; v < var.nodes.size(); ++v) {
    const int end = var_forms.end_of[v], r = m.ref_of_variant[v];
    if (end < 0 || r < 0 || !foldable(var_forms, end) || m.ref_of_variant[std::size_t(end)] >= 0 ||
        ref_forms.end_of[std::size_t(r)] >= 0)
      continue;
    m.ref_of_variant[v] = -1;
    link(std::size_t(end), std::size_t(r));
  }

  // 3. By structure: equal signatures, the k-th unmatched variant node of a signature to the k-th
  // unmatched reference node of it (exporters keep the order of parallel branches).
  const auto ref_sig = structural_signatures(ref, ref_forms), var_sig = structural_signatures(var, var_forms);
  std::unordered_map<std::uint64_t, std::vector<std::size_t>> ref_by_sig;
  for (std::size_t i = ref.nodes.size(); i-- > 0;)  // reversed: pop_back takes the first
    if (m.variant_of_ref[i] < 0 && is_layer(ref.nodes[i])) ref_by_sig[ref_sig[i]].push_back(i);
  for (std::size_t i = 0; i < var.nodes.size(); ++i) {
    const Node& n = var.nodes[i];
    if (m.ref_of_variant[i] >= 0 || is_quantization_plumbing(n) || !is_layer(n)) continue;
    auto it = ref_by_sig.find(var_sig[i]);
    if (it == ref_by_sig.end() || it->second.empty()) continue;
    link(i, it->second.back());
    it->second.pop_back();
    ++m.by_structure;
  }

  // 4. A Relu or Clip the quantization absorbed: ONNX Runtime's quantizer removes one that follows a
  // quantized op (the op's output range then starts at the activation's minimum and saturation
  // clips), so a QOperator node whose reference op is followed by an unmatched Relu / Clip writes
  // the activation's values: it is compared at the activation.
  std::vector<int> absorbed_at(ref.nodes.size(), -1);  // per reference op: the activation compared instead
  {
    std::unordered_map<std::string, std::vector<std::size_t>> readers;
    for (std::size_t i = 0; i < ref.nodes.size(); ++i)
      for (const auto& in : ref.nodes[i].inputs) readers[in].push_back(i);
    for (const auto& o : ref.outputs) readers[o.name].push_back(ref.nodes.size());  // a graph output
    for (std::size_t r = 0; r < ref.nodes.size(); ++r) {
      const int v = m.variant_of_ref[r];
      if (v < 0 || qoperator_float_op(var.nodes[std::size_t(v)]).empty() || ref.nodes[r].outputs.size() != 1) continue;
      auto it = readers.find(ref.nodes[r].outputs[0]);
      if (it == readers.end() || it->second.size() != 1 || it->second[0] >= ref.nodes.size()) continue;
      const std::size_t a = it->second[0];
      const Node& act = ref.nodes[a];
      if ((act.op_type != "Relu" && act.op_type != "Clip") || !act.domain.empty() || m.variant_of_ref[a] >= 0 ||
          act.inputs.empty() || act.inputs[0] != ref.nodes[r].outputs[0])
        continue;
      m.variant_of_ref[r] = -1;
      link(std::size_t(v), a);
      absorbed_at[r] = int(a);
    }
  }

  // What remains of a layer's rewritten form: unmatched variant nodes whose every reader is a node
  // matched by output tensor or another such node (ONNX Runtime's ConvInteger, the Cast of its
  // int32 result, the Mul and Reshape of the scales): set aside with the layer they compute.
  std::vector<char> part_of_layer(var.nodes.size(), 0);
  {
    const auto prod = producers(var);
    std::unordered_map<std::string, std::size_t> readers;
    for (const Node& n : var.nodes)
      for (const auto& in : n.inputs) ++readers[in];
    for (const auto& o : var.outputs) ++readers[o.name];
    std::unordered_map<std::size_t, std::size_t> reached;  // node -> reads from the layer's form
    for (std::size_t i = var.nodes.size(); i-- > 0;) {
      const bool root = m.ref_of_variant[i] >= 0 && var.nodes[i].outputs.size() == 1 &&
                        var.nodes[i].outputs[0] == ref.nodes[std::size_t(m.ref_of_variant[i])].outputs[0] &&
                        var.nodes[i].name != ref.nodes[std::size_t(m.ref_of_variant[i])].name;
      if (!root && !part_of_layer[i]) continue;
      for (const auto& in : var.nodes[i].inputs) {
        auto p = prod.find(in);
        if (p == prod.end() || m.ref_of_variant[p->second.node] >= 0) continue;
        const Node& pn = var.nodes[p->second.node];
        std::size_t total = 0;
        for (const auto& o : pn.outputs) total += readers[o];
        if (++reached[p->second.node] == total) part_of_layer[p->second.node] = 1;
      }
    }
  }
  const std::vector<char> var_constant = computes_constant(var), ref_constant = computes_constant(ref);
  for (std::size_t i = 0; i < var.nodes.size(); ++i) {
    const Node& n = var.nodes[i];
    if (m.ref_of_variant[i] >= 0 || is_quantization_plumbing(n) || !is_layer(n)) continue;
    // A computation on weights only (a Transpose of a MatMul's constant): folded when planned, it
    // runs with its reader in local runs.
    if (var_constant[i]) {
      ++m.plumbing;
      m.set_aside[i] = 1;
      continue;
    }
    // An FP16 export's precision change, or the rest of a matched layer's form (ONNX Runtime's
    // rewrite of it, the Conv before a BatchNormalization the reference folded, the chain of a
    // decomposed LayerNormalization): set aside.
    const int end = var_forms.end_of[i];
    if (is_float_cast(n) || part_of_layer[i] || (end >= 0 && m.ref_of_variant[std::size_t(end)] >= 0)) {
      ++m.plumbing;
      m.set_aside[i] = 1;
      continue;
    }
    m.unmatched.push_back({"variant", n.name, n.op_type,
                           (name_miss[i].empty() ? std::string("a second node of this name") : name_miss[i]) +
                               "; no reference node with its output tensor or its structure"});
  }
  // The reference's unmatched nodes, with what they are where that explains it.
  std::unordered_set<std::string> shape_values;     // int values computed from shapes
  std::unordered_set<std::string> constant_values;  // values computed from constants alone
  for (std::size_t i = 0; i < ref.nodes.size(); ++i)
    if (ref_constant[i] || ref.nodes[i].op_type == "Constant")
      constant_values.insert(ref.nodes[i].outputs.begin(), ref.nodes[i].outputs.end());
  for (const Node& n : ref.nodes) {
    const bool shape = n.op_type == "Shape" || n.op_type == "Size" ||
                       (n.op_type != "Constant" && !n.inputs.empty() &&
                        std::all_of(n.inputs.begin(), n.inputs.end(),
                                    [&](const std::string& in) {
                                      if (in.empty() || shape_values.count(in) || constant_values.count(in))
                                        return true;
                                      auto w = ref.initializers.find(in);
                                      return w != ref.initializers.end() && w->second.dtype() == DType::kInt64;
                                    }) &&
                        std::any_of(n.inputs.begin(), n.inputs.end(),
                                    [&](const std::string& in) { return shape_values.count(in) > 0; }));
    if (shape)
      for (const auto& o : n.outputs) shape_values.insert(o);
  }
  for (std::size_t i = 0; i < ref.nodes.size(); ++i) {
    const Node& n = ref.nodes[i];
    if (m.variant_of_ref[i] >= 0 || !is_layer(n)) continue;
    const bool shape = !n.outputs.empty() && shape_values.count(n.outputs[0]);
    // Inside a layer's form whose end is matched to a variant node of another form (or was, before
    // the activation after it was found absorbed: then it is compared there).
    std::string in_form;
    const int end = ref_forms.end_of[i];
    const int at = end >= 0 && absorbed_at[std::size_t(end)] >= 0 ? absorbed_at[std::size_t(end)] : end;
    if (end >= 0 && m.variant_of_ref[std::size_t(at)] >= 0) {
      const Form form = ref_forms.ends[std::size_t(end)].form;
      const std::size_t v = std::size_t(m.variant_of_ref[std::size_t(at)]);
      if (var_forms.ends[v].form != form)
        in_form = form == Form::kLayerNorm
                      ? "part of decomposed LayerNormalization " + ref.nodes[std::size_t(end)].name +
                            " (the variant's " + var.nodes[v].op_type + " " + var.nodes[v].name + ")"
                      : "folded into " + var.nodes[v].name + " (" + form_name(form) + " as one " +
                            var.nodes[v].op_type + ", compared at " + ref.nodes[std::size_t(at)].name + ")";
    }
    if (const int a = absorbed_at[i]; a >= 0) {
      const Node& act = ref.nodes[std::size_t(a)];
      const Node& v = var.nodes[std::size_t(m.variant_of_ref[std::size_t(a)])];
      in_form = "its " + act.op_type + " " + act.name + " is absorbed into " + v.op_type + " " + v.name +
                "'s quantized output range (ONNX Runtime's quantizer removes it): compared at " + act.name;
    }
    if (in_form.empty() && (n.op_type == "Relu" || n.op_type == "Clip") && !n.inputs.empty())
      in_form = absorbed_by_quantize(ref, var, m, n);
    m.unmatched.push_back({"reference", n.name, n.op_type,
                           !in_form.empty()  ? in_form
                           : ref_constant[i] ? "computes a constant from weights (the variant may hold it computed)"
                           : is_float_cast(n)
                               ? "a float Cast (the reference's own precision change): no variant counterpart"
                           : shape ? "shape computation (no activations; the variant may have folded it)"
                                   : "no variant node of this name, output tensor or structure"});
  }
  return m;
}

namespace {

// Where a quantized input of an op finds its scale and zero point (input slots), and where its
// quantized output finds its own. ONNX's QLinearConv / QLinearMatMul and com.microsoft's QLinear
// ops (any domain: ONNX Runtime writes them in com.microsoft), QuantizeLinear, DequantizeLinear.
struct ScaleSlots {
  std::size_t scale = 0, zero_point = 0;
};
bool is_qlinear_binary(const std::string& op) {
  return op == "QLinearConv" || op == "QLinearMatMul" || op == "QLinearAdd" || op == "QLinearMul" || op == "QGemm";
}
bool is_qlinear_unary(const std::string& op) {
  return op == "QLinearSigmoid" || op == "QLinearLeakyRelu" || op == "QLinearAveragePool" ||
         op == "QLinearGlobalAveragePool" || op == "QLinearSoftmax" || op == "QLinearReduceMean";
}
std::optional<ScaleSlots> input_scale_slots(const Node& n, std::size_t slot) {
  const std::string& op = n.op_type;
  if (op == "DequantizeLinear" || is_qlinear_unary(op))
    return slot == 0 ? std::optional<ScaleSlots>({1, 2}) : std::nullopt;
  if (is_qlinear_binary(op)) {
    if (slot == 0 || slot == 3) return ScaleSlots{slot + 1, slot + 2};
    return std::nullopt;
  }
  if (op == "QLinearConcat" && slot >= 2 && (slot - 2) % 3 == 0) return ScaleSlots{slot + 1, slot + 2};
  return std::nullopt;
}
std::optional<ScaleSlots> output_scale_slots(const Node& n) {
  const std::string& op = n.op_type;
  if (op == "QuantizeLinear") return ScaleSlots{1, 2};
  if (op == "QGemm") return ScaleSlots{7, 8};
  if (is_qlinear_binary(op)) return ScaleSlots{6, 7};
  if (is_qlinear_unary(op)) return ScaleSlots{3, 4};
  if (op == "QLinearConcat") return ScaleSlots{0, 1};
  return std::nullopt;
}

// Ops whose outputs hold (some of) their first input's values, quantized or not: a quantized input
// gives quantized outputs of the same scale.
bool moves_values(const Node& n) {
  static const std::set<std::string> ops{
      "Reshape",       "Transpose",    "Flatten", "Squeeze", "Unsqueeze", "Identity",  "MaxPool",
      "GlobalMaxPool", "Slice",        "Split",   "Gather",  "Resize",    "Upsample",  "Pad",
      "DepthToSpace",  "SpaceToDepth", "Tile",    "Expand",  "ReduceMax", "ReduceMin", "Concat"};
  return ops.count(n.op_type) > 0;
}

// The params at `slots` of node `n` when they are scalar initializers (the zero point optional).
std::optional<QuantParams> params_at(const Graph& g, const Node& n, ScaleSlots slots) {
  auto scalar = [&](const std::string& v) {
    auto it = g.initializers.find(v);
    return it != g.initializers.end() && it->second.numel() == 1;
  };
  if (!n.has_input(slots.scale) || !scalar(n.inputs[slots.scale])) return std::nullopt;
  QuantParams p{n.inputs[slots.scale], n.has_input(slots.zero_point) ? n.inputs[slots.zero_point] : ""};
  if (!p.zero_point.empty() && !scalar(p.zero_point)) return std::nullopt;
  return p;
}

}  // namespace

std::unordered_map<std::string, std::optional<QuantParams>> quantized_values(const Graph& g) {
  std::unordered_map<std::string, std::optional<QuantParams>> out;
  for (const Node& n : g.nodes) {
    if (n.outputs.empty() || n.outputs[0].empty()) continue;
    if (const auto slots = output_scale_slots(n)) {
      out[n.outputs[0]] = params_at(g, n, *slots);
      continue;
    }
    if (n.op_type == "ConvInteger" || n.op_type == "MatMulInteger" || n.op_type == "DynamicQuantizeLinear") {
      out[n.outputs[0]] = std::nullopt;  // an int32 accumulator; a scale computed at run time
      continue;
    }
    if (!moves_values(n) || n.inputs.empty()) continue;
    auto in = out.find(n.inputs[0]);
    if (in == out.end()) continue;
    std::optional<QuantParams> p = in->second;
    if (n.op_type == "Concat")  // one scale for all its inputs, or none
      for (const auto& v : n.inputs) {
        auto o = out.find(v);
        if (o == out.end() || o->second != p) p.reset();
      }
    const std::size_t outputs = n.op_type == "MaxPool" ? 1 : n.outputs.size();  // MaxPool's indices are int64
    for (std::size_t k = 0; k < outputs; ++k)
      if (!n.outputs[k].empty()) out[n.outputs[k]] = p;
  }
  return out;
}

namespace {

LocalPlan plan_one(const Graph& ref, const Graph& var, const NodeMatch& match,
                   const std::unordered_map<std::string, Producer>& var_producers,
                   const std::unordered_map<std::string, std::optional<QuantParams>>& quantized,
                   const std::vector<char>& var_constant, std::size_t node) {
  LocalPlan plan;
  std::set<std::size_t> nodes;
  std::vector<std::size_t> todo = {node};
  std::set<std::string> seen_inputs;
  while (!todo.empty()) {
    const std::size_t i = todo.back();
    todo.pop_back();
    if (!nodes.insert(i).second) continue;
    for (const std::string& v : var.nodes[i].inputs) {
      if (v.empty() || var.initializers.count(v) || seen_inputs.count(v)) continue;
      auto p = var_producers.find(v);
      // What was set aside (plumbing, an FP16 export's float Casts, the rest of the layer's
      // rewritten form) runs with the node: the reference value enters where the variant's own
      // data enters.
      // So does a computation on the variant's weights alone (a Transpose of a MatMul's weight): its
      // own values, folded in the local session as in the model's, whose store then gives the
      // fold and its packed form (fed the reference's folded copy, each local session planned it
      // as a constant input and packed it again: 3.6 GB for SDXL's second text encoder).
      if (p != var_producers.end() && (match.set_aside[p->second.node] || var_constant[p->second.node])) {
        todo.push_back(p->second.node);
        continue;
      }
      seen_inputs.insert(v);
      if (p == var_producers.end()) {
        if (is_graph_input(var, v) && is_graph_input(ref, v)) {
          plan.inputs.emplace_back(v, v);
          continue;
        }
        plan.error = "input '" + v + "' is a graph input the reference does not have";
        return plan;
      }
      const int r = match.ref_of_variant[p->second.node];
      if (r < 0 || p->second.output >= ref.nodes[std::size_t(r)].outputs.size()) {
        plan.error = "input '" + v + "' comes from node '" + var.nodes[p->second.node].name +
                     "', which has no reference counterpart";
        return plan;
      }
      plan.inputs.emplace_back(v, ref.nodes[std::size_t(r)].outputs[p->second.output]);
    }
  }
  plan.nodes.assign(nodes.begin(), nodes.end());
  // ONNX Runtime's QOperator form: values the variant holds quantized are fed the reference's
  // floats quantized with the scale of the node that reads them (else the value's own), and a
  // quantized output is compared dequantized.
  for (const auto& [v, r] : plan.inputs) {
    auto q = quantized.find(v);
    if (q == quantized.end()) continue;
    std::optional<QuantParams> params;
    for (std::size_t i : plan.nodes) {
      const Node& n = var.nodes[i];
      for (std::size_t k = 0; k < n.inputs.size() && !params; ++k)
        if (n.inputs[k] == v)
          if (const auto slots = input_scale_slots(n, k)) params = params_at(var, n, *slots);
      if (params) break;
    }
    if (!params) params = q->second;
    if (!params) {
      plan.error = "input '" + v + "' is an integer tensor with no stored scale and zero point (made by '" +
                   var.nodes[var_producers.at(v).node].name + "'): the reference's float value cannot be quantized";
      return plan;
    }
    plan.quantize.emplace_back(v, *params);
  }
  const Node& target = var.nodes[node];
  if (!target.outputs.empty())
    if (auto q = quantized.find(target.outputs[0]); q != quantized.end()) {
      if (!q->second) {
        plan.error = "its output '" + target.outputs[0] + "' is an integer tensor with no stored scale and zero " +
                     "point to dequantize it: not compared";
        return plan;
      }
      plan.dequantize = q->second;
    }
  return plan;
}

}  // namespace

LocalGraph local_graph(const Graph& variant, const LocalPlan& plan, const std::map<std::string, DType>& input_types) {
  LocalGraph out{extract_subgraph(variant, plan.nodes, input_types), variant.nodes.at(plan.nodes.back()).name};
  Graph& g = out.graph;
  // Its weights are the variant graph's own bytes (borrowed views: that graph outlives the local
  // sessions), not copies: the model sessions' store then serves their converted, folded, packed
  // and device forms (SharedConstants keys by the bytes). Copies made every form again, per node:
  // an FP16 SDXL export's weights (copied out of their file, as it is not aligned) twice more.
  struct View final : BorrowedMemory {
    void release_pages(const std::byte*, std::size_t) const noexcept override {}
  };
  const auto view = std::make_shared<const View>();
  for (auto& [name, t] : g.initializers) {
    const Tensor& source = variant.initializers.at(name);
    if (!source.is_borrowed() && !source.on_device() && source.numel() > 0)
      t = Tensor::borrowed(source.dtype(), source.shape(), source.raw(), view);
  }
  auto add_initializer = [&](const std::string& v) {
    if (!v.empty() && !g.initializers.count(v)) g.initializers.emplace(v, variant.initializers.at(v));
  };
  auto quant_node = [&](const char* op, const std::string& name, const std::string& x, const QuantParams& p,
                        const std::string& y) {
    Node n;
    n.op_type = op;
    n.name = name;
    auto opset = variant.opsets.find("");
    n.opset = opset == variant.opsets.end() ? 10 : std::max(opset->second, 10);  // QLinear ops need 10
    n.inputs = {x, p.scale};
    if (!p.zero_point.empty()) n.inputs.push_back(p.zero_point);
    n.outputs = {y};
    add_initializer(p.scale);
    add_initializer(p.zero_point);
    return n;
  };
  std::vector<Node> quantizers;
  for (const auto& [v, params] : plan.quantize) {
    auto t = input_types.find(v);
    if (t != input_types.end() && t->second != DType::kFloat32) continue;  // the reference holds it quantized too
    const std::string q = v + "/qeval_quantized";
    for (Node& n : g.nodes)
      for (auto& in : n.inputs)
        if (in == v) in = q;
    quantizers.push_back(quant_node("QuantizeLinear", v + "/qeval_QuantizeLinear", v, params, q));
  }
  g.nodes.insert(g.nodes.begin(), quantizers.begin(), quantizers.end());
  if (plan.dequantize) {
    const std::string& y = g.nodes.back().outputs.at(0);
    out.compared = out.compared + "/qeval_DequantizeLinear";
    g.nodes.push_back(quant_node("DequantizeLinear", out.compared, y, *plan.dequantize, y + "/qeval_dequantized"));
  }
  // The compared node's outputs alone: the rest die where they are read, and a DequantizeLinear
  // whose readers are all fused no longer runs (an int8 layer's activation DQ ran in every local
  // run, its float output kept as a graph output nobody read).
  g.outputs.clear();
  for (const std::string& v : g.nodes.back().outputs)
    if (!v.empty()) g.outputs.push_back(ValueInfo{v});
  return out;
}

std::unordered_map<std::string, DType> narrow_float_values(const Graph& g) {
  std::unordered_map<std::string, DType> out;
  auto narrow = [](DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; };
  for (const auto& [name, t] : g.initializers)
    if (narrow(t.dtype())) out[name] = t.dtype();
  for (const Node& n : g.nodes) {
    std::optional<DType> type;
    if (n.op_type == "Cast") {
      const std::int64_t to = n.get_int("to", 0);
      if (to == 10) type = DType::kFloat16;
      else if (to == 16) type = DType::kBFloat16;
    } else if (!is_quantization_plumbing(n)) {
      for (const auto& in : n.inputs)
        if (auto it = out.find(in); it != out.end()) type = it->second;
    }
    if (type)
      for (const auto& o : n.outputs)
        if (!o.empty()) out[o] = *type;
  }
  return out;
}

std::vector<LocalPlan> plan_local_runs(const Graph& ref, const Graph& var, const NodeMatch& match) {
  const auto var_producers = producers(var);
  const auto quantized = quantized_values(var);
  const std::vector<char> var_constant = computes_constant(var);
  std::vector<LocalPlan> plans(var.nodes.size());
  for (std::size_t i = 0; i < var.nodes.size(); ++i) {
    if (match.ref_of_variant[i] < 0) {
      plans[i].error = match.set_aside[i] ? "set aside (quantization plumbing, a float Cast, part of a layer's form)"
                                          : "no reference counterpart";
      continue;
    }
    plans[i] = plan_one(ref, var, match, var_producers, quantized, var_constant, i);
  }
  return plans;
}

std::vector<std::string> reference_order(const Graph& variant, const Graph& reference) {
  const std::size_t n = variant.nodes.size();
  if (&variant == &reference || n < 2) return {};
  const NodeMatch match = match_nodes(reference, variant);
  const auto made_by = producers(variant);
  // Edges per input slot (a node reading one value twice waits for one producer twice).
  std::vector<std::vector<std::size_t>> readers(n), inputs_from(n);
  std::vector<std::size_t> waiting(n, 0);
  for (std::size_t i = 0; i < n; ++i)
    for (const std::string& v : variant.nodes[i].inputs) {
      auto p = v.empty() ? made_by.end() : made_by.find(v);
      if (p == made_by.end() || p->second.node == i) continue;
      readers[p->second.node].push_back(i);
      inputs_from[i].push_back(p->second.node);
      ++waiting[i];
    }
  // Each node's place in the reference's order: its counterpart's index; an unmatched node takes its
  // earliest reader's (in reverse: readers come later in a topological order), else its latest input's.
  constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();
  std::vector<std::int64_t> key(n, kNone);
  for (std::size_t i = n; i-- > 0;) {
    if (match.ref_of_variant[i] >= 0) {
      key[i] = match.ref_of_variant[i];
      continue;
    }
    for (std::size_t r : readers[i]) key[i] = std::min(key[i], key[r]);
  }
  for (std::size_t i = 0; i < n; ++i)
    if (key[i] == kNone) {
      key[i] = -1;
      for (std::size_t p : inputs_from[i]) key[i] = std::max(key[i], key[p]);
    }
  // Kahn's algorithm taking the ready node earliest in the reference's order (then the variant's).
  using Item = std::pair<std::int64_t, std::size_t>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> ready;
  for (std::size_t i = 0; i < n; ++i)
    if (waiting[i] == 0) ready.push({key[i], i});
  std::vector<std::size_t> order;
  order.reserve(n);
  while (!ready.empty()) {
    const std::size_t i = ready.top().second;
    ready.pop();
    order.push_back(i);
    for (std::size_t r : readers[i])
      if (--waiting[r] == 0) ready.push({key[r], r});
  }
  if (order.size() != n) return {};  // a cycle: left as the model lists them (planning reports it)
  bool changed = false;
  for (std::size_t k = 0; k < n; ++k) changed |= order[k] != k;
  if (!changed) return {};
  std::vector<std::string> names;
  names.reserve(n);
  for (std::size_t i : order) names.push_back(variant.nodes[i].name);
  return names;
}

}  // namespace qeval::eval
