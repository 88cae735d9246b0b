// Layer matching across the forms exporters and runtimes give one layer (issue 20): Conv +
// BatchNormalization folded or not, LayerNormalization as one op or decomposed, Gemm vs MatMul +
// Add, ONNX Runtime's static QDQ and QLinear forms, ModelOpt's Q/DQ and FP8 Q/DQ; hand-made pairs
// and the torch exporter's opset 16/17 pair (tools/make_layer_form_pairs.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "datasets/npy.h"
#include "eval/exec/onnx_import.h"
#include "eval/exec/session.h"
#include "eval/onnx_builder.h"
#include "eval/run/node_match.h"
#include "metrics/tensor_error.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

using testing::OnnxBuilder;

constexpr int kF32 = onnx::TensorProto::FLOAT;
constexpr int kI8 = onnx::TensorProto::INT8;
constexpr int kU8 = onnx::TensorProto::UINT8;
constexpr int kI32 = onnx::TensorProto::INT32;

void set_int(onnx::NodeProto& n, const std::string& name, std::int64_t v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}
void set_ints(onnx::NodeProto& n, const std::string& name, const std::vector<std::int64_t>& v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (auto x : v) a->add_ints(x);
}

std::size_t index_of(const Graph& g, const std::string& name) {
  for (std::size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].name == name) return i;
  ADD_FAILURE() << "no node " << name;
  return g.nodes.size();
}

const UnmatchedNodeInfo* unmatched(const NodeMatch& m, const std::string& name) {
  for (const auto& u : m.unmatched)
    if (u.name == name) return &u;
  return nullptr;
}

std::vector<float> ramp(std::size_t n, float scale) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * (float(i % 7) - 3.0f + 0.25f * float(i));
  return v;
}

// ---- Conv + BatchNormalization ------------------------------------------------------------------

// x [1, 2, 4, 4] -> Conv (3 filters 1x1, no bias) -> BatchNormalization -> Relu -> y.
Graph conv_bn_graph() {
  OnnxBuilder b(13);
  b.input("x", kF32, {1, 2, 4, 4}).output("y", kF32, {1, 3, 4, 4});
  b.initializer("w", ramp(6, 0.5f), {3, 2, 1, 1});
  b.initializer("scale", {1.0f, 2.0f, 0.5f}, {3}).initializer("shift", {0.1f, 0.0f, -0.2f}, {3});
  b.initializer("mean", {0.3f, -0.1f, 0.0f}, {3}).initializer("var", {1.0f, 4.0f, 0.25f}, {3});
  b.node("Conv", {"x", "w"}, {"conv_out"}, "conv");
  b.node("BatchNormalization", {"conv_out", "scale", "shift", "mean", "var"}, {"bn_out"}, "bn");
  b.node("Relu", {"bn_out"}, {"y"}, "relu");
  return b.graph("conv_bn.onnx");
}

// The same network with the BatchNormalization folded into the Conv (a bias appears). `names`:
// "other" (another exporter's node and tensor names), "conv" (the Conv keeps its name and takes
// the BatchNormalization's output, as ONNX Runtime's fusion does).
Graph folded_graph(const std::string& names, std::int64_t filters = 3) {
  OnnxBuilder b(13);
  b.input("x", kF32, {1, 2, 4, 4}).output("y", kF32, {1, filters, 4, 4});
  b.initializer("w_folded", ramp(std::size_t(filters) * 2, 0.7f), {filters, 2, 1, 1});
  b.initializer("b_folded", std::vector<float>(std::size_t(filters), 0.05f), {filters});
  const bool other = names == "other";
  b.node("Conv", {"x", "w_folded", "b_folded"}, {other ? "t0" : "bn_out"}, other ? "/m/Conv" : "conv");
  b.node("Relu", {other ? "t0" : "bn_out"}, {"y"}, other ? "/m/Relu" : "relu");
  return b.graph("folded.onnx");
}

TEST(LayerForms, FoldedConvMatchesTheReferencesBatchNormalization) {
  const Graph ref = conv_bn_graph();
  for (const std::string names : {"other", "conv"}) {
    SCOPED_TRACE(names);
    const Graph var = folded_graph(names);
    const NodeMatch m = match_nodes(ref, var);
    const std::size_t conv = index_of(var, names == "other" ? "/m/Conv" : "conv");
    // The folded Conv computes the BatchNormalization's value: it is compared there.
    EXPECT_EQ(m.ref_of_variant[conv], int(index_of(ref, "bn")));
    EXPECT_EQ(m.variant_of_ref[index_of(ref, "conv")], -1);
    EXPECT_EQ(m.ref_of_variant[index_of(var, names == "other" ? "/m/Relu" : "relu")], int(index_of(ref, "relu")));
    EXPECT_EQ(m.by_name + m.by_output + m.by_structure, 2u);
    if (names == "other") {
      EXPECT_EQ(m.by_structure, 1u);  // the Conv; the Relu writes the graph output "y"
    }
    ASSERT_EQ(m.unmatched.size(), 1u);
    const UnmatchedNodeInfo* u = unmatched(m, "conv");
    ASSERT_NE(u, nullptr);
    EXPECT_EQ(u->side, "reference");
    EXPECT_EQ(u->reason.rfind("folded into " + var.nodes[conv].name, 0), 0u) << u->reason;
    // Local error: the folded Conv on the reference's Conv input.
    const auto plans = plan_local_runs(ref, var, m);
    ASSERT_TRUE(plans[conv].ok()) << plans[conv].error;
    EXPECT_EQ(plans[conv].nodes, std::vector<std::size_t>{conv});
    EXPECT_EQ(plans[conv].inputs, (std::vector<std::pair<std::string, std::string>>{{"x", "x"}}));
  }
  // Structure means structure: another number of filters is another layer.
  const NodeMatch other = match_nodes(ref, folded_graph("other", 4));
  EXPECT_EQ(other.by_structure, 0u);
}

TEST(LayerForms, BatchNormalizationInTheVariantOnlyMatchesTheFoldedReference) {
  const Graph ref = folded_graph("conv");  // the reference folded; the variant keeps Conv -> BN
  Graph var = conv_bn_graph();
  const NodeMatch m = match_nodes(ref, var);
  // By name the variant's Conv meets the reference's Conv; the value the reference computes there
  // is the variant's BatchNormalization output.
  EXPECT_EQ(m.ref_of_variant[index_of(var, "bn")], int(index_of(ref, "conv")));
  EXPECT_EQ(m.ref_of_variant[index_of(var, "conv")], -1);
  EXPECT_EQ(m.set_aside[index_of(var, "conv")], 1);
  EXPECT_EQ(m.plumbing, 1u);
  EXPECT_TRUE(m.unmatched.empty()) << m.unmatched[0].name << ": " << m.unmatched[0].reason;
  // Its local run is the Conv and the BatchNormalization on the reference's input.
  const auto plans = plan_local_runs(ref, var, m);
  const LocalPlan& bn = plans[index_of(var, "bn")];
  ASSERT_TRUE(bn.ok()) << bn.error;
  EXPECT_EQ(bn.nodes.size(), 2u);
  EXPECT_EQ(bn.inputs, (std::vector<std::pair<std::string, std::string>>{{"x", "x"}}));
  // Unfolded in both (other names): Conv to Conv, BatchNormalization to BatchNormalization.
  for (auto& n : var.nodes) n.name = "/v/" + n.name;
  const NodeMatch same = match_nodes(conv_bn_graph(), var);
  EXPECT_EQ(same.by_name, 0u);
  EXPECT_EQ(same.by_name + same.by_output + same.by_structure, 3u);
  EXPECT_EQ(same.ref_of_variant[index_of(var, "/v/conv")], 0);
  EXPECT_TRUE(same.unmatched.empty());
}

// ONNX Runtime's static QDQ quantization (quantize_static, QDQ format): BatchNormalization folded by
// its optimizer first, the Conv keeps its name and takes the BN's output; uint8 activations with zero
// points, int8 weights, the bias as int32 through a DequantizeLinear; nodes named
// "<tensor>_QuantizeLinear".
TEST(LayerForms, OnnxRuntimesStaticQdqFormWithTheBatchNormalizationFolded) {
  const Graph ref = conv_bn_graph();
  OnnxBuilder b(13);
  b.input("x", kF32, {1, 2, 4, 4}).output("y", kF32, {1, 3, 4, 4});
  b.initializer_raw("w_quantized", kI8, std::vector<std::int8_t>{10, -20, 30, 40, 50, 60}, {3, 2, 1, 1});
  b.initializer("w_scale", {0.01f}, {}).initializer_raw("w_zero_point", kI8, std::vector<std::int8_t>{0}, {});
  b.initializer_raw("b_quantized", kI32, std::vector<std::int32_t>{5, 0, -5}, {3});
  b.initializer("b_scale", {0.0002f}, {}).initializer_raw("b_zero_point", kI32, std::vector<std::int32_t>{0}, {});
  b.initializer("x_scale", {0.02f}, {}).initializer_raw("x_zero_point", kU8, std::vector<std::uint8_t>{128}, {});
  b.initializer("y_scale", {0.03f}, {}).initializer_raw("y_zero_point", kU8, std::vector<std::uint8_t>{100}, {});
  b.node("QuantizeLinear", {"x", "x_scale", "x_zero_point"}, {"x_QuantizeLinear_Output"}, "x_QuantizeLinear");
  b.node("DequantizeLinear", {"x_QuantizeLinear_Output", "x_scale", "x_zero_point"}, {"x_DequantizeLinear_Output"},
         "x_DequantizeLinear");
  b.node("DequantizeLinear", {"w_quantized", "w_scale", "w_zero_point"}, {"w_DequantizeLinear_Output"},
         "w_DequantizeLinear");
  b.node("DequantizeLinear", {"b_quantized", "b_scale", "b_zero_point"}, {"b_DequantizeLinear_Output"},
         "b_DequantizeLinear");
  b.node("Conv", {"x_DequantizeLinear_Output", "w_DequantizeLinear_Output", "b_DequantizeLinear_Output"}, {"bn_out"},
         "conv");
  b.node("QuantizeLinear", {"bn_out", "y_scale", "y_zero_point"}, {"bn_out_QuantizeLinear_Output"},
         "bn_out_QuantizeLinear");
  b.node("DequantizeLinear", {"bn_out_QuantizeLinear_Output", "y_scale", "y_zero_point"},
         {"bn_out_DequantizeLinear_Output"}, "bn_out_DequantizeLinear");
  b.node("Relu", {"bn_out_DequantizeLinear_Output"}, {"y"}, "relu");
  const Graph var = b.graph("qdq.onnx");
  const NodeMatch m = match_nodes(ref, var);
  EXPECT_EQ(m.ref_of_variant[index_of(var, "conv")], int(index_of(ref, "bn")));
  EXPECT_EQ(m.ref_of_variant[index_of(var, "relu")], int(index_of(ref, "relu")));
  EXPECT_EQ(m.plumbing, 6u);
  ASSERT_EQ(m.unmatched.size(), 1u);
  EXPECT_EQ(m.unmatched[0].reason.rfind("folded into conv", 0), 0u) << m.unmatched[0].reason;
  EXPECT_EQ(count_quantized_nodes(var), 2u);  // the Conv and the Relu read dequantized values
  // Renamed (another exporter's names): the same by structure, through the plumbing.
  Graph renamed = var;
  for (auto& n : renamed.nodes) n.name = "/r/" + n.name;
  const NodeMatch s = match_nodes(ref, renamed);
  EXPECT_EQ(s.ref_of_variant[index_of(renamed, "/r/conv")], int(index_of(ref, "bn")));
  EXPECT_EQ(s.by_output + s.by_structure, 2u);
}

// ONNX Runtime's QOperator form: QuantizeLinear -> QLinearConv (-> QLinearConv ...) ->
// DequantizeLinear, every node and tensor named anew; and QLinearMatMul.
TEST(LayerForms, QLinearConvAndQLinearMatMulMatchTheFloatOps) {
  OnnxBuilder r(13);
  r.input("x", kF32, {1, 2, 4, 4}).output("y", kF32, {1, 3, 4, 3});
  r.initializer("w", ramp(6, 0.5f), {3, 2, 1, 1}).initializer("b", {0.1f, 0.2f, 0.3f}, {3});
  r.initializer("m", ramp(12, 0.1f), {4, 3});
  r.node("Conv", {"x", "w", "b"}, {"c"}, "conv");
  r.node("MatMul", {"c", "m"}, {"y"}, "mm");
  const Graph ref = r.graph("ref.onnx");
  OnnxBuilder v(13);
  v.input("x", kF32, {1, 2, 4, 4}).output("y", kF32, {1, 3, 4, 3});
  v.initializer_raw("wq", kI8, std::vector<std::int8_t>(6, 3), {3, 2, 1, 1});
  v.initializer_raw("bq", kI32, std::vector<std::int32_t>(3, 7), {3});
  v.initializer_raw("mq", kI8, std::vector<std::int8_t>(12, 5), {4, 3});
  v.initializer("s", {0.02f}, {}).initializer_raw("zu", kU8, std::vector<std::uint8_t>{128}, {});
  v.initializer_raw("zi", kI8, std::vector<std::int8_t>{0}, {});
  v.node("QuantizeLinear", {"x", "s", "zu"}, {"xq"}, "x_QuantizeLinear");
  v.node("QLinearConv", {"xq", "s", "zu", "wq", "s", "zi", "s", "zu", "bq"}, {"cq"}, "conv_quant");
  v.node("QLinearMatMul", {"cq", "s", "zu", "mq", "s", "zi", "s", "zu"}, {"yq"}, "mm_quant");
  v.node("DequantizeLinear", {"yq", "s", "zu"}, {"y"}, "y_DequantizeLinear");
  const Graph var = v.graph("qop.onnx");
  const NodeMatch m = match_nodes(ref, var);
  EXPECT_EQ(m.ref_of_variant[index_of(var, "conv_quant")], int(index_of(ref, "conv")));
  EXPECT_EQ(m.ref_of_variant[index_of(var, "mm_quant")], int(index_of(ref, "mm")));
  // The QLinearMatMul writes "yq" (the DequantizeLinear after it, plumbing, writes "y"): both
  // matched by structure.
  EXPECT_EQ(m.by_structure, 2u);
  EXPECT_TRUE(m.unmatched.empty()) << m.unmatched[0].name << ": " << m.unmatched[0].reason;
  EXPECT_EQ(count_quantized_nodes(var), 2u);  // both QLinear ops
}

// Local error of the QOperator form: a QLinear node's input that the reference holds in float is
// quantized with the node's own x_scale / x_zero_point, its output dequantized with its y_scale /
// y_zero_point; a uint8 MaxPool's scale is its input's; an integer output with no stored scale is
// not compared, and the plan says why.
TEST(LayerForms, QLinearLocalPlansQuantizeInputsAndDequantizeOutputs) {
  OnnxBuilder r(13);
  r.input("x", kF32, {1, 2, 4, 4}).output("y", kF32, {1, 3, 2, 3});
  r.initializer("w", ramp(6, 0.5f), {3, 2, 1, 1}).initializer("b", {0.1f, 0.2f, 0.3f}, {3});
  r.initializer("m", ramp(12, 0.1f), {4, 3});
  r.node("Conv", {"x", "w", "b"}, {"c"}, "conv");
  r.node("MatMul", {"c", "m"}, {"mm_out"}, "mm");
  auto& rp = r.node("MaxPool", {"mm_out"}, {"y"}, "pool");
  set_ints(rp, "kernel_shape", {2, 1});
  set_ints(rp, "strides", {2, 1});
  const Graph ref = r.graph("ref.onnx");
  OnnxBuilder v(13);
  v.input("x", kF32, {1, 2, 4, 4}).output("y", kF32, {1, 3, 2, 3});
  v.initializer_raw("wq", kI8, std::vector<std::int8_t>{3, -5, 7, 1, -2, 4}, {3, 2, 1, 1});
  v.initializer_raw("bq", kI32, std::vector<std::int32_t>(3, 7), {3});
  v.initializer_raw("mq", kI8, std::vector<std::int8_t>{1, 2, 3, 4, 5, 6, -1, -2, -3, -4, -5, -6}, {4, 3});
  v.initializer("sx", {0.02f}, {}).initializer("sc", {0.05f}, {}).initializer("sy", {0.1f}, {});
  v.initializer("sw", {0.01f}, {}).initializer_raw("zu", kU8, std::vector<std::uint8_t>{128}, {});
  v.initializer_raw("zc", kU8, std::vector<std::uint8_t>{120}, {});
  v.initializer_raw("zi", kI8, std::vector<std::int8_t>{0}, {});
  v.node("QuantizeLinear", {"x", "sx", "zu"}, {"xq"}, "x_QuantizeLinear");
  v.node("QLinearConv", {"xq", "sx", "zu", "wq", "sw", "zi", "sc", "zc", "bq"}, {"cq"}, "conv_quant");
  v.node("QLinearMatMul", {"cq", "sc", "zc", "mq", "sw", "zi", "sy", "zu"}, {"yq"}, "mm_quant");
  auto& vp = v.node("MaxPool", {"yq"}, {"pq"}, "pool_quant");
  set_ints(vp, "kernel_shape", {2, 1});
  set_ints(vp, "strides", {2, 1});
  v.node("DequantizeLinear", {"pq", "sy", "zu"}, {"y"}, "y_DequantizeLinear");
  const Graph var = v.graph("qop.onnx");
  const auto q = quantized_values(var);
  EXPECT_EQ(q.at("cq"), (QuantParams{"sc", "zc"}));
  EXPECT_EQ(q.at("pq"), (QuantParams{"sy", "zu"}));  // MaxPool keeps its input's scale
  EXPECT_FALSE(q.count("y"));
  const NodeMatch m = match_nodes(ref, var);
  const std::size_t conv = index_of(var, "conv_quant"), mm = index_of(var, "mm_quant"),
                    pool = index_of(var, "pool_quant");
  ASSERT_EQ(m.ref_of_variant[pool], int(index_of(ref, "pool")));
  const auto plans = plan_local_runs(ref, var, m);
  // The first QLinearConv: its QuantizeLinear runs with it, on the reference's x.
  ASSERT_TRUE(plans[conv].ok()) << plans[conv].error;
  EXPECT_EQ(plans[conv].nodes.size(), 2u);
  EXPECT_TRUE(plans[conv].quantize.empty());
  EXPECT_EQ(plans[conv].dequantize, (QuantParams{"sc", "zc"}));
  // The QLinearMatMul reads the QLinearConv's uint8 output, where the reference has the Conv's floats.
  ASSERT_TRUE(plans[mm].ok()) << plans[mm].error;
  EXPECT_EQ(plans[mm].inputs, (std::vector<std::pair<std::string, std::string>>{{"cq", "c"}}));
  ASSERT_EQ(plans[mm].quantize.size(), 1u);
  EXPECT_EQ(plans[mm].quantize[0], (std::pair<std::string, QuantParams>{"cq", {"sc", "zc"}}));
  EXPECT_EQ(plans[mm].dequantize, (QuantParams{"sy", "zu"}));
  // The uint8 MaxPool: no scale of its own, its input's.
  ASSERT_TRUE(plans[pool].ok()) << plans[pool].error;
  ASSERT_EQ(plans[pool].quantize.size(), 1u);
  EXPECT_EQ(plans[pool].quantize[0].second, (QuantParams{"sy", "zu"}));
  EXPECT_EQ(plans[pool].dequantize, (QuantParams{"sy", "zu"}));

  // The local graph of the QLinearMatMul runs on floats: quantized in, dequantized out.
  const LocalGraph lg = local_graph(var, plans[mm], {{"cq", DType::kFloat32}});
  ASSERT_EQ(lg.graph.nodes.size(), 3u);
  EXPECT_EQ(lg.graph.nodes[0].op_type, "QuantizeLinear");
  EXPECT_EQ(lg.graph.nodes[0].inputs, (std::vector<std::string>{"cq", "sc", "zc"}));
  EXPECT_EQ(lg.graph.nodes[1].inputs[0], lg.graph.nodes[0].outputs[0]);
  EXPECT_EQ(lg.graph.nodes[2].op_type, "DequantizeLinear");
  EXPECT_EQ(lg.compared, lg.graph.nodes[2].name);
  // Its only output is the compared one (the QuantizeLinear's and the MatMul's die where read).
  ASSERT_EQ(lg.graph.outputs.size(), 1u);
  EXPECT_EQ(lg.graph.outputs[0].name, lg.graph.nodes[2].outputs[0]);
  // Its weights are the variant graph's bytes (views, not copies: the model sessions' store serves
  // their forms).
  for (const auto& [name, t] : lg.graph.initializers) {
    EXPECT_EQ(t.raw(), var.initializers.at(name).raw()) << name;
    EXPECT_TRUE(t.is_borrowed()) << name;
  }
  // c = 0.05 * (code - 120) for codes 120..143: exact in uint8 of that scale; the MatMul's int32
  // sums requantized to sy = 0.1 (zero point 128) and dequantized.
  std::vector<float> c(1 * 3 * 4 * 4);
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = 0.05f * float(i % 24);
  Session s(lg.graph);
  const Tensor out = s.run({{"cq", testing::floats({1, 3, 4, 4}, c)}}).at(lg.graph.nodes[2].outputs[0]);
  ASSERT_EQ(out.shape(), (Shape{1, 3, 4, 3}));
  const std::vector<std::int8_t> mq{1, 2, 3, 4, 5, 6, -1, -2, -3, -4, -5, -6};
  for (std::int64_t row = 0; row < 12; ++row)
    for (std::int64_t col = 0; col < 3; ++col) {
      std::int32_t acc = 0;
      for (std::int64_t k = 0; k < 4; ++k) acc += std::int32_t(std::lround(c[row * 4 + k] / 0.05f)) * mq[k * 3 + col];
      const float multiplier = 0.05f * 0.01f / 0.1f;  // a_scale * b_scale / y_scale, in float
      const float code = std::clamp(std::nearbyint(float(acc) * multiplier) + 128.0f, 0.0f, 255.0f);
      EXPECT_FLOAT_EQ(out.data<float>()[row * 3 + col], 0.1f * (code - 128.0f)) << row << "," << col;
    }
  // A reference that holds the value quantized too: fed as it is.
  EXPECT_EQ(local_graph(var, plans[mm], {{"cq", DType::kUInt8}}).graph.nodes[0].op_type, "QLinearMatMul");

  // ONNX Runtime's dynamic form with the MatMulInteger writing the MatMul's tensor: an int32
  // accumulator with no scale to read: no local run, and why.
  OnnxBuilder d(13);
  d.input("x", kF32, {1, 3, 4, 4}).output("mm_out", kI32, {1, 3, 4, 3});
  d.initializer_raw("mq", kI8, std::vector<std::int8_t>(12, 1), {4, 3});
  d.node("DynamicQuantizeLinear", {"x"}, {"xq", "xs", "xz"}, "x_QuantizeLinear");
  d.node("MatMulInteger", {"xq", "mq", "xz"}, {"mm_out"}, "mm_int");
  OnnxBuilder dr(13);
  dr.input("x", kF32, {1, 3, 4, 4}).output("mm_out", kF32, {1, 3, 4, 3});
  dr.initializer("m", ramp(12, 0.1f), {4, 3});
  dr.node("MatMul", {"x", "m"}, {"mm_out"}, "mm");
  const Graph dref = dr.graph("ref.onnx"), dvar = d.graph("dyn.onnx");
  const NodeMatch dm = match_nodes(dref, dvar);
  ASSERT_EQ(dm.ref_of_variant[1], 0);
  const LocalPlan dp = plan_local_runs(dref, dvar, dm)[1];
  EXPECT_NE(dp.error.find("its output 'mm_out' is an integer tensor with no stored scale"), std::string::npos)
      << dp.error;
}

// ---- Conv + Mul / Add by a constant ------------------------------------------------------------

// x [1, 2, 4, 4] -> Conv (3 filters 1x1, bias) -> Mul by `scale` -> Add `shift` -> Relu -> y; empty
// `scale` or `shift`: no Mul or no Add. Shapes [3, 1, 1], [1, 3, 1, 1] or [1] (scalar).
struct ConvScale {
  std::vector<float> w = ramp(6, 0.5f), b = {0.1f, -0.2f, 0.3f};
  std::vector<float> scale, shift;
  std::vector<std::int64_t> scale_dims, shift_dims;
  float scale_at(std::size_t c) const { return scale.empty() ? 1.0f : scale[scale.size() == 1 ? 0 : c]; }
  float shift_at(std::size_t c) const { return shift.empty() ? 0.0f : shift[shift.size() == 1 ? 0 : c]; }
};
Graph conv_scale_graph(const ConvScale& f) {
  OnnxBuilder b(13);
  b.input("x", kF32, {1, 2, 4, 4}).output("y", kF32, {1, 3, 4, 4});
  b.initializer("w", f.w, {3, 2, 1, 1}).initializer("b", f.b, {3});
  b.node("Conv", {"x", "w", "b"}, {"conv_out"}, "conv");
  std::string v = "conv_out";
  if (!f.scale.empty()) {
    b.initializer("scale", f.scale, f.scale_dims);
    b.node("Mul", {v, "scale"}, {"mul_out"}, "mul");
    v = "mul_out";
  }
  if (!f.shift.empty()) {
    b.initializer("shift", f.shift, f.shift_dims);
    b.node("Add", {"shift", v}, {"add_out"}, "add");
    v = "add_out";
  }
  b.node("Relu", {v}, {"y"}, "relu");
  return b.graph("conv_scale.onnx");
}
// The same with the Mul and Add folded into the Conv's weights and bias (W s, B s + a), named as
// `names` says: "other" (another exporter), "ort" (ONNX Runtime's ConvMulFusion / ConvAddFusion:
// the Conv keeps its name and takes the last node's output), "deploy" (qeval's FP16 deployment fold:
// the Conv takes the last node's name and output).
Graph conv_scale_folded(const ConvScale& f, const std::string& names) {
  std::vector<float> w = f.w, bias = f.b;
  for (std::size_t c = 0; c < 3; ++c) {
    for (std::size_t k = 0; k < 2; ++k) w[c * 2 + k] *= f.scale_at(c);
    bias[c] = bias[c] * f.scale_at(c) + f.shift_at(c);
  }
  const std::string last = f.shift.empty() ? "mul" : "add";
  const std::string name = names == "other" ? "/m/Conv" : names == "ort" ? "conv" : last;
  const std::string out = names == "other" ? "t0" : last + "_out";
  OnnxBuilder b(13);
  b.input("x", kF32, {1, 2, 4, 4}).output("y", kF32, {1, 3, 4, 4});
  b.initializer("w_folded", w, {3, 2, 1, 1}).initializer("b_folded", bias, {3});
  b.node("Conv", {"x", "w_folded", "b_folded"}, {out}, name);
  b.node("Relu", {out}, {"y"}, names == "other" ? "/m/Relu" : "relu");
  return b.graph("conv_scale_folded.onnx");
}

TEST(LayerForms, ConvFollowedByMulAndAddByConstantsMatchesTheFoldedConv) {
  ConvScale f;
  f.scale = {2.0f, 0.5f, -1.5f}, f.scale_dims = {3, 1, 1};
  f.shift = {0.25f, -0.1f, 0.4f}, f.shift_dims = {1, 3, 1, 1};
  const Graph ref = conv_scale_graph(f);
  std::vector<float> xs(32);
  for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.7f * float(i));
  const Tensor x = testing::floats({1, 2, 4, 4}, xs);
  Session ref_session(ref);
  const Tensor y = ref_session.run({{"x", x}}).at("y");
  for (const std::string names : {"other", "ort", "deploy"}) {
    SCOPED_TRACE(names);
    const Graph var = conv_scale_folded(f, names);
    {  // folded numerically: the same network
      Session s(var);
      EXPECT_LE(*metrics::tensor_error(y, s.run({{"x", x}}).at("y")).rel_l2, 1e-6);
    }
    const NodeMatch m = match_nodes(ref, var);
    const std::size_t conv = 0, relu = 1;
    // The folded Conv computes the Add's value: compared there.
    EXPECT_EQ(m.ref_of_variant[conv], int(index_of(ref, "add")));
    EXPECT_EQ(m.ref_of_variant[relu], int(index_of(ref, "relu")));
    EXPECT_EQ(m.by_name, names == "other" ? 0u : names == "ort" ? 2u : 1u);
    EXPECT_EQ(m.by_output, names == "other" ? 1u : names == "ort" ? 0u : 1u);  // "other": the Relu writes "y"
    EXPECT_EQ(m.by_structure, names == "other" ? 1u : 0u);
    ASSERT_EQ(m.unmatched.size(), 2u);
    for (const char* inner : {"conv", "mul"}) {
      const UnmatchedNodeInfo* u = unmatched(m, inner);
      ASSERT_NE(u, nullptr) << inner;
      EXPECT_EQ(u->side, "reference");
      EXPECT_EQ(u->reason,
                "folded into " + var.nodes[conv].name + " (Conv + Mul/Add by a constant as one Conv, compared at add)");
    }
    const auto plans = plan_local_runs(ref, var, m);  // the folded Conv on the reference's Conv input
    ASSERT_TRUE(plans[conv].ok()) << plans[conv].error;
    EXPECT_EQ(plans[conv].inputs, (std::vector<std::pair<std::string, std::string>>{{"x", "x"}}));
    // The other way round: the chain in the variant, set aside but for its Add.
    const NodeMatch back = match_nodes(var, ref);
    EXPECT_EQ(back.ref_of_variant[index_of(ref, "add")], int(conv));
    EXPECT_EQ(back.set_aside[index_of(ref, "conv")], 1);
    EXPECT_EQ(back.set_aside[index_of(ref, "mul")], 1);
    EXPECT_TRUE(back.unmatched.empty()) << back.unmatched[0].name << ": " << back.unmatched[0].reason;
    const LocalPlan add = plan_local_runs(var, ref, back)[index_of(ref, "add")];
    ASSERT_TRUE(add.ok()) << add.error;
    EXPECT_EQ(add.nodes.size(), 3u);  // Conv, Mul, Add on the reference's x
  }
  // A scalar Mul alone after a Conv without bias: the folded Conv has no bias either.
  ConvScale g;
  g.b.clear();
  g.scale = {0.5f}, g.scale_dims = {1};
  OnnxBuilder nb(13);
  nb.input("x", kF32, {1, 2, 4, 4}).output("y", kF32, {1, 3, 4, 4});
  nb.initializer("w", g.w, {3, 2, 1, 1}).initializer("scale", g.scale, {1});
  nb.node("Conv", {"x", "w"}, {"conv_out"}, "conv");
  nb.node("Mul", {"conv_out", "scale"}, {"mul_out"}, "mul");
  nb.node("Relu", {"mul_out"}, {"y"}, "relu");
  OnnxBuilder fb(13);
  fb.input("x", kF32, {1, 2, 4, 4}).output("y", kF32, {1, 3, 4, 4});
  fb.initializer("w2", ramp(6, 0.25f), {3, 2, 1, 1});
  fb.node("Conv", {"x", "w2"}, {"t"}, "/n/Conv");
  fb.node("Relu", {"t"}, {"y"}, "/n/Relu");
  const NodeMatch scalar = match_nodes(nb.graph(), fb.graph());
  EXPECT_EQ(scalar.by_structure, 1u);
  EXPECT_EQ(scalar.ref_of_variant[0], 1);  // the Mul
  // A recipe's SmoothQuant pre-scale Mul after a Conv is the next layer's plumbing, not a form: the
  // Conv stays matched to the Conv.
  {
    OnnxBuilder sq(13);
    sq.input("x", kF32, {1, 2, 4, 4}).output("y", kF32, {1, 3, 4, 4});
    sq.initializer("w", f.w, {3, 2, 1, 1}).initializer("b", f.b, {3});
    sq.initializer("pre", {0.5f, 2.0f, 1.0f}, {1, 3, 1, 1}).initializer("s", {0.05f}, {});
    sq.node("Conv", {"x", "w", "b"}, {"conv_out"}, "conv");
    sq.node("Mul", {"conv_out", "pre"}, {"scaled"}, "relu/input_quantizer/Mul");
    sq.node("QuantizeLinear", {"scaled", "s"}, {"q"}, "relu/input_quantizer/QuantizeLinear");
    sq.node("DequantizeLinear", {"q", "s"}, {"dq"}, "relu/input_quantizer/DequantizeLinear");
    sq.node("Relu", {"dq"}, {"y"}, "relu");
    OnnxBuilder plain(13);
    plain.input("x", kF32, {1, 2, 4, 4}).output("y", kF32, {1, 3, 4, 4});
    plain.initializer("w", f.w, {3, 2, 1, 1}).initializer("b", f.b, {3});
    plain.node("Conv", {"x", "w", "b"}, {"conv_out"}, "conv");
    plain.node("Relu", {"conv_out"}, {"y"}, "relu");
    const Graph plain_graph = plain.graph(), sq_graph = sq.graph();
    const NodeMatch smooth = match_nodes(plain_graph, sq_graph);
    EXPECT_EQ(smooth.ref_of_variant[index_of(sq_graph, "conv")], int(index_of(plain_graph, "conv")));
    EXPECT_EQ(smooth.ref_of_variant[index_of(sq_graph, "relu/input_quantizer/Mul")], -1);
    EXPECT_TRUE(smooth.unmatched.empty()) << smooth.unmatched[0].name << ": " << smooth.unmatched[0].reason;
  }
  // Not per channel: a Mul by a [4] vector scales the last axis (W), which no Conv folds.
  ConvScale h;
  h.scale = {1.0f, 2.0f, 3.0f, 4.0f}, h.scale_dims = {4};
  const Graph along = conv_scale_graph(h);
  const NodeMatch along_w = match_nodes(along, conv_scale_folded(ConvScale{}, "other"));
  EXPECT_EQ(along_w.ref_of_variant[0], int(index_of(along, "conv")));  // the plain Conv, no form
  const UnmatchedNodeInfo* mul = unmatched(along_w, "mul");
  ASSERT_NE(mul, nullptr);
  EXPECT_EQ(mul->reason.rfind("folded", 0), std::string::npos) << mul->reason;
}

// ---- Gemm vs MatMul + Add -----------------------------------------------------------------------

// x [2, 8] -> Gemm (W [4, 8], transB, bias [4]) -> Relu; as MatMul by the transposed constant (an
// initializer or a Transpose node) + Add, with other names.
Graph gemm_graph() {
  OnnxBuilder b(13);
  b.input("x", kF32, {2, 8}).output("y", kF32, {2, 4});
  b.initializer("W", ramp(32, 0.1f), {4, 8}).initializer("bias", {0.1f, 0.2f, 0.3f, 0.4f}, {4});
  set_int(b.node("Gemm", {"x", "W", "bias"}, {"g"}, "fc"), "transB", 1);
  b.node("Relu", {"g"}, {"y"}, "relu");
  return b.graph("gemm.onnx");
}
Graph matmul_add_graph(bool transpose_node, bool bias_first) {
  OnnxBuilder b(13);
  b.input("x", kF32, {2, 8}).output("y", kF32, {2, 4});
  b.initializer("bias_1", {0.1f, 0.2f, 0.3f, 0.4f}, {4});
  std::string w = "W_t";
  if (transpose_node) {
    b.initializer("W_0", ramp(32, 0.1f), {4, 8});
    set_ints(b.node("Transpose", {"W_0"}, {"W_t"}, "/fc/Transpose"), "perm", {1, 0});
  } else {
    b.initializer("W_t", ramp(32, 0.1f), {8, 4});
  }
  b.node("MatMul", {"x", w}, {"t0"}, "/fc/MatMul");
  b.node("Add", bias_first ? std::vector<std::string>{"bias_1", "t0"} : std::vector<std::string>{"t0", "bias_1"},
         {"t1"}, "/fc/Add");
  b.node("Relu", {"t1"}, {"y"}, "/Relu");
  return b.graph("matmul_add.onnx");
}

TEST(LayerForms, GemmMatchesMatMulPlusAddBothWays) {
  const Graph gemm = gemm_graph();
  for (bool transpose_node : {false, true})
    for (bool bias_first : {false, true}) {
      SCOPED_TRACE(::testing::Message() << transpose_node << bias_first);
      const Graph mm = matmul_add_graph(transpose_node, bias_first);
      // Gemm in the reference, MatMul + Add in the variant.
      const NodeMatch m = match_nodes(gemm, mm);
      EXPECT_EQ(m.ref_of_variant[index_of(mm, "/fc/Add")], int(index_of(gemm, "fc")));
      EXPECT_EQ(m.ref_of_variant[index_of(mm, "/Relu")], int(index_of(gemm, "relu")));
      EXPECT_EQ(m.set_aside[index_of(mm, "/fc/MatMul")], 1);
      EXPECT_TRUE(m.unmatched.empty()) << m.unmatched[0].name << ": " << m.unmatched[0].reason;
      const auto plans = plan_local_runs(gemm, mm, m);
      const LocalPlan& add = plans[index_of(mm, "/fc/Add")];
      ASSERT_TRUE(add.ok()) << add.error;
      EXPECT_EQ(add.nodes.size(), transpose_node ? 3u : 2u);  // (Transpose,) MatMul and Add
      EXPECT_EQ(m.plumbing, transpose_node ? 2u : 1u);
      // MatMul + Add in the reference, Gemm in the variant.
      const NodeMatch back = match_nodes(mm, gemm);
      EXPECT_EQ(back.ref_of_variant[index_of(gemm, "fc")], int(index_of(mm, "/fc/Add")));
      const UnmatchedNodeInfo* u = unmatched(back, "/fc/MatMul");
      ASSERT_NE(u, nullptr);
      EXPECT_EQ(u->reason.rfind("folded into fc (MatMul + Add as one Gemm", 0), 0u) << u->reason;
    }
  // A Gemm without bias is a MatMul by the transposed constant alone, not MatMul + Add.
  OnnxBuilder b(13);
  b.input("x", kF32, {2, 8}).output("y", kF32, {2, 4});
  b.initializer("W", ramp(32, 0.1f), {8, 4});
  b.node("MatMul", {"x", "W"}, {"t"}, "mm");
  b.node("Relu", {"t"}, {"y"}, "r");
  const NodeMatch no_bias = match_nodes(gemm, b.graph());
  EXPECT_EQ(no_bias.ref_of_variant[0], -1);
}

// A MatMul whose weight a Transpose computes (PyTorch's FP16 exports: every linear layer), run
// against the same graph (a precision variant): its local run computes the transposed weight
// itself from the variant's weight (folded when planned, packed once through the run's store),
// rather than taking the reference's folded value as an input.
TEST(LayerForms, ALocalRunComputesAWeightsTransposeItself) {
  const Graph g = matmul_add_graph(/*transpose_node=*/true, /*bias_first=*/false);
  const NodeMatch m = match_nodes(g, g);
  const auto plans = plan_local_runs(g, g, m);
  const LocalPlan& mm = plans[index_of(g, "/fc/MatMul")];
  ASSERT_TRUE(mm.ok()) << mm.error;
  EXPECT_EQ(mm.inputs, (std::vector<std::pair<std::string, std::string>>{{"x", "x"}}));
  EXPECT_EQ(mm.nodes, (std::vector<std::size_t>{index_of(g, "/fc/Transpose"), index_of(g, "/fc/MatMul")}));
  const LocalGraph lg = local_graph(g, mm, {{"x", DType::kFloat32}});
  EXPECT_TRUE(lg.graph.initializers.count("W_0"));
}

// ModelOpt's Q/DQ form (float weights behind QuantizeLinear -> DequantizeLinear, int8 or FP8 in
// TensorRT's custom ops) on MatMul + Add layers, every name changed: matched by structure.
TEST(LayerForms, ModelOptQdqAndFp8QdqFormsMatchByStructure) {
  const Graph ref = matmul_add_graph(false, true);
  for (bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8" : "int8");
    OnnxBuilder b(19);
    if (fp8) b.domain("trt", 1);
    b.input("x", kF32, {2, 8}).output("y", kF32, {2, 4});
    b.initializer("w", ramp(32, 0.1f), {8, 4}).initializer("c", {0.1f, 0.2f, 0.3f, 0.4f}, {4});
    b.initializer("xs", {0.02f}, {}).initializer("ws", {0.01f}, {});
    const std::string q = fp8 ? "TRT_FP8QuantizeLinear" : "QuantizeLinear";
    const std::string dq = fp8 ? "TRT_FP8DequantizeLinear" : "DequantizeLinear";
    const std::string domain = fp8 ? "trt" : "";
    b.node(q, {"x", "xs"}, {"xq"}, "/l/input_quantizer/" + q, domain);
    b.node(dq, {"xq", "xs"}, {"xd"}, "/l/input_quantizer/" + dq, domain);
    b.node(q, {"w", "ws"}, {"wq"}, "/l/weight_quantizer/" + q, domain);
    b.node(dq, {"wq", "ws"}, {"wd"}, "/l/weight_quantizer/" + dq, domain);
    b.node("MatMul", {"xd", "wd"}, {"m"}, "/l/MatMul");
    b.node("Add", {"c", "m"}, {"a"}, "/l/Add");
    b.node("Relu", {"a"}, {"y"}, "/l/Relu");
    const Graph var = b.graph("modelopt.onnx");
    const NodeMatch m = match_nodes(ref, var);
    EXPECT_EQ(m.by_name, 0u);
    EXPECT_EQ(m.plumbing, 4u);
    EXPECT_EQ(m.ref_of_variant[index_of(var, "/l/MatMul")], int(index_of(ref, "/fc/MatMul")));
    EXPECT_EQ(m.ref_of_variant[index_of(var, "/l/Add")], int(index_of(ref, "/fc/Add")));
    EXPECT_EQ(m.ref_of_variant[index_of(var, "/l/Relu")], int(index_of(ref, "/Relu")));
    EXPECT_TRUE(m.unmatched.empty());
    EXPECT_EQ(count_quantized_nodes(var), 1u);
  }
}

// ---- LayerNormalization -------------------------------------------------------------------------

// x [1, 4, 8] -> LayerNormalization (one op, opset 17; or decomposed as the torch exporter writes
// it below 17) -> MatMul + Add -> y. `names`: prefix of every node and intermediate tensor.
Graph layer_norm_graph(bool decomposed, const std::string& names, bool affine = true) {
  OnnxBuilder b(decomposed ? 16 : 17);
  b.input("x", kF32, {1, 4, 8}).output("y", kF32, {1, 4, 8});
  b.initializer(names + "gamma", ramp(8, 0.2f), {8}).initializer(names + "beta", ramp(8, 0.05f), {8});
  b.initializer(names + "W", ramp(64, 0.01f), {8, 8}).initializer(names + "b", ramp(8, 0.1f), {8});
  const std::string t = names + "t";
  if (!decomposed) {
    set_int(
        b.node("LayerNormalization", {"x", names + "gamma", names + "beta"}, {t + "ln"}, names + "LayerNormalization"),
        "axis", -1);
  } else {
    b.initializer(names + "two", {2.0f}, {}).initializer(names + "eps", {1e-5f}, {});
    set_ints(b.node("ReduceMean", {"x"}, {t + "mean"}, names + "ReduceMean"), "axes", {-1});
    b.node("Sub", {"x", t + "mean"}, {t + "d"}, names + "Sub");
    b.node("Pow", {t + "d", names + "two"}, {t + "p"}, names + "Pow");
    set_ints(b.node("ReduceMean", {t + "p"}, {t + "var"}, names + "ReduceMean_1"), "axes", {-1});
    b.node("Add", {t + "var", names + "eps"}, {t + "ve"}, names + "Add");
    b.node("Sqrt", {t + "ve"}, {t + "s"}, names + "Sqrt");
    b.node("Div", {t + "d", t + "s"}, {affine ? t + "n" : t + "ln"}, names + "Div");
    if (affine) {
      b.node("Mul", {t + "n", names + "gamma"}, {t + "g"}, names + "Mul");
      b.node("Add", {t + "g", names + "beta"}, {t + "ln"}, names + "Add_1");
    }
  }
  b.node("MatMul", {t + "ln", names + "W"}, {t + "mm"}, names + "MatMul");
  b.node("Add", {names + "b", t + "mm"}, {"y"}, names + "Add_2");
  return b.graph("ln.onnx");
}

TEST(LayerForms, DecomposedLayerNormalizationMatchesTheOneOp) {
  const Graph one = layer_norm_graph(false, "/a/"), chain = layer_norm_graph(true, "/b/");
  // The one op in the reference, the chain in the variant: its last Add is the LayerNormalization.
  const NodeMatch m = match_nodes(one, chain);
  EXPECT_EQ(m.ref_of_variant[index_of(chain, "/b/Add_1")], int(index_of(one, "/a/LayerNormalization")));
  EXPECT_EQ(m.ref_of_variant[index_of(chain, "/b/MatMul")], int(index_of(one, "/a/MatMul")));
  EXPECT_EQ(m.ref_of_variant[index_of(chain, "/b/Add_2")], int(index_of(one, "/a/Add_2")));
  EXPECT_EQ(m.plumbing, 8u);  // ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul
  EXPECT_TRUE(m.unmatched.empty()) << m.unmatched[0].name << ": " << m.unmatched[0].reason;
  const auto plans = plan_local_runs(one, chain, m);
  const LocalPlan& ln = plans[index_of(chain, "/b/Add_1")];
  ASSERT_TRUE(ln.ok()) << ln.error;
  EXPECT_EQ(ln.nodes.size(), 9u);
  EXPECT_EQ(ln.inputs, (std::vector<std::pair<std::string, std::string>>{{"x", "x"}}));
  // The chain in the reference: its other nodes are listed as parts of it.
  const NodeMatch back = match_nodes(chain, one);
  EXPECT_EQ(back.ref_of_variant[index_of(one, "/a/LayerNormalization")], int(index_of(chain, "/b/Add_1")));
  EXPECT_EQ(back.by_output + back.by_structure, 3u);
  ASSERT_EQ(back.unmatched.size(), 8u);
  for (const auto& u : back.unmatched) {
    EXPECT_EQ(u.side, "reference");
    EXPECT_EQ(u.reason.rfind("part of decomposed LayerNormalization /b/Add_1", 0), 0u) << u.name << ": " << u.reason;
  }
  // Without the affine part (elementwise_affine=False): the Div ends the chain.
  OnnxBuilder b(17);
  b.input("x", kF32, {1, 4, 8}).output("y", kF32, {1, 4, 8});
  b.node("LayerNormalization", {"x", "ones"}, {"y"}, "ln");
  b.initializer("ones", std::vector<float>(8, 1.0f), {8});
  const NodeMatch bare = match_nodes(b.graph(), layer_norm_graph(true, "/c/", false));
  EXPECT_EQ(bare.by_structure, 0u);  // a scale [8] against none: another layer
}

// The torch exporter's own pair: a tiny pre-norm transformer block at opset 16 (LayerNormalization
// decomposed) and 17 (one op), and the opset-17 export with its Gemms as MatMul by a transposed
// constant + Add under other names (tools/make_layer_form_pairs.py). Every layer of the opset-17
// export matches; both exports and the rewrite compute torch's output.
TEST(LayerForms, TorchExportsAtOpset16And17MatchLayerForLayer) {
  const auto dir = testing::data_dir() / "layer_forms";
  const Graph g17 = load_onnx(dir / "block_opset17.onnx"), g16 = load_onnx(dir / "block_opset16.onnx");
  const Graph g17mm = load_onnx(dir / "block_opset17_matmul.onnx");
  const Tensor x = datasets::read_npy(dir / "inputs" / "x.npy");
  const Tensor expected = datasets::read_npy(dir / "outputs" / "logits.npy");
  for (const Graph* g : {&g17, &g16, &g17mm}) {
    Session s(*g);
    const auto e = metrics::tensor_error(expected, s.run({{"x", x}}).at("logits"));
    EXPECT_LE(*e.rel_l2, 1e-5);
  }
  std::size_t layers = 0;
  for (const Node& n : g17.nodes) layers += n.op_type != "Constant";
  {
    const NodeMatch m = match_nodes(g17, g16);  // the one op in the reference
    std::printf("  torch opset 17 vs 16: %zu by name, %zu by output, %zu by structure, %zu set aside, %zu unmatched\n",
                m.by_name, m.by_output, m.by_structure, m.plumbing, m.unmatched.size());
    for (const char* ln : {"/ln1/LayerNormalization", "/ln2/LayerNormalization"})
      EXPECT_EQ(m.variant_of_ref[index_of(g17, ln)],
                int(index_of(g16, std::string(ln).replace(std::string(ln).find("LayerNormalization"), 18, "Add_1"))));
    EXPECT_EQ(m.by_name + m.by_output + m.by_structure, layers);
    EXPECT_EQ(m.plumbing, 16u);  // the two chains' other nodes
    for (const auto& u : m.unmatched) ADD_FAILURE() << u.side << " " << u.name << ": " << u.reason;
  }
  {
    const NodeMatch m = match_nodes(g16, g17);  // the chain in the reference
    std::size_t parts = 0;
    for (const auto& u : m.unmatched) parts += u.reason.rfind("part of decomposed LayerNormalization /ln", 0) == 0;
    EXPECT_EQ(parts, 16u);
    EXPECT_EQ(m.unmatched.size(), 16u);
  }
  {
    const NodeMatch m = match_nodes(g17, g17mm);  // Gemm -> Transpose, MatMul, Add; all names changed
    std::printf(
        "  torch opset 17 vs its Gemms as MatMul + Add: %zu by name, %zu by output, %zu by structure, %zu set aside, "
        "%zu unmatched\n",
        m.by_name, m.by_output, m.by_structure, m.plumbing, m.unmatched.size());
    EXPECT_EQ(m.variant_of_ref[index_of(g17, "/head/Gemm")], int(g17mm.nodes.size() - 1));  // the Add writing "logits"
    EXPECT_GE(m.variant_of_ref[index_of(g17, "/attn/Gemm")], 0);
    EXPECT_EQ(g17mm.nodes[std::size_t(m.variant_of_ref[index_of(g17, "/attn/Gemm")])].op_type, "Add");
    EXPECT_EQ(m.by_name + m.by_output + m.by_structure, layers);
    for (const auto& u : m.unmatched) ADD_FAILURE() << u.side << " " << u.name << ": " << u.reason;
  }
}

}  // namespace
}  // namespace qeval::eval
