// Internal to the executor (eval/exec/*.cc): a session's plan for one set of input shapes, the
// buffer pool executions take activation buffers from, and the storage-form and rounding helpers
// that planning and execution share (storage.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "eval/exec/session.h"

namespace qeval::eval {

// The rounding of a value stored as `storage` that the model declares as `declared`.
Rounding rounding_for(DType storage, DType declared, Precision precision);
void apply_rounding(Tensor& t, Rounding r);  // on the CPU (weights, constants, graph inputs)
Tensor rounded(Tensor t, Rounding r);
// The same rounding as the kernels' output option.
inline kernels::RoundTo round_to(Rounding r) {
  switch (r) {
    case Rounding::kFp16: return kernels::RoundTo::kFp16;
    case Rounding::kBf16: return kernels::RoundTo::kBf16;
    case Rounding::kNone: break;
  }
  return kernels::RoundTo::kNone;
}

// The format value `id`'s values are exact in (kNone: FP32 or unknown): a constant's, the rounding
// its weights get at load; a runtime value's, its final rounding point (P: Session::Plan).
template <class P>
Rounding exact_format(const P& p, int id, Precision precision) {
  if (id < 0) return Rounding::kNone;
  const ValueMeta& m = p.metas[std::size_t(id)];
  return p.constants[std::size_t(id)] ? rounding_for(m.dtype, m.declared, precision) : p.rounding[std::size_t(id)];
}

// A tensor in its declared ONNX type -> storage type (narrow floats widen to float32).
Tensor to_storage(const Tensor& t);
// Storage float32 -> declared narrow float type (values are already representable).
Tensor to_declared(const Tensor& t, DType declared);
// The most one tensor may take: the machine's memory and swap.
std::uint64_t max_tensor_bytes();
// A node output over `max_bytes` (InputError naming the node and the output).
[[noreturn]] void fail_over_memory(const std::string& source, const Node& node, const std::string& output,
                                   const ValueMeta& m, std::uint64_t max_bytes);
// A bad_alloc while running or folding a node (InputError naming the node and its outputs).
[[noreturn]] void fail_out_of_memory(const std::string& source, const Node& node,
                                     const std::vector<std::pair<std::string, const ValueMeta*>>& outputs);

// Reuses dead activation buffers, within a run and across runs: best fit by capacity, at most
// twice the request; among equal capacities the most recently given (still in cache). Oldest-first
// made the teacher-forced UNet calls after each observed step ~30% slower than in an unobserved
// run (the observed step leaves many same-size buffers behind; the oldest is cold).
// A bounded pool (make_bounded_pool, eval/exec/pool.h) keeps host memory within the most it ever
// had lent at once: when no free buffer fits and a new one would make the pool hold more, the free
// buffers given back longest ago are freed first. Keeping every buffer that fitted no request held
// ~0.3 GB more than the live values at the peak of a 1024x1024 model's lockstep run (bench/README.md).
// Not the default: repeated runs of one plan then take other buffers each run (best fit up to twice
// the request) and free and fault in some every run (unet_block at 1 thread: +11% CPU time). The
// evaluator's single-model and txt2img workers use one (txt2img: the VAE decoder's activations on
// top of every UNet buffer kept made a full-size observed run 13.1 GB, bounded 10.4 GB; tiny-sd's
// default run took the same CPU time within noise).
class BufferPool {
 public:
  explicit BufferPool(bool bounded = false) : bounded_(bounded) {}

  // A buffer of `dtype` and `shape` in host memory, or in `device`'s memory when given (a device
  // backend's values). A pool serves one device besides the host.
  Tensor take(DType dtype, const Shape& shape, const std::shared_ptr<DeviceMemory>& device = nullptr) {
    const std::size_t need = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
    auto& free = device ? device_free_ : free_;
    auto it = free.lower_bound(need);
    if (it != free.end() && it->first <= 2 * need + 4096 && it->second.tensor.device() == device) {
      Tensor t = std::move(it->second.tensor);
      if (!device) free_bytes_ -= it->first;
      free.erase(it);
      t.reuse_as(dtype, shape);
      note_lent();
      return t;
    }
    if (!device && bounded_) make_room(need);
    Tensor t(dtype, shape, device);
    allocated_ += t.capacity();
    if (!device) held_ += t.capacity();
    note_lent();
    return t;
  }
  // Bytes of the buffers the pool made and did not free (lent to executions, taken over by
  // observers, or free in it).
  std::size_t allocated_bytes() const { return allocated_; }
  // Host bytes free in the pool now.
  std::size_t free_bytes() const { return free_bytes_; }
  // The most host bytes lent at once so far (made and not given back nor handed over).
  std::size_t peak_lent_bytes() const { return peak_lent_; }
  void give(Tensor&& t) {
    // Inserted before its equals, so that take()'s lower_bound finds it first (LIFO).
    const bool on_device = t.on_device();
    auto& free = on_device ? device_free_ : free_;
    const std::size_t cap = t.capacity();
    if (cap == 0) return;
    if (!on_device) {
      free_bytes_ += cap;
      // A buffer the pool did not make (an input converted to its storage type, a device value's
      // host copy) is the pool's from now on, within its bound: uncounted, a bounded pool kept
      // every such buffer (an observed SDXL run's local sessions: ~80 MB more per node).
      if (free_bytes_ > held_) {
        allocated_ += free_bytes_ - held_;
        held_ = free_bytes_;
      }
    }
    free.emplace_hint(free.lower_bound(cap), cap, Free{std::move(t), ++given_});
  }
  // `t`, taken from this pool, leaves it for good (a run's output handed to the caller): it no
  // longer counts as lent (allocated_bytes still counts it: the pool made it).
  void hand_over(const Tensor& t) {
    if (!t.on_device()) held_ -= std::min(held_, t.capacity());
  }
  void clear() {
    clear_host();
    for (const auto& [cap, f] : device_free_) allocated_ -= std::min(allocated_, cap);
    device_free_.clear();
  }
  // The free host buffers go (device ones stay: freeing them waits for the device).
  void clear_host() {
    for (const auto& [cap, f] : free_) forget(cap);
    free_.clear();
    free_bytes_ = 0;
  }

 private:
  struct Free {
    Tensor tensor;
    std::uint64_t given;  // order of giving back (oldest = smallest)
  };
  std::size_t lent() const { return held_ > free_bytes_ ? held_ - free_bytes_ : 0; }
  void note_lent() { peak_lent_ = std::max(peak_lent_, lent()); }
  void forget(std::size_t cap) {
    held_ -= std::min(held_, cap);
    allocated_ -= std::min(allocated_, cap);
  }
  // Frees the oldest free host buffers until `need` more bytes keep the pool within its bound.
  void make_room(std::size_t need) {
    need = (need + 63) / 64 * 64;  // a Tensor's capacity
    const std::size_t bound = std::max(peak_lent_, lent() + need);
    while (!free_.empty() && held_ + need > bound) {
      auto oldest = free_.begin();
      for (auto i = free_.begin(); i != free_.end(); ++i)
        if (i->second.given < oldest->second.given) oldest = i;
      free_bytes_ -= oldest->first;
      forget(oldest->first);
      free_.erase(oldest);
    }
  }

  std::multimap<std::size_t, Free> free_, device_free_;
  std::size_t allocated_ = 0;
  std::size_t held_ = 0, free_bytes_ = 0, peak_lent_ = 0;  // host buffers only
  std::uint64_t given_ = 0;
  bool bounded_ = false;
};

struct Session::Plan {
  struct Step {
    std::size_t node;          // for a fused step: its last node
    std::vector<int> in, out;  // value ids; -1 for omitted
    bool folded = false;
    std::vector<int> release;            // runtime values dead after this step
    std::shared_ptr<FusedKernel> fused;  // runs instead of the node's op when set
    // An observed fused step: its nodes' steps (indices into Plan::steps, in order); `out` holds
    // every member's output and run_all writes them all.
    std::vector<std::size_t> members;
    std::vector<std::size_t> member_nodes;  // their nodes (indices into Session::nodes())
    // A pure view op (Reshape and kin: the output holds the input's bytes, same type): when its
    // input dies at this step, the output takes over the input's buffer instead of a copy.
    bool view = false;
    // Moves elements only (Reshape, Transpose, Slice, Concat, ...) of inputs already exact in its
    // outputs' rounding: the outputs are too, and no rounding pass runs over them.
    bool exact_outputs = false;
    // A device backend's kernel for the node (Backend::compile); null: the node runs on the CPU
    // (a fused step runs on the device when the device backend made its kernel).
    std::shared_ptr<StepKernel> kernel;
  };
  std::vector<ValueMeta> metas;
  std::vector<std::shared_ptr<const Tensor>> constants;  // per value id, null for runtime values
  std::vector<Rounding> rounding;
  std::vector<Step> steps;           // one per node: what observers see
  std::vector<Step> fused_steps;     // steps with fusable node groups replaced; empty if none
  std::vector<Step> observed_steps;  // the same groups keeping every member's output; empty if none
  // The buffers of the last execution that retained them all, reused by the next one in place
  // (the same values at the same sizes: no pool search, no new pages).
  std::vector<Tensor> retained;
  std::size_t executions = 0;  // started so far (QEVAL_PROFILE_STEPS leaves out each plan's first)
  std::vector<int> input_ids, output_ids;
  std::unordered_map<std::string, int> ids;
  // A device backend's plan: the nodes that run on the CPU and why (Session::host_steps).
  std::vector<HostStep> host_steps;
};

}  // namespace qeval::eval
