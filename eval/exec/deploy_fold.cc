// BatchNormalization and constant Mul/Add folding in FP32, as deployments do before casting weights
// to FP16/BF16.
#include "eval/exec/deploy_fold.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace qeval::eval {

namespace {

// A float32 initializer of `graph` named `name`, or nullptr.
const Tensor* float_weight(const Graph& g, const std::string& name) {
  auto it = g.initializers.find(name);
  return it != g.initializers.end() && it->second.dtype() == DType::kFloat32 ? &it->second : nullptr;
}

struct BnParams {
  std::vector<double> s, shift;  // y = x * s + shift per channel
};

// The inference-form parameters of BatchNormalization node `bn`, when all are constants of one
// channel count (the training-mode outputs unused); empty otherwise.
BnParams bn_params(const Graph& g, const Node& bn) {
  if (bn.inputs.size() != 5 || (bn.opset >= 14 && bn.get_int("training_mode", 0) != 0)) return {};
  for (std::size_t o = 1; o < bn.outputs.size(); ++o)
    if (!bn.outputs[o].empty()) return {};
  const Tensor *scale = float_weight(g, bn.inputs[1]), *beta = float_weight(g, bn.inputs[2]),
               *mean = float_weight(g, bn.inputs[3]), *var = float_weight(g, bn.inputs[4]);
  if (!scale || !beta || !mean || !var) return {};
  const std::int64_t c = scale->numel();
  if (scale->rank() != 1 || beta->numel() != c || mean->numel() != c || var->numel() != c) return {};
  const double eps = bn.get_float("epsilon", 1e-5f);
  BnParams p;
  for (std::int64_t i = 0; i < c; ++i) {
    const double s = double(scale->data<float>()[i]) / std::sqrt(double(var->data<float>()[i]) + eps);
    p.s.push_back(s);
    p.shift.push_back(double(beta->data<float>()[i]) - double(mean->data<float>()[i]) * s);
  }
  return p;
}

Tensor vector_of(const std::vector<double>& v) {
  Tensor t(DType::kFloat32, {std::int64_t(v.size())});
  for (std::size_t i = 0; i < v.size(); ++i) t.data<float>()[i] = float(v[i]);
  return t;
}

// The per-output-channel values of constant `k` broadcast against a Conv output of rank `rank`
// with `c` channels ([c,1,1] or [1,c,1,1] for a 2-D conv; a scalar: c copies); empty when it is not
// one value per channel.
std::vector<double> per_channel(const Tensor& k, std::int64_t c, std::int64_t rank) {
  if (k.numel() == 1) return std::vector<double>(std::size_t(c), double(k.data<float>()[0]));
  if (k.rank() > rank || k.rank() < rank - 1 || k.numel() != c) return {};
  for (std::int64_t j = 0; j < k.rank(); ++j)
    if (k.dim(j) != (j + rank - k.rank() == 1 ? c : 1)) return {};
  std::vector<double> v;
  for (std::int64_t i = 0; i < c; ++i) v.push_back(double(k.data<float>()[i]));
  return v;
}

// Conv -> Mul or Add by a per-channel constant (or a scalar), the Conv's output read by nothing
// else: into the Conv's weights and bias (W * s, B * s; B + a), in double, stored in float32. The
// Conv takes the Mul's or Add's name and output, as for BatchNormalization. Chains fold in turn.
void fold_scales_into_convs(const Graph& g, DeploymentFold& out) {
  auto weight = [&](const std::string& n) -> const Tensor* {
    if (auto it = out.weights.find(n); it != out.weights.end()) return &it->second;
    return float_weight(g, n);
  };
  std::unordered_map<std::string, std::size_t> producer, readers;
  for (std::size_t i = 0; i < out.nodes.size(); ++i) {
    for (const auto& o : out.nodes[i].outputs) producer[o] = i;
    for (const auto& in : out.nodes[i].inputs) ++readers[in];
  }
  for (const auto& o : g.outputs) ++readers[o.name];
  std::vector<char> drop(out.nodes.size(), 0);
  for (std::size_t i = 0; i < out.nodes.size(); ++i) {
    Node& op = out.nodes[i];
    const bool mul = op.op_type == "Mul";
    if (!op.domain.empty() || (!mul && op.op_type != "Add") || op.inputs.size() != 2 || op.outputs.size() != 1) continue;
    for (int side = 0; side < 2; ++side) {
      const std::string &x = op.inputs[std::size_t(side)], &k = op.inputs[std::size_t(1 - side)];
      const Tensor* kt = weight(k);
      auto p = producer.find(x);
      if (!kt || p == producer.end() || readers[x] != 1 || drop[p->second]) continue;
      const Node& conv = out.nodes[p->second];
      if (conv.op_type != "Conv" || !conv.domain.empty() || conv.inputs.size() < 2) continue;
      const Tensor* w = weight(conv.inputs[1]);
      const Tensor* b = conv.has_input(2) ? weight(conv.inputs[2]) : nullptr;
      if (!w || w->rank() < 3 || (conv.has_input(2) && (!b || b->numel() != w->dim(0)))) continue;
      const std::int64_t c = w->dim(0);
      const std::vector<double> v = per_channel(*kt, c, w->rank());
      if (v.empty()) continue;
      Tensor wf(DType::kFloat32, w->shape());
      const std::int64_t per = w->numel() / c;
      std::vector<double> bias(std::size_t(c), 0.0);
      for (std::int64_t oc = 0; oc < c; ++oc) {
        const double s = mul ? v[std::size_t(oc)] : 1.0;
        for (std::int64_t j = 0; j < per; ++j)
          wf.data<float>()[oc * per + j] = mul ? float(double(w->data<float>()[oc * per + j]) * s)
                                               : w->data<float>()[oc * per + j];
        const double b0 = b ? double(b->data<float>()[oc]) : 0.0;
        bias[std::size_t(oc)] = mul ? b0 * s : b0 + v[std::size_t(oc)];
      }
      Node folded = conv;
      folded.name = op.name;
      folded.outputs = op.outputs;
      const std::string wn = op.name + "/folded_conv_weight", bn = op.name + "/folded_conv_bias";
      folded.inputs = {conv.inputs[0], wn, bn};
      for (std::size_t in = 1; in < conv.inputs.size(); ++in)
        if (!g.initializers.count(conv.inputs[in])) out.weights.erase(conv.inputs[in]);  // an earlier fold's
      out.weights[wn] = std::move(wf);
      out.weights[bn] = vector_of(bias);
      drop[p->second] = 1;
      op = std::move(folded);
      ++out.scales_into_conv;
      break;
    }
  }
  std::vector<Node> kept;
  for (std::size_t i = 0; i < out.nodes.size(); ++i)
    if (!drop[i]) kept.push_back(std::move(out.nodes[i]));
  out.nodes = std::move(kept);
}

}  // namespace

DeploymentFold fold_for_deployment(const Graph& g, const std::vector<Node>& nodes, bool scales) {
  DeploymentFold out;
  std::unordered_map<std::string, std::size_t> producer, readers;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    for (const auto& o : nodes[i].outputs) producer[o] = i;
    for (const auto& in : nodes[i].inputs) ++readers[in];
  }
  for (const auto& o : g.outputs) ++readers[o.name];
  std::vector<char> drop(nodes.size(), 0);
  std::vector<Node> rewritten = nodes;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const Node& bn = nodes[i];
    if (bn.op_type != "BatchNormalization" || !bn.domain.empty()) continue;
    const BnParams p = bn_params(g, bn);
    if (p.s.empty()) continue;
    const std::int64_t c = std::int64_t(p.s.size());
    // Into the Conv before it.
    auto prod = producer.find(bn.inputs[0]);
    if (prod != producer.end() && readers[bn.inputs[0]] == 1) {
      const Node& conv = nodes[prod->second];
      const Tensor* w = conv.op_type == "Conv" && conv.domain.empty() && conv.inputs.size() >= 2
                            ? float_weight(g, conv.inputs[1])
                            : nullptr;
      const Tensor* b = conv.has_input(2) ? float_weight(g, conv.inputs[2]) : nullptr;
      if (w && w->rank() >= 3 && w->dim(0) == c && (!conv.has_input(2) || (b && b->numel() == c))) {
        Tensor wf(DType::kFloat32, w->shape());
        const std::int64_t per = w->numel() / c;
        std::vector<double> bias(static_cast<std::size_t>(c), 0.0);
        for (std::int64_t oc = 0; oc < c; ++oc) {
          for (std::int64_t k = 0; k < per; ++k)
            wf.data<float>()[oc * per + k] = float(double(w->data<float>()[oc * per + k]) * p.s[std::size_t(oc)]);
          bias[std::size_t(oc)] =
              (b ? double(b->data<float>()[oc]) : 0.0) * p.s[std::size_t(oc)] + p.shift[std::size_t(oc)];
        }
        Node folded = conv;
        folded.name = bn.name;
        folded.outputs = {bn.outputs[0]};
        const std::string wn = bn.name + "/folded_conv_weight", bname = bn.name + "/folded_conv_bias";
        folded.inputs = {conv.inputs[0], wn, bname};
        out.weights[wn] = std::move(wf);
        out.weights[bname] = vector_of(bias);
        drop[prod->second] = 1;
        rewritten[i] = std::move(folded);
        ++out.into_conv;
        continue;
      }
    }
    // Alone: the same function with its parameters in range.
    Node scaled = bn;
    const std::string base = bn.name + "/folded_";
    scaled.inputs = {bn.inputs[0], base + "scale", base + "shift", base + "mean", base + "var"};
    scaled.attributes["epsilon"] = Attribute::of_float(0.0f);
    out.weights[base + "scale"] = vector_of(p.s);
    out.weights[base + "shift"] = vector_of(p.shift);
    out.weights[base + "mean"] = vector_of(std::vector<double>(std::size_t(c), 0.0));
    out.weights[base + "var"] = vector_of(std::vector<double>(std::size_t(c), 1.0));
    rewritten[i] = std::move(scaled);
    ++out.standalone;
  }
  for (std::size_t i = 0; i < rewritten.size(); ++i)
    if (!drop[i]) out.nodes.push_back(std::move(rewritten[i]));
  if (scales) fold_scales_into_convs(g, out);
  return out;
}

}  // namespace qeval::eval
