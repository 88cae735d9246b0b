// What a caller may see of an execution (eval/exec/session.h): each node's values as they are
// produced, whole or, for the intermediates of a fused elementwise chain, in pieces; and any of
// those values kept readable past its last reader in the graph, without a copy (NodeEvent::keep).
// What to compute from them, and how long to keep what, is the caller's (the evaluator's lockstep
// capture: eval/run/observe.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "eval/exec/graph.h"
#include "kernels/tensor.h"

namespace qeval::eval {

// A value an observer keeps. While the execution still needs the value, get() is the execution's
// own tensor; when the execution is done with it, its buffer moves into the handle instead of back
// to the buffer pool, and goes back to the pool when the last copy of the handle goes (or at
// let_go()). Handles are used on the execution's thread and must not outlive its session's pool.
class KeptValue {
 public:
  struct State;  // eval/exec/execution.cc
  KeptValue() = default;
  explicit KeptValue(std::shared_ptr<State> state) : state_(std::move(state)) {}
  // The value; null for an empty handle, or after let_go() once the execution has freed it.
  const Tensor* get() const;
  explicit operator bool() const { return state_ != nullptr; }
  // Whether the buffer is the handle's (the execution is done with the value).
  bool owned() const;
  // No longer needed past the execution's own use: a buffer the handle owns goes back to the pool
  // now (the handle becomes empty); one the execution still uses goes back when it is done, and
  // until then get() still reads it.
  void let_go();

 private:
  std::shared_ptr<State> state_;
};

// Lends an execution's values (NodeEvent::keep); implemented by the execution.
class ValueLender {
 public:
  virtual KeptValue keep(const Tensor* value) = 0;

 protected:
  ~ValueLender() = default;
};

// What an observer sees after each node. Tensors hold storage values (float16 as rounded float32),
// in host memory unless the observer reads_device_values().
struct NodeEvent {
  const Node& node;
  std::span<const Tensor* const> inputs;   // nullptr for omitted optional inputs
  std::span<const Tensor* const> outputs;  // nullptr for omitted optional outputs
  bool folded;                             // computed once at plan time (constant sub-graph)
  std::size_t index = 0;                   // of `node` in Session::nodes()
  ValueLender* lender = nullptr;
  // Keeps `value` (one of inputs or outputs) readable after the execution is done with it; while
  // any copy of the handle wants it, a view does not take its buffer over.
  KeptValue keep(const Tensor* value) const { return lender && value ? lender->keep(value) : KeptValue(); }
};

// A streamed group's members computed again from the group's inputs (a fused attention's scores
// and probabilities: the same bits as its run wrote), so that an observer that compares against
// them need not keep them whole. Every member is [rows, row_len] row-major (row_len: its shape's
// last dimension).
class MemberRows {
 public:
  virtual ~MemberRows() = default;
  // Rows [row0, row1) of each member k into dst[k] ((row1 - row0) * row_len values; null: not
  // wanted). row0 and row1 as a piece the group handed out began and ended (piece boundaries).
  virtual void rows(std::span<const Tensor* const> inputs, std::int64_t row0, std::int64_t row1,
                    std::span<float* const> dst) = 0;
  // Whether `row` is a place a piece may begin or end.
  virtual bool boundary(std::int64_t row) const = 0;
};

// What begin_stream is told of a fused group about to run.
struct StreamedGroup {
  std::span<const std::size_t> members;   // node indices, in order, but the last
  std::span<const Shape> shapes;          // each one's output shape (float32)
  std::span<const Tensor* const> inputs;  // the group's inputs, as its kernel reads them
  // A fresh MemberRows for this group (its own scratch; call it with copies of `inputs`), null
  // when its members cannot be computed again in rows (elementwise chains).
  std::function<std::unique_ptr<MemberRows>()> recompute;
};

// A fused group's intermediates, streamed instead of written (Observer::pieces): an elementwise
// chain's, or a fused attention's scores [, scaled scores] and probabilities. Before such a group
// runs, begin_stream names its members but the last (StreamedGroup). When it returns true, those
// outputs are never written: each member's values come through on_piece(member, offset, values,
// count) (member: position in `members`) in consecutive pieces, in order, each but the last a
// multiple of kStreamPiece elements (an attention's pieces are whole rows: every member's piece of
// one range of rows, then the next range), and no on_node follows for them (the last member's
// does, as usual). end_stream() then returns false to have the step run again writing every
// member's output (on_node follows for each, as usual): e.g. when a piece held a NaN.
class PieceObserver {
 public:
  static constexpr std::int64_t kStreamPiece = 128;
  virtual bool begin_stream(const std::vector<Node>& nodes, const StreamedGroup& group) = 0;
  virtual void on_piece(std::size_t member, std::int64_t offset, const float* values, std::int64_t count) = 0;
  virtual bool end_stream() = 0;

 protected:
  ~PieceObserver() = default;
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
  // Where a fused chain's intermediates go in pieces; null: they are written whole (on_node).
  virtual PieceObserver* pieces() { return nullptr; }
  // True when the observer reads values in a device's memory where they are (e.g. with
  // eval/exec/device_scan.h); false: a device backend's values are copied to the host for it.
  virtual bool reads_device_values() const { return false; }
};

}  // namespace qeval::eval
