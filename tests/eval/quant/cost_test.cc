// Compute costs (parameters, multiply-accumulates) of Conv/MatMul/Gemm from recorded shapes, engine
// weight bytes per precision, and the speed classes from lint findings.
#include "eval/quant/cost.h"

#include <gtest/gtest.h>

#include "eval/onnx_builder.h"
#include "test_util.h"

namespace qeval::eval::quant {
namespace {

using testing::OnnxBuilder;

OnnxBuilder four_products() {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {1, 3, 8, 8}).input("a", onnx::TensorProto::FLOAT, {2, 5});
  b.input("m", onnx::TensorProto::FLOAT, {2, 7, 5}).input("q", onnx::TensorProto::FLOAT, {2, 4, 8});
  b.input("k", onnx::TensorProto::FLOAT, {2, 8, 4});
  b.initializer("W", std::vector<float>(4 * 3 * 3 * 3, 0.5f), {4, 3, 3, 3});
  b.initializer("G", std::vector<float>(15, 0.5f), {3, 5});
  b.initializer("B", std::vector<float>(30, 0.5f), {5, 6});
  b.initializer("unused", std::vector<float>(1000, 0.5f), {1000});
  auto& conv = b.node("Conv", {"x", "W"}, {"c"}, "conv");
  auto* pads = conv.add_attribute();
  pads->set_name("pads");
  pads->set_type(onnx::AttributeProto::INTS);
  for (int i = 0; i < 4; ++i) pads->add_ints(1);
  auto& gemm = b.node("Gemm", {"a", "G"}, {"g"}, "gemm");
  auto* t = gemm.add_attribute();
  t->set_name("transB");
  t->set_type(onnx::AttributeProto::INT);
  t->set_i(1);
  b.node("MatMul", {"m", "B"}, {"mm"}, "linear");
  b.node("MatMul", {"q", "k"}, {"s"}, "scores");
  b.output("c", onnx::TensorProto::FLOAT).output("g", onnx::TensorProto::FLOAT);
  b.output("mm", onnx::TensorProto::FLOAT).output("s", onnx::TensorProto::FLOAT);
  return b;
}

TEST(ComputeCost, ParametersAndMultiplyAccumulatesFromShapes) {
  const Graph g = four_products().graph();
  const std::map<std::string, Shape> shapes = {{"x", {1, 3, 8, 8}}, {"c", {1, 4, 8, 8}}, {"a", {2, 5}},
                                               {"g", {2, 3}},       {"m", {2, 7, 5}},    {"mm", {2, 7, 6}},
                                               {"q", {2, 4, 8}},    {"k", {2, 8, 4}},    {"s", {2, 4, 4}}};
  const auto costs = compute_costs(g, shapes);
  ASSERT_EQ(costs.size(), 4u);
  EXPECT_EQ(costs[0].name, "conv");
  EXPECT_EQ(costs[0].params, 108);
  EXPECT_EQ(*costs[0].macs, 4.0 * 8 * 8 * 27);  // each output reads Cin x 3 x 3
  EXPECT_EQ(costs[1].params, 15);
  EXPECT_EQ(*costs[1].macs, 6.0 * 5);  // [2, 3] outputs, K = 5 (B is [N, K] with transB)
  EXPECT_EQ(costs[2].params, 30);
  EXPECT_EQ(*costs[2].macs, 84.0 * 5);
  EXPECT_EQ(costs[3].params, 0);  // two activations: no weight
  EXPECT_EQ(*costs[3].macs, 32.0 * 8);
  // Without the output's shape the MACs are unknown, never guessed.
  EXPECT_FALSE(compute_costs(g, {})[0].macs.has_value());
}

TEST(ComputeCost, WeightBytesByPrecisionSkipUnusedInitializers) {
  const Graph g = four_products().graph();
  EXPECT_EQ(weight_bytes(g, Precision::kFp32), (108 + 15 + 30) * 4);
  EXPECT_EQ(weight_bytes(g, Precision::kFp16), (108 + 15 + 30) * 2);
}

LintReport lint_with(std::vector<std::pair<std::string, Severity>> findings, int quantized, int total) {
  LintReport r;
  r.target_sm = 86;
  for (const auto& [rule, severity] : findings) {
    LintFinding f;
    f.rule = rule;
    f.severity = severity;
    r.findings.push_back(f);
  }
  for (int i = 0; i < total; ++i) {
    LintNode n;
    n.name = "n";
    n.name += std::to_string(i);  // not "n" + ...: GCC 12 -Wrestrict false positive
    n.state = i < quantized ? ComputeState::kQuantized : ComputeState::kHighPrecision;
    r.nodes.push_back(n);
  }
  return r;
}

TEST(SpeedClass, FollowsTheLintRules) {
  EXPECT_EQ(estimate_speed(lint_with({}, 8, 10), 0.9).speed, SpeedClass::kFaster);
  EXPECT_EQ(estimate_speed(lint_with({}, 8, 10), 0.2).speed, SpeedClass::kAboutFp16);
  // Unknown shapes: the share of nodes decides.
  EXPECT_EQ(estimate_speed(lint_with({}, 8, 10), std::nullopt).speed, SpeedClass::kFaster);
  const auto fp8 = estimate_speed(lint_with({{"fp8-target", Severity::kError}}, 8, 10), 0.9);
  EXPECT_EQ(fp8.speed, SpeedClass::kUnsupported);
  EXPECT_NE(fp8.reasons.back().find("sm86"), std::string::npos);
  // Notes do not count (FP8 without a target is a note).
  EXPECT_EQ(estimate_speed(lint_with({{"fp8-target", Severity::kInfo}}, 8, 10), 0.9).speed, SpeedClass::kFaster);
  const auto mha = estimate_speed(lint_with({{"attention-int8", Severity::kWarning}}, 8, 10), 0.9);
  EXPECT_EQ(mha.speed, SpeedClass::kSlowerRisk);
  EXPECT_NE(mha.reasons.back().find("attention-int8: 1"), std::string::npos);
  // Q/DQ pairs run as kernels: a risk when little compute is quantized, a remark otherwise.
  EXPECT_EQ(estimate_speed(lint_with({{"activation-only", Severity::kWarning}}, 2, 10), 0.2).speed,
            SpeedClass::kSlowerRisk);
  EXPECT_EQ(estimate_speed(lint_with({{"activation-only", Severity::kWarning}}, 8, 10), 0.9).speed,
            SpeedClass::kFaster);
}

}  // namespace
}  // namespace qeval::eval::quant
