// The ai.onnx opset upgrade: per-op rewrites between opsets 7 and the target (see opset_upgrade.h).
#include "eval/exec/opset_upgrade.h"

#include <array>
#include <cfloat>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "eval/exec/onnx_import.h"
#include "eval/exec/ops/op.h"
#include "eval/exec/session.h"
#include "kernels/error.h"
#include "kernels/numeric.h"

namespace qeval::eval {

namespace {

Tensor int64s(const std::vector<std::int64_t>& v) {
  Tensor t(DType::kInt64, {static_cast<std::int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<std::int64_t>());
  return t;
}

Tensor floats(const std::vector<float>& v) {
  Tensor t(DType::kFloat32, {static_cast<std::int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

std::vector<double> float_values(const Tensor& t) {
  std::vector<double> v(static_cast<std::size_t>(t.numel()));
  if (t.dtype() == DType::kFloat32) std::copy_n(t.data<float>(), t.numel(), v.begin());
  else if (t.dtype() == DType::kFloat64) std::copy_n(t.data<double>(), t.numel(), v.begin());
  else return {};
  return v;
}

class Upgrader {
 public:
  Upgrader(Graph& g, int from, int target, std::string need)
      : g_(g), from_(from), target_(target), need_(std::move(need)) {
    for (const auto& n : g.nodes) {
      taken_.insert(n.name);
      for (const auto& o : n.outputs) taken_.insert(o);
    }
    for (const auto& [k, v] : g.initializers) taken_.insert(k);
    for (const auto& in : g.inputs) taken_.insert(in.name);
  }

  OpsetUpgrade run() {
    OpsetUpgrade out;
    out.from = from_;
    out.to = target_;
    if (needs_metas()) infer_metas();
    std::vector<Node> nodes;
    nodes.reserve(g_.nodes.size());
    for (Node& n : g_.nodes) {
      if (!n.domain.empty()) {
        nodes.push_back(std::move(n));
        continue;
      }
      const std::size_t first = nodes.size();
      const std::string before = n.describe();
      const bool changed = rewrite(n, nodes);
      if (changed) {
        out.rewritten_nodes++;
        out.notes.push_back(before + ": " + note_);
      }
      for (std::size_t i = first; i < nodes.size(); ++i) {
        Node& m = nodes[i];
        m.opset = target_;
        if (!find_op(m.domain, m.op_type, target_))
          throw UnsupportedError(where(m) + "has no rewrite to opset " + std::to_string(target_) + ": " +
                                 unsupported_reason(m.domain, m.op_type, target_));
      }
    }
    g_.nodes = std::move(nodes);
    g_.opsets[""] = target_;
    return out;
  }

 private:
  bool crosses(int version) const { return from_ < version && version <= target_; }

  std::string where(const Node& n) const {
    return g_.source + ": " + n.describe() + " at opset " + std::to_string(from_) + ": ";
  }
  [[noreturn]] void unsupported(const Node& n, const std::string& what) const {
    throw UnsupportedError(where(n) + what + "; it cannot be upgraded to opset " + std::to_string(target_) +
                           (need_.empty() ? "" : " (" + need_ + ")"));
  }

  std::string fresh(const std::string& base) {
    std::string name = base;
    for (int i = 1; !taken_.insert(name).second; ++i) name = base + "_" + std::to_string(i);
    return name;
  }

  // Puts `value` in input slot `index` (as a new initializer) and drops the attribute.
  void attribute_to_input(Node& n, const std::string& attr, std::size_t index, Tensor value) {
    const std::string name = fresh(n.name + "/" + attr);
    g_.initializers.emplace(name, std::move(value));
    if (n.inputs.size() <= index) n.inputs.resize(index + 1);
    if (!n.inputs[index].empty())
      throw InputError(where(n) + "has both the attribute '" + attr + "' and input " + std::to_string(index));
    n.inputs[index] = name;
    n.attributes.erase(attr);
  }
  void ints_to_input(Node& n, const std::string& attr, std::size_t index) {
    if (!n.has(attr)) return;
    attribute_to_input(n, attr, index, int64s(n.get_ints(attr)));
  }

  // ---- what is known about values (element types, ranks, folded constants) ----

  bool needs_metas() const {
    for (const Node& n : g_.nodes) {
      if (!n.domain.empty()) continue;
      if (crosses(11) && n.op_type == "Clip" && (n.has("min") || n.has("max"))) return true;
      if (crosses(11) && n.op_type == "Pad" && n.get_float("value", 0.0f) != 0.0f) return true;
      if (crosses(13) && (n.op_type == "Softmax" || n.op_type == "LogSoftmax") && n.get_int("axis", 1) != -1)
        return true;
      if ((n.op_type == "Upsample" && from_ >= 9) || (n.op_type == "Resize" && from_ == 10))
        if (n.has_input(1) && !g_.initializers.count(n.inputs[1])) return true;
    }
    return false;
  }

  // Plans the original graph once with its symbolic dimensions guessed (batch 1, others 64): only
  // element types, ranks and constant values are read, and those do not depend on the guess. A
  // graph that does not plan so leaves metas_ empty and the rewrites take their generic forms.
  void infer_metas() {
    std::map<std::string, Shape> shapes;
    for (const ValueInfo& in : g_.inputs) {
      if (!in.has_shape) return;
      Shape s;
      for (std::size_t d = 0; d < in.dims.size(); ++d) s.push_back(in.dims[d] >= 0 ? in.dims[d] : (d == 0 ? 1 : 64));
      shapes[in.name] = s;
    }
    try {
      Session session(g_);
      metas_ = session.infer_metas(shapes);
    } catch (const std::exception&) {
      metas_.clear();
    }
  }

  const ValueMeta* meta(const std::string& value) const {
    auto it = metas_.find(value);
    return it == metas_.end() ? nullptr : &it->second;
  }

  const Tensor* constant(const std::string& value) const {
    if (auto it = g_.initializers.find(value); it != g_.initializers.end()) return &it->second;
    const ValueMeta* m = meta(value);
    return m && m->value ? m->value.get() : nullptr;
  }

  // The element type of a float value (Clip's and Pad's data: float16, float or double at these
  // opsets): from the planned metas, else followed back through producers that keep their first
  // input's type, else float.
  DType float_type(const std::string& value) const {
    if (const ValueMeta* m = meta(value)) return m->declared;
    std::string v = value;
    for (int hops = 0; hops < 10000; ++hops) {
      if (auto it = g_.initializers.find(v); it != g_.initializers.end()) return it->second.dtype();
      for (const ValueInfo& in : g_.inputs)
        if (in.name == v) return in.dtype;
      const Node* producer = nullptr;
      for (const Node& n : g_.nodes)
        for (const auto& o : n.outputs)
          if (o == v) producer = &n;
      if (!producer || producer->inputs.empty() || producer->inputs[0].empty()) break;
      if (producer->op_type == "Cast")
        return dtype_from_onnx(static_cast<int>(producer->get_int("to", 1)), where(*producer));
      v = producer->inputs[0];
    }
    return DType::kFloat32;
  }

  Tensor scalar(DType t, double v, const Node& n) const {
    Tensor s(t, {});
    switch (t) {
      case DType::kFloat32: s.data<float>()[0] = static_cast<float>(v); break;
      case DType::kFloat64: s.data<double>()[0] = v; break;
      case DType::kFloat16:
        reinterpret_cast<std::uint16_t*>(s.raw())[0] = to_float16(static_cast<float>(v)).bits;
        break;
      case DType::kBFloat16:
        reinterpret_cast<std::uint16_t*>(s.raw())[0] = to_bfloat16(static_cast<float>(v)).bits;
        break;
      default:
        unsupported(n, "an attribute value of element type " + std::string(dtype_name(t)) + " cannot become an input");
    }
    return s;
  }

  // ---- the rewrites; each appends the node (and any it adds) to `out`, true when the form changed ----

  bool rewrite(Node& n, std::vector<Node>& out) {
    note_.clear();
    bool changed = false;
    const std::string& op = n.op_type;
    if (op == "Upsample" || (op == "Resize" && from_ == 10)) {
      changed = to_resize11(n);
    } else if (op == "Resize" && crosses(13) &&
               n.get_string("coordinate_transformation_mode", "half_pixel") == "tf_half_pixel_for_nn") {
      changed = tf_half_pixel_for_nn(n);
    } else if (op == "Slice" && crosses(10)) {
      if (!n.has("starts") || !n.has("ends")) throw InputError(where(n) + "needs the attributes starts and ends");
      ints_to_input(n, "starts", 1);
      ints_to_input(n, "ends", 2);
      ints_to_input(n, "axes", 3);
      changed = true;
      note_ = "starts/ends/axes attributes -> inputs";
    } else if (op == "TopK" && crosses(10)) {
      if (!n.has("k")) throw InputError(where(n) + "needs the attribute k");
      attribute_to_input(n, "k", 1, int64s({n.get_int("k", 0)}));
      changed = true;
      note_ = "k attribute -> input";
    } else if (op == "Clip" && crosses(11)) {
      changed = clip(n);
    } else if (op == "Pad" && crosses(11)) {
      changed = pad(n);
    } else if (op == "Dropout" && crosses(12)) {
      if (n.has("ratio")) {
        attribute_to_input(n, "ratio", 1, [&] {
          Tensor r(DType::kFloat32, {});
          r.data<float>()[0] = n.get_float("ratio", 0.5f);
          return r;
        }());
        changed = true;
        note_ = "ratio attribute -> input";
      }
    } else if (op == "BatchNormalization" && crosses(9) && n.has("spatial") && n.get_int("spatial", 1) == 0) {
      return batch_norm_per_activation(n, out);
    } else if (op == "BatchNormalization") {
      changed = batch_norm(n);
    } else if ((op == "Softmax" || op == "LogSoftmax") && crosses(13)) {
      return softmax(n, out);
    }
    if (crosses(13) && (op == "Squeeze" || op == "Unsqueeze" || op == "ReduceSum") && n.has("axes")) {
      ints_to_input(n, "axes", 1);
      changed = true;
      note_ = "axes attribute -> input";
    }
    static const std::set<std::string> reduce_axes_input_at_18{"ReduceMax",    "ReduceMin",       "ReduceMean",
                                                               "ReduceProd",   "ReduceL1",        "ReduceL2",
                                                               "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"};
    if (crosses(18) && reduce_axes_input_at_18.count(op) && n.has("axes")) {
      ints_to_input(n, "axes", 1);
      changed = true;
      note_ = "axes attribute -> input";
    }
    if (op == "Split") changed |= split(n);
    out.push_back(std::move(n));
    return changed;
  }

  // Upsample-7 (scales attribute), Upsample-9 and Resize-10 (scales input) -> Resize-11+.
  bool to_resize11(Node& n) {
    if (from_ < 7 || (n.op_type == "Resize" && from_ != 10)) return false;
    const std::string mode = n.get_string("mode", "nearest");
    if (mode != "nearest" && mode != "linear")
      throw InputError(where(n) + "mode must be 'nearest' or 'linear', got '" + mode + "'");
    std::optional<std::vector<double>> scales;
    std::string scales_name;
    if (n.op_type == "Upsample" && from_ < 9) {
      if (!n.has("scales")) throw InputError(where(n) + "needs the attribute scales");
      const std::vector<float> s = n.get_floats("scales");
      scales = std::vector<double>(s.begin(), s.end());
      scales_name = fresh(n.name + "/scales");
      g_.initializers.emplace(scales_name, floats(s));
      n.attributes.erase("scales");
    } else {
      if (!n.has_input(1)) throw InputError(where(n) + "needs the scales input");
      scales_name = n.inputs[1];
      if (const Tensor* t = constant(scales_name)) scales = float_values(*t);
    }
    std::string rounding;
    if (mode == "nearest") {
      // These opsets' nearest takes floor(x / scale) when enlarging and ceil when shrinking (the
      // node tests of Resize-10 downsampling expect the ceiling; ONNX Runtime does the same);
      // Resize-11+ has one nearest_mode for all axes.
      bool up = false, down = false;
      if (scales) {
        for (double s : *scales) {
          up |= s > 1;
          down |= s < 1;
        }
      } else if (n.op_type == "Upsample") {
        up = true;  // Upsample's scales are >= 1 by definition
      } else {
        unsupported(n, "nearest resizing with scales '" + scales_name +
                           "' that are not constant (the rounding depends on whether they enlarge)");
      }
      if (up && down)
        unsupported(n, "nearest resizing that enlarges some axes and shrinks others (floor and ceiling rounding)");
      rounding = down ? "ceil" : "floor";
      n.attributes["nearest_mode"] = Attribute::of_string(rounding);
    }
    note_ = n.op_type + "-" + std::to_string(from_) + " -> Resize (asymmetric" +
            (rounding.empty() ? "" : ", nearest_mode " + rounding) + ")";
    n.op_type = "Resize";
    n.inputs = {n.inputs.at(0), "", scales_name};
    n.attributes["coordinate_transformation_mode"] = Attribute::of_string("asymmetric");
    return true;
  }

  // tf_half_pixel_for_nn (x + 0.5) / scale, removed at 13: it is half_pixel's coordinate + 0.5, so
  // floor and round_prefer_floor of it are round_prefer_ceil and ceil of half_pixel's.
  bool tf_half_pixel_for_nn(Node& n) {
    if (n.get_string("mode", "nearest") != "nearest")
      unsupported(n, "tf_half_pixel_for_nn with mode '" + n.get_string("mode", "nearest") + "'");
    const std::string nearest = n.get_string("nearest_mode", "round_prefer_floor");
    std::string to;
    if (nearest == "floor") to = "round_prefer_ceil";
    else if (nearest == "round_prefer_floor") to = "ceil";
    else unsupported(n, "tf_half_pixel_for_nn with nearest_mode '" + nearest + "'");
    n.attributes["coordinate_transformation_mode"] = Attribute::of_string("half_pixel");
    n.attributes["nearest_mode"] = Attribute::of_string(to);
    note_ = "tf_half_pixel_for_nn + " + nearest + " -> half_pixel + " + to;
    return true;
  }

  bool clip(Node& n) {
    if (!n.has("min") && !n.has("max")) return false;
    if (!n.has_input(0)) throw InputError(where(n) + "needs an input");
    const DType t = float_type(n.inputs[0]);
    // Before 11 an absent bound was -+FLT_MAX; from 11 it is the type's own limit, which only
    // differs for double, so double gets both bounds written out.
    const bool both = t == DType::kFloat64;
    if (n.has("min") || both) attribute_to_input(n, "min", 1, scalar(t, n.get_float("min", -FLT_MAX), n));
    if (n.has("max") || both) attribute_to_input(n, "max", 2, scalar(t, n.get_float("max", FLT_MAX), n));
    note_ = "min/max attributes -> inputs (" + std::string(dtype_name(t)) + ")";
    return true;
  }

  bool pad(Node& n) {
    if (!n.has("pads")) throw InputError(where(n) + "needs the attribute pads");
    ints_to_input(n, "pads", 1);
    const float value = n.get_float("value", 0.0f);
    if (n.has("value") && value != 0.0f) {
      attribute_to_input(n, "value", 2, scalar(float_type(n.inputs[0]), value, n));
    }
    n.attributes.erase("value");
    note_ = "pads/value attributes -> inputs";
    return true;
  }

  // spatial=0 (BatchNormalization-7/8): statistics per activation, shaped like X without its batch
  // dimension; opset 9 has no such form, so it becomes (X - mean) * (scale / sqrt(var + epsilon))
  // + B with the factor folded in double, as the executor's kernel folds it.
  bool batch_norm_per_activation(Node& n, std::vector<Node>& out) {
    std::array<const Tensor*, 4> p{};  // scale, B, mean, var
    for (std::size_t i = 0; i < 4; ++i) {
      p[i] = n.has_input(i + 1) ? constant(n.inputs[i + 1]) : nullptr;
      if (!p[i] || (p[i]->dtype() != DType::kFloat32 && p[i]->dtype() != DType::kFloat64))
        unsupported(n, "spatial=0 with input " + std::to_string(i + 1) +
                           " that is not a float or double constant (it is folded into the graph)");
      if (p[i]->shape() != p[0]->shape())
        throw InputError(where(n) + "inputs 1-4 must have one shape, got " + shape_to_string(p[0]->shape()) + " and " +
                         shape_to_string(p[i]->shape()));
    }
    if (const ValueMeta* m = meta(n.inputs[0]); m && m->shape.size() != p[0]->shape().size() + 1)
      unsupported(n, "spatial=0 with statistics of shape " + shape_to_string(p[0]->shape()) + " for a rank-" +
                         std::to_string(m->shape.size()) + " X (they broadcast only when shaped like X[1:])");
    if (n.outputs.size() > 1 && !n.outputs[1].empty())
      unsupported(n, "output 1 ('" + n.outputs[1] + "') asks for training-mode statistics");
    const double epsilon = n.get_float("epsilon", 1e-5f);
    auto values = [](const Tensor& t) {
      std::vector<double> v(static_cast<std::size_t>(t.numel()));
      for (std::size_t i = 0; i < v.size(); ++i)
        v[i] = t.dtype() == DType::kFloat32 ? t.data<float>()[i] : t.data<double>()[i];
      return v;
    };
    const std::vector<double> scale = values(*p[0]), var = values(*p[3]);
    Tensor factor(p[0]->dtype(), p[0]->shape());
    for (std::size_t i = 0; i < scale.size(); ++i) {
      const double a = scale[i] / std::sqrt(var[i] + epsilon);
      if (factor.dtype() == DType::kFloat32) factor.data<float>()[i] = static_cast<float>(a);
      else factor.data<double>()[i] = a;
    }
    const std::string factor_name = fresh(n.name + "/factor");
    g_.initializers.emplace(factor_name, std::move(factor));
    auto make = [&](const char* op, std::vector<std::string> inputs, std::string output) {
      Node m;
      m.op_type = op;
      m.name = fresh(n.name + "/" + op);
      m.inputs = std::move(inputs);
      m.outputs = {output.empty() ? fresh(m.name + "_output_0") : output};
      return m;
    };
    Node sub = make("Sub", {n.inputs[0], n.inputs[3]}, "");
    Node mul = make("Mul", {sub.outputs[0], factor_name}, "");
    Node add = make("Add", {mul.outputs[0], n.inputs[2]}, n.outputs.at(0));
    note_ = "spatial=0 -> Sub, Mul, Add with the statistics per activation";
    out.push_back(std::move(sub));
    out.push_back(std::move(mul));
    out.push_back(std::move(add));
    return true;
  }

  bool batch_norm(Node& n) {
    bool changed = false;
    if (crosses(9) && n.has("spatial")) {
      n.attributes.erase("spatial");
      changed = true;
      note_ = "spatial attribute dropped";
    }
    if (crosses(14)) {
      while (n.outputs.size() > 1 && n.outputs.back().empty()) n.outputs.pop_back();
      if (n.outputs.size() > 1) unsupported(n, "output 1 ('" + n.outputs[1] + "') asks for training-mode statistics");
    }
    return changed;
  }

  bool split(Node& n) {
    bool changed = false;
    if (crosses(13) && n.has("split")) {
      ints_to_input(n, "split", 1);
      changed = true;
      note_ = "split attribute -> input";
    }
    // From 18 a Split without sizes must say how many parts.
    if (crosses(18) && !n.has_input(1) && !n.has("num_outputs")) {
      n.attributes["num_outputs"] = Attribute::of_int(static_cast<std::int64_t>(n.outputs.size()));
      changed = true;
      note_ = "num_outputs " + std::to_string(n.outputs.size()) + " (equal parts)";
    }
    return changed;
  }

  // Before 13, Softmax coerced its input to 2-D at `axis` (default 1) and normalised rows; from 13
  // it normalises along one axis (default -1). The same when the axis is the last one; otherwise
  // Flatten(axis) -> Softmax(-1) -> Reshape(Shape(x)) computes the old meaning exactly.
  bool softmax(Node& n, std::vector<Node>& out) {
    const std::int64_t axis = n.get_int("axis", 1);
    if (!n.has_input(0)) throw InputError(where(n) + "needs an input");
    const std::string x = n.inputs[0];
    const ValueMeta* m = meta(x);
    const auto rank = m ? static_cast<std::int64_t>(m->shape.size()) : -1;
    if (axis == -1 || (rank > 0 && axis == rank - 1)) {
      n.attributes["axis"] = Attribute::of_int(-1);
      note_ = "axis " + std::to_string(axis) + " is the last axis: axis -1";
      out.push_back(std::move(n));
      return true;
    }
    const std::string y = n.outputs.at(0);
    Node shape;
    shape.op_type = "Shape";
    shape.name = fresh(n.name + "/Shape");
    shape.inputs = {x};
    shape.outputs = {fresh(shape.name + "_output_0")};
    Node flatten;
    flatten.op_type = "Flatten";
    flatten.name = fresh(n.name + "/Flatten");
    flatten.inputs = {x};
    flatten.outputs = {fresh(flatten.name + "_output_0")};
    flatten.attributes["axis"] = Attribute::of_int(axis);
    Node reshape;
    reshape.op_type = "Reshape";
    reshape.name = fresh(n.name + "/Reshape");
    n.inputs[0] = flatten.outputs[0];
    n.outputs[0] = fresh(n.name + "_2d_output_0");
    n.attributes["axis"] = Attribute::of_int(-1);
    reshape.inputs = {n.outputs[0], shape.outputs[0]};
    reshape.outputs = {y};
    note_ = "axis " + std::to_string(axis) + " of a rank-" + (rank >= 0 ? std::to_string(rank) : std::string("?")) +
            " input: Flatten -> " + n.op_type + "(-1) -> Reshape";
    out.push_back(std::move(shape));
    out.push_back(std::move(flatten));
    out.push_back(std::move(n));
    out.push_back(std::move(reshape));
    return true;
  }

  Graph& g_;
  const int from_, target_;
  const std::string need_;
  std::unordered_set<std::string> taken_;
  std::map<std::string, ValueMeta> metas_;
  std::string note_;
};

}  // namespace

OpsetUpgrade upgrade_opset(Graph& graph, int target, const std::string& need) {
  auto it = graph.opsets.find("");
  const int from = it == graph.opsets.end() ? target : it->second;
  if (from >= target) return {from, from, 0, {}};
  if (from < kOldestUpgradableOpset)
    throw InputError(graph.source + ": ai.onnx opset " + std::to_string(from) + " is too old" +
                     (need.empty() ? "" : " " + need) + ": qeval upgrades opset " +
                     std::to_string(kOldestUpgradableOpset) + " or later to " + std::to_string(target) +
                     "; re-export the model at opset " + std::to_string(kOldestUpgradableOpset) + " or later");
  return Upgrader(graph, from, target, need).run();
}

}  // namespace qeval::eval
