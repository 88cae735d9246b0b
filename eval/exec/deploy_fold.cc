// BatchNormalization folding in FP32, as deployments do before casting weights to FP16/BF16.
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

}  // namespace

DeploymentFold fold_for_deployment(const Graph& g, const std::vector<Node>& nodes) {
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
  return out;
}

}  // namespace qeval::eval
