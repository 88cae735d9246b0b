// What a caller may see of an execution: each node's values as they are produced, whole or (for a
// fused elementwise chain) in pieces, and the buffers it may keep (eval/exec/session.h runs it).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "eval/exec/graph.h"
#include "kernels/tensor.h"

namespace qeval::eval {

// What an observer sees after each node. Tensors hold storage values (float16 as rounded float32).
struct NodeEvent {
  const Node& node;
  std::span<const Tensor* const> inputs;   // nullptr for omitted optional inputs
  std::span<const Tensor* const> outputs;  // nullptr for omitted optional outputs
  bool folded;                             // computed once at plan time (constant sub-graph)
  std::size_t index = 0;                   // of `node` in Session::nodes()
};

class Observer {
 public:
  virtual ~Observer() = default;
  virtual void on_node(const NodeEvent& event) = 0;
  // False when the observer never reads the input of a view (Reshape, Flatten, Squeeze,
  // Unsqueeze, Identity): a non-retaining execution may then hand the input's buffer to the view's
  // output when the input dies there, as unobserved runs do (no copy), and the event's input is
  // an empty tensor (its address still identifies the value).
  virtual bool reads_view_inputs() const { return true; }
  // A non-retaining execution is about to give `value`'s buffer back to its pool (the value's last
  // reader has run): an observer that still needs the value may take the buffer (move from it).
  virtual void on_release(Tensor& value) { (void)value; }
  // A buffer the observer took on release and no longer needs (empty: none): the execution puts
  // it back in its pool before each step, so that taking values costs no memory in the long run.
  virtual Tensor spare() { return {}; }
  // Whether the observer still reads `value` after its last reader in the graph (it would take it
  // on release): a view whose input dies then copies it instead of taking its buffer over.
  virtual bool holds(const Tensor& value) const {
    (void)value;
    return false;
  }
  // A fused elementwise chain's intermediates, streamed instead of written (observed executions).
  // Before such a chain runs, begin_stream names its members but the last (`members`: node indices,
  // in order; every member's output is float32 of `shape`). When the observer returns true, those
  // outputs are never written: each member's values come through on_piece(member, offset, values,
  // count) (member: position in `members`) in consecutive pieces, in order, each but the last a
  // multiple of kStreamPiece elements, and no on_node follows for them (the last member's does, as
  // usual). end_stream() then returns false to have the step run again writing every member's
  // output (on_node follows for each, as usual): e.g. when a piece held a NaN.
  static constexpr std::int64_t kStreamPiece = 128;
  virtual bool begin_stream(const std::vector<Node>& nodes, std::span<const std::size_t> members,
                            const Shape& shape) {
    (void)nodes, (void)members, (void)shape;
    return false;
  }
  virtual void on_piece(std::size_t member, std::int64_t offset, const float* values, std::int64_t count) {
    (void)member, (void)offset, (void)values, (void)count;
  }
  virtual bool end_stream() { return true; }
};

}  // namespace qeval::eval
