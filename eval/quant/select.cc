// Structural node classification and recipe-driven selection.
#include "eval/quant/select.h"

#include <algorithm>
#include <functional>
#include <regex>
#include <set>
#include <unordered_map>

#include "kernels/error.h"

namespace qeval::eval::quant {

const char* category_name(NodeCategory c) {
  switch (c) {
    case NodeCategory::kNone: return "none";
    case NodeCategory::kConv: return "conv";
    case NodeCategory::kFeedForward: return "feed_forward";
    case NodeCategory::kQkvProjection: return "qkv_projection";
    case NodeCategory::kOtherLinear: return "other_linear";
    case NodeCategory::kAttentionQK: return "attention_qk";
    case NodeCategory::kAttentionAV: return "attention_av";
    case NodeCategory::kOtherMatMul: return "other_matmul";
  }
  return "?";
}

double category_level(NodeCategory c) {
  switch (c) {
    case NodeCategory::kConv: return 1;
    case NodeCategory::kFeedForward: return 2;
    case NodeCategory::kQkvProjection: return 2.5;
    case NodeCategory::kOtherLinear: return 3;
    case NodeCategory::kAttentionQK:
    case NodeCategory::kAttentionAV: return 4;
    default: return 0;
  }
}

namespace {

// Producer/consumer index of a graph.
struct Links {
  std::unordered_map<std::string, std::size_t> producer;
  std::unordered_map<std::string, std::vector<std::size_t>> consumers;
  explicit Links(const Graph& g) {
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
      for (const auto& o : g.nodes[i].outputs)
        if (!o.empty()) producer[o] = i;
      for (const auto& in : g.nodes[i].inputs)
        if (!in.empty()) consumers[in].push_back(i);
    }
  }
};

bool is_constant(const Graph& g, const std::string& v) { return !v.empty() && g.initializers.count(v); }

const std::set<std::string>& gelu_ops() {
  static const std::set<std::string> s{"Erf", "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Tanh"};
  return s;
}
// Ops a feed-forward activation is built of (GEGLU: Slice/Split + Erf + Mul; tanh GELU).
const std::set<std::string>& ff_path_ops() {
  static const std::set<std::string> s{"Add",     "Sub",       "Mul",  "Div",      "Slice", "Split",
                                       "Reshape", "Transpose", "Cast", "Identity", "Pow"};
  return s;
}
// Ops between a q/k/v projection and the attention MatMul (head split, scaling, bias).
const std::set<std::string>& qkv_path_ops() {
  static const std::set<std::string> s{"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Cast",
                                       "Split",   "Slice",     "Add",     "Sub",       "Mul",     "Div",      "Concat"};
  return s;
}
// Ops between the QK^T MatMul and its Softmax (scale, mask) and after the Softmax.
const std::set<std::string>& score_path_ops() {
  static const std::set<std::string> s{"Mul", "Div", "Add", "Sub", "Where", "Cast", "Reshape"};
  return s;
}
const std::set<std::string>& prob_path_ops() {
  static const std::set<std::string> s{"Cast", "Reshape", "Dropout", "Identity"};
  return s;
}

// Depth-limited search forward from node `start` through `through` ops for a node satisfying
// `goal` (checked on every node reached, before the pass-through test).
bool reaches_forward(const Graph& g, const Links& l, std::size_t start, int depth, const std::set<std::string>& through,
                     const std::function<bool(std::size_t)>& goal) {
  if (depth == 0) return false;
  for (const auto& o : g.nodes[start].outputs) {
    auto it = l.consumers.find(o);
    if (it == l.consumers.end()) continue;
    for (std::size_t c : it->second) {
      if (goal(c)) return true;
      if (g.nodes[c].domain.empty() && through.count(g.nodes[c].op_type) &&
          reaches_forward(g, l, c, depth - 1, through, goal))
        return true;
    }
  }
  return false;
}

// Depth-limited search backward from value `v`.
bool reaches_backward(const Graph& g, const Links& l, const std::string& v, int depth,
                      const std::set<std::string>& through, const std::function<bool(std::size_t)>& goal) {
  if (depth == 0) return false;
  auto it = l.producer.find(v);
  if (it == l.producer.end()) return false;
  const Node& p = g.nodes[it->second];
  if (goal(it->second)) return true;
  if (!p.domain.empty() || !through.count(p.op_type)) return false;
  for (const auto& in : p.inputs)
    if (!in.empty() && !is_constant(g, in) && reaches_backward(g, l, in, depth - 1, through, goal)) return true;
  return false;
}

bool is_gelu(const Graph& g, std::size_t n) {
  const Node& node = g.nodes[n];
  return node.domain.empty() || node.domain == "com.microsoft" ? gelu_ops().count(node.op_type) > 0 : false;
}

}  // namespace

std::vector<QuantTarget> classify_nodes(const Graph& g) {
  const Links links(g);
  std::vector<QuantTarget> out(g.nodes.size());
  auto two_activations = [&](const Node& n) {
    return n.input_count() == 2 && !is_constant(g, n.inputs[0]) && !is_constant(g, n.inputs[1]);
  };
  // Pass 1: op-level shapes (conv, linear, activation MatMul).
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    QuantTarget& t = out[i];
    t.node = n.name;
    t.node_index = i;
    t.op_type = n.op_type;
    if (!n.domain.empty()) continue;
    auto weight_rank = [&](std::size_t k) {
      return is_constant(g, n.inputs[k]) ? g.initializers.at(n.inputs[k]).rank() : -1;
    };
    if (n.op_type == "Conv" && n.input_count() >= 2 && !is_constant(g, n.inputs[0]) && weight_rank(1) >= 3) {
      t.category = NodeCategory::kConv;
      t.weight_out_axis = 0;
    } else if (n.op_type == "MatMul" && n.input_count() == 2 && !is_constant(g, n.inputs[0]) && weight_rank(1) == 2) {
      t.category = NodeCategory::kOtherLinear;
      t.weight_out_axis = 1;  // [K, N]
      t.weight_in_axis = 0;
    } else if (n.op_type == "Gemm" && n.input_count() >= 2 && !is_constant(g, n.inputs[0]) && weight_rank(1) == 2 &&
               n.get_int("transA", 0) == 0) {
      t.category = NodeCategory::kOtherLinear;
      const bool trans_b = n.get_int("transB", 0) != 0;
      t.weight_out_axis = trans_b ? 0 : 1;
      t.weight_in_axis = trans_b ? 1 : 0;
    } else if (n.op_type == "MatMul" && two_activations(n)) {
      t.category = NodeCategory::kOtherMatMul;
    }
    if (t.category != NodeCategory::kNone && t.category != NodeCategory::kOtherMatMul) {
      t.has_weight = true;
      t.weight_input = 1;
      t.weight_name = n.inputs[1];
      t.activations = {{0, "input"}};
    }
  }
  // Pass 2: attention MatMuls (QK^T reaches a Softmax; AV reads one).
  auto is_softmax = [&](std::size_t k) { return g.nodes[k].op_type == "Softmax" && g.nodes[k].domain.empty(); };
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    QuantTarget& t = out[i];
    if (t.category != NodeCategory::kOtherMatMul) continue;
    if (reaches_backward(g, links, g.nodes[i].inputs[0], 3, prob_path_ops(), is_softmax)) {
      t.category = NodeCategory::kAttentionAV;
      t.activations = {{0, "softmax"}, {1, "v_bmm"}};
    } else if (reaches_forward(g, links, i, 4, score_path_ops(), is_softmax)) {
      t.category = NodeCategory::kAttentionQK;
      t.activations = {{0, "q_bmm"}, {1, "k_bmm"}};
    } else {
      t.activations = {{0, "a_bmm"}, {1, "b_bmm"}};  // quantized only when a recipe asks (other_matmuls)
    }
  }
  // Pass 3: linear layers by what they feed or read.
  auto is_attention = [&](std::size_t k) {
    return out[k].category == NodeCategory::kAttentionQK || out[k].category == NodeCategory::kAttentionAV;
  };
  auto gelu = [&](std::size_t k) { return is_gelu(g, k); };
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    QuantTarget& t = out[i];
    if (t.category != NodeCategory::kOtherLinear) continue;
    if (reaches_forward(g, links, i, 8, qkv_path_ops(), is_attention)) t.category = NodeCategory::kQkvProjection;
    else if (reaches_forward(g, links, i, 4, ff_path_ops(), gelu) ||
             reaches_backward(g, links, g.nodes[i].inputs[0], 5, ff_path_ops(), gelu))
      t.category = NodeCategory::kFeedForward;
  }
  return out;
}

bool is_diffusers_unet(const Graph& g) {
  auto input = [&](const char* name) {
    return std::any_of(g.inputs.begin(), g.inputs.end(), [&](const ValueInfo& v) { return v.name == name; });
  };
  if (input("sample")) return true;
  auto named = [&](const char* part) {
    return std::any_of(g.nodes.begin(), g.nodes.end(),
                       [&](const Node& n) { return n.name.find(part) != std::string::npos; }) ||
           std::any_of(g.initializers.begin(), g.initializers.end(),
                       [&](const auto& w) { return w.first.find(part) != std::string::npos; });
  };
  return named("down_blocks") && named("up_blocks");
}

Selection select_nodes(const Graph& g, const Recipe& recipe, bool allow_empty) {
  const auto classes = classify_nodes(g);
  auto compile = [&](const std::vector<std::string>& patterns) {
    std::vector<std::regex> res;
    for (const auto& p : patterns) res.emplace_back(p);
    return res;
  };
  const auto include = compile(recipe.include);
  const auto exclude = compile(recipe.exclude);
  const std::regex defaults(kDefaultExclusionPattern);
  auto matches = [](const std::regex& re, const QuantTarget& t) {
    return std::regex_search(t.node, re) || (!t.weight_name.empty() && std::regex_search(t.weight_name, re));
  };
  auto any = [&](const std::vector<std::regex>& res, const QuantTarget& t) {
    for (const auto& re : res)
      if (matches(re, t)) return true;
    return false;
  };

  const std::set<std::string> keep(recipe.exclude_nodes.begin(), recipe.exclude_nodes.end());
  const bool default_exclusions = recipe.default_exclusions && is_diffusers_unet(g);
  Selection s;
  for (const auto& t : classes) {
    const double level = category_level(t.category);
    const bool other = t.category == NodeCategory::kOtherMatMul && recipe.other_matmuls;
    if (level == 0 && !other) continue;
    s.candidates[static_cast<std::size_t>(t.category)]++;
    bool on = other || recipe.level >= level;
    std::string why = on ? ""
                         : "recipe level " + level_string(recipe.level) + " < " + level_string(level) + " (" +
                               category_name(t.category) + ")";
    if (on && default_exclusions && matches(defaults, t)) {
      on = false;
      s.excluded_by_default++;
      why = "default exclusion (TensorRT demo's list of diffusers UNet layers)";
    }
    if (!on && any(include, t)) {
      on = true;
      s.included_by_pattern++;
    }
    if (on && any(exclude, t)) {
      on = false;
      s.excluded_by_pattern++;
      why = "the recipe's 'exclude' pattern";
    }
    if (on && keep.count(t.node)) {
      on = false;
      s.excluded_by_name++;
      why = "the recipe's 'exclude_nodes'";
    }
    if (!on) {
      s.left_out.push_back({t.node, t.op_type, t.category, why});
      continue;
    }
    s.selected[static_cast<std::size_t>(t.category)]++;
    s.targets.push_back(t);
  }
  if (s.targets.empty() && !allow_empty) {
    int total = 0;
    for (int c : s.candidates) total += c;
    throw InputError(
        recipe.source + ": recipe '" + recipe.name + "' selects no node of " + g.source + " (" + std::to_string(total) +
        " quantizable nodes; level " + level_string(recipe.level) + ", " + std::to_string(s.excluded_by_default) +
        " removed by the default exclusions, " + std::to_string(s.excluded_by_pattern) + " by 'exclude'" +
        (s.excluded_by_name ? ", " + std::to_string(s.excluded_by_name) + " by 'exclude_nodes'" : "") + ")");
  }
  return s;
}

}  // namespace qeval::eval::quant
