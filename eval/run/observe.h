// Per-layer observation of `qeval run`, in lockstep: inside one (prompt, seed), the reference's call
// of a model captures that call's values; the same call of every other variant is then compared
// with them node by node (accumulated error), every variant's own outputs feed drift statistics
// (absmax, p99.9, mean, std, |x| histogram, clipping against its quantizers' ranges, the first
// NaN/Inf), and each node can be re-run alone on the reference's inputs in the variant's precision
// (local error). Statistics live in cells: one per layer (a node of the reference's graphs) and
// denoising step.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "eval/exec/device_scan.h"
#include "eval/exec/graph.h"
#include "eval/exec/observer.h"
#include "eval/exec/session.h"
#include "eval/pipelines/model_call.h"
#include "eval/run/node_match.h"
#include "metrics/activation_stats.h"

namespace qeval::eval {

// The models a run observes and their layers: every node of each model's reference graph. A
// stepped model (the UNet) has one cell per step and layer, the others one cell per layer.
class LayerSpace {
 public:
  struct Model {
    std::string name;
    const Graph* graph = nullptr;  // the reference's
    bool stepped = false;
    std::size_t first_layer = 0;
  };
  LayerSpace() = default;
  LayerSpace(std::vector<Model> models, int steps);

  const std::vector<Model>& models() const { return models_; }
  int model_index(std::string_view name) const;  // -1 when not observed
  std::size_t layers() const { return layers_; }
  int steps() const { return steps_; }
  std::size_t layer(std::size_t model, std::size_t node) const { return models_[model].first_layer + node; }
  std::size_t model_of(std::size_t layer) const;
  const Node& node_of(std::size_t layer) const;
  int cells_of(std::size_t layer) const { return models_[model_of(layer)].stepped ? steps_ : 1; }
  // The layer whose node's first output is `value` in model `model`, -1 for none.
  int layer_of_output(std::size_t model, const std::string& value) const;

 private:
  std::vector<Model> models_;
  std::vector<std::unordered_map<std::string, std::size_t>> layer_of_output_;  // per model
  std::size_t layers_ = 0;
  int steps_ = 1;
};

struct LayerCell {
  metrics::ActivationStats act;  // the variant's own output
  metrics::ErrorStats acc;       // against the reference's output, variants run end to end

  LayerCell() = default;
  LayerCell(const LayerCell& o)
      : act(o.act), acc(o.acc), local_(o.local_ ? std::make_unique<metrics::ErrorStats>(*o.local_) : nullptr) {}
  LayerCell& operator=(const LayerCell& o);
  LayerCell(LayerCell&&) noexcept = default;
  LayerCell& operator=(LayerCell&&) noexcept = default;
  // Local error (the node run on the reference's inputs), made on first write: a run without
  // local error would spend a third of every cell on it (measured: 2.5% of an observed run).
  const metrics::ErrorStats& local() const;
  metrics::ErrorStats& local_mut();
  bool operator==(const LayerCell& o) const { return act == o.act && acc == o.acc && local() == o.local(); }
  // Adds `o` (parts nothing was added to are skipped: the reference's errors, local error when off).
  void merge(const LayerCell& o);
  void clear() {  // only what was added to (a cleared part is not written again)
    if (act.calls || act.clipped) act.clear();
    if (acc.calls) acc.clear();
    if (local_ && local_->calls) local_->clear();
  }

 private:
  std::unique_ptr<metrics::ErrorStats> local_;
};

// One variant's cells over a LayerSpace (the run's pooled statistics), each made on first use.
// Cells lie in the order they were first used: units' logs (CallLog) are pooled in execution
// order, so each merge walks the cells front to back (a layer-major layout put the cells of
// consecutive nodes ~11 KB apart: a cache miss per node and cell).
class LayerCells {
 public:
  // Shares the space: cells stay valid when the observation that made them moves.
  explicit LayerCells(std::shared_ptr<const LayerSpace> space = nullptr) : space_(std::move(space)) {}
  LayerCells(const LayerCells& other);
  LayerCells& operator=(const LayerCells& other);
  LayerCells(LayerCells&&) noexcept = default;
  LayerCells& operator=(LayerCells&&) noexcept = default;

  LayerCell& at(std::size_t layer, int step);  // step -1 (a model with no steps) is cell 0
  // Null when the layer has no cells; an empty cell for a step of such a layer never added to.
  const LayerCell* find(std::size_t layer, int step) const;
  bool has(std::size_t layer) const { return layer < touched_.size() && touched_[layer]; }
  std::size_t layers() const { return touched_.size(); }
  const LayerSpace* space() const { return space_.get(); }
  // Adds other's cells (the pooled statistics are exact sums: any order gives the same bits).
  void merge(const LayerCells& other);
  bool operator==(const LayerCells& other) const;

 private:
  static constexpr std::size_t kChunk = 256;  // cells per block of storage (addresses stay put)
  LayerCell& cell(std::size_t slot) { return chunks_[slot / kChunk][slot % kChunk]; }
  const LayerCell& cell(std::size_t slot) const { return chunks_[slot / kChunk][slot % kChunk]; }
  std::size_t key(std::size_t layer, int step) const;  // into index_ (step-major)

  std::shared_ptr<const LayerSpace> space_;
  std::vector<std::unique_ptr<LayerCell[]>> chunks_;
  std::vector<std::uint32_t> keys_;  // per cell in use: its index_ key
  std::vector<std::int32_t> index_;  // per (step, layer): its cell, -1 for none
  std::vector<char> touched_;        // per layer: has cells now
};

// One variant's statistics of one unit as a log of what each node event added, written and read
// front to back, pooled into LayerCells when the unit is merged. A unit adds each (layer, step)
// about once, so cells of its own (a LayerCell and a heap histogram each, ~950 B, ~100 MB per
// worker on tiny-sd) only spread the same numbers over memory that clear() and merge() walked
// again; an entry is 112 B (local error apart) and its histogram bins go to one byte arena.
class CallLog {
 public:
  // Room for `events` entries without regrowing (a grown vector is fresh memory, and fresh pages
  // cost several microseconds each on this VM).
  void reserve(std::size_t events);
  // Appends what `cell` holds: the statistics of one node event (each sum a single term).
  void add(std::size_t layer, int step, const LayerCell& cell);
  // Adds every entry to `cells` (exact sums: the same bits as adding the events there directly).
  void merge_into(LayerCells& cells) const;
  void clear();  // no entries, keeping the storage
  std::size_t size() const { return entries_.size(); }

 private:
  // Counts of one event fit 32 bits (a tensor of 2^32 floats is 16 GiB; checked).
  struct Error {  // an ErrorStats whose sums hold one term each
    std::uint32_t count = 0, nonfinite = 0, calls = 0, cosine_calls = 0;
    double ref_sq = 0, err_sq = 0, cosine_sum = 0, max_abs = 0;
  };
  struct Entry {
    std::uint32_t layer = 0;
    std::int32_t step = 0;
    std::uint32_t count = 0, nan = 0, inf = 0, clipped = 0, calls = 0;
    float absmax = 0;
    double sum = 0, sum_sq = 0;
    std::int32_t hist_first = 0;
    std::uint32_t hist_bins = 0, hist_at = 0;  // bins and where their bytes start in hist_
    Error acc;
  };
  static Error error_of(const metrics::ErrorStats& e);
  static void add_error(metrics::ErrorStats& to, const Error& e);
  std::vector<Entry> entries_;
  std::vector<std::uint8_t> hist_;                    // every entry's histogram counts (LEB128)
  std::vector<std::pair<std::size_t, Error>> local_;  // (entry, its local error), when measured
};

// Where a variant first produced a NaN, or more infinities than the reference's same output has
// (so an attention mask's -inf, there by design, is not reported).
struct NonFiniteHit {
  std::size_t unit = 0;  // the unit's index: the first hit of a run is the one of the lowest unit
  std::string sample;
  int step = -1;
  std::string model, node, op;
  std::uint64_t nan = 0, inf = 0;
  bool operator==(const NonFiniteHit&) const = default;
};

// A variant's graphs as the observation sees them (built once, shared by all threads).
struct ObservedModel {
  const Graph* graph = nullptr;    // the variant's graph of this model
  NodeMatch match;                 // against the reference's graph
  std::vector<int> layer_of_node;  // variant node -> layer, -1 for none
  std::vector<float> clip_amax;    // per variant node: its output's quantizer range (+inf: none)
  // Per variant node whose quantizers sit behind SmoothQuant's per-channel pre-scale: the range per
  // channel of the last axis (empty: clip_amax applies to every element). clip_amax is then the
  // smallest of them.
  std::vector<std::vector<float>> channel_clip_amax;
  // Per variant node: the format of its quantized inputs ("int8", "fp8_e4m3", ...; "" = none): the
  // node reads a DequantizeLinear output.
  std::vector<std::string> format;
  // Per variant node: the scale and zero point of its output when the variant holds it quantized
  // (ONNX Runtime's QOperator form: QLinear ops and what moves their values, quantized_values);
  // it is compared dequantized.
  std::vector<std::optional<std::pair<float, std::int32_t>>> dequantize;
  std::vector<LocalPlan> local;  // per variant node; empty when local error is off
  // Local error in lockstep (LocalErrorsInLockstep): per reference node of the model, the variant
  // nodes whose local run waits for it to have run (their counterpart and their inputs' producers;
  // for a graph input, its first reader); per variant node, how many reference nodes it waits for
  // (0: no local run). Empty when local error is off.
  std::vector<std::vector<std::size_t>> local_after;
  std::vector<unsigned> local_waits;
  // Per variant node: a view (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Transpose: its output
  // holds its first input's values, so its statistics are that input's); and the nodes whose first
  // output such a view reads.
  std::vector<char> view, feeds_view;
  // Node name -> index: observers see the session's copy of a node (it may have fused Q/DQ into
  // it), found back by name.
  std::unordered_map<std::string, std::size_t> index_of;
};

struct ObservedVariant {
  std::string name;
  bool reference = false;
  SessionOptions options;
  std::map<std::string, Precision> model_precision;  // BuiltVariant::model_precision
  std::vector<ObservedModel> models;                 // per LayerSpace model
};

// Builds a variant's view: node matching, layers, quantizer ranges (from symmetric per-tensor
// QuantizeLinear nodes: amax = scale * the format's largest value), local plans when asked.
ObservedModel observe_model(const LayerSpace& space, std::size_t model, const Graph& variant_graph, bool local_error);

// A reference's fused group whose members it streamed (a fused attention's scores and
// probabilities, ~1 GB each at full size): kept as copies of the group's inputs, its members
// computed again in rows when a variant compares with them.
struct RecomputedGroup {
  std::unique_ptr<MemberRows> rows;
  std::vector<Tensor> inputs;  // copies of the group's inputs
  std::vector<const Tensor*> input_ptrs;
  std::vector<Shape> shapes;  // each member's
  void compute(std::int64_t row0, std::int64_t row1, std::span<float* const> dst) {
    rows->rows(input_ptrs, row0, row1, dst);
  }
};

// The reference's values of one model call: copies (the executor reuses its buffers; storage kept
// across calls and reused when a value's size fits), or, in a lockstep call (`borrowing`), the
// reference execution's values themselves, kept through the executor's handles (KeptValue): all of
// them when it retains its buffers (local error reads them after the call), else each layer output
// until its readers (the variants' matching nodes) have compared; one the execution frees before
// that stays the handle's until its last reader is done, then goes back to the pool.
class Capture {
 public:
  std::string model;
  int step = -1, call = -1;
  bool valid = false;

  // Forgets the previous call's values. `space`: the layers the call's values are kept by;
  // `model_index`: the call's model in it (LayerSpace::model_index).
  void start(const ModelCall& c, const LayerSpace& space, int model_index);
  // Holds no call (borrowed values are about to go); buffers kept for readers that never came (a
  // local run whose reference nodes did not all run) go back to the pool.
  void forget();
  bool matches(const ModelCall& c) const { return valid && model == c.model && step == c.step && call == c.call; }
  bool has(const std::string& name) const { return find(name) != nullptr; }
  // nullptr when this call did not produce it (or the capture holds no call)
  const Tensor* find(const std::string& name) const;
  // A value of this call: a copy, or while `borrowing` is set the tensor itself through `kept`
  // (NodeEvent::keep of `value`). `energy`: its sum of squares when known (what
  // ActivationStats::add returned for it), for the variants' one-pass error. `readers`: as
  // keep_output's (consumed(name)).
  void keep(const std::string& name, const Tensor& value, KeptValue kept = {},
            std::optional<double> energy = std::nullopt, unsigned readers = 0);
  // The same for the first output of a layer's node (kept by layer: the observers' hot path).
  // `readers`: how many variant nodes will compare against it in this call (consumed()).
  void keep_output(std::size_t layer, const Tensor& value, KeptValue kept, std::optional<double> energy,
                   unsigned readers = 0);
  // The first output of a layer's node that the reference streamed (member `member` of `group`):
  // no tensor is kept; read whole (output(), find()) it is computed again, and that copy lives
  // until the layer's next consumed(). `readers` as keep_output's.
  void keep_recomputed(std::size_t layer, std::shared_ptr<RecomputedGroup> group, std::size_t member,
                       std::optional<double> energy, unsigned readers);
  struct Recomputed {
    RecomputedGroup* group = nullptr;  // null: the layer's value is not such a one (or not produced)
    std::size_t member = 0;
    std::optional<double> energy;
  };
  Recomputed recomputed(std::size_t layer) const;
  // A reader of the layer's output (of the value kept by name) is done with it.
  void consumed(std::size_t layer);
  void consumed(const std::string& name);
  bool borrowing = false;
  struct Value {
    const Tensor* tensor = nullptr;
    std::optional<double> energy;
  };
  Value value(const std::string& name) const;  // {} when this call did not produce it
  Value output(std::size_t layer) const;       // the layer's first output ({} when not produced)
  // The layers whose reference node has run in this call; `measured`: with statistics of its
  // output (a float output the node computed, not a folded constant).
  void mark_ran(std::size_t layer, bool measured);
  bool ran(std::size_t layer) const { return layer < ran_.size() && ran_[layer] == generation_; }
  bool measured(std::size_t layer) const { return ran(layer) && measured_[layer]; }
  // The layers marked ran since the last call of this (in order), into `out` (replaced).
  void take_ran(std::vector<std::size_t>& out) {
    out.swap(ran_now_);
    ran_now_.clear();
  }

 private:
  struct Slot {
    Tensor tensor;   // a copy
    KeptValue kept;  // or the execution's value (borrowing)
    std::uint64_t generation = 0;
    std::optional<double> energy;
    unsigned pending = 0;  // readers yet to come (borrowed values only)
    // keep_recomputed's: the group, the member, and the member computed whole while read
    std::shared_ptr<RecomputedGroup> group;
    std::size_t member = 0;
    mutable Tensor whole;
  };
  void fill(Slot& s, const Tensor& value, KeptValue kept, std::optional<double> energy);
  void consumed(Slot& s);
  Value read(const Slot& s) const;
  const LayerSpace* space_ = nullptr;
  int model_index_ = -1;
  std::unordered_map<std::string, Slot> slots_;  // values that are no layer's first output
  std::vector<Slot> outputs_;                    // per layer
  std::vector<std::uint64_t> ran_;               // per layer: the generation in which its reference node ran
  std::vector<char> measured_;                   // per layer: with statistics, when it ran
  std::vector<std::size_t> waiting_;             // layers whose borrowed output may have readers to come
  std::vector<Slot*> waiting_named_;             // the same for values kept by name (in slots_: stable)
  std::vector<std::size_t> ran_now_;             // layers marked ran since take_ran()
  std::uint64_t generation_ = 0;
};

// What one unit (one prompt and seed) contributed, per variant (RunObservation::variants order).
struct UnitObservation {
  std::vector<CallLog> calls;
  std::vector<std::optional<NonFiniteHit>> first_nonfinite;
  void clear();  // for the next unit, keeping the logs' storage
};

// Where full tensors go when asked (variant, call, node, tensor); called on the unit's thread.
using TensorSink =
    std::function<void(const std::string& variant, const ModelCall& call, const Node& node, const Tensor& value)>;
// Sees every node event of every variant's observed model calls, called on the unit's thread
// (compare-recipes records the shapes of one call of each model from the reference's).
using NodeHook = std::function<void(const std::string& variant, const ModelCall& call, const NodeEvent& event)>;

// The run-wide, read-only part: layers and variants.
struct RunObservation {
  std::shared_ptr<const LayerSpace> space = std::make_shared<LayerSpace>();
  std::vector<ObservedVariant> variants;
  std::size_t reference = 0;
  bool local_error = false;
  // Per layer: how many nodes of the other variants are matched to it (read its reference value),
  // and, with local error, how many local runs read it (as an input or the output they compare
  // with): a lockstep capture holds the value until they are done.
  std::vector<unsigned> readers;
  // The same for values captured by name (graph inputs, second outputs) that local runs read, per
  // LayerSpace model.
  std::vector<std::unordered_map<std::string, unsigned>> named_readers;
  unsigned named_readers_of(int model, const std::string& name) const;
  // Fills readers and named_readers from the variants' ObservedModels.
  void count_readers();
  TensorSink full_tensors;  // empty: not kept
  NodeHook node_hook;       // empty: none
  // Whether node_hook reads tensor values, not only shapes: on a device backend every observed
  // value then crosses to the host for it (CallShapes' hook reads shapes: false).
  bool node_hook_reads_values = true;
  // Only this variant's events reach node_hook ("" = every variant's); the others' observers keep
  // their fast paths (streamed chains, views taking over buffers).
  std::string node_hook_variant;
  bool hooks(std::size_t variant) const {
    return node_hook && (node_hook_variant.empty() || variants[variant].name == node_hook_variant);
  }

  UnitObservation make_unit() const;
};

// Per thread: one session per (variant, local plan), made on first use and reused across units.
class LocalSessions {
 public:
  struct Entry {
    std::unique_ptr<Graph> graph;
    std::unique_ptr<Session> session;
    // Inputs the variant holds in float16/bfloat16 (an FP16 export): the reference's float32
    // value is converted to that type before the run.
    std::vector<std::pair<std::string, DType>> narrow_inputs;
    std::string compared;  // the node whose output is compared (local_graph: the node or its DequantizeLinear)
  };
  Entry& get(const RunObservation& run, std::size_t variant, std::size_t model, std::size_t node,
             const Capture& capture);
  // A local run's output `out` compared with the reference's `ref` (every value finite, sum of
  // squares `ref_energy`) by a scan queued on their device (eval/exec/device_scan.h ScanQueue): the
  // local error is added to `unit` (variant, layer, step) by flush(). False (nothing queued) when
  // no device scan takes them.
  bool defer(const Tensor& out, const Tensor& ref, double ref_energy, UnitObservation& unit, std::size_t variant,
             std::size_t layer, int step);
  // Waits for the device once and adds every deferred local error to its unit: before the units'
  // statistics are read, and while they live.
  void flush();
  // After a local run: the pool's free host buffers go when they pass kMaxFreeBytes. The bounded
  // pool alone keeps up to the most one run ever had lent (a 4096-token attention member's local
  // run: ~4 GB), refilled afterwards by every later node's sizes: an observed SDXL run grew ~1.5 GB
  // a transformer block at 32x32 after its 64x64 attention.
  void trim();
  static constexpr std::size_t kMaxFreeBytes = std::size_t(1) << 30;

 private:
  struct Deferred {
    UnitObservation* unit;
    std::size_t variant, layer;
    int step;
    std::int64_t n;
    double ref_energy;
  };
  QueuedScans<Deferred> deferred_;
  std::map<std::tuple<std::size_t, std::size_t, std::size_t>, Entry> entries_;
  // Per (variant, model): its values held in float16/bfloat16 (narrow_float_values).
  std::map<std::pair<std::size_t, std::size_t>, std::unordered_map<std::string, DType>> narrow_;
  // Shared by the sessions (they run one at a time); bounded (eval/exec/pool.h): the full-size
  // pipeline's local runs of the VAE decoder's 512x512 nodes kept every size they had taken
  // (observed with local error: 13.61 -> 11.89 GB peak RSS).
  std::shared_ptr<BufferPool> pool_;
  // Theirs, with the variants' store as its parent (SharedConstants(parent)).
  std::shared_ptr<SharedConstants> constants_;
};

// Per worker: what the observation needs of a node a variant's session runs, found once per node
// (by its index in the session's nodes()) and kept across units (a worker's sessions stay).
class ObservedNodes {
 public:
  // The node's entries of its ObservedModel in one place: on_node reads them for every node of
  // four interleaved executions, and each array of its own missed cache.
  struct Info {
    bool known = false;  // a node of the variant's graph (by name)
    bool view = false, feeds_view = false;
    int layer = -1;  // -1: no reference counterpart
    float clip_amax = 0;
    const std::vector<float>* channel_clip_amax = nullptr;     // null when there are none
    std::vector<std::size_t> graph_inputs;                     // inputs that are graph inputs
    std::optional<std::pair<float, std::int32_t>> dequantize;  // ObservedModel::dequantize
  };
  // nullptr for a node the variant's graph does not have.
  const Info* find(const RunObservation& run, std::size_t variant, int model, const Node& node, std::size_t index) {
    if (model < 0) return nullptr;  // a model the observation does not cover
    if (variant < infos_.size() && std::size_t(model) < infos_[variant].size()) {
      const auto& of_model = infos_[variant][std::size_t(model)];
      if (index < of_model.size() && of_model[index]) return of_model[index]->known ? &*of_model[index] : nullptr;
    }
    return add(run, variant, model, node, index);
  }

 private:
  const Info* add(const RunObservation& run, std::size_t variant, int model, const Node& node, std::size_t index);
  std::vector<std::vector<std::vector<std::optional<Info>>>> infos_;  // per variant, model, session node
};

// The ModelCallObserver a pipeline gets for one variant inside one unit. The reference's observer
// fills `capture`; the others compare against it when it holds the same call.
class LockstepObserver : public ModelCallObserver {
 public:
  LockstepObserver(const RunObservation& run, std::size_t variant, UnitObservation& unit, Capture& capture,
                   ObservedNodes& nodes, std::string sample, std::size_t unit_index = 0);
  ~LockstepObserver() override;
  Observer* begin(const ModelCall& call) override;
  void end(const ModelCall& call, const std::map<std::string, Tensor>& outputs) override;
  // In a lockstep call (after begin()): whether this variant's execution may take its next step
  // now, i.e. the reference nodes its next nodes match have run (always, for the reference and for
  // nodes with no match).
  bool ready(const Session::Execution& next);

 private:
  class NodeObserver;
  const ObservedNodes::Info* node_info(const Node& node, std::size_t index) {
    return nodes_.find(run_, variant_, node_observer_model(), node, index);
  }
  int node_observer_model() const;
  // This call's statistics of the last outputs views read (by value address, unique per value in
  // a call), for the views to take instead of computing them again.
  struct Recent {
    const Tensor* value = nullptr;
    std::size_t layer = 0;
    metrics::ActivationStats act;
    std::optional<metrics::TensorError> err;
    std::optional<double> energy;
  };
  std::array<Recent, 4> recent_;
  std::size_t recent_next_ = 0;
  metrics::ActivationStats scratch_;  // one call's statistics
  Tensor dequantized_;                // a quantized output's values (ObservedModel::dequantize)
  // Per-channel clip thresholds (ObservedModel::channel_clip_amax) in the memory of the device
  // whose values they count, uploaded once: the device scan counts them, no output to the host.
  const Tensor* channel_clip_on(const std::vector<float>& thresholds, const Tensor& like);
  std::map<std::pair<const std::vector<float>*, const DeviceMemory*>, Tensor> channel_clip_device_;
  LayerCell event_;                   // one node event's statistics, then appended to the log
  const RunObservation& run_;
  std::size_t variant_;
  UnitObservation& unit_;
  Capture& capture_;
  ObservedNodes& nodes_;
  std::string sample_;
  std::size_t unit_index_;
  std::unique_ptr<NodeObserver> node_observer_;
};

// Runs one model call of several variants together, node by node: after each node of the
// reference (each `window` nodes), every other variant runs the nodes whose reference counterparts
// have run, so it reads the reference's values (borrowed by the capture, not copied) while they
// are still in cache. Each execution's observer is observers[v] (begun for this call, the
// reference's first); the capture is borrowing. ms[v] += the time spent running variant v's
// nodes. Leaves every execution done, not finished.
// `after_reference_step` (when set) runs after each reference step, untimed (local error in lockstep).
void run_lockstep(std::size_t reference, std::span<Session::Execution* const> executions,
                  std::span<LockstepObserver* const> observers, std::vector<double>& ms, std::size_t window = 1,
                  const std::function<void()>& after_reference_step = {});

// One observed model call of the variants in `who` (the reference first), run together node by
// node (run_lockstep) while the capture borrows the reference's values: each value goes back to the
// pool once its readers have compared, as in an unobserved run. Local error either runs node by
// node during the call (`lockstep_local`, LockstepLocalErrors: the values it reads are held until
// it is done), or after the nodes, before the executions finish (`local_errors`; the reference's
// execution must then retain every buffer: start() decides). start(v, observer) builds variant v's
// execution (keeping its inputs alive); starting and finishing are charged to ms[v]. Returns the
// outputs (empty for variants not in `who`).
std::vector<std::map<std::string, Tensor>> run_call_in_lockstep(
    const ModelCall& call, const std::vector<std::size_t>& who, std::size_t reference,
    std::span<const std::unique_ptr<LockstepObserver>> observers, Capture& capture,
    const std::function<std::unique_ptr<Session::Execution>(std::size_t, Observer*)>& start,
    const std::function<void()>& local_errors, std::vector<double>& ms, std::size_t window = 1,
    class LockstepLocalErrors* lockstep_local = nullptr);

// Local error of every observed node of `capture`'s model for variant `variant`: each node (with
// its quantization plumbing) re-run alone on the reference's captured inputs in the variant's
// precision, its output compared with the reference's.
void run_local_errors(const RunObservation& run, std::size_t variant, const Capture& capture, LocalSessions& sessions,
                      UnitObservation& unit);

// Local error during a lockstep call: each variant node's local run as soon as the reference nodes
// it waits for (ObservedModel::local_after) have run, on the reference's values as the capture
// holds them (RunObservation::readers counts these reads), which it then lets go. The reference's
// execution need not retain its buffers: a 1024x1024 model kept every activation until the call
// ended. Same statistics as run_local_errors after the call (the pooled sums are exact).
class LockstepLocalErrors {
 public:
  LockstepLocalErrors(const RunObservation& run, Capture& capture, LocalSessions& sessions, UnitObservation& unit)
      : run_(run), capture_(capture), sessions_(sessions), unit_(unit) {}
  // A call of `model` (its name) by `variants` (the reference's is skipped), before it starts.
  void start(std::string_view model, const std::vector<std::size_t>& variants);
  // Runs every local run whose reference nodes have all run by now (run_lockstep's hook).
  void after_reference_step();
  // The call is over: its local errors are in the unit (LocalSessions::flush).
  void finish() { sessions_.flush(); }

 private:
  const RunObservation& run_;
  Capture& capture_;
  LocalSessions& sessions_;
  UnitObservation& unit_;
  int model_ = -1;
  std::vector<std::size_t> variants_;
  std::vector<std::vector<unsigned>> waits_;  // per variants_ entry, per variant node: still to run
  std::vector<std::size_t> ran_;              // reference layers just run
};

}  // namespace qeval::eval
