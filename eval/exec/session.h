// The executor: plans a Graph for concrete input shapes (shapes inferred, constant sub-graphs
// folded, buffers reused once dead) and runs it through a backend, calling an optional observer
// after every node. The work is split by concern: plan.cc (shapes, folding, liveness), fusion.cc
// (node groups that run as one kernel), execution.cc (running a plan step by step), the buffer
// pool (plan.h), the backend seam (backend.h; CPU kernels in cpu_backend.cc), storage forms and
// rounding (storage.cc).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "eval/exec/backend.h"
#include "eval/exec/graph.h"
#include "eval/exec/observer.h"
#include "eval/exec/ops/op.h"
#include "eval/exec/qdq_fusion.h"

namespace qeval::eval {

// fp16 / bf16 model a deployment (TensorRT, ONNX Runtime): BatchNormalization folded in FP32 first
// (eval/exec/deploy_fold.h), then weights and every op's float outputs rounded. fp16-strict /
// bf16-strict round every value of the graph as written (ONNX's per-op semantics), folding nothing.
enum class Precision { kFp32, kFp16, kBf16, kFp16Strict, kBf16Strict };
std::string_view precision_name(Precision p);
// The precision a name ("fp32", "fp16", "bf16") stands for; nullopt for any other name.
std::optional<Precision> precision_from_name(std::string_view name);
// The names precision_from_name takes (for CLI choices and config checks).
const std::vector<std::string>& precision_names();

struct SessionOptions {
  // fp16/bf16 emulate TensorRT's reduced-precision kernels: weights, graph inputs and every op's
  // float outputs are rounded to the format; kernels accumulate in float32. Values a model itself
  // declares as float16/bfloat16 are rounded to their format under every precision.
  Precision precision = Precision::kFp32;
  // Conv/MatMul/Gemm between DequantizeLinear of int8 values run as int8 x int8 -> int32 with the
  // integer kernels (eval/exec/qdq_fusion.h), as TensorRT executes them. Off: every DQ runs and
  // the float op accumulates the dequantized values (to compare the two).
  bool integer_qdq = true;
  // Activation buffers are kept across runs (no reallocation); false frees them after each run.
  bool keep_buffers = true;
  // Where activation buffers come from and go back to: shared by sessions of one thread, run one
  // after the other or interleaved (an evaluator worker's model sessions, its many small
  // local-error sessions: Session::make_pool); null: the session's own.
  std::shared_ptr<class BufferPool> pool = nullptr;
  // The most one tensor a run allocates may take, in bytes; 0: the machine's memory and swap. A
  // larger node output is an InputError naming the node when the plan is made.
  std::uint64_t max_tensor_bytes = 0;
  // What runs the steps (eval/exec/backend.h); null: default_backend() (the CPU's unless the
  // process chose a device: qeval --device).
  std::shared_ptr<Backend> backend = nullptr;
  // The order to run the graph's nodes in, by name (null: as the graph lists them). Any order in
  // which every node comes after the nodes it reads from gives the same values; a lockstep variant
  // follows its reference's order (eval/run/node_match.h reference_order), so that the reference's
  // values wait less for their comparisons. Ignored unless it names every node the session runs
  // once, in such an order.
  std::shared_ptr<const std::vector<std::string>> node_order = nullptr;
  // Packed weights and the session's rounded or widened copies of initializers, shared by the
  // sessions given the same object (eval/exec/ops/op.h SharedConstants): the evaluator's threads
  // and variants over one graph keep one copy. Null: the session's own.
  std::shared_ptr<SharedConstants> constants = nullptr;
};

// A node a device backend's plan runs on the CPU, and why (Backend::compile's reason).
struct HostStep {
  std::size_t node;  // index in Session::nodes()
  std::string why;
};

// QEVAL_PROFILE_STEPS is set and not "0" (read once): sessions time their steps and set-up.
bool profiling_steps();
// QEVAL_PROFILE_MEMORY is set and not "0" (read once): after each step, when the process's
// resident memory not backed by files has grown by 256 MB or more since the last line, a line on
// stderr names the model and node (where a run's memory goes, step by step).
bool tracing_memory();
void trace_memory(const std::string& model, const Node& node);

// Not thread-safe: one Session per thread (sessions over the same Graph share its weights).
class Session {
 public:
  // Creates every node's Op (attribute errors surface here). The graph must outlive the session.
  explicit Session(const Graph& graph, SessionOptions options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Runs the graph. Inputs are matched by name and checked against the model's declared element
  // types and fixed dimensions (InputError names the input, the expected and the given shape/type).
  // Outputs come back in their declared element types (float16 outputs as float16 bits).
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs, Observer* observer = nullptr);
  // The same with the caller's tensors by address (not copied; they must stay alive for the run).
  std::map<std::string, Tensor> run(const std::map<std::string, const Tensor*>& inputs, Observer* observer = nullptr);

  // One run advanced a node at a time (Session::run is one that runs to the end): the evaluator
  // interleaves the runs of a reference and its variants node by node, so the variants read the
  // reference's values while they are still in cache. The inputs must outlive the execution, and
  // the session must not run anything else meanwhile. With `retain`, no activation buffer is
  // released before finish(): every value the observer saw stays readable until then.
  class Execution {
   public:
    Execution(Session& session, const std::map<std::string, Tensor>& inputs, Observer* observer = nullptr,
              bool retain = false);
    Execution(Session& session, const std::map<std::string, const Tensor*>& inputs, Observer* observer = nullptr,
              bool retain = false);
    ~Execution();
    Execution(const Execution&) = delete;
    Execution& operator=(const Execution&) = delete;
    bool done() const;
    const Node& next_node() const;   // the node step() runs next (not done()); of a group, the last
    std::size_t next_index() const;  // its index in Session::nodes()
    // Every node step() runs next, in order (indices in Session::nodes()): one, or a group that
    // runs as one kernel (attention, a chain of elementwise ops), each observed as if alone.
    std::span<const std::size_t> next_indices() const;
    const std::vector<Node>& nodes() const;  // the session's (Session::nodes())
    void step();
    // Runs what is left; the outputs, as run() returns them.
    std::map<std::string, Tensor> finish();
    // Runs what is left for the observer alone: no output is returned (a device backend's are
    // not copied to the host).
    void finish_unread();

   private:
    class State;
    std::unique_ptr<State> state_;
  };

  // A buffer pool for SessionOptions::pool.
  static std::shared_ptr<BufferPool> make_pool();
  // Bytes of every buffer `pool` has made (lent to executions, taken over by observers, or free in
  // it): the activation memory of the runs it served.
  static std::size_t pool_allocated_bytes(const BufferPool& pool);

  // Gives the buffers a retaining execution left for the next one back to the pool (e.g. when
  // this model will not run for a while: the evaluator drops the UNet's after the last denoising
  // step, and with a pool shared by the worker's sessions the VAE decoder reuses them).
  void drop_retained();

  // On a device backend: the nodes the plan for these input shapes runs on the CPU, and why
  // (empty on the CPU backend, whose nodes all run in host memory).
  std::vector<HostStep> host_steps(const std::map<std::string, Shape>& input_shapes);

  // Metas of every value after planning for these input shapes (for inspect and tests).
  std::map<std::string, ValueMeta> infer_metas(const std::map<std::string, Shape>& input_shapes);

  const Graph& graph() const { return graph_; }
  // The nodes this session runs: the graph's, with Q/DQ-wrapped Conv/MatMul/Gemm rewritten to
  // their fused form when options().integer_qdq (same names and outputs), and what was fused.
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<quant::FusedNode>& fused_nodes() const { return fused_; }
  const SessionOptions& options() const { return options_; }

  // Peak bytes of activation buffers held at once during the last run (pool capacity included).
  std::size_t last_peak_activation_bytes() const { return peak_bytes_; }
  // The largest set of simultaneously live activations in the last run (exact sizes): the floor
  // any allocator could reach; the pool's peak is compared against it.
  std::size_t last_live_activation_bytes() const { return live_peak_bytes_; }

 private:
  struct Plan;
  // Plans for these input shapes. Small integer inputs (shape tensors, axes, indices) are planned
  // as constants, so a plan is specific to their values too (`int_values`).
  Plan& plan_for(const std::map<std::string, Shape>& input_shapes,
                 const std::map<std::string, const Tensor*>& int_values);
  // Finds node groups that run as one kernel (same bits as the nodes): MatMul -> [scale] ->
  // Softmax -> MatMul attention, chains of elementwise ops. Fills plan.fused_steps, and
  // plan.observed_steps where the kernels also write each member's output for an observer.
  void fuse(Plan& plan) const;
  // fp16/bf16 deployments: the values a deployment keeps in FP32 inside one kernel are not rounded.
  void keep_fused_intermediates(Plan& plan) const;

  const Graph& graph_;
  SessionOptions options_;
  std::vector<Node> nodes_;  // what runs (see nodes())
  std::vector<quant::FusedNode> fused_;
  std::vector<std::unique_ptr<Op>> ops_;  // one per node of nodes_
  // Initializers in storage form, converted and rounded once per session; those needing neither
  // alias the graph's own tensors (no copy of the weights).
  std::unordered_map<std::string, std::shared_ptr<const Tensor>> weights_;
  // Weights the deployment fold computed (float32, before rounding); in weights_ too, rounded.
  std::map<std::string, Tensor> folded_weights_;
  // Value names some op needs at plan time (Op::constant_inputs); graph inputs among them are
  // planned as constants.
  std::set<std::string> constant_graph_inputs_;
  std::map<std::string, std::unique_ptr<Plan>> plans_;  // key: input shapes + int input values
  std::shared_ptr<BufferPool> pool_;                    // activation buffers, kept across runs (maybe shared)
  std::shared_ptr<Backend> backend_;                    // runs the steps (options.backend or the default)
  std::shared_ptr<DeviceMemory> device_;                // backend_->memory(): null on the CPU
  // Constants (weights, folded values) copied to the device once for every plan's device steps.
  std::unordered_map<const Tensor*, std::shared_ptr<const Tensor>> device_constants_;
  // The weights_ of the graph's initializers: the same tensors in every session over this graph
  // and precision (aliases, or SharedConstants' forms), so their device copies are shared through
  // options_.constants too: the evaluator's workers held one copy of every weight each (16 workers:
  // out of GPU memory at full size).
  std::unordered_set<const Tensor*> shared_weights_;
  // Constant `c`'s device copy: options_.constants' when `c` is one of shared_weights_, else a new one.
  std::shared_ptr<const Tensor> device_copy(const std::shared_ptr<const Tensor>& c);
  std::size_t peak_bytes_ = 0;
  std::size_t live_peak_bytes_ = 0;
  // QEVAL_PROFILE_STEPS=1: each step of every execution but a plan's first timed (the device
  // synchronised around it), summed by kind
  // ("Conv", "cpu:ArgMax", "fused:attention") and printed to stderr when the session ends; and the
  // session's set-up: "setup: graph" (Q/DQ fusion, deployment fold, ops), "setup: weights"
  // (storage copies, rounding, spilling), "setup: plan", "setup: first run" (each plan's first
  // execution: packing and device uploads happen there).
  std::map<std::string, std::pair<std::size_t, double>> profile_;
  void add_profile(const std::string& kind, std::chrono::steady_clock::time_point since);
};

// Part of a graph on its own: `nodes` (indices into graph.nodes, ascending = topological order),
// the initializers they read (copied), every other value they read as a graph input of the type in
// `input_types` (float32 when not listed) with no fixed shape, and every output of theirs as a
// graph output. A Session over it runs those nodes alone under any options: the evaluator's local
// error runs one node on the reference's inputs in a variant's precision. Throws
// std::invalid_argument for an index out of range or not ascending.
Graph extract_subgraph(const Graph& graph, std::span<const std::size_t> nodes,
                       const std::map<std::string, DType>& input_types = {});

}  // namespace qeval::eval
