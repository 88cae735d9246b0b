// Capture in a lockstep call whose reference execution does not retain its values: a borrowed layer
// output that readers still wait for is held (a view must not take it over) and taken over when the
// execution releases it, and handed back as a spare once its last reader is done; when every
// reader is done before the release, the execution's buffer goes back untouched.
#include <gtest/gtest.h>

#include "eval/run/observe.h"

namespace qeval::eval {
namespace {

Tensor filled(float v) {
  Tensor t(DType::kFloat32, {8});
  for (float& x : t.span<float>()) x = v;
  return t;
}

TEST(Capture, HoldsABorrowedOutputUntilItsReadersAreDone) {
  Graph g;
  g.nodes.resize(2);
  g.nodes[0].name = std::string("a");  // GCC 12 warns (-Wrestrict) of assigning a 1-char literal
  g.nodes[0].op_type = "Relu";
  g.nodes[0].outputs = {"y"};
  g.nodes[1].name = std::string("b");
  g.nodes[1].op_type = "Neg";
  g.nodes[1].outputs = {"z"};
  const LayerSpace space({{"m", &g, false, 0}}, 1);
  ModelCall call;
  call.model = "m";
  Capture cap;
  cap.borrowing = true;
  cap.start(call, space, 0);

  // Layer 0: two readers. Released before either read it: taken over, same values.
  Tensor y = filled(2.0f);
  cap.keep_output(0, y, 32.0, 2);
  EXPECT_TRUE(cap.holds(y));
  cap.on_release(y);
  EXPECT_NE(cap.output(0).tensor, &y);
  ASSERT_TRUE(cap.output(0).tensor);
  EXPECT_EQ(cap.output(0).tensor->span<float>()[7], 2.0f);
  EXPECT_EQ(*cap.output(0).energy, 32.0);
  const void* taken = cap.output(0).tensor->raw();
  cap.consumed(0);
  EXPECT_EQ(cap.spare().capacity(), 0u);  // a reader to come: still held
  EXPECT_EQ(cap.output(0).tensor->span<float>()[0], 2.0f);
  cap.consumed(0);
  // The last reader is done: the buffer is spare (for the execution's pool), the value gone.
  EXPECT_FALSE(cap.output(0).tensor);
  Tensor back = cap.spare();
  EXPECT_EQ(back.raw(), taken);
  EXPECT_EQ(cap.spare().capacity(), 0u);
  cap.consumed(0);  // more than its readers: no harm
  EXPECT_EQ(cap.spare().capacity(), 0u);

  // Layer 1: one reader, done before the release: the buffer stays with the execution.
  Tensor z = filled(-1.0f);
  cap.keep_output(1, z, 8.0, 1);
  EXPECT_TRUE(cap.holds(z));
  cap.consumed(1);
  EXPECT_FALSE(cap.holds(z));
  cap.on_release(z);
  EXPECT_EQ(cap.output(1).tensor, &z);
  EXPECT_EQ(z.numel(), 8);

  // Copies (not borrowing) are never held.
  Capture copies;
  copies.start(call, space, 0);
  Tensor w = filled(3.0f);
  copies.keep_output(0, w, 72.0, 2);
  EXPECT_FALSE(copies.holds(w));
  copies.on_release(w);
  EXPECT_EQ(w.numel(), 8);
  EXPECT_EQ(copies.output(0).tensor->span<float>()[0], 3.0f);

  // The next call starts with nothing held.
  cap.start(call, space, 0);
  Tensor u = filled(5.0f);
  cap.keep_output(0, u, 200.0, 0);
  EXPECT_FALSE(cap.holds(u));
  EXPECT_FALSE(cap.holds(y));
}

}  // namespace
}  // namespace qeval::eval
