// What a reduced-precision deployment folds in FP32 before casting weights (eval/exec/deploy_fold.h):
// constant per-channel Mul/Add after a Conv go into the Conv's weights and bias.
#include "eval/exec/deploy_fold.h"

#include <gtest/gtest.h>

#include <cmath>

#include "eval/exec/session.h"
#include "onnx_builder.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

using testing::floats;
using testing::OnnxBuilder;

std::vector<float> ramp(std::size_t n, float step, float start) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + step * float(i);
  return v;
}

// x [1,2,4,4] -> Conv (3 output channels, bias) -> Mul by [3,1,1] -> Add [1,3,1,1] -> y; a second
// Conv whose output is also a graph output, and a Mul by a [2] vector (along W, not per channel):
// neither folds.
Graph graph() {
  OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {1, 2, 4, 4}).output("y", onnx::TensorProto::FLOAT);
  b.output("c2", onnx::TensorProto::FLOAT).output("z", onnx::TensorProto::FLOAT);
  b.initializer("w", ramp(54, 0.01f, -0.2f), {3, 2, 3, 3}).initializer("bias", {0.1f, -0.2f, 0.3f}, {3});
  b.initializer("s", {2.0f, 0.5f, -1.5f}, {3, 1, 1}).initializer("a", {1.0f, 2.0f, 3.0f}, {1, 3, 1, 1});
  b.initializer("row", {1.0f, 2.0f}, {2});
  b.node("Conv", {"x", "w", "bias"}, {"c"}, "conv");  // no padding: 2x2 outputs
  b.node("Mul", {"s", "c"}, {"m"}, "scale");  // the constant first
  b.node("Add", {"m", "a"}, {"y"}, "shift");
  b.node("Conv", {"x", "w", "bias"}, {"c2"}, "conv2");
  b.node("Mul", {"c2", "row"}, {"z"}, "along_w");
  return b.graph();
}

TEST(DeploymentFold, PerChannelMulAndAddAfterAConvGoIntoItsWeightsAndBias) {
  const Graph g = graph();
  const DeploymentFold f = fold_for_deployment(g, g.nodes);
  EXPECT_EQ(f.scales_into_conv, 2u);
  ASSERT_EQ(f.nodes.size(), 3u);  // conv+scale+shift as one Conv named "shift"; conv2; along_w
  const Node& folded = f.nodes[0];
  EXPECT_EQ(folded.op_type, "Conv");
  EXPECT_EQ(folded.name, "shift");
  EXPECT_EQ(folded.outputs, std::vector<std::string>{"y"});
  const Tensor& w = f.weights.at(folded.inputs[1]);
  const Tensor& bias = f.weights.at(folded.inputs[2]);
  const float s[] = {2.0f, 0.5f, -1.5f}, a[] = {1.0f, 2.0f, 3.0f}, b0[] = {0.1f, -0.2f, 0.3f};
  for (int oc = 0; oc < 3; ++oc) {
    for (int j = 0; j < 18; ++j)
      EXPECT_EQ(w.data<float>()[oc * 18 + j], float(double(g.initializers.at("w").data<float>()[oc * 18 + j]) * s[oc]));
    EXPECT_EQ(bias.data<float>()[oc], float(double(b0[oc]) * s[oc] + a[oc]));
  }
  EXPECT_EQ(f.weights.size(), 2u);  // the Mul's intermediate fold was replaced, not kept
  EXPECT_EQ(f.nodes[1].name, "conv2");
  EXPECT_EQ(f.nodes[2].name, "along_w");

  // The same function: FP32 sessions of the graph before and after give the same outputs (within
  // the rounding of the folded weights).
  Graph after = g;
  after.nodes = f.nodes;
  for (const auto& [name, t] : f.weights) after.initializers.emplace(name, t);
  Session before_s(g), after_s(after);
  std::map<std::string, Tensor> in{{"x", floats({1, 2, 4, 4}, ramp(32, 0.07f, -1.0f))}};
  const auto want = before_s.run(in), got = after_s.run(in);
  for (const char* out : {"y", "c2", "z"})
    for (std::int64_t i = 0; i < want.at(out).numel(); ++i)
      EXPECT_NEAR(got.at(out).data<float>()[i], want.at(out).data<float>()[i], 1e-5) << out << " " << i;
}

}  // namespace
}  // namespace qeval::eval
