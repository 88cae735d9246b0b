// Capture in a lockstep call whose reference execution does not retain its values: a borrowed layer
// output that readers still wait for is kept through the executor's handle (NodeEvent::keep) when
// the execution frees it, and its buffer goes back to the pool once its last reader is done; when
// every reader is done before the execution frees it, the value goes back untouched.
#include <gtest/gtest.h>

#include "eval/exec/session.h"
#include "eval/onnx_builder.h"
#include "eval/run/observe.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

using testing::OnnxBuilder;

// x -> Relu (a) -> y -> Transpose (b) -> z -> Relu (c) -> w, one step each (no two elementwise
// ops in a row, so nothing fuses): y dies after b, z after c.
Graph chain() {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {2, 4}).output("w", onnx::TensorProto::FLOAT);
  b.node("Relu", {"x"}, {"y"}, "a");
  b.node("Transpose", {"y"}, {"z"}, "b");
  b.node("Relu", {"z"}, {"w"}, "c");
  return b.graph();
}

// Keeps a's output as layer 0 (two readers) and b's as layer 1 (one reader).
class Keeping final : public Observer {
 public:
  explicit Keeping(Capture& cap) : cap_(cap) {}
  void on_node(const NodeEvent& e) override {
    if (e.node.name == "a") cap_.keep_output(0, *e.outputs[0], e.keep(e.outputs[0]), 32.0, 2);
    if (e.node.name == "b") {
      z = e.outputs[0];
      cap_.keep_output(1, *e.outputs[0], e.keep(e.outputs[0]), 8.0, 1);
    }
  }
  const Tensor* z = nullptr;

 private:
  Capture& cap_;
};

TEST(Capture, KeepsABorrowedOutputUntilItsReadersAreDone) {
  const Graph g = chain();
  const LayerSpace space({{"m", &g, false, 0}}, 1);
  ModelCall call;
  call.model = "m";
  Capture cap;
  cap.borrowing = true;
  cap.start(call, space, 0);
  Keeping keeping(cap);
  Session session(g);
  const std::map<std::string, Tensor> in{{"x", testing::floats({2, 4}, std::vector<float>(8, 2.0f))}};
  Session::Execution ex(session, in, &keeping);

  ex.step();  // a: y kept for two readers
  ASSERT_FALSE(ex.done());
  ex.step();  // b: z kept for one reader; y freed by the execution: its buffer is the capture's now
  ASSERT_TRUE(cap.output(0).tensor);
  EXPECT_EQ(cap.output(0).tensor->span<float>()[7], 2.0f);
  EXPECT_EQ(*cap.output(0).energy, 32.0);
  const void* taken = cap.output(0).tensor->raw();
  cap.consumed(0);
  EXPECT_EQ(cap.output(0).tensor->span<float>()[0], 2.0f);  // a reader to come: still kept
  cap.consumed(0);
  EXPECT_FALSE(cap.output(0).tensor);  // the last reader is done: gone, the buffer back in the pool
  cap.consumed(0);                     // more than its readers: no harm

  // z's reader is done before the execution frees z: readable, the execution's own, until then.
  cap.consumed(1);
  EXPECT_EQ(cap.output(1).tensor, keeping.z);
  ASSERT_FALSE(ex.done());
  const std::map<std::string, Tensor> out = ex.finish();  // c: w takes y's old buffer from the pool
  EXPECT_EQ(out.at("w").raw(), taken);
  EXPECT_EQ(out.at("w").span<float>()[0], 2.0f);
  EXPECT_FALSE(cap.output(1).tensor);  // z freed as usual

  // Copies (not borrowing) are the capture's own.
  Capture copies;
  copies.start(call, space, 0);
  Tensor v = testing::floats({8}, std::vector<float>(8, 3.0f));
  copies.keep_output(0, v, KeptValue(), 72.0, 2);
  ASSERT_TRUE(copies.output(0).tensor);
  EXPECT_NE(copies.output(0).tensor, &v);
  EXPECT_EQ(copies.output(0).tensor->span<float>()[0], 3.0f);
}

// A view (Reshape) whose input a capture still waits for copies instead of taking the buffer over,
// even for an observer that never reads view inputs.
TEST(Capture, AKeptValueIsNotTakenOverByAView) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {8}).output("r", onnx::TensorProto::FLOAT);
  b.initializer_i64("shape", {2, 4});
  b.node("Relu", {"x"}, {"y"}, "a");
  b.node("Reshape", {"y", "shape"}, {"r"}, "view");
  const Graph g = b.graph();
  struct KeepY final : Observer {
    void on_node(const NodeEvent& e) override {
      if (e.node.name == "a") y = e.keep(e.outputs[0]);
      if (e.node.name == "view") view_out = e.outputs[0]->raw();
    }
    bool reads_view_inputs() const override { return false; }
    KeptValue y;
    const void* view_out = nullptr;
  } keep;
  Session session(g);
  const std::map<std::string, Tensor> in{{"x", testing::floats({8}, std::vector<float>(8, 1.5f))}};
  const std::map<std::string, Tensor> out = session.run(in, &keep);
  ASSERT_TRUE(keep.y.get());
  EXPECT_TRUE(keep.y.owned());
  EXPECT_NE(keep.y.get()->raw(), keep.view_out);
  EXPECT_EQ(keep.y.get()->span<float>()[3], 1.5f);
  EXPECT_EQ(out.at("r").shape(), (Shape{2, 4}));
  keep.y.let_go();
  EXPECT_FALSE(keep.y);
}

}  // namespace
}  // namespace qeval::eval
