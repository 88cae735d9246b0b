// The Q/DQ graph rewrite of a calibrated recipe.
#include "eval/quant/apply.h"

#include "eval/exec/opset_upgrade.h"

#include <cmath>
#include <cstring>
#include <set>
#include <unordered_map>

#include "kernels/error.h"
#include "kernels/numeric.h"

namespace qeval::eval::quant {

std::string quantizer_prefix(const std::string& node, const std::string& role) {
  return node + "/" + role + "_quantizer";
}

namespace {

DType quant_dtype(QuantFormat f) {
  switch (f) {
    case QuantFormat::kInt8: return DType::kInt8;
    case QuantFormat::kFp8E4M3: return DType::kFloat8E4M3FN;
    case QuantFormat::kFp8E5M2: return DType::kFloat8E5M2;
  }
  return DType::kInt8;
}

std::uint8_t quantize_code(float x, float scale, QuantFormat f) {
  switch (f) {
    case QuantFormat::kInt8: return static_cast<std::uint8_t>(quantize_int8(x, scale));
    case QuantFormat::kFp8E4M3: return to_float8_e4m3fn(x / scale).bits;
    case QuantFormat::kFp8E5M2: return to_float8_e5m2(x / scale).bits;
  }
  return 0;
}

Tensor scalar_f32(float v) {
  Tensor t(DType::kFloat32, {});
  t.data<float>()[0] = v;
  return t;
}

class Rewriter {
 public:
  Rewriter(Graph& g, const Recipe& r) : g_(g), r_(r) {
    for (const auto& n : g.nodes) {
      taken_.insert(n.name);
      for (const auto& o : n.outputs) taken_.insert(o);
    }
    for (const auto& [k, v] : g.initializers) taken_.insert(k);
    for (const auto& in : g.inputs) taken_.insert(in.name);
  }

  std::string fresh(const std::string& name) {
    if (!taken_.insert(name).second)
      throw InputError(g_.source + ": cannot insert '" + name + "': the name is already used in the graph");
    return name;
  }

  std::string add_initializer(const std::string& name, Tensor t) {
    g_.initializers.emplace(fresh(name), std::move(t));
    return name;
  }

  // Zero point of the format: int8 0 or the float8 +0 code, scalar or [count].
  std::string zero_point(const std::string& prefix, std::int64_t count) {
    Tensor z(quant_dtype(r_.format), count < 0 ? Shape{} : Shape{count});  // zero-initialised
    return add_initializer(prefix + "/zero_point", std::move(z));
  }

  Node make(const std::string& op, const std::string& name, std::vector<std::string> inputs) {
    Node n;
    n.op_type = op;
    n.name = fresh(name);
    n.opset = g_.opsets.at("");
    n.inputs = std::move(inputs);
    n.outputs = {fresh(name + "_output_0")};
    return n;
  }

  Graph& g_;
  const Recipe& r_;
  std::set<std::string> taken_;
};

}  // namespace

AppliedRecipe apply_recipe(const Graph& graph, const Selection& selection, const Recipe& recipe,
                           const CalibrationResult& calibration) {
  AppliedRecipe out;
  out.graph = graph;
  Graph& g = out.graph;
  out.opset_from = g.opsets.count("") ? g.opsets.at("") : 0;
  const bool int8 = recipe.format == QuantFormat::kInt8;
  const OpsetUpgrade up = upgrade_opset(
      g, int8 ? 13 : 19, int8 ? "for INT8 Q/DQ nodes, which need opset 13" : "for FP8 Q/DQ nodes, which need opset 19");
  out.opset_to = g.opsets.at("");
  out.opset_rewritten_nodes = up.rewritten_nodes;
  out.opset_rewrites = up.notes;

  const float fmax = format_max(recipe.format);
  Rewriter rw(g, recipe);
  std::unordered_map<std::string, const QuantTarget*> by_node;
  for (const auto& t : selection.targets) by_node[t.node] = &t;

  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size() + selection.targets.size() * 4);
  std::set<std::string> replaced_weights;
  for (Node& node : g.nodes) {
    auto it = by_node.find(node.name);
    if (it == by_node.end()) {
      nodes.push_back(std::move(node));
      continue;
    }
    const QuantTarget& t = *it->second;
    const Smoothing* sm = calibration.smoothing_for(t.node);
    for (const auto& act : t.activations) {
      const ActivationRange* range = calibration.find(t.node, act.input);
      if (!range)
        throw InputError("calibration result has no range for node '" + t.node + "' input " +
                         std::to_string(act.input) + " (" + act.role +
                         "): it was calibrated for another recipe or model; recalibrate");
      if (!(range->amax > 0) || !std::isfinite(range->amax))
        throw InputError("node '" + t.node + "' input " + std::to_string(act.input) + " ('" + node.inputs[act.input] +
                         "'): amax must be finite and > 0, got " + std::to_string(range->amax));
      const std::string prefix = quantizer_prefix(t.node, act.role);
      std::string x = node.inputs[act.input];
      if (sm && act.role == "input") {
        Tensor pre(DType::kFloat32, {static_cast<std::int64_t>(sm->scale.size())});
        for (std::size_t j = 0; j < sm->scale.size(); ++j) pre.data<float>()[j] = 1.0f / sm->scale[j];
        const std::string pre_name = rw.add_initializer(prefix + "/pre_quant_scale", std::move(pre));
        Node mul = rw.make("Mul", prefix + "/Mul", {x, pre_name});
        x = mul.outputs[0];
        nodes.push_back(std::move(mul));
      }
      const std::string scale = rw.add_initializer(prefix + "/scale", scalar_f32(range->amax / fmax));
      const std::string zp = rw.zero_point(prefix, -1);
      Node q = rw.make("QuantizeLinear", prefix + "/QuantizeLinear", {x, scale, zp});
      Node dq = rw.make("DequantizeLinear", prefix + "/DequantizeLinear", {q.outputs[0], scale, zp});
      node.inputs[act.input] = dq.outputs[0];
      nodes.push_back(std::move(q));
      nodes.push_back(std::move(dq));
      out.quantized_activations++;
    }
    if (t.has_weight) {
      const Tensor& w0 = graph.initializers.at(t.weight_name);
      if (w0.dtype() != DType::kFloat32)
        throw UnsupportedError(graph.source + ": node '" + t.node + "': weight '" + t.weight_name + "' is " +
                               std::string(dtype_name(w0.dtype())) + "; recipes quantize float32 weights");
      Tensor w = w0;  // smoothed copy
      float* wd = w.data<float>();
      const Shape& shape = w.shape();
      const int out_axis = t.weight_out_axis;
      // Strides for (out channel, rest) indexing: element e has channel (e / inner) % channels.
      std::int64_t inner = 1;
      for (int d = out_axis + 1; d < w.rank(); ++d) inner *= shape[static_cast<std::size_t>(d)];
      const std::int64_t channels = shape[static_cast<std::size_t>(out_axis)];
      if (sm) {
        std::int64_t in_inner = 1;
        for (int d = t.weight_in_axis + 1; d < w.rank(); ++d) in_inner *= shape[static_cast<std::size_t>(d)];
        const std::int64_t in_channels = shape[static_cast<std::size_t>(t.weight_in_axis)];
        if (static_cast<std::int64_t>(sm->scale.size()) != in_channels)
          throw InputError("SmoothQuant scales of node '" + t.node + "' have " + std::to_string(sm->scale.size()) +
                           " channels, weight '" + t.weight_name + "' has " + std::to_string(in_channels));
        for (std::int64_t e = 0; e < w.numel(); ++e)
          wd[e] *= sm->scale[static_cast<std::size_t>((e / in_inner) % in_channels)];
        out.smoothed_layers++;
      }
      WeightQuant wq;
      wq.node = t.node;
      wq.weight = t.weight_name;
      const bool per_channel = recipe.weights == WeightGranularity::kPerChannel;
      wq.axis = per_channel ? out_axis : -1;
      wq.amax.assign(per_channel ? static_cast<std::size_t>(channels) : 1u, 0.0f);
      for (std::int64_t e = 0; e < w.numel(); ++e) {
        float& m = wq.amax[per_channel ? static_cast<std::size_t>((e / inner) % channels) : 0];
        m = std::max(m, std::fabs(wd[e]));
      }
      std::vector<float> scales(wq.amax.size());
      for (std::size_t c = 0; c < scales.size(); ++c) {
        // An all-zero channel quantizes to zeros with any scale; 1 keeps the scale valid.
        scales[c] = wq.amax[c] > 0 && std::isfinite(wq.amax[c]) ? wq.amax[c] / fmax : 1.0f;
        if (!std::isfinite(wq.amax[c]))
          throw InputError(graph.source + ": weight '" + t.weight_name + "' of node '" + t.node + "' holds inf or NaN");
      }
      Tensor q(quant_dtype(recipe.format), shape);
      auto* qd = reinterpret_cast<std::uint8_t*>(q.raw());
      for (std::int64_t e = 0; e < w.numel(); ++e)
        qd[e] = quantize_code(wd[e], scales[per_channel ? static_cast<std::size_t>((e / inner) % channels) : 0],
                              recipe.format);
      const std::string prefix = quantizer_prefix(t.node, "weight");
      const std::string qname = rw.add_initializer(prefix + "/weight", std::move(q));
      Tensor st(DType::kFloat32, per_channel ? Shape{channels} : Shape{});
      std::copy(scales.begin(), scales.end(), st.data<float>());
      const std::string sname = rw.add_initializer(prefix + "/scale", std::move(st));
      const std::string zp = rw.zero_point(prefix, per_channel ? channels : -1);
      Node dq = rw.make("DequantizeLinear", prefix + "/DequantizeLinear", {qname, sname, zp});
      if (per_channel) dq.attributes["axis"] = Attribute::of_int(out_axis);
      node.inputs[t.weight_input] = dq.outputs[0];
      nodes.push_back(std::move(dq));
      replaced_weights.insert(t.weight_name);
      out.weights.push_back(std::move(wq));
    }
    nodes.push_back(std::move(node));
  }
  g.nodes = std::move(nodes);
  // Drop float weights no node reads any more.
  std::set<std::string> used;
  for (const auto& n : g.nodes)
    for (const auto& i : n.inputs) used.insert(i);
  for (const auto& o : g.outputs) used.insert(o.name);
  for (const auto& w : replaced_weights)
    if (!used.count(w)) g.initializers.erase(w);
  return out;
}

}  // namespace qeval::eval::quant
