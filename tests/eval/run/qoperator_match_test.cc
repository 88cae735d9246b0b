// Layer matching of ONNX Runtime's QOperator form on hand-made graphs: a QLinear node matches the
// reference node of its name whose op is its float op, a renamed one the producer of the float
// tensor its quantized output is named after (<tensor>_QuantizeLinear_Output), and a Relu that
// ORT's quantizer removed moves the comparison to the Relu (the QLinear node's codes are clipped).
#include <gtest/gtest.h>

#include "eval/exec/onnx_import.h"
#include "eval/onnx_builder.h"
#include "eval/run/node_match.h"

namespace qeval::eval {
namespace {

using testing::OnnxBuilder;

constexpr int kF32 = onnx::TensorProto::FLOAT;
constexpr int kI8 = onnx::TensorProto::INT8;
constexpr int kU8 = onnx::TensorProto::UINT8;
constexpr const char* kMs = "com.microsoft";

std::size_t index_of(const Graph& g, const std::string& name) {
  for (std::size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].name == name) return i;
  ADD_FAILURE() << "no node " << name;
  return 0;
}

// x -> Conv "conv" (c) -> Relu "relu" (r) -> Add "add" of x (y) -> Sigmoid "sig" (s);
// without the Relu, the Conv writes r.
Graph reference(bool relu = true) {
  OnnxBuilder b(13);
  b.input("x", kF32, {1, 2, 4, 4}).output("s", kF32);
  b.initializer("w", std::vector<float>(2 * 2 * 1 * 1, 0.5f), {2, 2, 1, 1});
  b.node("Conv", {"x", "w"}, {relu ? "c" : "r"}, "conv");
  if (relu) b.node("Relu", {"c"}, {"r"}, "relu");
  b.node("Add", {"r", "x"}, {"y"}, "add");
  b.node("Sigmoid", {"y"}, {"s"}, "sig");
  return b.graph("ref.onnx");
}

// The same network as ONNX Runtime writes its QOperator form: the Relu gone (the QLinearConv's
// output range starts at 0), the Add renamed ("fused_add") but writing y's quantized tensor.
// `renamed`: every node and tensor named anew.
Graph qoperator(bool renamed = false) {
  const std::string xq = renamed ? "t0" : "x_QuantizeLinear_Output", rq = renamed ? "t1" : "r_QuantizeLinear_Output";
  const std::string yq = renamed ? "t2" : "y_QuantizeLinear_Output", sq = renamed ? "t3" : "s_QuantizeLinear_Output";
  const std::string p = renamed ? "n_" : "";
  OnnxBuilder b(13);
  b.domain(kMs, 1);
  b.input("x", kF32, {1, 2, 4, 4}).output("s", kF32);
  b.initializer("sx", {0.05f}, {}).initializer("sw", {0.01f}, {}).initializer("sr", {0.02f}, {});
  b.initializer("sy", {0.03f}, {}).initializer("ss", {1.0f / 256}, {});
  b.initializer_raw<std::uint8_t>("z", kU8, {0}, {});
  b.initializer_raw<std::int8_t>("wq", kI8, std::vector<std::int8_t>(4, 50), {2, 2, 1, 1});
  b.initializer_raw<std::int8_t>("wz", kI8, {0}, {});
  b.node("QuantizeLinear", {"x", "sx", "z"}, {xq}, p + "x_QuantizeLinear");
  b.node("QLinearConv", {xq, "sx", "z", "wq", "sw", "wz", "sr", "z"}, {rq}, p + "conv");
  b.node("QLinearAdd", {rq, "sr", "z", xq, "sx", "z", "sy", "z"}, {yq}, p + "fused_add", kMs);
  b.node("QLinearSigmoid", {yq, "sy", "z", "ss", "z"}, {sq}, p + "sig", kMs);
  b.node("DequantizeLinear", {sq, "ss", "z"}, {"s"}, p + "s_DequantizeLinear");
  return b.graph("qop.onnx");
}

TEST(QOperatorMatch, QLinearNodesMatchTheirFloatOpsAndAnAbsorbedReluIsComparedAtTheRelu) {
  const Graph ref = reference(), var = qoperator();
  const NodeMatch m = match_nodes(ref, var);
  EXPECT_EQ(m.by_name, 2u);    // conv, sig
  EXPECT_EQ(m.by_output, 1u);  // fused_add by y
  EXPECT_EQ(m.by_structure, 0u);
  EXPECT_EQ(m.ref_of_variant[index_of(var, "conv")], int(index_of(ref, "relu")));
  EXPECT_EQ(m.ref_of_variant[index_of(var, "fused_add")], int(index_of(ref, "add")));
  EXPECT_EQ(m.ref_of_variant[index_of(var, "sig")], int(index_of(ref, "sig")));
  ASSERT_EQ(m.unmatched.size(), 1u);
  EXPECT_EQ(m.unmatched[0].side, "reference");
  EXPECT_EQ(m.unmatched[0].name, "conv");
  EXPECT_EQ(m.unmatched[0].reason,
            "its Relu relu is absorbed into QLinearConv conv's quantized output range (ONNX Runtime's quantizer "
            "removes it): compared at relu");
}

TEST(QOperatorMatch, RenamedQLinearNodesMatchByStructure) {
  // Every node and tensor renamed: the QLinearConv by its Conv's structure, the QLinearAdd and
  // QLinearSigmoid as an Add and a Sigmoid over their data inputs (not their scales).
  const Graph var = qoperator(true), ref = reference(false);
  const NodeMatch m = match_nodes(ref, var);
  EXPECT_EQ(m.by_name, 0u);
  EXPECT_EQ(m.by_output, 0u);
  EXPECT_EQ(m.by_structure, 3u);
  EXPECT_EQ(m.ref_of_variant[index_of(var, "n_conv")], int(index_of(ref, "conv")));
  EXPECT_EQ(m.ref_of_variant[index_of(var, "n_fused_add")], int(index_of(ref, "add")));
  EXPECT_EQ(m.ref_of_variant[index_of(var, "n_sig")], int(index_of(ref, "sig")));
  EXPECT_TRUE(m.unmatched.empty());
}

}  // namespace
}  // namespace qeval::eval
