// A fused attention observed in lockstep: the reference streams its scores, scaled scores and
// probabilities (statistics in pieces, its members computed again from copies of Q, K^T and V when
// a variant compares), the variant streams its own against those rows: the same statistics as
// when every member is written whole, without a member in the pool.
#include <gtest/gtest.h>

#include <cmath>

#include "../onnx_builder.h"
#include "eval/run/observe.h"

namespace qeval::eval {
namespace {

using testing::OnnxBuilder;

// 4 entries of 1024 queries by 1024 keys: each member 16 MiB, streamed in two chunks. Q, K^T and
// V come from nodes (a local run reads them as the reference's values).
constexpr std::int64_t kB = 4, kL = 1024, kD = 16;
constexpr std::size_t kMemberBytes = std::size_t(kB * kL * kL) * sizeof(float);

Graph attention_graph() {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {kB, kL, kD});
  b.output("y", onnx::TensorProto::FLOAT);
  b.initializer("a", {0.9f}, {}).initializer("c", {0.05f}, {}).initializer("scale", {0.25f}, {});
  b.node("Mul", {"x", "a"}, {"q"}, "to_q");
  b.node("Add", {"x", "c"}, {"k"}, "to_k");
  onnx::AttributeProto* perm = b.node("Transpose", {"k"}, {"kt"}, "k_t").add_attribute();
  perm->set_name("perm");
  perm->set_type(onnx::AttributeProto::INTS);
  for (std::int64_t d : {0, 2, 1}) perm->add_ints(d);
  b.node("Sin", {"x"}, {"v"}, "to_v");
  b.node("MatMul", {"q", "kt"}, {"s"}, "qk");
  b.node("Mul", {"s", "scale"}, {"scaled"}, "scale");
  b.node("Softmax", {"scaled"}, {"p"}, "softmax");
  b.node("MatMul", {"p", "v"}, {"o"}, "pv");
  b.node("Neg", {"o"}, {"y"}, "out");
  return b.graph();
}

struct Outcome {
  std::vector<LayerCells> cells;  // per variant
  std::size_t pool_bytes = 0;     // the activation memory of the call (the sessions' shared pool)
};

// One observed call of the FP32 reference and an FP16 variant in lockstep; `written`: a node hook
// on every variant, so nothing streams and every member is written whole.
Outcome observed_call(const Graph& g, bool local_error, bool written) {
  RunObservation obs;
  obs.reference = 0;
  obs.local_error = local_error;
  obs.space = std::make_shared<const LayerSpace>(std::vector<LayerSpace::Model>{{"model", &g, false, 0}}, 1);
  for (std::size_t v = 0; v < 2; ++v) {
    ObservedVariant ov;
    ov.name = v ? "fp16" : "fp32";
    ov.reference = v == 0;
    ov.options.precision = v ? Precision::kFp16 : Precision::kFp32;
    ov.models.push_back(observe_model(*obs.space, 0, g, local_error && v != 0));
    obs.variants.push_back(std::move(ov));
  }
  obs.count_readers();
  if (written) obs.node_hook = [](const std::string&, const ModelCall&, const NodeEvent&) {};
  const auto pool = Session::make_pool();
  Session ref(g, {Precision::kFp32, true, true, pool}), var(g, {Precision::kFp16, true, true, pool});
  UnitObservation unit = obs.make_unit();
  Capture capture;
  ObservedNodes nodes;
  LocalSessions local;
  std::vector<std::unique_ptr<LockstepObserver>> observers;
  for (std::size_t v = 0; v < 2; ++v)
    observers.push_back(std::make_unique<LockstepObserver>(obs, v, unit, capture, nodes, "s", 0));
  Tensor x(DType::kFloat32, {kB, kL, kD});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = std::sin(float(i) * 0.37f);
  const std::map<std::string, Tensor> inputs = {{"x", x}};
  LockstepLocalErrors lockstep_local(obs, capture, local, unit);
  std::vector<double> ms(2, 0.0);
  const ModelCall call{"model", "s", 0, -1};
  run_call_in_lockstep(
      call, {0, 1}, 0, observers, capture,
      [&](std::size_t v, Observer* o) { return std::make_unique<Session::Execution>(v ? var : ref, inputs, o, false); },
      {}, ms, 1, local_error ? &lockstep_local : nullptr);
  Outcome out;
  for (std::size_t v = 0; v < 2; ++v) {
    out.cells.emplace_back(obs.space);
    unit.calls[v].merge_into(out.cells.back());
  }
  out.pool_bytes = Session::pool_allocated_bytes(*pool);
  return out;
}

// A device backend's values stay on the device for observers (device scans) unless something
// reads whole tensors: a tensor sink, or a node hook that reads values; one that reads shapes
// alone (qeval run's CallShapes) does not bring them to the host.
TEST(LockstepAttention, OnlyHooksThatReadValuesBringDeviceValuesToTheHost) {
  const Graph g = attention_graph();
  RunObservation obs;
  obs.space = std::make_shared<const LayerSpace>(std::vector<LayerSpace::Model>{{"model", &g, false, 0}}, 1);
  ObservedVariant ov;
  ov.name = "fp32";
  ov.reference = true;
  ov.models.push_back(observe_model(*obs.space, 0, g, false));
  obs.variants.push_back(std::move(ov));
  obs.count_readers();
  UnitObservation unit = obs.make_unit();
  Capture capture;
  ObservedNodes nodes;
  const ModelCall call{"model", "s", 0, -1};
  auto reads_device_values = [&] {
    LockstepObserver o(obs, 0, unit, capture, nodes, "s", 0);
    const bool device = o.begin(call)->reads_device_values();
    o.end(call, {});
    return device;
  };
  EXPECT_TRUE(reads_device_values());
  obs.node_hook = [](const std::string&, const ModelCall&, const NodeEvent&) {};
  EXPECT_FALSE(reads_device_values());
  obs.node_hook_reads_values = false;
  EXPECT_TRUE(reads_device_values());
  obs.full_tensors = [](const std::string&, const ModelCall&, const Node&, const Tensor&) {};
  EXPECT_FALSE(reads_device_values());
}

TEST(LockstepAttention, StreamedMembersGiveTheStatisticsOfWrittenOnesWithoutThemInMemory) {
  const Graph g = attention_graph();
  for (bool local_error : {false, true}) {
    SCOPED_TRACE(local_error ? "local error" : "no local error");
    const Outcome streamed = observed_call(g, local_error, false), written = observed_call(g, local_error, true);
    for (std::size_t v = 0; v < 2; ++v) EXPECT_TRUE(streamed.cells[v] == written.cells[v]) << v;
    // Every member compared (and re-run alone with local error) in the variant.
    for (const char* name : {"qk", "scale", "softmax", "pv"}) {
      std::size_t node = 0;
      while (g.nodes[node].name != name) ++node;
      const LayerCell* c = streamed.cells[1].find(node, -1);
      ASSERT_TRUE(c) << name;
      EXPECT_EQ(c->acc.calls, 1u) << name;
      EXPECT_GT(c->acc.err_sq.value(), 0.0) << name;
      EXPECT_EQ(c->local().calls, local_error ? 1u : 0u) << name;
      EXPECT_EQ(streamed.cells[0].find(node, -1)->act.calls, 1u) << name;
    }
    // Written, the reference's members wait for the variant's (three of each at least); streamed,
    // none is ever in the pool.
    EXPECT_GE(written.pool_bytes, 3 * kMemberBytes);
    EXPECT_LT(streamed.pool_bytes, kMemberBytes);
  }
}

}  // namespace
}  // namespace qeval::eval
