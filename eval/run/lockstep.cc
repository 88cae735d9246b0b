// Lockstep observation: the node observer that captures the reference's values and compares the
// variants' against them as they are produced, the lockstep loop over executions, and local error
// (eval/run/observe.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "eval/exec/device_scan.h"
#include "eval/exec/pool.h"
#include "eval/run/observe.h"
#include "kernels/numeric.h"
#include "metrics/scan_totals.h"
#include "metrics/tensor_error.h"

namespace qeval::eval {

class LockstepObserver::NodeObserver final : public Observer, private PieceObserver {
 public:
  explicit NodeObserver(LockstepObserver& owner) : o_(owner) {}
  int model() const { return model_; }
  void start(const ModelCall& call, int model, bool capture, bool compare) {
    call_ = call;
    model_ = model;
    capture_ = capture;
    compare_ = compare;
  }
  void on_node(const NodeEvent& e) override;
  // Adds the deferred comparisons' statistics to the unit (one wait for the device): at the end of
  // each call, before the unit's statistics are read.
  void flush();
  // A view's statistics come from its input's by address (Recent) or from its own output; the
  // reference's inputs are captured for local error, and a node hook may read any event.
  bool reads_view_inputs() const override { return (capture_ && o_.run_.local_error) || o_.run_.hooks(o_.variant_); }
  PieceObserver* pieces() override { return this; }
  // A device backend's values are scanned where they are (eval/exec/device_scan.h), the totals
  // alone crossing to the host (local error's sessions take the captured values where they are
  // too), unless something here reads whole tensors: a tensor sink or a node hook that reads
  // values (every variant's observer alike: the reference's captured values are where the
  // variants' are). `qeval run`'s hook (CallShapes) reads shapes: with it every observed value
  // crossed to the host, 221 GB in a two-step full-size run.
  bool reads_device_values() const override {
    return !o_.run_.full_tensors && !(o_.run_.node_hook && o_.run_.node_hook_reads_values);
  }

 private:
  bool begin_stream(const std::vector<Node>& nodes, const StreamedGroup& group) override;
  bool begin_reference_stream(const std::vector<Node>& nodes, const StreamedGroup& group);
  void on_piece(std::size_t member, std::int64_t offset, const float* values, std::int64_t count) override;
  bool end_stream() override;
  bool end_reference_stream();
  // The rows [r0, r1) of every member of `group` into recomputed_ (when it holds other rows).
  bool recompute(RecomputedGroup& group, std::int64_t r0, std::int64_t r1);
  // A variant's output compared with the reference's finite one by a scan queued on the device
  // (ScanQueue) and read at flush(): its statistics, error and non-finite check go to the unit
  // then, in order. False (nothing queued) when no device scan takes them.
  bool defer(const Tensor& out, const Tensor& ref, double ref_energy, float clip, const Tensor* channel,
             std::size_t layer, const Node& node);
  // t's values in host memory: t itself, or its copy in `scratch`.
  static const Tensor* on_host(const Tensor* t, Tensor& scratch) {
    if (!t || !t->on_device()) return t;
    scratch = t->to_host();
    return &scratch;
  }

  LockstepObserver& o_;
  ModelCall call_;
  int model_ = -1;
  bool capture_ = false, compare_ = false;
  // A group's members whose outputs come in pieces: a variant's error pass against the reference's
  // same output (kept whole by the capture, or computed again in rows: `group`), or the
  // reference's own statistics (reference_stream_).
  struct Streamed {
    std::size_t layer = 0;
    const float* ref = nullptr;
    double ref_energy = 0;
    metrics::StreamedError pass;
    LayerCell cell;
    RecomputedGroup* group = nullptr;  // the reference's member computed again
    std::size_t group_member = 0;
    std::int64_t row_len = 1;
    metrics::StreamedStats stats;  // the reference's
    std::optional<double> energy;
  };
  std::vector<Streamed> streamed_;  // the first streaming_ are this group's
  std::size_t streaming_ = 0;
  Tensor host_out_, host_ref_;  // host copies of device values, where whole tensors are read
  bool reference_stream_ = false;
  // A piece the reference's rows could not be computed for: the step runs again, written whole.
  bool failed_ = false;
  std::shared_ptr<RecomputedGroup> group_;  // the reference's group being streamed
  // The reference's rows last computed again (every member's), for a variant's pieces.
  RecomputedGroup* recomputed_group_ = nullptr;
  std::int64_t recomputed_r0_ = 0, recomputed_r1_ = 0;
  std::vector<std::vector<float>> recomputed_;
  // Deferred comparisons (defer), in the order of their events.
  struct Pending {
    std::size_t layer;
    std::int64_t n;
    double ref_energy;
    const Node* node;  // the session's, alive until the call ends
  };
  QueuedScans<Pending> pending_;
  LayerCell flushed_;
};

bool LockstepObserver::NodeObserver::defer(const Tensor& out, const Tensor& ref, double ref_energy, float clip,
                                           const Tensor* channel, std::size_t layer, const Node& node) {
  if (!pending_.add(out, &ref, clip, channel, Pending{layer, out.numel(), ref_energy, &node})) return false;
  constexpr std::size_t kMaxPending = 1024;  // ~4 MB of pinned results
  if (pending_.size() >= kMaxPending) flush();
  return true;
}

void LockstepObserver::NodeObserver::flush() {
  pending_.take([&](const Pending& d, const kernels::ScanTotals& t) {
    LayerCell& cell = flushed_;
    cell.clear();
    if (t.nan || t.inf) {  // diverged from the finite reference
      metrics::add_scan(cell.act, t);
      cell.acc.add(metrics::error_from_scan(t), d.n);
    } else {
      metrics::add_scan_with_error(cell.act, cell.acc, t, d.ref_energy, d.n);
    }
    o_.unit_.calls[o_.variant_].add(d.layer, call_.step, cell);
    // The reference is finite: any NaN or infinity here is the variant's own.
    if ((t.nan || t.inf) && !o_.unit_.first_nonfinite[o_.variant_])
      o_.unit_.first_nonfinite[o_.variant_] = NonFiniteHit{
          o_.unit_index_, o_.sample_, call_.step, std::string(call_.model), d.node->name, d.node->op_type, t.nan, t.inf};
  });
}

// A variant's group members are streamed when all that their events would do is the one-pass
// error against the reference's output: no node hook, no full tensors, no per-channel clipping (it
// reads the output by rows), no view reading the statistics back. The reference's output is kept
// whole, or (a fused attention the reference streamed) computed again in the rows of each piece.
bool LockstepObserver::NodeObserver::begin_stream(const std::vector<Node>& nodes, const StreamedGroup& group) {
  const RunObservation& run = o_.run_;
  if (run.hooks(o_.variant_) || run.full_tensors) return false;
  if (capture_) return begin_reference_stream(nodes, group);
  if (!compare_) return false;
  const std::span<const std::size_t> members = group.members;
  if (streamed_.size() < members.size()) streamed_.resize(members.size());
  for (std::size_t k = 0; k < members.size(); ++k) {
    const ObservedNodes::Info* info = o_.node_info(nodes[members[k]], members[k]);
    if (!info || info->layer < 0 || info->feeds_view || info->view || info->channel_clip_amax) return false;
    const Shape& shape = group.shapes[k];
    Streamed& m = streamed_[k];
    m.layer = std::size_t(info->layer);
    if (const Capture::Recomputed rc = o_.capture_.recomputed(m.layer); rc.group) {
      // Pieces of whole rows (a fused attention's) against the same rows computed again.
      if (!group.recompute || !rc.energy || rc.group->shapes[rc.member] != shape || shape.empty()) return false;
      m.ref = nullptr;
      m.group = rc.group;
      m.group_member = rc.member;
      m.row_len = std::max<std::int64_t>(shape.back(), 1);
      m.ref_energy = *rc.energy;
    } else {
      const Capture::Value ref = o_.capture_.output(m.layer);
      if (!ref.tensor || !ref.energy || ref.tensor->dtype() != DType::kFloat32 || ref.tensor->shape() != shape ||
          ref.tensor->on_device())
        return false;
      m.ref = ref.tensor->data<float>();
      m.group = nullptr;
      m.ref_energy = *ref.energy;
    }
    m.pass.start(shape_numel(shape), info->clip_amax);
  }
  streaming_ = members.size();
  failed_ = false;
  recomputed_group_ = nullptr;
  return true;
}

// The reference streams a fused attention's members in a lockstep call (the capture borrows): their
// statistics in pieces, and for the variants a copy of the group's inputs (Q, K^T, V: a few MB) to
// compute the members again from, instead of the members themselves (~1 GB each at full size).
bool LockstepObserver::NodeObserver::begin_reference_stream(const std::vector<Node>& nodes,
                                                            const StreamedGroup& group) {
  const RunObservation& run = o_.run_;
  if (!o_.capture_.borrowing || !group.recompute) return false;
  const std::span<const std::size_t> members = group.members;
  if (streamed_.size() < members.size()) streamed_.resize(members.size());
  for (std::size_t k = 0; k < members.size(); ++k) {
    const ObservedNodes::Info* info = o_.node_info(nodes[members[k]], members[k]);
    if (!info || info->layer < 0 || info->feeds_view || info->view || info->channel_clip_amax) return false;
    if (run.local_error && !info->graph_inputs.empty()) return false;  // captured as inputs: on_node's
    if (group.shapes[k].empty()) return false;
    streamed_[k].layer = std::size_t(info->layer);
    streamed_[k].stats.start(shape_numel(group.shapes[k]), info->clip_amax);
  }
  auto g = std::make_shared<RecomputedGroup>();
  g->rows = group.recompute();
  if (!g->rows) return false;
  g->inputs.reserve(group.inputs.size());
  for (const Tensor* t : group.inputs) g->inputs.push_back(t ? Tensor(*t) : Tensor());
  for (std::size_t i = 0; i < group.inputs.size(); ++i)
    g->input_ptrs.push_back(group.inputs[i] ? &g->inputs[i] : nullptr);
  g->shapes.assign(group.shapes.begin(), group.shapes.end());
  group_ = std::move(g);
  streaming_ = members.size();
  reference_stream_ = true;
  return true;
}

bool LockstepObserver::NodeObserver::recompute(RecomputedGroup& group, std::int64_t r0, std::int64_t r1) {
  if (recomputed_group_ == &group && recomputed_r0_ <= r0 && r1 <= recomputed_r1_) return true;
  if (!group.rows->boundary(r0) || !group.rows->boundary(r1)) return false;
  recomputed_.resize(group.shapes.size());
  std::vector<float*> dst(group.shapes.size());
  for (std::size_t k = 0; k < dst.size(); ++k) {
    const std::int64_t row_len = std::max<std::int64_t>(group.shapes[k].back(), 1);
    recomputed_[k].resize(std::size_t((r1 - r0) * row_len));
    dst[k] = recomputed_[k].data();
  }
  group.compute(r0, r1, dst);
  recomputed_group_ = &group;
  recomputed_r0_ = r0;
  recomputed_r1_ = r1;
  return true;
}

void LockstepObserver::NodeObserver::on_piece(std::size_t member, std::int64_t offset, const float* values,
                                              std::int64_t count) {
  Streamed& m = streamed_[member];
  if (reference_stream_) {
    m.stats.feed(values, count);
    return;
  }
  if (!m.group) {
    m.pass.feed(values, m.ref + offset, count);
    return;
  }
  if (failed_) return;
  const std::int64_t r0 = offset / m.row_len, r1 = (offset + count) / m.row_len;
  if (offset % m.row_len || count % m.row_len || !recompute(*m.group, r0, r1)) {
    failed_ = true;
    return;
  }
  m.pass.feed(values, recomputed_[m.group_member].data() + (offset - recomputed_r0_ * m.row_len), count);
}

// Each member's statistics, then (all finite) appended to the log in order as their events would
// have; a non-finite value has the step written whole and its events run as usual.
bool LockstepObserver::NodeObserver::end_stream() {
  if (reference_stream_) return end_reference_stream();
  recomputed_group_ = nullptr;  // the reference's groups go once their readers are done
  if (failed_) {
    failed_ = false;
    return false;
  }
  for (std::size_t k = 0; k < streaming_; ++k) {
    Streamed& m = streamed_[k];
    m.cell.clear();
    if (!m.pass.finish(m.cell.act, m.cell.acc, m.ref_energy)) return false;
  }
  for (std::size_t k = 0; k < streaming_; ++k) {
    o_.unit_.calls[o_.variant_].add(streamed_[k].layer, call_.step, streamed_[k].cell);
    o_.capture_.consumed(streamed_[k].layer);
  }
  return true;
}

// The reference's members as on_node would have logged and captured them; a value that is not
// finite (or beyond 2^60: no energy for the variants' one-pass error) has the step written whole.
bool LockstepObserver::NodeObserver::end_reference_stream() {
  reference_stream_ = false;
  std::shared_ptr<RecomputedGroup> group = std::move(group_);
  for (std::size_t k = 0; k < streaming_; ++k) {
    Streamed& m = streamed_[k];
    m.cell.clear();
    m.energy = m.stats.finish(m.cell.act);
    if (!m.energy) return false;
  }
  const RunObservation& run = o_.run_;
  for (std::size_t k = 0; k < streaming_; ++k) {
    const std::size_t layer = streamed_[k].layer;
    o_.unit_.calls[o_.variant_].add(layer, call_.step, streamed_[k].cell);
    o_.capture_.keep_recomputed(layer, group, k, streamed_[k].energy,
                                layer < run.readers.size() ? run.readers[layer] : 0);
    o_.capture_.mark_ran(layer, true);
  }
  return true;
}

const ObservedNodes::Info* ObservedNodes::add(const RunObservation& run, std::size_t variant, int model,
                                              const Node& node, std::size_t index) {
  if (infos_.size() <= variant) infos_.resize(variant + 1);
  auto& of_variant = infos_[variant];
  if (of_variant.size() <= std::size_t(model)) of_variant.resize(std::size_t(model) + 1);
  auto& of_model = of_variant[std::size_t(model)];
  if (of_model.size() <= index) of_model.resize(index + 1);
  const ObservedModel& om = run.variants[variant].models[std::size_t(model)];
  const auto found = om.index_of.find(node.name);
  Info& info = of_model[index].emplace();
  info.known = found != om.index_of.end();
  if (info.known) {
    const std::size_t i = found->second;  // in the variant's graph
    info.layer = om.layer_of_node[i];
    info.view = om.view[i];
    info.feeds_view = om.feeds_view[i];
    info.clip_amax = om.clip_amax[i];
    if (!om.channel_clip_amax[i].empty()) info.channel_clip_amax = &om.channel_clip_amax[i];
    if (i < om.dequantize.size()) info.dequantize = om.dequantize[i];
  }
  // Inputs the node reads from outside every node (graph inputs): the reference captures them as
  // inputs; anything else it captures as the output of the node that made it.
  for (std::size_t i = 0; i < node.inputs.size(); ++i) {
    const std::string& v = node.inputs[i];
    if (!v.empty() && std::any_of(om.graph->inputs.begin(), om.graph->inputs.end(),
                                  [&](const ValueInfo& in) { return in.name == v; }))
      info.graph_inputs.push_back(i);
  }
  return info.known ? &info : nullptr;
}

int LockstepObserver::node_observer_model() const { return node_observer_->model(); }

void LockstepObserver::NodeObserver::on_node(const NodeEvent& e) {
  const ObservedNodes::Info* info = o_.node_info(e.node, e.index);
  if (!info) return;
  const RunObservation& run = o_.run_;
  const ObservedVariant& variant = run.variants[o_.variant_];
  const int layer = info->layer;
  if (run.hooks(o_.variant_)) run.node_hook(variant.name, call_, e);
  Capture& cap = o_.capture_;
  // A variant's node is the last reader of the reference's value it compares with (after its
  // non-finite check below), whatever path it takes.
  struct Consumed {
    Capture* cap;
    int layer;
    ~Consumed() {
      if (cap) cap->consumed(std::size_t(layer));
    }
  } consumed{compare_ && layer >= 0 ? &cap : nullptr, layer};
  const Tensor* produced = e.folded || e.outputs.empty() || layer < 0 ? nullptr : e.outputs[0];
  // A variant's quantized output (ONNX Runtime's QOperator form) is compared dequantized with its
  // own scale and zero point.
  bool dequantized = false;
  if (produced && info->dequantize && !capture_ &&
      (produced->dtype() == DType::kUInt8 || produced->dtype() == DType::kInt8)) {
    produced = on_host(produced, host_out_);
    Tensor& d = o_.dequantized_;
    if (d.dtype() != DType::kFloat32 || d.shape() != produced->shape()) d = Tensor(DType::kFloat32, produced->shape());
    const auto [scale, zero_point] = *info->dequantize;
    float* dst = d.data<float>();
    if (produced->dtype() == DType::kUInt8)
      for (std::int64_t k = 0; k < d.numel(); ++k)
        dst[k] = dequantize(produced->data<std::uint8_t>()[k], scale, zero_point);
    else
      for (std::int64_t k = 0; k < d.numel(); ++k)
        dst[k] = dequantize(produced->data<std::int8_t>()[k], scale, zero_point);
    produced = &d;
    dequantized = true;
  }
  const Tensor* out = produced && produced->dtype() == DType::kFloat32 ? produced : nullptr;
  // This event's statistics, appended to the unit's log at the end.
  LayerCell* cell = out ? &o_.event_ : nullptr;
  if (cell) cell->clear();
  const std::vector<float>* channel_clip = info->channel_clip_amax;
  const bool per_channel =
      out && channel_clip && out->rank() > 0 && out->shape().back() == std::int64_t(channel_clip->size());
  const float clip = per_channel ? std::numeric_limits<float>::infinity() : info->clip_amax;
  // Per channel on a device: counted by the scans below (`channel`), else by a host pass at the end.
  const Tensor* channel = per_channel && out->on_device() ? o_.channel_clip_on(*channel_clip, *out) : nullptr;
  bool channel_counted = false;
  auto scan = [&](const Tensor* ref, kernels::ScanTotals& t) {
    const bool ok = scan_on_device(*out, ref, clip, t, channel);
    channel_counted |= ok && channel;
    return ok;
  };
  const Node* ref_node = layer >= 0 ? &run.space->node_of(std::size_t(layer)) : nullptr;
  // A view of a value whose statistics this call has: the same values, so the same statistics
  // (and, against the reference's view of the reference's same value, the same error).
  Recent* from = nullptr;
  if (out && info->view && !dequantized && !e.inputs.empty() && e.inputs[0])
    for (Recent& r : o_.recent_)
      if (r.value == e.inputs[0] && r.act.count + r.act.nan + r.act.inf == std::uint64_t(out->numel())) from = &r;
  if (from && !capture_ && !(from->err && ref_node->inputs[0] == run.space->node_of(from->layer).outputs[0]))
    from = nullptr;  // no error to take: compute
  // (A dequantized output is a scratch copy, not the value a view reads.)
  const bool keep_recent = out && info->feeds_view && !dequantized;
  std::optional<double> energy;
  std::optional<metrics::TensorError> error;
  if (from) {
    metrics::ActivationStats& call = o_.scratch_;
    call = from->act;
    if (call.clipped || clip != std::numeric_limits<float>::infinity() || per_channel) {
      call.clipped = 0;
      kernels::ScanTotals t;
      if (scan(nullptr, t)) call.clipped = t.clipped;
      else if (!per_channel)  // (per channel on the host: below, for every path)
        call.add_clipped(on_host(out, host_out_)->data<float>(), out->numel(), clip);
    }
    cell->act.merge(call);
    energy = from->energy;
    error = from->err;
    if (!capture_) cell->acc.add(*error, out->numel());
  } else if (out) {
    // Statistics into a cleared scratch when a view will read them (merging a call's statistics
    // gives the same bits as adding them directly), else straight into the cell.
    metrics::ActivationStats& act = keep_recent ? o_.scratch_ : cell->act;
    if (keep_recent) act.clear();
    // A value in device memory: its totals from the device (metrics/scan_totals.h).
    kernels::ScanTotals t;
    if (capture_) {
      energy = scan(nullptr, t) ? metrics::add_scan(act, t)
                                : act.add(on_host(out, host_out_)->data<float>(), out->numel(), clip);
    } else {
      // Against the reference's same output when there is one: one pass for the statistics and
      // the error when the reference's energy is known.
      const Capture::Value ref = compare_ ? cap.output(std::size_t(layer)) : Capture::Value{};
      const bool comparable =
          ref.tensor && ref.tensor->shape() == out->shape() && ref.tensor->dtype() == DType::kFloat32;
      if (comparable && ref.energy && !keep_recent && (!per_channel || channel) &&
          defer(*out, *ref.tensor, *ref.energy, clip, channel, std::size_t(layer), e.node)) {
        return;  // the rest at flush()
      } else if (comparable && ref.energy && scan(ref.tensor, t)) {
        if (t.nan || t.inf) {  // diverged from the finite reference
          metrics::add_scan(act, t);
          error = metrics::error_from_scan(t);
          cell->acc.add(*error, out->numel());
        } else {
          error = metrics::add_scan_with_error(act, cell->acc, t, *ref.energy, out->numel());
        }
      } else if (comparable && ref.energy) {
        error = metrics::add_with_error(act, cell->acc, on_host(out, host_out_)->data<float>(),
                                        on_host(ref.tensor, host_ref_)->data<float>(), *ref.energy, out->numel(), clip);
      } else {
        if (scan(nullptr, t)) metrics::add_scan(act, t);
        else act.add(on_host(out, host_out_)->data<float>(), out->numel(), clip);
        if (comparable) {
          error = metrics::tensor_error(on_host(ref.tensor, host_ref_)->data<float>(),
                                        on_host(out, host_out_)->data<float>(), out->numel());
          cell->acc.add(*error, out->numel());
        }
      }
    }
    if (keep_recent) cell->act.merge(act);
  }
  if (keep_recent) {
    Recent& r = o_.recent_[o_.recent_next_++ % o_.recent_.size()];
    r.value = out;
    r.layer = std::size_t(layer);
    std::swap(r.act, o_.scratch_);  // no copy: the scratch is cleared or assigned before each use
    if (from) r.act.clipped = 0;    // a view's own clipping is not the next view's
    r.err = error;
    r.energy = energy;
  }
  if (capture_) {
    // The reference's values (with the energy the variants' one-pass error needs); graph inputs
    // and second outputs only for local error (the variants compare layer outputs).
    const bool local = run.local_error;
    for (std::size_t i : info->graph_inputs)
      if (local && i < e.inputs.size() && e.inputs[i] && !cap.has(e.node.inputs[i]))
        cap.keep(e.node.inputs[i], *e.inputs[i], e.keep(e.inputs[i]), std::nullopt,
                 run.named_readers_of(model_, e.node.inputs[i]));
    for (std::size_t k = 0; k < e.outputs.size(); ++k) {
      if (!e.outputs[k]) continue;
      if (k == 0 && layer >= 0)
        cap.keep_output(std::size_t(layer), *e.outputs[0], e.keep(e.outputs[0]), energy,
                        std::size_t(layer) < run.readers.size() ? run.readers[std::size_t(layer)] : 0);
      else if (local)
        cap.keep(e.node.outputs[k], *e.outputs[k], e.keep(e.outputs[k]), std::nullopt,
                 run.named_readers_of(model_, e.node.outputs[k]));
    }
    if (layer >= 0) cap.mark_ran(std::size_t(layer), out != nullptr);
  }
  if (!out) return;
  if (run.full_tensors) run.full_tensors(variant.name, call_, e.node, *out);
  if (per_channel && !channel_counted)
    cell->act.add_clipped(on_host(out, host_out_)->data<float>(), out->numel(), std::span<const float>(*channel_clip));
  o_.unit_.calls[o_.variant_].add(std::size_t(layer), call_.step, *cell);
  const std::uint64_t nan = cell->act.nan, inf = cell->act.inf;
  if ((nan || inf) && !o_.unit_.first_nonfinite[o_.variant_]) flush();  // an earlier deferred one first
  // A NaN is always reported; an infinity only when the reference's same output has fewer (an
  // attention mask's -inf is by design).
  if ((nan || inf) && !o_.unit_.first_nonfinite[o_.variant_]) {
    bool anomaly = nan > 0;
    if (!anomaly && compare_) {
      const Tensor* r = on_host(cap.output(std::size_t(layer)).tensor, host_ref_);
      std::uint64_t ref_inf = 0;
      if (r && r->dtype() == DType::kFloat32)
        for (float x : r->span<float>()) ref_inf += std::isinf(x);
      anomaly = inf > ref_inf;
    }
    if (anomaly)
      o_.unit_.first_nonfinite[o_.variant_] = NonFiniteHit{
          o_.unit_index_, o_.sample_, call_.step, std::string(call_.model), e.node.name, e.node.op_type, nan, inf};
  }
}

LockstepObserver::LockstepObserver(const RunObservation& run, std::size_t variant, UnitObservation& unit,
                                   Capture& capture, ObservedNodes& nodes, std::string sample, std::size_t unit_index)
    : run_(run),
      variant_(variant),
      unit_(unit),
      capture_(capture),
      nodes_(nodes),
      sample_(std::move(sample)),
      unit_index_(unit_index),
      node_observer_(std::make_unique<NodeObserver>(*this)) {}

LockstepObserver::~LockstepObserver() = default;

const Tensor* LockstepObserver::channel_clip_on(const std::vector<float>& thresholds, const Tensor& like) {
  auto key = std::make_pair(&thresholds, like.device().get());
  auto it = channel_clip_device_.find(key);
  if (it == channel_clip_device_.end()) {
    Tensor host(DType::kFloat32, {std::int64_t(thresholds.size())});
    std::copy(thresholds.begin(), thresholds.end(), host.data<float>());
    it = channel_clip_device_.emplace(key, host.to_device(like.device())).first;
  }
  return &it->second;
}

Observer* LockstepObserver::begin(const ModelCall& call) {
  const int m = run_.space->model_index(call.model);
  if (m < 0) {
    node_observer_->start(call, -1, false, false);
    return nullptr;
  }
  for (Recent& r : recent_) r.value = nullptr;  // another call: its values are others
  const bool is_ref = variant_ == run_.reference;
  if (is_ref) capture_.start(call, *run_.space, m);
  node_observer_->start(call, m, is_ref, !is_ref && capture_.matches(call));
  return node_observer_.get();
}

void LockstepObserver::end(const ModelCall&, const std::map<std::string, Tensor>&) { node_observer_->flush(); }

bool LockstepObserver::ready(const Session::Execution& next) {
  if (variant_ == run_.reference || node_observer_->model() < 0) return true;
  for (std::size_t index : next.next_indices()) {
    const ObservedNodes::Info* info = node_info(next.nodes()[index], index);
    if (info && info->layer >= 0 && !capture_.ran(std::size_t(info->layer))) return false;
  }
  return true;
}

std::vector<std::map<std::string, Tensor>> run_call_in_lockstep(
    const ModelCall& call, const std::vector<std::size_t>& who, std::size_t reference,
    std::span<const std::unique_ptr<LockstepObserver>> observers, Capture& capture,
    const std::function<std::unique_ptr<Session::Execution>(std::size_t, Observer*)>& start,
    const std::function<void()>& local_errors, std::vector<double>& ms, std::size_t window,
    LockstepLocalErrors* lockstep_local) {
  const std::size_t nv = observers.size();
  auto timed = [&](std::size_t v, auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms[v] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<std::unique_ptr<Session::Execution>> runs(nv);
  std::vector<Session::Execution*> executions(nv);
  std::vector<LockstepObserver*> lockstep(nv);
  for (std::size_t v : who) {
    timed(v, [&] { runs[v] = start(v, observers[v]->begin(call)); });
    executions[v] = runs[v].get();
    lockstep[v] = observers[v].get();
  }
  {
    struct Borrowing {
      Capture& c;
      explicit Borrowing(Capture& cap) : c(cap) { c.borrowing = true; }
      ~Borrowing() {
        c.borrowing = false;
        c.forget();
      }
    } borrowing(capture);
    std::function<void()> hook;
    if (lockstep_local) {
      lockstep_local->start(call.model, who);
      hook = [lockstep_local] { lockstep_local->after_reference_step(); };
    }
    run_lockstep(reference, executions, lockstep, ms, window, hook);
    if (lockstep_local) lockstep_local->finish();
    if (local_errors) local_errors();
  }
  std::vector<std::map<std::string, Tensor>> outputs(nv);
  for (std::size_t v : who)
    timed(v, [&] {
      outputs[v] = runs[v]->finish();
      observers[v]->end(call, outputs[v]);
    });
  return outputs;
}

void run_lockstep(std::size_t reference, std::span<Session::Execution* const> executions,
                  std::span<LockstepObserver* const> observers, std::vector<double>& ms, std::size_t window,
                  const std::function<void()>& after_reference_step) {
  // One clock read between segments (a node of the reference, a variant's catch-up): each
  // segment's time is the difference to the previous read.
  using Clock = std::chrono::steady_clock;
  Clock::time_point last = Clock::now();
  auto charge = [&](std::size_t v) {
    const Clock::time_point now = Clock::now();
    ms[v] += std::chrono::duration<double, std::milli>(now - last).count();
    last = now;
  };
  Session::Execution& ref = *executions[reference];
  auto catch_up = [&](bool all) {
    for (std::size_t v = 0; v < executions.size(); ++v) {
      Session::Execution* x = executions[v];
      if (v == reference || !x || x->done()) continue;
      bool ran = false;
      while (!x->done() && (all || !observers[v] || observers[v]->ready(*x))) {
        x->step();
        ran = true;
      }
      if (ran) charge(v);
    }
  };
  window = std::max<std::size_t>(window, 1);
  for (std::size_t n = 1; !ref.done(); ++n) {
    ref.step();
    charge(reference);
    if (after_reference_step) {
      after_reference_step();
      last = Clock::now();  // untimed, as local error after the call
    }
    if (n % window == 0) catch_up(false);
  }
  catch_up(true);  // nodes matched to reference nodes that never ran as such
}

LocalSessions::Entry& LocalSessions::get(const RunObservation& run, std::size_t variant, std::size_t model,
                                         std::size_t node, const Capture& capture) {
  auto key = std::make_tuple(variant, model, node);
  auto it = entries_.find(key);
  if (it != entries_.end()) return it->second;
  const ObservedVariant& v = run.variants[variant];
  const ObservedModel& om = v.models[model];
  const LocalPlan& plan = om.local[node];
  auto narrow = narrow_.find({variant, model});
  if (narrow == narrow_.end())
    narrow = narrow_.emplace(std::make_pair(variant, model), narrow_float_values(*om.graph)).first;
  Entry e;
  std::map<std::string, DType> types;
  for (const auto& [var_value, ref_value] : plan.inputs) {
    const DType ref_type = capture.find(ref_value)->dtype();
    auto n = narrow->second.find(var_value);
    // The variant holds this value in float16/bfloat16 (an FP16 export): the reference's FP32
    // value enters rounded to it, as the export's own value would be.
    types[var_value] = ref_type == DType::kFloat32 && n != narrow->second.end() ? n->second : ref_type;
    if (types[var_value] != ref_type) e.narrow_inputs.emplace_back(var_value, types[var_value]);
  }
  LocalGraph local = local_graph(*om.graph, plan, types);
  e.graph = std::make_unique<Graph>(std::move(local.graph));
  e.compared = std::move(local.compared);
  SessionOptions options = v.options;
  if (auto p = v.model_precision.find(run.space->models()[model].name); p != v.model_precision.end())
    options.precision = p->second;
  // Thousands of these per worker, run one at a time: one pool for all (no buffers held per
  // session, no allocation per run), bounded (LocalSessions::pool_).
  if (!pool_) pool_ = make_bounded_pool();
  options.pool = pool_;
  // Its graph copies the model's tensors: the forms of mapped weights (converted, packed, on the
  // device) come from the model sessions' store, those of its own tensors from one that goes with
  // this worker's local sessions.
  if (!constants_) constants_ = std::make_shared<SharedConstants>(v.options.constants);
  options.constants = constants_;
  e.session = std::make_unique<Session>(*e.graph, options);
  return entries_.emplace(key, std::move(e)).first->second;
}

namespace {

// Compares the local run's target node output with the reference's as it is produced: on the
// device by a scan queued there (LocalSessions::defer) when both are there and the reference is
// finite (its energy known), else tensor_error over the host's copies into `cell`.
class LocalCompare : public Observer {
 public:
  LocalCompare(const std::string& node, const Capture::Value& ref, LayerCell& cell, LocalSessions& sessions,
               UnitObservation& unit, std::size_t variant, std::size_t layer, int step)
      : node_(node), ref_(*ref.tensor), ref_energy_(ref.energy), cell_(cell), sessions_(sessions), unit_(unit),
        variant_(variant), layer_(layer), step_(step) {}
  bool reads_device_values() const override { return true; }
  void on_node(const NodeEvent& e) override {
    if (e.node.name != node_ || e.outputs.empty() || !e.outputs[0]) return;
    const Tensor& out = *e.outputs[0];
    if (out.dtype() != DType::kFloat32 || out.shape() != ref_.shape()) return;
    if (ref_energy_ && sessions_.defer(out, ref_, *ref_energy_, unit_, variant_, layer_, step_)) {
      deferred_ = true;
      return;
    }
    Tensor host_ref, host_out;
    const Tensor& r = ref_.on_device() ? (host_ref = ref_.to_host()) : ref_;
    const Tensor& o = out.on_device() ? (host_out = out.to_host()) : out;
    cell_.local_mut().add(metrics::tensor_error(r.data<float>(), o.data<float>(), out.numel()), out.numel());
  }
  bool deferred() const { return deferred_; }

 private:
  const std::string& node_;
  const Tensor& ref_;
  std::optional<double> ref_energy_;
  LayerCell& cell_;
  LocalSessions& sessions_;
  UnitObservation& unit_;
  std::size_t variant_, layer_;
  int step_;
  bool deferred_ = false;
};

}  // namespace

bool LocalSessions::defer(const Tensor& out, const Tensor& ref, double ref_energy, UnitObservation& unit,
                          std::size_t variant, std::size_t layer, int step) {
  if (!deferred_.add(out, &ref, std::numeric_limits<float>::infinity(), nullptr,
                     Deferred{&unit, variant, layer, step, out.numel(), ref_energy}))
    return false;
  constexpr std::size_t kMaxDeferred = 4096;  // ~17 MB of pinned results
  if (deferred_.size() >= kMaxDeferred) flush();
  return true;
}

void LocalSessions::trim() {
  if (pool_) trim_free_host_buffers(*pool_, kMaxFreeBytes);
}

void LocalSessions::flush() {
  deferred_.take([](const Deferred& d, const kernels::ScanTotals& t) {
    LayerCell cell;
    // A non-finite output: diverged from the finite reference (error_from_scan says so).
    cell.local_mut().add(t.nan || t.inf ? metrics::error_from_scan(t)
                                        : metrics::error_from_energies(d.n, d.ref_energy, t.sum_sq, t.err_sq, t.err_max),
                         d.n);
    d.unit->calls[d.variant].add(d.layer, d.step, cell);
  });
}

namespace {

// The local error of variant node `i` of model `m` (see run_local_errors), when the reference ran
// its counterpart with a float output and the capture holds every input it reads.
void run_local_error(const RunObservation& run, std::size_t variant, std::size_t m, std::size_t i,
                     const Capture& capture, LocalSessions& sessions, UnitObservation& unit) {
  const ObservedModel& om = run.variants[variant].models[m];
  const int layer = om.layer_of_node[i];
  if (layer < 0 || !om.local[i].ok()) return;
  const Capture::Value ref = capture.output(std::size_t(layer));
  const Tensor* ref_out = ref.tensor;
  // Only layers the reference ran (folded constants have no error) with a float output.
  if (!ref_out || ref_out->dtype() != DType::kFloat32) return;
  if (!capture.measured(std::size_t(layer))) return;
  std::map<std::string, const Tensor*> in;  // the reference's values themselves, not copies
  for (const auto& [var_value, ref_value] : om.local[i].inputs) {
    const Tensor* t = capture.find(ref_value);
    if (!t) return;
    in.emplace(var_value, t);
  }
  LocalSessions::Entry& e = sessions.get(run, variant, m, i, capture);
  std::vector<Tensor> narrowed;  // an FP16 export's inputs: the reference's values in its type
  narrowed.reserve(e.narrow_inputs.size());
  Tensor host;
  for (const auto& [name, type] : e.narrow_inputs) {
    const Tensor& f = in.at(name)->on_device() ? (host = in.at(name)->to_host()) : *in.at(name);
    Tensor& t = narrowed.emplace_back(type, f.shape());
    auto* bits = reinterpret_cast<std::uint16_t*>(t.raw());  // float16/bfloat16 codes
    for (std::int64_t k = 0; k < f.numel(); ++k)
      bits[k] = type == DType::kFloat16 ? to_float16(f.data<float>()[k]).bits : to_bfloat16(f.data<float>()[k]).bits;
    in[name] = &t;
  }
  LayerCell cell;
  LocalCompare cmp(e.compared, ref, cell, sessions, unit, variant, std::size_t(layer), capture.step);
  Session::Execution(*e.session, in, &cmp).finish_unread();  // its output is the observer's alone
  if (!cmp.deferred()) unit.calls[variant].add(std::size_t(layer), capture.step, cell);
  sessions.trim();
}

}  // namespace

void run_local_errors(const RunObservation& run, std::size_t variant, const Capture& capture, LocalSessions& sessions,
                      UnitObservation& unit) {
  if (!capture.valid || !run.local_error) return;
  const int m = run.space->model_index(capture.model);
  if (m < 0) return;
  const ObservedModel& om = run.variants[variant].models[std::size_t(m)];
  if (om.local.empty()) return;
  for (std::size_t i = 0; i < om.graph->nodes.size(); ++i)
    run_local_error(run, variant, std::size_t(m), i, capture, sessions, unit);
  sessions.flush();
}

void LockstepLocalErrors::start(std::string_view model, const std::vector<std::size_t>& variants) {
  model_ = run_.local_error ? run_.space->model_index(model) : -1;
  variants_.clear();
  if (model_ < 0) return;
  for (std::size_t v : variants)
    if (v != run_.reference && !run_.variants[v].models[std::size_t(model_)].local_waits.empty())
      variants_.push_back(v);
  waits_.resize(variants_.size());
  for (std::size_t k = 0; k < variants_.size(); ++k)
    waits_[k] = run_.variants[variants_[k]].models[std::size_t(model_)].local_waits;
}

void LockstepLocalErrors::after_reference_step() {
  capture_.take_ran(ran_);
  if (model_ < 0 || !capture_.valid) return;
  const std::size_t m = std::size_t(model_), first = run_.space->models()[m].first_layer;
  for (std::size_t layer : ran_) {
    const std::size_t ref_node = layer - first;
    for (std::size_t k = 0; k < variants_.size(); ++k) {
      const ObservedModel& om = run_.variants[variants_[k]].models[m];
      if (ref_node >= om.local_after.size()) continue;
      for (std::size_t i : om.local_after[ref_node]) {
        if (waits_[k][i] == 0 || --waits_[k][i] > 0) continue;
        run_local_error(run_, variants_[k], m, i, capture_, sessions_, unit_);
        // Its reads of the reference's values are done (RunObservation::readers counted them).
        capture_.consumed(std::size_t(om.layer_of_node[i]));
        for (const auto& [var_value, ref_value] : om.local[i].inputs) {
          const int l = run_.space->layer_of_output(m, ref_value);
          if (l >= 0) capture_.consumed(std::size_t(l));
          else capture_.consumed(ref_value);
        }
      }
    }
  }
}

}  // namespace qeval::eval
