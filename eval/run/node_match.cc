// Node matching across a reference graph and a variant's graph.
#include "eval/run/node_match.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

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

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}
std::uint64_t hash_str(std::uint64_t h, const std::string& s) { return mix(h, std::hash<std::string>{}(s)); }

// A structural signature per node (Weisfeiler-Lehman style, in topological order): op type, domain,
// attributes, the shapes of its weights and the signatures of the nodes that produce its inputs,
// looking through quantization plumbing and float casts to the value they carry. Names play no
// part, so two exports of one network that differ only in node and tensor names give equal
// signatures node for node. Shapes are those of the weights, not their types (an FP16 export's
// weights match the FP32 ones).
std::vector<std::uint64_t> structural_signatures(const Graph& g) {
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
    if (depth < 8 && !n.inputs.empty() &&
        (is_quantization_plumbing(n) || is_float_cast(n)))
      return value_sig(n.inputs[0], depth + 1);
    if (n.op_type == "Constant") {
      std::uint64_t h = 5;
      if (const Tensor* t = n.get_tensor("value"))
        for (auto d : t->shape()) h = mix(h, std::uint64_t(d));
      return h;
    }
    return mix(sig[p->second.node], p->second.output);
  };
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    std::uint64_t h = hash_str(hash_str(0, n.op_type), n.domain);
    for (const auto& [name, a] : n.attributes) {  // std::map: a fixed order
      h = hash_str(h, name);
      switch (a.kind) {
        case Attribute::Kind::kInt: h = mix(h, std::uint64_t(a.i)); break;
        case Attribute::Kind::kFloat: h = mix(h, std::hash<float>{}(a.f)); break;
        case Attribute::Kind::kString: h = hash_str(h, a.s); break;
        case Attribute::Kind::kInts: for (auto v : a.ints) h = mix(h, std::uint64_t(v)); break;
        case Attribute::Kind::kFloats: for (auto v : a.floats) h = mix(h, std::hash<float>{}(v)); break;
        case Attribute::Kind::kStrings: for (const auto& v : a.strings) h = hash_str(h, v); break;
        default: break;
      }
    }
    for (const auto& in : n.inputs) h = mix(h, value_sig(in, 0));
    sig[i] = h;
  }
  return sig;
}

bool is_layer(const Node& n) { return n.op_type != "Constant"; }

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

  // 1. By node name (and the same op type).
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
    if (r.op_type != n.op_type || r.domain != n.domain) {
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
    if (it == ref_by_output.end() || m.variant_of_ref[it->second] >= 0) continue;
    link(i, it->second);
    ++m.by_output;
  }

  // 3. By structure: equal signatures, the k-th unmatched variant node of a signature to the k-th
  // unmatched reference node of it (exporters keep the order of parallel branches).
  const auto ref_sig = structural_signatures(ref), var_sig = structural_signatures(var);
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
  for (std::size_t i = 0; i < var.nodes.size(); ++i) {
    const Node& n = var.nodes[i];
    if (m.ref_of_variant[i] >= 0 || is_quantization_plumbing(n) || !is_layer(n)) continue;
    // An FP16 export's precision change, or the rest of a matched layer's form: set aside.
    if (is_float_cast(n) || part_of_layer[i]) {
      ++m.plumbing;
      m.set_aside[i] = 1;
      continue;
    }
    m.unmatched.push_back({"variant", n.name, n.op_type,
                           (name_miss[i].empty() ? std::string("a second node of this name") : name_miss[i]) +
                               "; no reference node with its output tensor or its structure"});
  }
  // The reference's unmatched nodes, with what they are where that explains it.
  std::unordered_set<std::string> shape_values;  // int values computed from shapes
  for (const Node& n : ref.nodes) {
    const bool shape = n.op_type == "Shape" || n.op_type == "Size" ||
                       (n.op_type != "Constant" && !n.inputs.empty() &&
                        std::all_of(n.inputs.begin(), n.inputs.end(), [&](const std::string& in) {
                          if (in.empty() || shape_values.count(in)) return true;
                          auto w = ref.initializers.find(in);
                          return w != ref.initializers.end() && w->second.dtype() == DType::kInt64;
                        }) &&
                        std::any_of(n.inputs.begin(), n.inputs.end(), [&](const std::string& in) { return shape_values.count(in) > 0; }));
    if (shape)
      for (const auto& o : n.outputs) shape_values.insert(o);
  }
  for (std::size_t i = 0; i < ref.nodes.size(); ++i) {
    const Node& n = ref.nodes[i];
    if (m.variant_of_ref[i] >= 0 || !is_layer(n)) continue;
    const bool shape = !n.outputs.empty() && shape_values.count(n.outputs[0]);
    m.unmatched.push_back({"reference", n.name, n.op_type,
                           is_float_cast(n) ? "a float Cast (the reference's own precision change): no variant counterpart"
                           : shape ? "shape computation (no activations; the variant may have folded it)"
                                   : "no variant node of this name, output tensor or structure"});
  }
  return m;
}

namespace {

LocalPlan plan_one(const Graph& ref, const Graph& var, const NodeMatch& match,
                   const std::unordered_map<std::string, Producer>& var_producers, std::size_t node) {
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
      if (p != var_producers.end() && match.set_aside[p->second.node]) {
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
  return plan;
}

}  // namespace

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
  std::vector<LocalPlan> plans(var.nodes.size());
  for (std::size_t i = 0; i < var.nodes.size(); ++i) {
    if (match.ref_of_variant[i] < 0) {
      plans[i].error = match.set_aside[i] ? "set aside (quantization plumbing, a float Cast, part of a layer's form)"
                                          : "no reference counterpart";
      continue;
    }
    plans[i] = plan_one(ref, var, match, var_producers, i);
  }
  return plans;
}

}  // namespace qeval::eval
