// The executor's backend seam: what runs a planned step, and where its values live. The graph, the
// plan (shapes, constant folding, fusion decisions, rounding points, buffer lifetimes) and the
// observers are the same on every backend; an execution calls only these to run a step. The CPU
// backend is qeval's kernels (cpu_backend.cc). A device backend (CUDA: eval/exec/cuda/) keeps its
// values in the device's memory (Backend::memory) and compiles each node it runs there at plan
// time (Backend::compile); a node it does not run runs on the CPU, its inputs copied to host
// memory and its outputs back, and the plan records which node and why (Session::host_steps).
// Constant sub-graphs are folded on the CPU at plan time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "eval/exec/observer.h"
#include "eval/exec/ops/op.h"
#include "kernels/attention.h"
#include "kernels/tensor.h"

namespace qeval::eval {

// Where the plan rounds a stored float32 value: fp16/bf16 variants and values a model declares in
// a reduced format.
enum class Rounding : std::uint8_t { kNone, kFp16, kBf16 };

// Consecutive-in-effect nodes run as one kernel. A fused kernel gives the same bits as its nodes
// (tested), so observed and unobserved runs agree exactly.
class FusedKernel {
 public:
  virtual ~FusedKernel() = default;
  virtual void run(std::span<const Tensor* const> inputs, Tensor& output) = 0;
  // The same, also writing each member node's output, as the nodes would have (rounded as the
  // executor rounds them): `outputs` holds one per member in order, the last being run()'s
  // output (which the executor rounds). Observed executions run this: they see every node.
  virtual void run_all(std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs) = 0;
  // run(), handing each member's output but the last to `piece(member, offset, values, count)` in
  // consecutive pieces (multiples of PieceObserver::kStreamPiece but the last), never written whole.
  // Only where can_stream().
  using PieceSink = std::function<void(std::size_t, std::int64_t, const float*, std::int64_t)>;
  virtual bool can_stream() const { return false; }
  virtual void run_streamed(std::span<const Tensor* const> inputs, Tensor& output, const PieceSink& piece) {
    (void)inputs, (void)output, (void)piece;
  }
  // Its members computed again later, in rows, from (copies of) its inputs; null where it cannot.
  virtual std::unique_ptr<MemberRows> member_rows() const { return nullptr; }
};

// One stage of a fused elementwise chain (Backend::elementwise_chain): the op whose
// run_elementwise loop the stage applies, or a terminal 8-bit QuantizeLinear (op null).
struct ChainStage {
  const Op* op;
  int arity;
  int chain_operand;           // binary ops: which operand (0 or 1) is the chain's running value
  const Node* node = nullptr;  // the stage's node (its op type and attributes, for a device backend)
  int other = -1;              // binary ops: index of the other operand among the kernel's inputs
  bool other_scalar = false;
  // The other operand broadcast over the chain's shape (a per-channel scale or bias): element i
  // reads other[(i / repeat) % period]. period 0: the other operand has the chain's shape.
  std::int64_t period = 0, repeat = 1;
  Rounding rounding = Rounding::kNone;  // of the stage's output (the last one: the executor's)
  // The terminal QuantizeLinear (op null): y = quantize_to<int8 | uint8>(x, scale, zero point),
  // the loop QuantizeLinear's run() uses for one scale.
  DType quantize = DType::kFloat32;
  float scale = 1.0f;
  std::int32_t zero_point = 0;
};

// A node compiled for a device backend (Backend::compile): runs it on tensors in the device's
// memory, its outputs allocated there with the planned types and shapes (contents undefined).
// Inputs are null where omitted; constant inputs arrive as the same device tensor every run.
class StepKernel {
 public:
  virtual ~StepKernel() = default;
  virtual void run(std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // Runs one node on tensors in host memory: `op`'s outputs from its inputs (buffers of the
  // planned shapes and types). A device backend runs here the nodes it did not compile (the CPU's
  // kernels).
  virtual void run(const Op& op, std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs) = 0;
  // The memory a device backend keeps its values in; null for a backend computing in host memory.
  virtual std::shared_ptr<DeviceMemory> memory() const { return nullptr; }
  // Device backends, at plan time: the kernel that runs `node` (its op; its input metas, constant
  // values set where known, null where omitted; its output metas) on the device. Null with `why`
  // set ("no CUDA kernel for Op type", "int64 Gather indices") for a node that runs on the CPU.
  // `exact`, per input: the format its values are exact in (the plan's rounding of a runtime
  // value; for a float constant, the session's format, weights being rounded at load; kNone: any
  // float32): a kernel may compute on such operands in that format (fp16 or bf16 on tensor cores)
  // without changing a value.
  virtual std::unique_ptr<StepKernel> compile(const Node& node, const Op& op,
                                              std::span<const ValueMeta* const> inputs,
                                              std::span<const Rounding> exact, std::span<const ValueMeta> outputs,
                                              std::string& why) {
    (void)node, (void)op, (void)inputs, (void)exact, (void)outputs;
    why = "the backend computes in host memory";
    return nullptr;
  }
  // The kernels of node groups the plan fuses; each gives the bits of its nodes run one by one.
  // A backend may return null: the group is not fused (its nodes run one by one). A device
  // backend's fused kernels get tensors in its memory.
  // MatMul(Q, K^T) -> [scale] -> Softmax -> MatMul(., V):
  virtual std::shared_ptr<FusedKernel> attention(const kernels::AttentionShape& shape) = 0;
  // A chain of elementwise ops, each feeding only the next:
  virtual std::shared_ptr<FusedKernel> elementwise_chain(std::vector<ChainStage> stages) = 0;
  // Rounds a stored float32 value to the format where the plan rounds it (kNone: nothing), where
  // the value is (a device backend gets host tensors too: the outputs of nodes run on the CPU).
  virtual void round(Tensor& value, Rounding rounding) = 0;
};

// qeval's CPU kernels (stateless, one shared instance).
std::shared_ptr<Backend> cpu_backend();
// The backend of sessions whose options name none: cpu_backend() unless set (qeval --device sets
// it once, before any session exists).
std::shared_ptr<Backend> default_backend();
void set_default_backend(std::shared_ptr<Backend> backend);

}  // namespace qeval::eval
