// Running a plan: one step at a time (Session::Execution), inputs checked against the model,
// buffers taken from and given back to the pool as values are born and die, observers told.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <unordered_map>

#include "eval/exec/plan.h"
#include "kernels/error.h"
#include "kernels/numeric.h"

namespace qeval::eval {

// A kept value: the execution's tensor while it needs it (`live`), then the buffer handed over
// (`owned`), back to `pool` when the last handle goes.
struct KeptValue::State {
  const Tensor* live = nullptr;
  Tensor owned;
  std::shared_ptr<BufferPool> pool;  // null for values the execution never frees (constants, inputs)
  bool wanted = true;                // false after let_go(): the execution frees it as usual
  ~State() {
    if (pool && owned.capacity() > 0) pool->give(std::move(owned));
  }
};

const Tensor* KeptValue::get() const { return state_ ? state_->live : nullptr; }
bool KeptValue::owned() const { return state_ && state_->owned.capacity() > 0; }
void KeptValue::let_go() {
  if (!state_) return;
  if (owned()) state_.reset();
  else state_->wanted = false;
}

class Session::Execution::State final : public ValueLender {
 public:
  State(Session& s, const std::map<std::string, const Tensor*>& inputs, Observer* observer, bool retain)
      : s_(s), observer_(observer), retain_(retain) {
    // Check the inputs against the model before planning.
    std::map<std::string, Shape> shapes;
    for (const auto& in : s_.graph_.inputs) {
      auto it = inputs.find(in.name);
      if (it == inputs.end()) {
        std::string given;
        for (const auto& [k, _] : inputs) given += (given.empty() ? "" : ", ") + k;
        throw InputError(s_.graph_.source + ": missing input '" + in.name +
                         "' (given: " + (given.empty() ? "none" : given) + ")");
      }
      const Tensor& t = *it->second;
      if (t.dtype() != in.dtype)
        throw InputError(s_.graph_.source + ": input '" + in.name + "' must be " + std::string(dtype_name(in.dtype)) +
                         ", got " + std::string(dtype_name(t.dtype())));
      if (in.has_shape) {
        bool ok = in.dims.size() == t.shape().size();
        for (std::size_t d = 0; ok && d < in.dims.size(); ++d) ok = in.dims[d] < 0 || in.dims[d] == t.shape()[d];
        if (!ok) {
          std::string want = "[";
          for (std::size_t d = 0; d < in.dims.size(); ++d)
            want += (d ? ", " : "") + (in.dims[d] >= 0 ? std::to_string(in.dims[d])
                                                       : (in.dim_params[d].empty() ? "?" : in.dim_params[d]));
          throw InputError(s_.graph_.source + ": input '" + in.name + "' has shape " + shape_to_string(t.shape()) +
                           ", the model expects " + want + "]");
        }
      }
      shapes[in.name] = t.shape();
    }
    for (const auto& given : inputs) {
      const std::string& name = given.first;
      if (std::none_of(s_.graph_.inputs.begin(), s_.graph_.inputs.end(),
                       [&](const ValueInfo& v) { return v.name == name; }))
        throw InputError(s_.graph_.source + ": the model has no input named '" + name + "'");
    }

    // Small integer/bool inputs are planned as constants (shape tensors fed as
    // inputs, as the ONNX node tests do); larger ones stay runtime data.
    // (Read on the host: one in device memory, a local run's input, is copied there first.)
    std::map<std::string, const Tensor*> int_values;
    for (const auto& [name, t] : inputs)
      if (((t->dtype() == DType::kInt64 || t->dtype() == DType::kInt32 || t->dtype() == DType::kBool) &&
           t->numel() <= 64) ||
          s_.constant_graph_inputs_.count(name))
        int_values[name] = t->on_device() ? &host_inputs_.emplace_back(t->to_host()) : t;
    p_ = &s_.plan_for(shapes, int_values);
    Plan& p = *p_;
    ++p.executions;
    if (retain_) slots_ = std::move(p.retained);
    slots_.resize(p.metas.size());
    mirrors_.resize(p.metas.size());
    kept_.resize(p.metas.size());
    // Inputs already in storage form with nothing to round are read in place,
    // not copied.
    aliased_.assign(p.metas.size(), nullptr);
    for (std::size_t i = 0; i < s_.graph_.inputs.size(); ++i) {
      int id = p.ids.at(s_.graph_.inputs[i].name);
      if (p.constants[std::size_t(id)]) continue;
      const Tensor& given = *inputs.at(s_.graph_.inputs[i].name);
      const Rounding r = p.rounding[std::size_t(id)];
      if (storage_type(given.dtype()) == given.dtype() && (r == Rounding::kNone || given.dtype() != DType::kFloat32)) {
        aliased_[std::size_t(id)] = &given;
        continue;
      }
      Tensor& slot = slots_[std::size_t(id)];
      if (given.on_device() && storage_type(given.dtype()) == given.dtype()) {
        // float32 in device memory (a local run on the reference's values): rounded there
        if (slot.device() != given.device() || !slot.reuse_as(given.dtype(), given.shape())) {
          if (slot.capacity() > 0) s_.pool_->give(std::move(slot));
          slot = s_.pool_->take(given.dtype(), given.shape(), given.device());
        }
        given.device()->copy(slot.device_data(), given.device_data(), given.nbytes());
        if (r != Rounding::kNone) s_.backend_->round(slot, r);
      } else if (storage_type(given.dtype()) == given.dtype()) {  // float32 to round: a pooled copy
        if (slot.on_device() || !slot.reuse_as(given.dtype(), given.shape())) slot = s_.pool_->take(given.dtype(), given.shape());
        std::memcpy(slot.raw(), given.raw(), given.nbytes());
        apply_rounding(slot, r);
      } else {
        slot = to_storage(given.on_device() ? given.to_host() : given);
        apply_rounding(slot, r);
      }
      // Inputs converted to storage form are activations too (their release subtracts them).
      // Retained buffers of other values count when a step takes them.
      live_ += slot.capacity();
      live_exact_ += slot.nbytes();
    }
    s_.peak_bytes_ = live_;
    s_.live_peak_bytes_ = live_exact_;
    // Observers see every node: fused groups write each member's output for them.
    const std::vector<Plan::Step>& fused = observer_ ? p.observed_steps : p.fused_steps;
    steps_ = fused.empty() ? &p.steps : &fused;
  }

  bool done() const { return next_ >= steps_->size(); }
  const Node& next_node() const { return s_.nodes_[(*steps_)[next_].node]; }
  std::size_t next_index() const { return (*steps_)[next_].node; }
  const std::vector<Node>& nodes() const { return s_.nodes_; }
  std::span<const std::size_t> next_indices() const {
    const Plan::Step& step = (*steps_)[next_];
    return step.members.empty() ? std::span<const std::size_t>(&step.node, 1) : step.member_nodes;
  }

  void step() {
    const Plan& p = *p_;
    // A plan's first execution (weights packed, constants uploaded on first use) counts as set-up.
    struct FirstRun {
      Session* s;
      std::chrono::steady_clock::time_point since = s ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
      ~FirstRun() {
        if (s) s->add_profile("setup: first run", since);
      }
    } first_run{profiling() && p.executions == 1 ? &s_ : nullptr};
    const Plan::Step& step = (*steps_)[next_++];
    BufferPool& pool = *s_.pool_;
    // On a device backend a compiled node or a fused group runs on the device, any other node on
    // the CPU: each input is read where the step runs (copied there once, kept while it lives).
    const bool on_device = s_.device_ && (step.kernel || step.fused);
    // Host time outside the timed window (input copies, observers, releases), when profiling.
    const bool profile = profiling() && p_->executions > 1;
    HostTime outside(profile ? this : nullptr, s_.nodes_[step.node].op_type);
    // Its output buffers, an op's scratch or the copies of its inputs (a weight's first upload):
    // the graph asks for more than the machine has.
    auto out_of_memory = [&] {
      std::vector<std::pair<std::string, const ValueMeta*>> outputs;  // a fused step's: every member's
      for (int id : step.out)
        for (const auto& [name, value_id] : p.ids)
          if (id >= 0 && value_id == id) outputs.emplace_back(name, &p.metas[std::size_t(id)]);
      fail_out_of_memory(s_.graph_.source, s_.nodes_[step.node], outputs);
    };
    // A folded step's output is a constant: its inputs are read only for an observer, where the
    // observer reads them (a Shape of a device activation is not copied to the host for an
    // observer that reads device values: 159 GB in a full-size 2 x 20 observed run).
    // A device value is copied to the host for an observer that reads host memory only.
    const bool device_values = observer_ && observer_->reads_device_values();
    auto seen = [&](int id) { return device_values ? value(id) : value_at(id, false); };
    ins_.clear();
    try {
      if (!step.folded)
        for (int id : step.in) ins_.push_back(value_at(id, on_device));
      else if (observer_)
        for (int id : step.in) ins_.push_back(seen(id));
    } catch (const std::bad_alloc&) {
      out_of_memory();
    }
    // Timed from here: the copies of inputs to where the step runs (weights uploaded once) are not
    // the step's. A plan's first execution is left out (weights packed or uploaded, buffers
    // allocated, and on a GPU each kernel's module loaded on its first launch).
    std::chrono::steady_clock::time_point started;
    if (profile) {
      outside.pause();
      if (s_.device_) s_.device_->synchronize();
      started = std::chrono::steady_clock::now();
    }
    bool streamed = false;  // a chain whose intermediates went to the observer in pieces
    // A view whose input dies here takes the input's buffer (the bytes are already the output's):
    // no copy, no new buffer. Not for an observer that reads the input afterwards, nor when a
    // retaining execution keeps the input readable.
    const int in0 = step.in.empty() ? -1 : step.in[0];
    const bool take_over = step.view && (!observer_ || (!retain_ && !observer_->reads_view_inputs())) &&
                           !p.constants[std::size_t(in0)] && !aliased_[std::size_t(in0)] &&
                           slots_[std::size_t(in0)].capacity() > 0 && mirrors_[std::size_t(in0)].capacity() == 0 &&
                           std::find(step.release.begin(), step.release.end(), in0) != step.release.end() && !kept(in0);
    if (take_over) {
      const int id = step.out[0];
      const ValueMeta& m = p.metas[std::size_t(id)];
      // Counted in the live sets already (as the input); its release now subtracts nothing.
      slots_[std::size_t(id)] = std::move(slots_[std::size_t(in0)]);
      slots_[std::size_t(id)].reuse_as(m.dtype, m.shape);
      if (!step.exact_outputs) s_.backend_->round(slots_[std::size_t(id)], p.rounding[std::size_t(id)]);
    } else if (!step.folded) {
      // A chain the observer takes streamed: only its last member's output is written.
      PieceObserver* pieces = observer_ ? observer_->pieces() : nullptr;
      if (!step.members.empty() && step.fused->can_stream() && !retain_ && pieces) {
        const std::size_t last = step.out.size() - 1;
        member_shapes_.clear();
        bool floats = true;
        for (std::size_t o = 0; o <= last; ++o) {
          const ValueMeta& m = p.metas[std::size_t(step.out[o])];
          floats &= m.dtype == DType::kFloat32;
          if (o < last) member_shapes_.push_back(m.shape);
        }
        const FusedKernel* kernel = step.fused.get();
        StreamedGroup group{std::span<const std::size_t>(step.member_nodes.data(), last), member_shapes_, ins_,
                            [kernel] { return kernel->member_rows(); }};
        streamed = floats && pieces->begin_stream(s_.nodes_, group);
      }
      try {
        outs_.clear();
        for (std::size_t o = 0; o < step.out.size(); ++o) {
          const int id = step.out[o];
          if (id < 0 || (streamed && o + 1 < step.out.size())) {
            outs_.push_back(nullptr);
            continue;
          }
          outs_.push_back(output_slot(id, on_device));
        }
        if (streamed) {
          step.fused->run_streamed(ins_, *outs_.back(),
                                   [&](std::size_t member, std::int64_t offset, const float* values,
                                       std::int64_t count) { pieces->on_piece(member, offset, values, count); });
          if (!pieces->end_stream()) {  // again, writing every member
            streamed = false;
            for (std::size_t o = 0; o + 1 < step.out.size(); ++o) outs_[o] = output_slot(step.out[o], on_device);
          }
        }
        if (streamed) {
        } else if (!step.members.empty()) {
          step.fused->run_all(ins_, outs_);  // the members' outputs but the last come rounded
        } else if (step.fused) {
          step.fused->run(ins_, *outs_[0]);
        } else if (step.kernel) {
          step.kernel->run(ins_, outs_);
        } else {
          s_.backend_->run(*s_.ops_[step.node], ins_, outs_);
        }
        for (std::size_t o = step.members.empty() ? 0 : step.out.size() - 1; o < step.out.size(); ++o)
          if (step.out[o] >= 0 && !step.exact_outputs) s_.backend_->round(*outs_[o], p.rounding[std::size_t(step.out[o])]);
      } catch (const std::bad_alloc&) {
        out_of_memory();
      }
    }
    auto profile_kind = [&] {
      const Node& node = s_.nodes_[step.node];
      std::string kind = node.op_type;
      if (step.fused) kind = node.op_type == "MatMul" ? "fused:attention" : "fused:chain";
      if (s_.device_ && !on_device) kind = "cpu:" + kind;
      return kind;
    };
    if (profile && !step.folded) {
      if (s_.device_) s_.device_->synchronize();
      auto& [count, ms] = s_.profile_[profile_kind()];
      ++count;
      ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
      outside.resume();
    }
    if (observer_) {
      // Observers' time on its own line ("observe: <kind>"), out of the step's host time.
      struct Observing {
        Session* s;
        HostTime& outside;
        std::string kind;
        std::chrono::steady_clock::time_point since = s ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
        ~Observing() {
          if (!s) return;
          if (s->device_) s->device_->synchronize();
          s->add_profile("observe: " + kind, since);
          outside.resume();
        }
      } observing{profile && !step.folded ? &s_ : nullptr, outside, profile && !step.folded ? profile_kind() : ""};
      if (observing.s) outside.pause();
      auto notify = [&](const Plan::Step& st, std::span<const Tensor* const> ins) {
        out_views_.clear();
        for (int id : st.out) out_views_.push_back(seen(id));
        observer_->on_node(NodeEvent{s_.nodes_[st.node], ins, out_views_, st.folded, st.node, this});
      };
      if (step.members.empty()) {
        if (on_device && !device_values) {
          member_ins_.clear();
          for (int id : step.in) member_ins_.push_back(seen(id));
          notify(step, member_ins_);
        } else {
          notify(step, ins_);
        }
      }
      for (std::size_t k = streamed ? step.members.size() - 1 : 0; k < step.members.size(); ++k) {
        // each node of the group, as if it had run alone (the streamed ones had their pieces)
        const Plan::Step& st = p.steps[step.members[k]];
        member_ins_.clear();
        for (int id : st.in) member_ins_.push_back(seen(id));
        notify(st, member_ins_);
      }
    }
    struct Traced {
      const Session& s;
      const Node& node;
      ~Traced() {
        if (tracing_memory()) trace_memory(s.graph_.source, node);
      }
    } traced{s_, s_.nodes_[step.node]};
    if (retain_) return;  // every value stays readable until finish()
    for (int id : step.release) {
      Tensor& t = slots_[std::size_t(id)];
      live_ -= t.capacity();
      live_exact_ -= t.nbytes();
      // What an observer keeps: its slot, or its copy in the other memory (a device value's host
      // copy, or a host value's device copy: a graph input a device step read).
      const std::shared_ptr<KeptValue::State> k = kept_[std::size_t(id)].lock();
      const bool copy_kept = k && k->live == &mirrors_[std::size_t(id)];
      Tensor& given = copy_kept ? mirrors_[std::size_t(id)] : t;
      Tensor& other = copy_kept ? t : mirrors_[std::size_t(id)];
      if (k && k->wanted) {
        k->owned = std::move(given);  // the observer still reads it: the buffer is the handle's now
        k->live = &k->owned;
        k->pool = s_.pool_;
      } else {
        if (k) k->live = nullptr;  // let go: no longer readable
        pool.give(std::move(given));
      }
      pool.give(std::move(other));
      kept_[std::size_t(id)].reset();
    }
  }

  std::map<std::string, Tensor> finish(bool outputs = true) {
    while (!done()) step();
    const Plan& p = *p_;
    std::map<std::string, Tensor> result;
    for (std::size_t i = 0; outputs && i < s_.graph_.outputs.size(); ++i) {
      int id = p.output_ids[i];
      const ValueMeta& m = p.metas[std::size_t(id)];
      const bool runtime = !p.constants[std::size_t(id)] && !aliased_[std::size_t(id)];
      const bool unique = std::count(p.output_ids.begin(), p.output_ids.end(), id) == 1;
      if (m.declared == m.dtype && runtime && unique && !slots_[std::size_t(id)].on_device()) {
        s_.pool_->hand_over(slots_[std::size_t(id)]);
        result[s_.graph_.outputs[i].name] = std::move(slots_[std::size_t(id)]);  // handed over, no copy
        continue;
      }
      const Tensor* t = value_at(id, false);
      result[s_.graph_.outputs[i].name] = m.declared == m.dtype ? Tensor(*t) : to_declared(*t, m.declared);
    }
    for (Tensor& m : mirrors_) s_.pool_->give(std::move(m));
    // The outputs' buffers that were copied (a device value, another type) or not read: to the pool
    // for the next run (freed with the execution, a device buffer would be allocated afresh).
    if (!retain_)
      for (int id : p.output_ids)
        if (id >= 0 && slots_[std::size_t(id)].capacity() > 0) s_.pool_->give(std::move(slots_[std::size_t(id)]));
    if (!s_.options_.keep_buffers) {
      slots_.clear();
      s_.pool_->clear();
    } else if (retain_) {
      p_->retained = std::move(slots_);
    }
    return result;
  }

  KeptValue keep(const Tensor* v) override {
    // A value in a slot is freed when it dies; constants and the caller's inputs are not.
    const std::less<const Tensor*> before;
    auto index_in = [&](const std::vector<Tensor>& ts) -> std::ptrdiff_t {
      return ts.empty() || before(v, ts.data()) || !before(v, ts.data() + ts.size()) ? -1 : v - ts.data();
    };
    std::ptrdiff_t id = index_in(slots_);
    if (id < 0) id = index_in(mirrors_);  // a device value's host copy
    if (id < 0) {
      auto k = std::make_shared<KeptValue::State>();
      k->live = v;
      return KeptValue(std::move(k));
    }
    std::weak_ptr<KeptValue::State>& w = kept_[std::size_t(id)];
    std::shared_ptr<KeptValue::State> k = w.lock();
    if (!k) {
      k = std::make_shared<KeptValue::State>();
      k->live = v;
      w = k;
    }
    k->wanted = true;
    return KeptValue(std::move(k));
  }

 private:
  // Host time of a step outside its timed window, added to the session's profile as "host: <op>"
  // (no device synchronisation: what the host spends, whatever the device does meanwhile).
  class HostTime {
   public:
    HostTime(State* s, std::string_view op) : s_(s), kind_(s ? "host: " + std::string(op) : std::string()) {}
    ~HostTime() {
      pause();
      if (s_) ++s_->s_.profile_[kind_].first;
    }
    void pause() {
      if (s_ && running_) s_->s_.profile_[kind_].second += ms_since(from_);
      running_ = false;
    }
    void resume() {
      from_ = std::chrono::steady_clock::now();
      running_ = true;
    }

   private:
    static double ms_since(std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
    }
    State* s_;
    std::string kind_;
    std::chrono::steady_clock::time_point from_ = std::chrono::steady_clock::now();
    bool running_ = true;
  };

  static bool profiling() { return profiling_steps(); }

  // Whether a handle still wants runtime value `id` (NodeEvent::keep).
  bool kept(int id) const {
    const std::shared_ptr<KeptValue::State> k = kept_[std::size_t(id)].lock();
    return k && k->wanted;
  }

  // The slot of runtime value `id`, holding a buffer of its shape (from the pool), on the device
  // or in host memory.
  Tensor* output_slot(int id, bool on_device) {
    const ValueMeta& m = p_->metas[std::size_t(id)];
    Tensor& t = slots_[std::size_t(id)];
    const std::shared_ptr<DeviceMemory>& where = on_device ? s_.device_ : nullptr;
    if (!retain_ || t.device() != where || !t.reuse_as(m.dtype, m.shape)) {
      if (t.capacity() > 0) s_.pool_->give(std::move(t));
      t = s_.pool_->take(m.dtype, m.shape, where);
    }
    live_ += t.capacity();
    live_exact_ += t.nbytes();
    s_.peak_bytes_ = std::max(s_.peak_bytes_, live_);
    s_.live_peak_bytes_ = std::max(s_.live_peak_bytes_, live_exact_);
    return &t;
  }

  const Tensor* value(int id) const {
    if (id < 0) return nullptr;
    if (const auto& c = p_->constants[std::size_t(id)]) return c.get();
    if (const Tensor* a = aliased_[std::size_t(id)]) return a;
    return &slots_[std::size_t(id)];
  }

  // Value `id` on the device or in host memory: itself when it is there; a constant's device copy
  // (the session's, made once); a runtime value's copy there, made on first need and released
  // with the value.
  const Tensor* value_at(int id, bool on_device) {
    const Tensor* v = value(id);
    if (!v || v->on_device() == on_device) return v;
    if (const auto& c = p_->constants[std::size_t(id)]) {
      std::shared_ptr<const Tensor>& d = s_.device_constants_[c.get()];
      if (!d) d = s_.device_copy(c);
      return d.get();
    }
    Tensor& m = mirrors_[std::size_t(id)];
    if (m.capacity() == 0 || m.on_device() != on_device) {
      if (m.capacity() > 0) s_.pool_->give(std::move(m));
      m = s_.pool_->take(v->dtype(), v->shape(), on_device ? s_.device_ : nullptr);
      if (v->nbytes() == 0) {
      } else if (on_device) {
        s_.device_->to_device(m.device_data(), v->raw(), v->nbytes());
      } else {
        v->device()->to_host(m.raw(), v->device_data(), v->nbytes());
      }
    }
    return &m;
  }

  Session& s_;
  Observer* observer_;
  bool retain_;
  Plan* p_ = nullptr;
  const std::vector<Plan::Step>* steps_ = nullptr;
  std::size_t next_ = 0;
  std::vector<Tensor> slots_;
  // A value's copy in the other memory (device backends: a CPU step's device input, or a device
  // value an observer reads); freed with the value.
  std::vector<Tensor> mirrors_;
  std::vector<std::weak_ptr<KeptValue::State>> kept_;  // per value id: a handle's, if any
  std::vector<const Tensor*> aliased_;
  std::deque<Tensor> host_inputs_;  // host copies of device inputs planned as constants
  std::size_t live_ = 0, live_exact_ = 0;
  std::vector<const Tensor*> ins_, member_ins_, out_views_;
  std::vector<Shape> member_shapes_;  // a streamed group's members' (StreamedGroup)
  std::vector<Tensor*> outs_;
};

namespace {
std::map<std::string, const Tensor*> borrowed(const std::map<std::string, Tensor>& inputs) {
  std::map<std::string, const Tensor*> b;
  for (const auto& [name, t] : inputs) b.emplace(name, &t);
  return b;
}
}  // namespace

Session::Execution::Execution(Session& session, const std::map<std::string, Tensor>& inputs, Observer* observer,
                              bool retain)
    : Execution(session, borrowed(inputs), observer, retain) {}
Session::Execution::Execution(Session& session, const std::map<std::string, const Tensor*>& inputs, Observer* observer,
                              bool retain)
    : state_(std::make_unique<State>(session, inputs, observer, retain)) {}
Session::Execution::~Execution() = default;
bool Session::Execution::done() const { return state_->done(); }
const Node& Session::Execution::next_node() const { return state_->next_node(); }
std::span<const std::size_t> Session::Execution::next_indices() const { return state_->next_indices(); }
const std::vector<Node>& Session::Execution::nodes() const { return state_->nodes(); }
std::size_t Session::Execution::next_index() const { return state_->next_index(); }
void Session::Execution::step() { state_->step(); }
std::map<std::string, Tensor> Session::Execution::finish() { return state_->finish(); }
void Session::Execution::finish_unread() { state_->finish(false); }

}  // namespace qeval::eval
