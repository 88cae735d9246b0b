// Internal to the executor (eval/exec/*.cc): a session's plan for one set of input shapes, the
// buffer pool executions take activation buffers from, and the storage-form and rounding helpers
// that planning and execution share (storage.cc).
#pragma once

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
class BufferPool {
 public:
  // A buffer of `dtype` and `shape` in host memory, or in `device`'s memory when given (a device
  // backend's values). A pool serves one device besides the host.
  Tensor take(DType dtype, const Shape& shape, const std::shared_ptr<DeviceMemory>& device = nullptr) {
    const std::size_t need = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
    auto& free = device ? device_free_ : free_;
    auto it = free.lower_bound(need);
    if (it != free.end() && it->first <= 2 * need + 4096 && it->second.device() == device) {
      Tensor t = std::move(it->second);
      free.erase(it);
      t.reuse_as(dtype, shape);
      return t;
    }
    Tensor t(dtype, shape, device);
    allocated_ += t.capacity();
    return t;
  }
  std::size_t allocated_bytes() const { return allocated_; }
  void give(Tensor&& t) {
    // Inserted before its equals, so that take()'s lower_bound finds it first (LIFO).
    auto& free = t.on_device() ? device_free_ : free_;
    if (t.capacity() > 0) free.emplace_hint(free.lower_bound(t.capacity()), t.capacity(), std::move(t));
  }
  void clear() {
    free_.clear();
    device_free_.clear();
  }

 private:
  std::multimap<std::size_t, Tensor> free_, device_free_;
  std::size_t allocated_ = 0;
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
