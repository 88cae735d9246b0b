// Planning: shapes and types inferred node by node, constant sub-graphs folded on the CPU, value
// lifetimes (which buffers die after which step), rounding points, and the fused step lists.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <unordered_map>

#include "eval/exec/ops/moves.h"
#include "eval/exec/plan.h"
#include "eval/exec/spill.h"
#include "kernels/error.h"
#include "kernels/numeric.h"

namespace qeval::eval {

namespace {

// Whether a step only moves elements of float inputs that are all exact in its outputs' (one)
// rounding, so that its outputs are exact in it too (P: Session::Plan).
template <class P>
bool moves_exact_values(const P& p, const typename P::Step& step, const Node& node, Precision precision) {
  if (!moves_elements(node)) return false;
  Rounding r = Rounding::kNone;
  for (int id : step.out) {
    if (id < 0) continue;
    const Rounding o = p.rounding[std::size_t(id)];
    if (o == Rounding::kNone || (r != Rounding::kNone && o != r)) return false;
    r = o;
  }
  if (r == Rounding::kNone) return false;
  for (int id : step.in)
    if (id >= 0 && p.metas[std::size_t(id)].dtype == DType::kFloat32 && exact_format(p, id, precision) != r)
      return false;
  return true;
}

// A fold that every session given the same SharedConstants can take from it: one input of 1 MiB
// or more (a weight: its form is the store's, the same tensor in every such session), any others
// small constants, one output. Returns that input's id and the store key (the node's op and
// attributes, the small inputs' bytes, the output's type and rounding); nullopt for any other fold.
template <class P>
std::optional<std::pair<int, std::string>> shared_fold(const P& p, const typename P::Step& step, const Node& node) {
  constexpr std::size_t kLarge = std::size_t(1) << 20;
  constexpr std::int64_t kSmall = 64;
  if (step.out.size() != 1 || step.out[0] < 0) return std::nullopt;
  auto bytes_of = [](const Tensor& t) {
    std::string b = std::string(dtype_name(t.dtype())) + shape_to_string(t.shape()) + ":";
    b.append(reinterpret_cast<const char*>(t.raw()), t.nbytes());
    return b;
  };
  int large = -1;
  std::string key = "fold " + node.domain + "." + node.op_type + " " + std::to_string(node.opset);
  for (int id : step.in) {
    if (id < 0) {
      key += "|-";
      continue;
    }
    const Tensor& t = *p.constants[std::size_t(id)];
    if (t.nbytes() >= kLarge && large < 0) {
      large = id;
      key += "|W";
    } else if (t.numel() <= kSmall) {
      key += "|" + bytes_of(t);
    } else {
      return std::nullopt;
    }
  }
  if (large < 0) return std::nullopt;
  for (const auto& [name, a] : node.attributes) {
    // Floats by their bits: two attributes that print alike are not the same fold.
    key += "|" + name + "=" + std::to_string(int(a.kind)) + ":" + std::to_string(a.i) + ":" +
           std::to_string(std::bit_cast<std::uint32_t>(a.f)) + ":" + a.s;
    for (std::int64_t v : a.ints) key += "," + std::to_string(v);
    for (float v : a.floats) key += "," + std::to_string(std::bit_cast<std::uint32_t>(v));
    for (const auto& v : a.strings) key += "," + v;
    if (a.kind == Attribute::Kind::kTensor) {
      if (a.t.numel() > kSmall) return std::nullopt;
      key += bytes_of(a.t);
    }
  }
  const auto& m = p.metas[std::size_t(step.out[0])];
  key += "|out " + std::string(dtype_name(m.dtype)) + " " + std::string(dtype_name(m.declared)) + " rounding " +
         std::to_string(int(p.rounding[std::size_t(step.out[0])]));
  return std::make_pair(large, std::move(key));
}

}  // namespace

Session::Plan& Session::plan_for(const std::map<std::string, Shape>& input_shapes,
                                 const std::map<std::string, const Tensor*>& int_values) {
  std::vector<Shape> shapes;
  std::string key;
  for (const auto& in : graph_.inputs) {
    auto it = input_shapes.find(in.name);
    if (it == input_shapes.end()) throw InputError(graph_.source + ": input '" + in.name + "' was not given");
    shapes.push_back(it->second);
    key += shape_to_string(it->second);
    if (auto v = int_values.find(in.name); v != int_values.end())
      key.append("=").append(reinterpret_cast<const char*>(v->second->raw()), v->second->nbytes());
    key += ";";
  }
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;

  const auto started = std::chrono::steady_clock::now();
  auto plan = std::make_unique<Plan>();
  Plan& p = *plan;
  auto new_value = [&](const std::string& name) {
    int id = static_cast<int>(p.metas.size());
    p.ids[name] = id;
    p.metas.emplace_back();
    p.constants.emplace_back();
    p.rounding.push_back(Rounding::kNone);
    return id;
  };
  auto set_constant = [&](int id, std::shared_ptr<const Tensor> t, DType declared) {
    p.metas[std::size_t(id)] = ValueMeta{t->dtype(), declared, t->shape(), t};
    p.constants[std::size_t(id)] = std::move(t);
  };

  for (const auto& [name, t] : graph_.initializers) set_constant(new_value(name), weights_.at(name), t.dtype());
  for (const auto& [name, t] : folded_weights_) set_constant(new_value(name), weights_.at(name), t.dtype());
  for (std::size_t i = 0; i < graph_.inputs.size(); ++i) {
    const auto& in = graph_.inputs[i];
    if (p.ids.count(in.name)) continue;
    int id = new_value(in.name);
    p.metas[std::size_t(id)] = meta_of(in.dtype, shapes[i]);
    p.rounding[std::size_t(id)] = rounding_for(storage_type(in.dtype), in.dtype, options_.precision);
    p.input_ids.push_back(id);
    if (auto v = int_values.find(in.name); v != int_values.end())
      set_constant(id, std::make_shared<const Tensor>(*v->second), in.dtype);
  }

  const std::uint64_t max_bytes = options_.max_tensor_bytes ? options_.max_tensor_bytes : max_tensor_bytes();
  for (std::size_t n = 0; n < nodes_.size(); ++n) {
    const Node& node = nodes_[n];
    Plan::Step step;
    step.node = n;
    std::vector<const ValueMeta*> in_metas;
    bool all_constant = true;
    for (const auto& name : node.inputs) {
      if (name.empty()) {
        step.in.push_back(-1);
        in_metas.push_back(nullptr);
        continue;
      }
      int id = p.ids.at(name);
      step.in.push_back(id);
      in_metas.push_back(&p.metas[std::size_t(id)]);
      all_constant &= p.constants[std::size_t(id)] != nullptr;
    }
    std::vector<ValueMeta> out_metas;
    try {
      out_metas = ops_[n]->infer(in_metas);  // may compute a value (Shape, Range)
    } catch (const std::bad_alloc&) {
      throw InputError(graph_.source + ": " + node.describe() + ": out of memory while inferring its outputs");
    } catch (const std::invalid_argument& e) {
      // shape_numel's overflow (a Reshape to [2^32, 2^32, 2^32]): the model's shapes, not a fault.
      throw InputError(graph_.source + ": " + node.describe() + ": " + e.what());
    }
    if (out_metas.size() < node.outputs.size())  // a model's mistake (fuzz_onnx_loader: Log with 2 outputs)
      throw InputError(graph_.source + ": " + node.describe() + " has " + std::to_string(node.outputs.size()) +
                       " outputs; the op gives " + std::to_string(out_metas.size()));
    bool op_gave_values = true;
    for (std::size_t o = 0; o < node.outputs.size(); ++o)
      op_gave_values &= node.outputs[o].empty() || out_metas[o].value != nullptr;
    // Sizes are checked before anything is allocated: an Expand or ConstantOfShape to [2^45]
    // must name the node, not end in a bad_alloc. An element count past int64 is always an
    // error; the memory limit applies here to values folded now, and after fusion to the values
    // a run allocates (attention scores inside a fused step never exist as a tensor).
    const bool folds_now = !op_gave_values && all_constant;
    for (std::size_t o = 0; o < node.outputs.size(); ++o) {
      if (node.outputs[o].empty()) continue;
      const ValueMeta& m = out_metas[o];
      const auto numel = try_shape_numel(m.shape);
      const auto bytes = numel ? try_nbytes(m.dtype, *numel) : std::nullopt;
      if (!bytes)
        throw InputError(graph_.source + ": " + node.describe() + ": output '" + node.outputs[o] + "' " +
                         shape_to_string(m.shape) + " has more elements than fit in 64 bits");
      if (folds_now && *bytes > max_bytes) fail_over_memory(graph_.source, node, node.outputs[o], m, max_bytes);
    }
    for (std::size_t o = 0; o < node.outputs.size(); ++o) {
      if (node.outputs[o].empty()) {
        step.out.push_back(-1);
        continue;
      }
      int id = new_value(node.outputs[o]);
      step.out.push_back(id);
      ValueMeta& m = p.metas[std::size_t(id)];
      m = out_metas[o];
      p.rounding[std::size_t(id)] = rounding_for(m.dtype, m.declared, options_.precision);
      if (m.value) p.constants[std::size_t(id)] = m.value;
    }
    if (folds_now) {
      // Constant sub-graph: compute it once now.
      auto fold = [&] {
        std::vector<const Tensor*> ins;
        for (int id : step.in) ins.push_back(id < 0 ? nullptr : p.constants[std::size_t(id)].get());
        std::vector<Tensor> outs;
        try {
          for (int id : step.out)
            outs.emplace_back(id < 0 ? Tensor() : Tensor(p.metas[std::size_t(id)].dtype, p.metas[std::size_t(id)].shape));
          std::vector<Tensor*> out_ptrs;
          for (std::size_t o = 0; o < outs.size(); ++o) out_ptrs.push_back(step.out[o] < 0 ? nullptr : &outs[o]);
          ops_[n]->run(ins, out_ptrs);
        } catch (const std::bad_alloc&) {
          std::vector<std::pair<std::string, const ValueMeta*>> outputs;
          for (std::size_t o = 0; o < step.out.size(); ++o)
            if (step.out[o] >= 0) outputs.emplace_back(node.outputs[o], &p.metas[std::size_t(step.out[o])]);
          fail_out_of_memory(graph_.source, node, outputs);
        }
        for (const Tensor* in : ins)  // mapped weights folded into new constants (a Transpose of one)
          if (in) in->release_pages();
        for (std::size_t o = 0; o < outs.size(); ++o) {
          if (step.out[o] < 0) continue;
          apply_rounding(outs[o], p.rounding[std::size_t(step.out[o])]);
          // On the CPU a large folded constant (an FP16 export's 722 transposed weights: 9 GB of
          // float32 at SDXL's size) goes to a temporary file: once packed it leaves memory as the
          // weights it came from did. A device backend uploads it once.
          if (!device_) outs[o] = spilled(std::move(outs[o]));
        }
        return outs;
      };
      // A weight's fold (a Transpose of it) is made once for every session of the run's store, so
      // its packed form and device copy are shared too: an fp16 variant of an FP16 SDXL export
      // folded and packed 6 GB again beside the reference's.
      const auto shared = options_.constants ? shared_fold(p, step, node) : std::nullopt;
      if (shared) {
        const int id = step.out[0];
        auto form = options_.constants->get<Tensor>(p.constants[std::size_t(shared->first)], shared->second,
                                                    [&](const Tensor&) { return std::move(fold()[0]); });
        if (device_) shared_weights_.insert(form.get());
        set_constant(id, std::move(form), p.metas[std::size_t(id)].declared);
      } else {
        std::vector<Tensor> outs = fold();
        for (std::size_t o = 0; o < outs.size(); ++o)
          if (step.out[o] >= 0)
            set_constant(step.out[o], std::make_shared<const Tensor>(std::move(outs[o])),
                         p.metas[std::size_t(step.out[o])].declared);
      }
      step.folded = true;
    } else if (op_gave_values) {
      step.folded = true;
    }
    if (!step.folded && step.in.size() >= 1 && step.in[0] >= 0 && step.out.size() == 1 && step.out[0] >= 0 &&
        keeps_element_order(node)) {
      const ValueMeta &a = p.metas[std::size_t(step.in[0])], &b = p.metas[std::size_t(step.out[0])];
      step.view = a.dtype == b.dtype && shape_numel(a.shape) == shape_numel(b.shape);
    }
    p.steps.push_back(std::move(step));
  }

  for (const auto& out : graph_.outputs) p.output_ids.push_back(p.ids.at(out.name));
  if (options_.precision == Precision::kFp16 || options_.precision == Precision::kBf16) keep_fused_intermediates(p);
  // Each step that runs: its device kernel (a device backend), or its CPU op prepared (weights
  // packed), once every value's rounding is final.
  for (Plan::Step& step : p.steps) {
    if (step.folded) continue;
    const Node& node = nodes_[step.node];
    step.exact_outputs = moves_exact_values(p, step, node, options_.precision);
    std::vector<const ValueMeta*> in_metas;
    for (int id : step.in) in_metas.push_back(id < 0 ? nullptr : &p.metas[std::size_t(id)]);
    if (device_) {  // a device backend: its kernel, or the CPU's op and why
      std::vector<ValueMeta> outs;
      for (int id : step.out) outs.push_back(id < 0 ? ValueMeta{} : p.metas[std::size_t(id)]);
      std::vector<Rounding> exact;  // the format each input's values are exact in
      for (int id : step.in) exact.push_back(exact_format(p, id, options_.precision));
      std::string why;
      step.kernel = backend_->compile(node, *ops_[step.node], in_metas, exact, outs, why);
      if (!step.kernel) p.host_steps.push_back({step.node, why.empty() ? "no device kernel" : why});
    }
    if (!step.kernel) ops_[step.node]->prepare(in_metas);
  }
  fuse(p);
  // The values an unobserved run allocates, against the machine's memory (an observed run also
  // writes fused steps' intermediates; a failed allocation there is caught in Execution::step).
  for (const Plan::Step& st : p.fused_steps.empty() ? p.steps : p.fused_steps) {
    if (st.folded) continue;
    for (int id : st.out) {
      if (id < 0 || p.constants[std::size_t(id)]) continue;
      const ValueMeta& m = p.metas[std::size_t(id)];
      if (*try_nbytes(m.dtype, *try_shape_numel(m.shape)) <= max_bytes) continue;  // both checked above
      for (const auto& [name, value_id] : p.ids)
        if (value_id == id) fail_over_memory(graph_.source, nodes_[st.node], name, m, max_bytes);
    }
  }
  // Liveness: a runtime value dies after its last reader (graph outputs never die).
  auto assign_releases = [&](std::vector<Plan::Step>& steps) {
    std::vector<int> last_use(p.metas.size(), -1);
    for (std::size_t s = 0; s < steps.size(); ++s) {
      if (steps[s].folded) continue;
      for (int id : steps[s].in)
        if (id >= 0) last_use[std::size_t(id)] = static_cast<int>(s);
      for (int id : steps[s].out)
        if (id >= 0 && last_use[std::size_t(id)] < 0) last_use[std::size_t(id)] = static_cast<int>(s);
    }
    for (int id : p.output_ids) last_use[std::size_t(id)] = -2;
    for (std::size_t id = 0; id < last_use.size(); ++id)
      if (last_use[id] >= 0 && !p.constants[id]) steps[std::size_t(last_use[id])].release.push_back(int(id));
  };
  assign_releases(p.steps);
  if (!p.fused_steps.empty()) assign_releases(p.fused_steps);
  if (!p.observed_steps.empty()) assign_releases(p.observed_steps);

  Plan& ref = *plan;
  plans_.emplace(std::move(key), std::move(plan));
  add_profile("setup: plan", started);
  return ref;
}

std::map<std::string, ValueMeta> Session::infer_metas(const std::map<std::string, Shape>& input_shapes) {
  Plan& p = plan_for(input_shapes, {});
  std::map<std::string, ValueMeta> out;
  for (const auto& [name, id] : p.ids) out[name] = p.metas[std::size_t(id)];
  return out;
}

// One run's state: the plan, the values (slots), where it is. Session::run is
// start, step until done, finish; the evaluator interleaves the executions of
// several sessions node by node.

}  // namespace qeval::eval
