// A variant stepped in its reference's node order (node_match.h reference_order,
// SessionOptions::node_order): the executor runs the given order with the same bytes, and a
// lockstep call whose variant lists a side branch early no longer keeps the reference's values
// waiting for it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "../onnx_builder.h"
#include "eval/run/node_match.h"
#include "eval/run/observe.h"

namespace qeval::eval {
namespace {

using testing::OnnxBuilder;

constexpr int kConvs = 12;
constexpr std::size_t kValueBytes = 8 * 64 * 64 * sizeof(float);

// A chain of 1x1 convolutions conv0..conv11 on [1, 8, 64, 64] values (128 KiB each) and a side
// branch: Conv "side" on conv0's output, a second graph output. `side_first`: the side conv listed
// right after conv0 (as ONNX Runtime's quantizer lists ISNet's side outputs), else last.
Graph chain_with_side(bool side_first) {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {1, 8, 64, 64});
  b.output("y11", onnx::TensorProto::FLOAT);
  b.output("s", onnx::TensorProto::FLOAT);
  auto weights = [&](const std::string& name, int seed) {
    std::vector<float> w(64);
    for (std::size_t k = 0; k < w.size(); ++k) w[k] = 0.3f * std::sin(float(k) * 0.7f + float(seed));
    b.initializer(name, w, {8, 8, 1, 1});
  };
  weights("ws", 99);
  std::string prev = "x";
  for (int i = 0; i < kConvs; ++i) {
    const std::string n = std::to_string(i), out = "y" + n;
    weights("w" + n, i);
    b.node("Conv", {prev, "w" + n}, {out}, "conv" + n);
    if (i == 0 && side_first) b.node("Conv", {"y0", "ws"}, {"s"}, "side");
    prev = out;
  }
  if (!side_first) b.node("Conv", {"y0", "ws"}, {"s"}, "side");
  return b.graph();
}

std::vector<std::string> names(const std::vector<Node>& nodes) {
  std::vector<std::string> out;
  for (const Node& n : nodes) out.push_back(n.name);
  return out;
}

Tensor input() {
  Tensor x(DType::kFloat32, {1, 8, 64, 64});
  float* p = x.data<float>();
  for (std::int64_t i = 0; i < x.numel(); ++i) p[i] = std::sin(float(i) * 0.013f);
  return x;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(ReferenceOrder, FollowsTheReferencesOrderAndIsEmptyWhenItAlreadyDoes) {
  const Graph ref = chain_with_side(false), early = chain_with_side(true), same = chain_with_side(false);
  const std::vector<std::string> order = reference_order(early, ref);
  EXPECT_EQ(order, names(ref.nodes));
  EXPECT_NE(names(early.nodes), names(ref.nodes));
  EXPECT_TRUE(reference_order(same, ref).empty());
  EXPECT_TRUE(reference_order(ref, ref).empty());
}

TEST(SessionNodeOrder, RunsTheNodesInTheGivenOrderWithTheSameBytes) {
  const Graph g = chain_with_side(true);
  const std::map<std::string, Tensor> inputs = {{"x", input()}};
  Session plain(g);
  const auto expected = plain.run(inputs);
  auto steps = [&](const std::shared_ptr<const std::vector<std::string>>& order) {
    SessionOptions options;
    options.node_order = order;
    Session s(g, options);
    std::vector<std::string> ran;
    Session::Execution x(s, inputs);
    while (!x.done()) {
      ran.push_back(x.next_node().name);
      x.step();
    }
    const auto out = x.finish();
    for (const char* name : {"y11", "s"}) EXPECT_TRUE(same_bytes(out.at(name), expected.at(name))) << name;
    return ran;
  };
  std::vector<std::string> side_last;
  for (int i = 0; i < kConvs; ++i) side_last.push_back("conv" + std::to_string(i));
  side_last.push_back("side");
  EXPECT_EQ(steps(std::make_shared<const std::vector<std::string>>(side_last)), side_last);
  // Orders that are not one of the graph's topological orders are ignored.
  std::vector<std::string> side_before_its_input = side_last;
  std::rotate(side_before_its_input.rbegin(), side_before_its_input.rbegin() + 1, side_before_its_input.rend());
  ASSERT_EQ(side_before_its_input.front(), "side");
  EXPECT_EQ(steps(std::make_shared<const std::vector<std::string>>(side_before_its_input)), names(g.nodes));
  std::vector<std::string> missing_one(side_last.begin(), side_last.end() - 1);
  EXPECT_EQ(steps(std::make_shared<const std::vector<std::string>>(missing_one)), names(g.nodes));
}

struct Outcome {
  LayerCells cells;        // the variant's statistics
  std::size_t pool_bytes;  // the activation memory of the call (the sessions' shared pool)
  std::vector<std::map<std::string, Tensor>> outputs;
};

// One observed call, in lockstep, of the FP32 reference `ref` and an FP16 variant whose graph is
// `var` (another object: matched by name), run in its own order or in the reference's.
Outcome lockstep_call(const Graph& ref, const Graph& var, bool follow) {
  RunObservation obs;
  obs.reference = 0;
  obs.space = std::make_shared<const LayerSpace>(std::vector<LayerSpace::Model>{{"model", &ref, false, 0}}, 1);
  for (std::size_t v = 0; v < 2; ++v) {
    ObservedVariant ov;
    ov.name = v ? "fp16" : "fp32";
    ov.reference = v == 0;
    ov.options.precision = v ? Precision::kFp16 : Precision::kFp32;
    ov.models.push_back(observe_model(*obs.space, 0, v ? var : ref, false));
    obs.variants.push_back(std::move(ov));
  }
  obs.count_readers();
  const auto pool = Session::make_pool();
  SessionOptions var_options{Precision::kFp16, true, true, pool};
  if (follow) var_options.node_order = std::make_shared<const std::vector<std::string>>(reference_order(var, ref));
  Session ref_session(ref, {Precision::kFp32, true, true, pool}), var_session(var, var_options);
  UnitObservation unit = obs.make_unit();
  Capture capture;
  ObservedNodes nodes;
  std::vector<std::unique_ptr<LockstepObserver>> observers;
  for (std::size_t v = 0; v < 2; ++v)
    observers.push_back(std::make_unique<LockstepObserver>(obs, v, unit, capture, nodes, "s", 0));
  const std::map<std::string, Tensor> inputs = {{"x", input()}};
  std::vector<double> ms(2, 0.0);
  Outcome out{LayerCells(obs.space), 0, {}};
  out.outputs = run_call_in_lockstep(
      ModelCall{"model", "s", 0, -1}, {0, 1}, 0, observers, capture,
      [&](std::size_t v, Observer* o) {
        return std::make_unique<Session::Execution>(v ? var_session : ref_session, inputs, o);
      },
      {}, ms, 1);
  unit.calls[1].merge_into(out.cells);
  out.pool_bytes = Session::pool_allocated_bytes(*pool);
  return out;
}

TEST(ReferenceOrder, ALockstepVariantInTheReferencesOrderKeepsFewReferenceValuesWaiting) {
  const Graph ref = chain_with_side(false), var = chain_with_side(true);
  const Outcome own = lockstep_call(ref, var, false), follows = lockstep_call(ref, var, true);
  // The same statistics and outputs to the bit: only the order of independent nodes changed.
  EXPECT_TRUE(own.cells == follows.cells);
  for (std::size_t v = 0; v < 2; ++v)
    for (const char* name : {"y11", "s"})
      EXPECT_TRUE(same_bytes(own.outputs[v].at(name), follows.outputs[v].at(name))) << v << " " << name;
  const LayerCell* side = follows.cells.find(std::size_t(kConvs), -1);  // the reference's last node
  ASSERT_TRUE(side);
  EXPECT_GT(side->acc.calls, 0u);
  // In its own order the variant waits at "side" (the reference runs it last) while the reference
  // keeps every conv output for the variant's comparisons; in the reference's order the two
  // executions hold a few values each.
  EXPECT_GE(own.pool_bytes, std::size_t(kConvs) * kValueBytes);
  EXPECT_LE(follows.pool_bytes, 8 * kValueBytes);
  ::testing::Test::RecordProperty("own_order_bytes", int(own.pool_bytes));
  ::testing::Test::RecordProperty("reference_order_bytes", int(follows.pool_bytes));
}

}  // namespace
}  // namespace qeval::eval
