// Local error in lockstep (LockstepLocalErrors): each variant node's local run right after the
// reference nodes it reads have run, the reference's execution retaining nothing: the same
// statistics as local error after a retaining call, in the activation memory of two plain runs.
#include <gtest/gtest.h>

#include <cmath>

#include "../onnx_builder.h"
#include "eval/run/observe.h"

namespace qeval::eval {
namespace {

using testing::OnnxBuilder;

constexpr int kConvs = 12;

// A chain of 1x1 convolutions (nothing fuses) on [1, 8, 64, 64] values: 128 KiB each.
Graph conv_chain() {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {1, 8, 64, 64});
  b.output(std::string("y").append(std::to_string(kConvs - 1)), onnx::TensorProto::FLOAT);
  std::string prev = "x";
  for (int i = 0; i < kConvs; ++i) {
    std::vector<float> w(64);
    for (std::size_t k = 0; k < w.size(); ++k) w[k] = 0.3f * std::sin(float(k) * 0.7f + float(i));
    const std::string wn = std::string("w").append(std::to_string(i)), out = std::string("y").append(std::to_string(i));
    b.initializer(wn, w, {8, 8, 1, 1});
    b.node("Conv", {prev, wn}, {out}, std::string("conv").append(std::to_string(i)));
    prev = out;
  }
  return b.graph();
}

Tensor input() {
  Tensor x(DType::kFloat32, {1, 8, 64, 64});
  float* p = x.data<float>();
  for (std::int64_t i = 0; i < x.numel(); ++i) p[i] = std::sin(float(i) * 0.013f);
  return x;
}

struct Outcome {
  LayerCells cells;        // the fp16 variant's statistics
  std::size_t pool_bytes;  // the activation memory of the call (the sessions' shared pool)
  std::vector<std::map<std::string, Tensor>> outputs;
};

// One observed call of the FP32 reference and an FP16 variant of `g` in lockstep, local error
// node by node (`per_node`) or after the call from a retaining reference execution.
Outcome observed_call(const Graph& g, bool per_node) {
  RunObservation obs;
  obs.reference = 0;
  obs.local_error = true;
  obs.space = std::make_shared<const LayerSpace>(std::vector<LayerSpace::Model>{{"model", &g, false, 0}}, 1);
  for (std::size_t v = 0; v < 2; ++v) {
    ObservedVariant ov;
    ov.name = v ? "fp16" : "fp32";
    ov.reference = v == 0;
    ov.options.precision = v ? Precision::kFp16 : Precision::kFp32;
    ov.models.push_back(observe_model(*obs.space, 0, g, v != 0));
    obs.variants.push_back(std::move(ov));
  }
  obs.count_readers();
  const auto pool = Session::make_pool();
  Session ref(g, {Precision::kFp32, true, true, pool}), var(g, {Precision::kFp16, true, true, pool});
  UnitObservation unit = obs.make_unit();
  Capture capture;
  ObservedNodes nodes;
  LocalSessions local;
  std::vector<std::unique_ptr<LockstepObserver>> observers;
  for (std::size_t v = 0; v < 2; ++v)
    observers.push_back(std::make_unique<LockstepObserver>(obs, v, unit, capture, nodes, "s", 0));
  const std::map<std::string, Tensor> inputs = {{"x", input()}};
  LockstepLocalErrors lockstep_local(obs, capture, local, unit);
  std::vector<double> ms(2, 0.0);
  const ModelCall call{"model", "s", 0, -1};
  Outcome out{LayerCells(obs.space), 0, {}};
  out.outputs = run_call_in_lockstep(
      call, {0, 1}, 0, observers, capture,
      [&](std::size_t v, Observer* o) {
        return std::make_unique<Session::Execution>(v ? var : ref, inputs, o, !per_node && v == 0);
      },
      per_node ? std::function<void()>() : [&] { run_local_errors(obs, 1, capture, local, unit); }, ms, 1,
      per_node ? &lockstep_local : nullptr);
  unit.calls[1].merge_into(out.cells);
  out.pool_bytes = Session::pool_allocated_bytes(*pool);
  return out;
}

TEST(LockstepLocalErrors, SameStatisticsAsAfterTheCallWithoutRetainingTheReference) {
  const Graph g = conv_chain();
  const Outcome after = observed_call(g, false), per_node = observed_call(g, true);
  // The statistics to the bit, local error of every conv included.
  EXPECT_TRUE(per_node.cells == after.cells);
  for (std::size_t layer = 0; layer < std::size_t(kConvs); ++layer) {
    const LayerCell* c = per_node.cells.find(layer, -1);
    ASSERT_TRUE(c) << layer;
    EXPECT_EQ(c->local().calls, 1u) << layer;
    EXPECT_GT(c->local().err_sq.value(), 0.0) << layer;  // FP16 weights and values: some error
  }
  ASSERT_EQ(per_node.outputs.size(), 2u);
  for (std::size_t v = 0; v < 2; ++v) {
    const Tensor& a = per_node.outputs[v].at("y11");
    const Tensor& b = after.outputs[v].at("y11");
    ASSERT_EQ(a.nbytes(), b.nbytes());
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << v;
  }

  // Memory: two plain runs one after the other on one pool, against the two observed calls.
  const auto pool = Session::make_pool();
  Session ref(g, {Precision::kFp32, true, true, pool}), var(g, {Precision::kFp16, true, true, pool});
  const std::map<std::string, Tensor> inputs = {{"x", input()}};
  ref.run(inputs);
  var.run(inputs);
  const std::size_t plain = Session::pool_allocated_bytes(*pool), value = 8 * 64 * 64 * sizeof(float);
  // Retaining, the reference keeps all its values; node by node, the two executions hold about
  // what each holds alone (an input and an output each, a value a local run waits for).
  EXPECT_GE(after.pool_bytes, std::size_t(kConvs) * value);
  EXPECT_LE(per_node.pool_bytes, 2 * plain);
  ::testing::Test::RecordProperty("plain_bytes", int(plain));
  ::testing::Test::RecordProperty("per_node_bytes", int(per_node.pool_bytes));
  ::testing::Test::RecordProperty("retaining_bytes", int(after.pool_bytes));
}

}  // namespace
}  // namespace qeval::eval
