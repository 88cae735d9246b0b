// Matching a Q/DQ variant's graph to the reference's, local-run plans, and running part of a graph
// alone (extract_subgraph).
#include "eval/run/node_match.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "eval/exec/session.h"
#include "eval/onnx_builder.h"
#include "eval/run/observe.h"
#include "kernels/numeric.h"

namespace qeval::eval {
namespace {

using testing::floats;
using testing::OnnxBuilder;

constexpr int kF32 = onnx::TensorProto::FLOAT;
constexpr int kI8 = onnx::TensorProto::INT8;

const std::vector<float> kW = {0.5f, -1.0f, 0.25f, 2.0f, 1.5f, -0.75f, 0.1f, 0.2f, -0.3f, 1.0f, 0.0f, -2.0f};

// x [1, 4] -> relu -> mm (W [4, 3]) -> add (+b) -> y.
Graph reference_graph() {
  OnnxBuilder b(17);
  b.input("x", kF32, {1, 4}).output("y", kF32, {1, 3});
  b.initializer("W", kW, {4, 3}).initializer("b", {0.1f, 0.2f, 0.3f}, {3});
  b.node("Relu", {"x"}, {"r"}, "relu");
  b.node("MatMul", {"r", "W"}, {"m"}, "mm");
  b.node("Add", {"m", "b"}, {"y"}, "add");
  return b.graph("ref.onnx");
}

// The same with the MatMul quantized as a recipe writes it (input and weight Q/DQ, int8,
// symmetric) and the Add renamed.
Graph qdq_graph() {
  OnnxBuilder b(17);
  b.input("x", kF32, {1, 4}).output("y", kF32, {1, 3});
  std::vector<std::int8_t> wq;
  for (float w : kW) wq.push_back(std::int8_t(std::nearbyint(w / (2.0f / 127))));
  b.initializer_raw("Wq", kI8, wq, {4, 3}).initializer("ws", {2.0f / 127}, {});
  b.initializer("xs", {0.02f}, {}).initializer("b", {0.1f, 0.2f, 0.3f}, {3});
  b.initializer_raw("zp", kI8, std::vector<std::int8_t>{0}, {});
  b.node("Relu", {"x"}, {"r"}, "relu");
  b.node("QuantizeLinear", {"r", "xs", "zp"}, {"rq"}, "mm/input_quantizer/QuantizeLinear");
  b.node("DequantizeLinear", {"rq", "xs", "zp"}, {"rd"}, "mm/input_quantizer/DequantizeLinear");
  b.node("DequantizeLinear", {"Wq", "ws", "zp"}, {"Wd"}, "mm/weight_quantizer/DequantizeLinear");
  b.node("MatMul", {"rd", "Wd"}, {"m"}, "mm");
  b.node("Add", {"m", "b"}, {"y"}, "add_renamed");
  return b.graph("qdq.onnx");
}

std::size_t index_of(const Graph& g, const std::string& name) {
  for (std::size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].name == name) return i;
  return g.nodes.size();
}

TEST(NodeMatch, ByNameWithQuantizationPlumbingSetAside) {
  const Graph ref = reference_graph(), var = qdq_graph();
  const NodeMatch m = match_nodes(ref, var);
  EXPECT_EQ(m.by_name, 2u);   // relu, mm
  EXPECT_EQ(m.plumbing, 3u);  // Q, DQ, weight DQ
  EXPECT_EQ(m.ref_of_variant[index_of(var, "mm")], int(index_of(ref, "mm")));
  EXPECT_EQ(m.variant_of_ref[index_of(ref, "relu")], int(index_of(var, "relu")));
  // The renamed Add produces the same tensor "y": matched by its output tensor's name.
  EXPECT_EQ(m.by_output, 1u);
  EXPECT_EQ(m.ref_of_variant[index_of(var, "add_renamed")], int(index_of(ref, "add")));
  EXPECT_TRUE(m.unmatched.empty());
  // The same graph object: node for node.
  const NodeMatch self = match_nodes(ref, ref);
  EXPECT_EQ(self.by_name, ref.nodes.size());
  EXPECT_TRUE(self.unmatched.empty());
}

// The reference graph as another exporter writes it: every node and tensor named differently.
Graph renamed_graph(bool quantized, bool swap_parallel = false) {
  OnnxBuilder b(17);
  b.input("x", kF32, {1, 4}).output("out", kF32, {1, 3});
  b.initializer("onnx::MatMul_7", kW, {4, 3}).initializer("bias_9", {0.1f, 0.2f, 0.3f}, {3});
  b.initializer("k", {2.0f}, {});
  b.node("Relu", {"x"}, {"t0"}, "/block/Relu");
  std::string mm_in = "t0";
  if (quantized) {
    b.initializer("xs", {0.02f}, {});
    b.initializer_raw("zp", kI8, std::vector<std::int8_t>{0}, {});
    b.node("QuantizeLinear", {"t0", "xs", "zp"}, {"t0q"}, "q_17");
    b.node("DequantizeLinear", {"t0q", "xs", "zp"}, {"t0d"}, "dq_18");
    mm_in = "t0d";
  }
  // Two parallel branches of one structure but for a scalar attribute-free Mul vs Div: the order of
  // the exporter's nodes must not matter where structures differ.
  auto mul = [&] { b.node("Mul", {"t0", "k"}, {"t3"}, "/block/Mul"); };
  auto mm = [&] { b.node("MatMul", {mm_in, "onnx::MatMul_7"}, {"t1"}, "/block/MatMul"); };
  if (swap_parallel) mul(), mm();
  else mm(), mul();
  b.node("Add", {"t1", "bias_9"}, {"out"}, "/block/Add");
  return b.graph("renamed.onnx");
}

Graph reference_with_branch() {
  OnnxBuilder b(17);
  b.input("x", kF32, {1, 4}).output("y", kF32, {1, 3});
  b.initializer("W", kW, {4, 3}).initializer("b", {0.1f, 0.2f, 0.3f}, {3}).initializer("two", {2.0f}, {});
  b.node("Relu", {"x"}, {"r"}, "relu");
  b.node("MatMul", {"r", "W"}, {"m"}, "mm");
  b.node("Mul", {"r", "two"}, {"side"}, "side_mul");
  b.node("Add", {"m", "b"}, {"y"}, "add");
  return b.graph("ref.onnx");
}

TEST(NodeMatch, ByStructureAcrossAnExportWithOtherNodeAndTensorNames) {
  const Graph ref = reference_with_branch();
  for (bool quantized : {false, true})
    for (bool swap : {false, true}) {
      const Graph var = renamed_graph(quantized, swap);
      const NodeMatch m = match_nodes(ref, var);
      EXPECT_EQ(m.by_name, 0u);
      EXPECT_EQ(m.by_structure, 4u) << quantized << swap;
      EXPECT_TRUE(m.unmatched.empty()) << m.unmatched.size();
      EXPECT_EQ(m.ref_of_variant[index_of(var, "/block/MatMul")], int(index_of(ref, "mm")));
      EXPECT_EQ(m.ref_of_variant[index_of(var, "/block/Mul")], int(index_of(ref, "side_mul")));
      EXPECT_EQ(m.ref_of_variant[index_of(var, "/block/Add")], int(index_of(ref, "add")));
      EXPECT_EQ(m.plumbing, quantized ? 2u : 0u);
    }
  // Structure means structure: a weight of another shape is another layer.
  OnnxBuilder b(17);
  b.input("x", kF32, {1, 4}).output("out", kF32, {1, 2});
  b.initializer("w2", std::vector<float>(8, 1.0f), {4, 2});
  b.node("Relu", {"x"}, {"t0"}, "r0");
  b.node("MatMul", {"t0", "w2"}, {"out"}, "m0");
  const NodeMatch other = match_nodes(ref, b.graph("other.onnx"));
  EXPECT_EQ(other.by_structure, 1u);  // the Relu only
  EXPECT_EQ(other.unmatched.size(), 1u + 3u);
  EXPECT_NE(other.unmatched[0].reason.find("structure"), std::string::npos) << other.unmatched[0].reason;
}

// ONNX Runtime's dynamic INT8 export (quantize_dynamic): the Conv becomes DynamicQuantizeLinear ->
// ConvInteger -> Cast -> Mul by the scales, and the Mul produces the Conv's output tensor.
TEST(NodeMatch, OnnxRuntimesDynamicInt8FormMatchesByOutputTensorAndCountsAsQuantized) {
  OnnxBuilder r(11);
  r.input("x", kF32, {1, 1, 4, 4}).output("y", kF32, {1, 1, 4, 4});
  r.initializer("w", {0.5f}, {1, 1, 1, 1});
  r.node("Conv", {"x", "w"}, {"conv_out"}, "Conv_0");
  r.node("Relu", {"conv_out"}, {"y"}, "Relu_1");
  const Graph ref = r.graph("ref.onnx");
  OnnxBuilder v(11);
  v.input("x", kF32, {1, 1, 4, 4}).output("y", kF32, {1, 1, 4, 4});
  v.initializer_raw("w_quantized", onnx::TensorProto::INT8, std::vector<std::int8_t>{127}, {1, 1, 1, 1});
  v.initializer_raw("w_zero_point", onnx::TensorProto::INT8, std::vector<std::int8_t>{0}, {});
  v.initializer("w_scale", {0.5f / 127}, {});
  v.node("DynamicQuantizeLinear", {"x"}, {"x_q", "x_scale", "x_zp"}, "x_QuantizeLinear");
  v.node("ConvInteger", {"x_q", "w_quantized", "x_zp", "w_zero_point"}, {"conv_int"}, "Conv_0_quant");
  v.node("Cast", {"conv_int"}, {"conv_f"}, "Conv_0_quant_cast").add_attribute()->CopyFrom([] {
    onnx::AttributeProto a;
    a.set_name("to");
    a.set_type(onnx::AttributeProto::INT);
    a.set_i(1);
    return a;
  }());
  v.node("Mul", {"x_scale", "w_scale"}, {"scales"}, "Conv_0_quant_scales_mul");
  v.node("Mul", {"conv_f", "scales"}, {"conv_out"}, "Conv_0_quant_output_scale_mul");
  v.node("Relu", {"conv_out"}, {"y"}, "Relu_1");
  const Graph var = v.graph("dyn.onnx");
  const NodeMatch m = match_nodes(ref, var);
  EXPECT_EQ(m.by_name, 1u);    // the Relu
  EXPECT_EQ(m.by_output, 1u);  // the Conv, at the Mul that writes its tensor
  EXPECT_EQ(m.ref_of_variant[index_of(var, "Conv_0_quant_output_scale_mul")], int(index_of(ref, "Conv_0")));
  // Set aside: DynamicQuantizeLinear, and the rest of the Conv's rewritten form (ConvInteger, the
  // Cast of its int32 result, the Mul of the scales), which only the matched Mul reads.
  EXPECT_EQ(m.plumbing, 4u);
  EXPECT_TRUE(m.unmatched.empty());
  EXPECT_EQ(count_quantized_nodes(var), 1u);  // the ConvInteger
  // Local error re-runs the whole form on the reference's Conv input.
  const auto plans = plan_local_runs(ref, var, m);
  const LocalPlan& conv = plans[index_of(var, "Conv_0_quant_output_scale_mul")];
  ASSERT_TRUE(conv.ok()) << conv.error;
  EXPECT_EQ(conv.nodes.size(), 5u);  // DynamicQuantizeLinear, ConvInteger, Cast, both Muls
  ASSERT_EQ(conv.inputs.size(), 1u);
  EXPECT_EQ(conv.inputs[0], (std::pair<std::string, std::string>{"x", "x"}));
}

TEST(NodeMatch, LocalPlanTakesThePlumbingAndMapsInputsToReferenceValues) {
  const Graph ref = reference_graph(), var = qdq_graph();
  const auto plans = plan_local_runs(ref, var, match_nodes(ref, var));
  const LocalPlan& mm = plans[index_of(var, "mm")];
  ASSERT_TRUE(mm.ok()) << mm.error;
  ASSERT_EQ(mm.nodes.size(), 4u);
  EXPECT_EQ(var.nodes[mm.nodes.back()].name, "mm");
  ASSERT_EQ(mm.inputs.size(), 1u);
  EXPECT_EQ(mm.inputs[0], (std::pair<std::string, std::string>{"r", "r"}));
  // Matched by its output tensor: re-run on the reference's MatMul output.
  const LocalPlan& add = plans[index_of(var, "add_renamed")];
  ASSERT_TRUE(add.ok()) << add.error;
  EXPECT_EQ(add.inputs[0], (std::pair<std::string, std::string>{"m", "m"}));
  EXPECT_FALSE(plans[index_of(var, "mm/input_quantizer/QuantizeLinear")].ok());
  const LocalPlan& relu = plans[index_of(var, "relu")];
  ASSERT_TRUE(relu.ok());
  EXPECT_EQ(relu.inputs[0], (std::pair<std::string, std::string>{"x", "x"}));  // a graph input
}

TEST(NodeMatch, QuantizerRangesAndFormatsComeFromTheGraph) {
  const Graph ref = reference_graph(), var = qdq_graph();
  LayerSpace space({{"model", &ref, false, 0}}, 1);
  const ObservedModel om = observe_model(space, 0, var, true);
  EXPECT_FLOAT_EQ(om.clip_amax[index_of(var, "relu")], 0.02f * 127);  // relu's output is quantized
  EXPECT_TRUE(std::isinf(om.clip_amax[index_of(var, "mm")]));
  EXPECT_EQ(om.format[index_of(var, "mm")], "int8");
  EXPECT_EQ(om.format[index_of(var, "relu")], "");
  EXPECT_EQ(om.layer_of_node[index_of(var, "mm")], int(index_of(ref, "mm")));
  EXPECT_EQ(om.layer_of_node[index_of(var, "add_renamed")], int(index_of(ref, "add")));  // by output tensor
}

TEST(ExtractSubgraph, RunsTheQuantizedNodeAloneOnGivenInputs) {
  const Graph ref = reference_graph(), var = qdq_graph();
  const auto plans = plan_local_runs(ref, var, match_nodes(ref, var));
  const LocalPlan& plan = plans[index_of(var, "mm")];
  const Graph sub = extract_subgraph(var, plan.nodes);
  ASSERT_EQ(sub.inputs.size(), 1u);
  EXPECT_EQ(sub.inputs[0].name, "r");
  EXPECT_EQ(sub.nodes.size(), 4u);
  EXPECT_TRUE(sub.initializers.count("Wq"));
  EXPECT_FALSE(sub.initializers.count("b"));  // only what the nodes read
  Session s(sub);
  const std::vector<float> r = {0.5f, 1.0f, 0.013f, 3.0f};
  auto out = s.run({{"r", floats({1, 4}, r)}});
  // DQ(Q(r)) @ DQ(Wq), computed by hand.
  for (int j = 0; j < 3; ++j) {
    double want = 0;
    for (int k = 0; k < 4; ++k) {
      const double rq = std::clamp(std::nearbyint(r[std::size_t(k)] / 0.02f), -128.0f, 127.0f) * 0.02f;
      const double wq = std::nearbyint(kW[std::size_t(k * 3 + j)] / (2.0f / 127)) * (2.0f / 127);
      want += rq * wq;
    }
    EXPECT_NEAR(out.at("m").data<float>()[j], want, 1e-5) << j;
  }
  // Without kept buffers (the evaluator's many local sessions) runs give the same results.
  SessionOptions lean;
  lean.keep_buffers = false;
  Session s2(sub, lean);
  for (int k = 0; k < 2; ++k) {
    auto again = s2.run({{"r", floats({1, 4}, r)}});
    EXPECT_EQ(std::memcmp(again.at("m").raw(), out.at("m").raw(), out.at("m").nbytes()), 0);
  }
  // One node under fp16: its input is rounded to fp16 like any graph input.
  const Graph one = extract_subgraph(ref, std::vector<std::size_t>{index_of(ref, "relu")});
  Session half(one, SessionOptions{Precision::kFp16});
  auto h = half.run({{"x", floats({1, 4}, {0.1f, -1.0f, 2.0f, 1.0f / 3})}});
  EXPECT_EQ(h.at("r").data<float>()[0], to_float(to_float16(0.1f)));
  EXPECT_EQ(h.at("r").data<float>()[1], 0.0f);
  EXPECT_THROW(extract_subgraph(ref, std::vector<std::size_t>{2, 1}), std::invalid_argument);
  EXPECT_THROW(extract_subgraph(ref, std::vector<std::size_t>{7}), std::invalid_argument);
}

}  // namespace
}  // namespace qeval::eval
