// Node matching across a reference graph and a variant's graph.
#include "eval/run/node_match.h"

#include <algorithm>
#include <set>
#include <unordered_map>

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
      op == "TRT_FP8DequantizeLinear")
    return true;
  return op == "Mul" && n.name.find("_quantizer/") != std::string::npos;
}

std::size_t count_quantized_nodes(const Graph& g) {
  std::unordered_map<std::string, const Node*> producer;
  for (const Node& n : g.nodes)
    for (const auto& o : n.outputs) producer[o] = &n;
  std::size_t count = 0;
  for (const Node& n : g.nodes) {
    if (is_quantization_plumbing(n)) continue;
    count += std::any_of(n.inputs.begin(), n.inputs.end(), [&](const std::string& in) {
      auto p = producer.find(in);
      return p != producer.end() &&
             (p->second->op_type == "DequantizeLinear" || p->second->op_type == "TRT_FP8DequantizeLinear");
    });
  }
  return count;
}

NodeMatch match_nodes(const Graph& ref, const Graph& var) {
  NodeMatch m;
  m.ref_of_variant.assign(var.nodes.size(), -1);
  m.variant_of_ref.assign(ref.nodes.size(), -1);
  if (&ref == &var) {
    for (std::size_t i = 0; i < ref.nodes.size(); ++i) m.ref_of_variant[i] = m.variant_of_ref[i] = int(i);
    m.by_name = ref.nodes.size();
    return m;
  }
  std::unordered_map<std::string, std::size_t> ref_by_name;
  for (std::size_t i = 0; i < ref.nodes.size(); ++i) ref_by_name.emplace(ref.nodes[i].name, i);
  for (std::size_t i = 0; i < var.nodes.size(); ++i) {
    const Node& n = var.nodes[i];
    if (is_quantization_plumbing(n)) {
      ++m.plumbing;
      continue;
    }
    auto it = ref_by_name.find(n.name);
    if (it == ref_by_name.end()) {
      if (n.op_type != "Constant") m.unmatched.push_back({"variant", n.name, n.op_type, "no reference node of this name"});
      continue;
    }
    const Node& r = ref.nodes[it->second];
    if (r.op_type != n.op_type || r.domain != n.domain) {
      m.unmatched.push_back({"variant", n.name, n.op_type, "the reference node of this name is a " + r.op_type});
      continue;
    }
    if (m.variant_of_ref[it->second] >= 0) continue;  // a second node of the same name: keep the first
    m.ref_of_variant[i] = int(it->second);
    m.variant_of_ref[it->second] = int(i);
    ++m.by_name;
  }
  for (std::size_t i = 0; i < ref.nodes.size(); ++i)
    if (m.variant_of_ref[i] < 0 && ref.nodes[i].op_type != "Constant")
      m.unmatched.push_back({"reference", ref.nodes[i].name, ref.nodes[i].op_type, "no variant node of this name"});
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
      if (p != var_producers.end() && is_quantization_plumbing(var.nodes[p->second.node])) {
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

std::vector<LocalPlan> plan_local_runs(const Graph& ref, const Graph& var, const NodeMatch& match) {
  const auto var_producers = producers(var);
  std::vector<LocalPlan> plans(var.nodes.size());
  for (std::size_t i = 0; i < var.nodes.size(); ++i) {
    if (match.ref_of_variant[i] < 0) {
      plans[i].error = is_quantization_plumbing(var.nodes[i]) ? "quantization plumbing" : "no reference counterpart";
      continue;
    }
    plans[i] = plan_one(ref, var, match, var_producers, i);
  }
  return plans;
}

}  // namespace qeval::eval
