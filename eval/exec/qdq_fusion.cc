// Q/DQ fusion: pattern matching over the graph (no shapes needed: types and scale shapes come from
// initializers and the producing Q nodes).
#include "eval/exec/qdq_fusion.h"

#include <map>
#include <optional>
#include <set>

#include "eval/exec/onnx_import.h"
#include "kernels/error.h"

namespace qeval::eval::quant {

namespace {

struct Producer {
  const Node* node = nullptr;
  std::size_t output = 0;
};

class GraphIndex {
 public:
  explicit GraphIndex(const Graph& g) : g_(g) {
    for (const auto& n : g.nodes)
      for (std::size_t o = 0; o < n.outputs.size(); ++o)
        if (!n.outputs[o].empty()) producers_[n.outputs[o]] = {&n, o};
    for (const auto& in : g.inputs) inputs_[in.name] = in.dtype;
  }
  const Tensor* initializer(const std::string& name) const {
    auto it = g_.initializers.find(name);
    return it == g_.initializers.end() ? nullptr : &it->second;
  }
  std::optional<Producer> producer(const std::string& name) const {
    auto it = producers_.find(name);
    if (it == producers_.end()) return std::nullopt;
    return it->second;
  }

  // The element type of a value when the graph alone says it: initializers, graph inputs, the
  // outputs of QuantizeLinear (its zero point's type, output_dtype, else uint8) and
  // DynamicQuantizeLinear.
  std::optional<DType> type_of(const std::string& name) const {
    if (const Tensor* t = initializer(name)) return t->dtype();
    if (auto it = inputs_.find(name); it != inputs_.end()) return it->second;
    auto p = producer(name);
    if (!p || !p->node->domain.empty()) return std::nullopt;
    const Node& n = *p->node;
    if (n.op_type == "DynamicQuantizeLinear") {
      if (p->output == 0 || p->output == 2) return DType::kUInt8;
      return DType::kFloat32;
    }
    if (n.op_type == "QuantizeLinear") {
      if (n.opset >= 21 && n.get_int("output_dtype", 0) != 0) {
        try {
          return dtype_from_onnx(int(n.get_int("output_dtype", 0)), n.describe());
        } catch (const InputError&) {
          return std::nullopt;
        }
      }
      if (n.has_input(2)) return type_of(n.inputs[2]);
      return DType::kUInt8;
    }
    return std::nullopt;
  }

  // Number of values and shape of a scale or zero point known from the graph: an initializer, or
  // DynamicQuantizeLinear's scalar scale / zero point.
  std::optional<Shape> shape_of(const std::string& name) const {
    if (const Tensor* t = initializer(name)) return t->shape();
    auto p = producer(name);
    if (p && p->node->domain.empty() && p->node->op_type == "DynamicQuantizeLinear" && p->output > 0) return Shape{};
    return std::nullopt;
  }

 private:
  const Graph& g_;
  std::map<std::string, Producer> producers_;
  std::map<std::string, DType> inputs_;
};

bool is_8bit(std::optional<DType> t) { return t && (*t == DType::kInt8 || *t == DType::kUInt8); }

bool one_value(const Shape& s) { return s.size() <= 1 && shape_numel(s) == 1; }

// The DequantizeLinear producing `value`, if it is a plain one (default domain, no blocks, 8-bit
// input, zero point of the same type and scale's shape).
const Node* dequantize_of(const GraphIndex& index, const std::string& value) {
  auto p = index.producer(value);
  if (!p) return nullptr;
  const Node& n = *p->node;
  if (!n.domain.empty() || n.op_type != "DequantizeLinear" || n.input_count() < 2) return nullptr;
  if (n.get_int("block_size", 0) != 0) return nullptr;
  const auto t = index.type_of(n.inputs[0]);
  if (!is_8bit(t)) return nullptr;
  const auto scale = index.shape_of(n.inputs[1]);
  if (!scale) return nullptr;
  if (n.has_input(2)) {
    const auto zt = index.type_of(n.inputs[2]);
    const auto zs = index.shape_of(n.inputs[2]);
    if (!zt || *zt != *t || !zs || !(*zs == *scale || (one_value(*zs) && one_value(*scale)))) return nullptr;
  }
  return &n;
}

// An activation operand: one scale.
bool activation_ok(const GraphIndex& index, const Node& dq) { return one_value(*index.shape_of(dq.inputs[1])); }

// A weight operand: an 8-bit initializer of `rank` (0: any) whose scale is one value or one per
// entry of dimension `channel_axis`.
bool weight_ok(const GraphIndex& index, const Node& dq, std::size_t rank, int channel_axis) {
  const Tensor* w = index.initializer(dq.inputs[0]);
  if (!w || (rank && std::size_t(w->rank()) != rank)) return false;
  const Shape scale = *index.shape_of(dq.inputs[1]);
  if (one_value(scale)) return true;
  if (scale.size() != 1 || w->rank() == 0) return false;
  std::int64_t axis = dq.get_int("axis", 1);
  if (axis < 0) axis += w->rank();
  return axis == channel_axis && scale[0] == w->shape()[std::size_t(channel_axis)];
}

// The rewritten node: same name, outputs and attributes; the DQ inputs replaced by theirs.
Node fused_node(const Node& op, const Node& a, const Node& b, const std::string& extra) {
  Node f = op;
  f.domain = kFusedDomain;
  f.opset = 1;
  auto input = [](const Node& dq, std::size_t i) { return dq.has_input(i) ? dq.inputs[i] : std::string(); };
  f.inputs = {a.inputs[0], a.inputs[1], input(a, 2), b.inputs[0], b.inputs[1], input(b, 2)};
  if (op.op_type != "MatMul") f.inputs.push_back(extra);
  return f;
}

}  // namespace

QdqFusion fuse_qdq(const Graph& graph) {
  const GraphIndex index(graph);
  QdqFusion out;
  out.nodes = graph.nodes;
  std::map<std::string, std::set<std::size_t>> readers;  // value -> reading node indices
  for (std::size_t i = 0; i < graph.nodes.size(); ++i)
    for (const auto& in : graph.nodes[i].inputs)
      if (!in.empty()) readers[in].insert(i);

  std::set<std::size_t> fused_indices;
  std::vector<std::pair<std::size_t, std::vector<const Node*>>> candidates;
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& n = graph.nodes[i];
    if (!n.domain.empty() || n.input_count() < 2) continue;
    const bool conv = n.op_type == "Conv", matmul = n.op_type == "MatMul", gemm = n.op_type == "Gemm";
    if (!conv && !matmul && !gemm) continue;
    const Node* a = dequantize_of(index, n.inputs[0]);
    const Node* b = dequantize_of(index, n.inputs[1]);
    if (!a || !b || !activation_ok(index, *a)) continue;
    bool ok = false;
    if (conv) {
      ok = weight_ok(index, *b, 0, 0) && index.initializer(b->inputs[0])->rank() >= 3;
    } else if (matmul) {
      // A constant weight (scale per tensor or per column), or a second activation.
      ok = index.initializer(b->inputs[0])
               ? weight_ok(index, *b, 0, 1) &&
                     (index.initializer(b->inputs[0])->rank() == 2 || one_value(*index.shape_of(b->inputs[1])))
               : activation_ok(index, *b);
    } else {
      const bool trans_b = n.get_int("transB", 0) != 0;
      ok = n.get_int("transA", 0) == 0 && weight_ok(index, *b, 2, trans_b ? 0 : 1);
    }
    if (!ok) continue;
    const std::string extra = n.has_input(2) ? n.inputs[2] : std::string();
    out.nodes[i] = fused_node(n, *a, *b, extra);
    fused_indices.insert(i);
    candidates.push_back({i, {a, b}});
  }

  // DQ nodes whose every reader was fused (and that give no graph output) are dropped.
  std::set<std::string> graph_outputs;
  for (const auto& o : graph.outputs) graph_outputs.insert(o.name);
  std::set<const Node*> dropped;
  for (const auto& [i, dqs] : candidates) {
    FusedNode f{graph.nodes[i].name, graph.nodes[i].op_type, {}};
    for (const Node* dq : dqs) {
      const std::string& v = dq->outputs[0];
      bool all_fused = !graph_outputs.count(v);
      for (std::size_t r : readers[v]) all_fused &= fused_indices.count(r) > 0;
      if (all_fused) {
        f.removed.push_back(dq->name);
        dropped.insert(dq);
      }
    }
    out.fused.push_back(std::move(f));
  }
  std::vector<Node> kept;
  kept.reserve(out.nodes.size());
  for (std::size_t i = 0; i < graph.nodes.size(); ++i)
    if (!dropped.count(&graph.nodes[i])) kept.push_back(std::move(out.nodes[i]));
  out.nodes = std::move(kept);
  return out;
}

}  // namespace qeval::eval::quant
