#include "eval/quant/apply.h"
#include "eval/exec/opset_upgrade.h"

#include <gtest/gtest.h>

#include <cmath>

#include "base/json_config.h"
#include "eval/exec/onnx_export.h"
#include "eval/exec/onnx_import.h"
#include "eval/quant/mini_block.h"
#include "kernels/error.h"
#include "kernels/numeric.h"
#include "test_util.h"

namespace qeval::eval::quant {
namespace {

Recipe recipe(const std::string& body) { return parse_recipe(base::JsonConfig::parse("{" + body + "}", "r.json")); }

std::vector<std::map<std::string, Tensor>> samples(int n) {
  std::vector<std::map<std::string, Tensor>> v;
  for (int i = 0; i < n; ++i)
    v.push_back({{"sample", testing::floats({1, 2, 4, 4}, testing::seeded_values(32, 10 + i, 1.0f))},
                 {"temb", testing::floats({1, 3}, testing::seeded_values(3, 50 + i, 1.0f))}});
  return v;
}

int count_ops(const Graph& g, const std::string& op) {
  int n = 0;
  for (const auto& node : g.nodes) n += node.op_type == op;
  return n;
}

const Node& node_named(const Graph& g, const std::string& name) {
  for (const auto& n : g.nodes)
    if (n.name == name) return n;
  throw std::runtime_error("no node " + name);
}

struct Applied {
  Selection selection;
  CalibrationResult calibration;
  AppliedRecipe applied;
};

Applied apply(const Graph& g, const Recipe& r) {
  Applied a;
  a.selection = select_nodes(g, r);
  TensorCalibrationSet set(samples(4));
  a.calibration = calibrate(g, a.selection, r, set);
  a.applied = apply_recipe(g, a.selection, r, a.calibration);
  return a;
}

TEST(ApplyRecipe, Int8InsertsQdqInTensorRtConvention) {
  const Graph g = testing::mini_unet_block().graph();
  const Recipe r =
      recipe(R"("format": "int8", "level": 4, "calibration": {"method": "max"}, "smoothquant": {"alpha": 0.8})");
  const Applied a = apply(g, r);
  const Graph& q = a.applied.graph;
  EXPECT_EQ(a.applied.quantized_activations, 12);
  EXPECT_EQ(a.applied.smoothed_layers, 7);
  EXPECT_EQ(count_ops(q, "QuantizeLinear"), 12);
  EXPECT_EQ(count_ops(q, "DequantizeLinear"), 12 + 8);
  EXPECT_EQ(count_ops(q, "Mul"), count_ops(g, "Mul") + 7);
  EXPECT_EQ(q.opsets.at(""), 17);  // int8 per-axis DequantizeLinear exists since 13
  EXPECT_EQ(q.nodes.size(), g.nodes.size() + 12 * 2 + 8 + 7);

  // The activation path of to_q: Mul(pre-scale) -> Q -> DQ -> MatMul, scale amax/127, zero point 0.
  const Node& mm = node_named(q, "/attn/attn1/to_q/MatMul");
  EXPECT_EQ(mm.inputs[0], "/attn/attn1/to_q/MatMul/input_quantizer/DequantizeLinear_output_0");
  EXPECT_EQ(mm.inputs[1], "/attn/attn1/to_q/MatMul/weight_quantizer/DequantizeLinear_output_0");
  const Node& qn = node_named(q, "/attn/attn1/to_q/MatMul/input_quantizer/QuantizeLinear");
  EXPECT_EQ(qn.inputs[0], "/attn/attn1/to_q/MatMul/input_quantizer/Mul_output_0");
  const Tensor& scale = q.initializers.at(qn.inputs[1]);
  EXPECT_EQ(scale.shape(), Shape{});
  EXPECT_FLOAT_EQ(scale.data<float>()[0], a.calibration.find("/attn/attn1/to_q/MatMul", 0)->amax / 127.0f);
  const Tensor& zp = q.initializers.at(qn.inputs[2]);
  EXPECT_EQ(zp.dtype(), DType::kInt8);
  EXPECT_EQ(zp.data<std::int8_t>()[0], 0);
  const Node& mul = node_named(q, "/attn/attn1/to_q/MatMul/input_quantizer/Mul");
  const Tensor& pre = q.initializers.at(mul.inputs[1]);
  const Smoothing* sm = a.calibration.smoothing_for("/attn/attn1/to_q/MatMul");
  for (std::size_t j = 0; j < 4; ++j) EXPECT_FLOAT_EQ(pre.data<float>()[j], 1.0f / sm->scale[j]);

  // Weights: int8 per output channel (axis 1 of a MatMul's [K, N]) holding diag(s) W.
  const Node& wdq = node_named(q, "/attn/attn1/to_q/MatMul/weight_quantizer/DequantizeLinear");
  EXPECT_EQ(wdq.get_int("axis", -99), 1);
  const Tensor& wq = q.initializers.at(wdq.inputs[0]);
  const Tensor& ws = q.initializers.at(wdq.inputs[1]);
  ASSERT_EQ(wq.dtype(), DType::kInt8);
  ASSERT_EQ(ws.shape(), Shape{4});
  const Tensor& w = g.initializers.at("to_q");
  for (int k = 0; k < 4; ++k) {
    for (int n = 0; n < 4; ++n) {
      const float smoothed = w.data<float>()[k * 4 + n] * sm->scale[static_cast<std::size_t>(k)];
      const float back = dequantize(wq.data<std::int8_t>()[k * 4 + n], ws.data<float>()[n], 0);
      EXPECT_LE(std::fabs(back - smoothed), ws.data<float>()[n] / 2 * 1.0001f) << k << "," << n;
    }
  }
  EXPECT_EQ(q.initializers.count("to_q"), 0u);  // the float weight is gone
  // Conv weights per output channel on axis 0; the Gemm's (transB) too.
  EXPECT_EQ(node_named(q, "/block/conv1/Conv/weight_quantizer/DequantizeLinear").get_int("axis", -99), 0);
  EXPECT_EQ(node_named(q, "/block/emb_proj/Gemm/weight_quantizer/DequantizeLinear").get_int("axis", -99), 0);
  // Attention MatMuls: both inputs through Q/DQ, no weight.
  const Node& av = node_named(q, "/attn/attn1/MatMul_1");
  EXPECT_EQ(av.inputs[0], "/attn/attn1/MatMul_1/softmax_quantizer/DequantizeLinear_output_0");
  EXPECT_EQ(av.inputs[1], "/attn/attn1/MatMul_1/v_bmm_quantizer/DequantizeLinear_output_0");
  // Unselected nodes are untouched.
  EXPECT_EQ(node_named(q, "/conv_in/Conv").inputs, node_named(g, "/conv_in/Conv").inputs);
}

TEST(ApplyRecipe, PerTensorWeightsAndFp8AtOpset19) {
  const Graph g = testing::mini_unet_block().graph();
  const Recipe r =
      recipe(R"("format": "fp8_e4m3", "weights": "per_tensor", "level": 3, "calibration": {"method": "max"})");
  const Applied a = apply(g, r);
  const Graph& q = a.applied.graph;
  EXPECT_EQ(a.applied.opset_from, 17);
  EXPECT_EQ(q.opsets.at(""), 19);
  for (const auto& n : q.nodes) EXPECT_EQ(n.opset, 19) << n.name;
  const Node& wdq = node_named(q, "/attn/ff/net.2/MatMul/weight_quantizer/DequantizeLinear");
  EXPECT_FALSE(wdq.has("axis"));
  const Tensor& wq = q.initializers.at(wdq.inputs[0]);
  const Tensor& ws = q.initializers.at(wdq.inputs[1]);
  EXPECT_EQ(wq.dtype(), DType::kFloat8E4M3FN);
  EXPECT_EQ(q.initializers.at(wdq.inputs[2]).dtype(), DType::kFloat8E4M3FN);
  const Tensor& w = g.initializers.at("ff.out");
  float amax = 0;
  for (float v : w.span<float>()) amax = std::max(amax, std::fabs(v));
  EXPECT_FLOAT_EQ(ws.data<float>()[0], amax / 448.0f);
  const auto* codes = reinterpret_cast<const std::uint8_t*>(wq.raw());
  for (std::int64_t e = 0; e < w.numel(); ++e)
    EXPECT_EQ(codes[e], to_float8_e4m3fn(w.data<float>()[e] / ws.data<float>()[0]).bits);
  const Node& act = node_named(q, "/attn/ff/net.2/MatMul/input_quantizer/QuantizeLinear");
  EXPECT_FLOAT_EQ(q.initializers.at(act.inputs[1]).data<float>()[0],
                  a.calibration.find("/attn/ff/net.2/MatMul", 0)->amax / 448.0f);
}

TEST(ApplyRecipe, ExportReimportsToTheSameGraph) {
  const Graph g = testing::mini_unet_block().graph();
  for (const char* body :
       {R"("format": "int8", "level": 4, "calibration": {"method": "max"}, "smoothquant": {"alpha": 0.5})",
        R"("format": "fp8_e4m3", "level": 4, "calibration": {"method": "max"})"}) {
    const Applied a = apply(g, recipe(body));
    const std::string bytes = serialize_onnx(a.applied.graph);
    ImportOptions lenient;
    lenient.require_supported_ops = false;
    const Graph back =
        parse_onnx({reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()}, "q.onnx", ".", lenient);
    ASSERT_EQ(back.nodes.size(), a.applied.graph.nodes.size());
    EXPECT_EQ(back.opsets, a.applied.graph.opsets);
    for (const auto& [k, t] : a.applied.graph.initializers) {
      const Tensor& u = back.initializers.at(k);
      EXPECT_EQ(t.dtype(), u.dtype()) << k;
      EXPECT_EQ(std::memcmp(t.raw(), u.raw(), t.nbytes()), 0) << k;
    }
    EXPECT_EQ(serialize_onnx(back), bytes);
  }
}

TEST(ApplyRecipe, BadCalibrationAndOldOpsetsAreInputErrors) {
  const Graph g = testing::mini_unet_block().graph();
  const Recipe r = recipe(R"("format": "int8", "level": 2, "calibration": {"method": "max"})");
  const Selection sel = select_nodes(g, r);
  CalibrationResult empty;
  try {
    apply_recipe(g, sel, r, empty);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("calibration result has no range for node '/block/conv1/Conv' input 0"),
              std::string::npos)
        << e.what();
  }
  // Below opset 7 nothing is upgraded: a plain input error (exit 2) saying what is needed.
  Graph old = g;
  old.opsets[""] = 6;
  const Selection old_sel = select_nodes(old, r);
  try {
    apply_recipe(old, old_sel, r, empty);
    FAIL() << "no error";
  } catch (const UnsupportedError& e) {
    FAIL() << "an UnsupportedError: " << e.what();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("opset 6 is too old for INT8 Q/DQ nodes, which need opset 13: qeval "
                                         "upgrades opset 7 or later to 13"),
              std::string::npos)
        << e.what();
  }
}

TEST(ApplyRecipe, OpsetUpgradeMovesReduceAxesToAnInput) {
  testing::OnnxBuilder b(17);
  b.input("x", onnx::TensorProto::FLOAT, {2, 3});
  b.output("y", onnx::TensorProto::FLOAT);
  auto& n = b.node("ReduceMean", {"x"}, {"y"}, "mean");
  auto* a = n.add_attribute();
  a->set_name("axes");
  a->set_type(onnx::AttributeProto::INTS);
  a->add_ints(1);
  Graph g = b.graph();
  upgrade_opset(g, 19);
  ASSERT_EQ(g.nodes[0].inputs.size(), 2u);
  EXPECT_FALSE(g.nodes[0].has("axes"));
  EXPECT_EQ(g.initializers.at(g.nodes[0].inputs[1]).data<std::int64_t>()[0], 1);
  EXPECT_EQ(g.nodes[0].opset, 19);
}

}  // namespace
}  // namespace qeval::eval::quant

namespace qeval::eval::quant {
namespace {

double relative_l2(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double d = double(a.data<float>()[i]) - double(b.data<float>()[i]);
    num += d * d;
    den += double(b.data<float>()[i]) * double(b.data<float>()[i]);
  }
  return std::sqrt(num / den);
}

TEST(ApplyRecipe, RunsInMemoryAndTheExportRunsIdentically) {
  const Graph g = testing::mini_unet_block().graph();
  // A calibration sample: with 4 samples of 32 values, unseen inputs clip (that is what a small
  // calibration set does; the tiny-sd tests use real prompts).
  const auto in = samples(4)[1];
  Session ref(g);
  const Tensor fp32 = ref.run(in).at("out");
  // Limits: int8 keeps ~7 bits, E4M3 3 mantissa bits, E5M2 2.
  const std::pair<const char*, double> cases[] = {
      {R"("format": "int8", "level": 4, "calibration": {"method": "max"}, "smoothquant": {"alpha": 0.8})", 0.03},
      {R"("format": "int8", "level": 2.5, "calibration": {"method": "percentile"}, "smoothquant": {"alpha": "search"})",
       0.03},
      {R"("format": "fp8_e4m3", "level": 4, "calibration": {"method": "max"})", 0.08},
      {R"("format": "fp8_e5m2", "weights": "per_tensor", "level": 3, "calibration": {"method": "mse"})", 0.2}};
  for (const auto& [body, limit] : cases) {
    SCOPED_TRACE(body);
    const Applied a = apply(g, recipe(body));
    Session mem(a.applied.graph);
    const Tensor q = mem.run(in).at("out");
    const std::string bytes = serialize_onnx(a.applied.graph);
    const Graph back = parse_onnx({reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()}, "q.onnx", ".");
    Session file(back);
    const Tensor qf = file.run(in).at("out");
    ASSERT_EQ(q.shape(), qf.shape());
    EXPECT_EQ(std::memcmp(q.raw(), qf.raw(), q.nbytes()), 0);
    const double err = relative_l2(q, fp32);
    EXPECT_GT(err, 0.0);    // something was quantized
    EXPECT_LT(err, limit);  // and the block still computes the same function
    std::printf("  %s: relative L2 vs FP32 %.4f\n", body, err);
  }
}

}  // namespace
}  // namespace qeval::eval::quant
