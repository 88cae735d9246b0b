// qeval lint: Q/DQ exports made by qeval itself (apply_recipe on the unet_block test model, the
// committed INT8 level-3 export) and one hand-built graph per finding.
#include "eval/quant/lint.h"

#include <gtest/gtest.h>

#include "base/json_config.h"
#include "datasets/npy.h"
#include "eval/exec/onnx_export.h"
#include "eval/exec/onnx_import.h"
#include "eval/onnx_builder.h"
#include "eval/quant/apply.h"
#include "eval/quant/calibrate.h"
#include "eval/quant/mini_block.h"
#include "kernels/error.h"
#include "test_util.h"

namespace qeval::eval::quant {
namespace {

namespace fs = std::filesystem;
using testing::OnnxBuilder;
constexpr int kFloat = onnx::TensorProto::FLOAT;
constexpr int kE4M3FN = 17;  // TensorProto.FLOAT8E4M3FN (Debian's onnx headers predate it)

// ---- helpers ------------------------------------------------------------------------------------

std::vector<const LintFinding*> findings_of(const LintReport& r, const std::string& rule) {
  std::vector<const LintFinding*> v;
  for (const auto& f : r.findings)
    if (f.rule == rule) v.push_back(&f);
  return v;
}

const LintNode& lint_node(const LintReport& r, const std::string& name) {
  for (const auto& n : r.nodes)
    if (n.name == name) return n;
  throw std::runtime_error("no lint node " + name);
}

std::string rules(const LintReport& r) {
  std::string s;
  for (const auto& f : r.findings) s += std::string(severity_name(f.severity)) + ":" + f.rule + "@" + f.node + " ";
  return s;
}

LintReport lint(const OnnxBuilder& b, int target = 0, std::map<std::string, Shape> shapes = {}) {
  LintOptions o;
  o.target_sm = target;
  o.input_shapes = std::move(shapes);
  return lint_graph(b.graph(), o);
}

void int_attr(onnx::NodeProto& n, const std::string& name, std::int64_t v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

// x -> QuantizeLinear -> DequantizeLinear (per tensor, int8 zero point `zp`); returns the DQ output.
std::string qdq(OnnxBuilder& b, const std::string& x, const std::string& prefix, std::int8_t zp = 0) {
  b.initializer(prefix + "/scale", {0.05f}, {});
  b.initializer_raw<std::int8_t>(prefix + "/zero_point", onnx::TensorProto::INT8, {zp}, {});
  b.node("QuantizeLinear", {x, prefix + "/scale", prefix + "/zero_point"}, {prefix + "/q"}, prefix + "/QuantizeLinear");
  b.node("DequantizeLinear", {prefix + "/q", prefix + "/scale", prefix + "/zero_point"}, {prefix + "/dq"},
         prefix + "/DequantizeLinear");
  return prefix + "/dq";
}

// An int8 weight behind a DequantizeLinear: per channel along `axis` (channels = dims[axis]), per
// tensor when axis is -1, or per channel without an axis attribute when axis is -2 (ONNX: axis 1).
std::string weight_dq(OnnxBuilder& b, const std::string& name, const std::vector<std::int64_t>& dims, int axis) {
  std::size_t n = 1;
  for (auto d : dims) n *= static_cast<std::size_t>(d);
  std::vector<std::int8_t> codes(n);
  for (std::size_t i = 0; i < n; ++i) codes[i] = static_cast<std::int8_t>(int(i % 9) - 4);
  b.initializer_raw<std::int8_t>(name, onnx::TensorProto::INT8, codes, dims);
  const std::int64_t channels = axis == -1 ? 0 : dims[static_cast<std::size_t>(axis == -2 ? 1 : axis)];
  if (axis == -1) {
    b.initializer(name + "/scale", {0.01f}, {});
    b.initializer_raw<std::int8_t>(name + "/zero_point", onnx::TensorProto::INT8, {0}, {});
  } else {
    b.initializer(name + "/scale", std::vector<float>(static_cast<std::size_t>(channels), 0.01f), {channels});
    b.initializer_raw<std::int8_t>(name + "/zero_point", onnx::TensorProto::INT8,
                                   std::vector<std::int8_t>(static_cast<std::size_t>(channels), 0), {channels});
  }
  auto& dq = b.node("DequantizeLinear", {name, name + "/scale", name + "/zero_point"}, {name + "/dq"},
                    name + "/DequantizeLinear");
  if (axis >= 0) int_attr(dq, "axis", axis);
  return name + "/dq";
}

// x [1, 4, 8, 8] -> Conv (weight [6, 4, 3, 3]) -> y, with Q/DQ on the input and/or the weight.
OnnxBuilder conv_graph(bool quantize_input, int weight_axis, bool quantize_weight = true) {
  OnnxBuilder b(13);
  b.input("x", kFloat, {1, 4, 8, 8});
  b.output("y", kFloat);
  const std::string in = quantize_input ? qdq(b, "x", "/conv/input_quantizer") : "x";
  std::string w = "conv.weight";
  if (quantize_weight) {
    w = weight_dq(b, "conv.weight.q", {6, 4, 3, 3}, weight_axis);
  } else {
    b.initializer("conv.weight", std::vector<float>(6 * 4 * 9, 0.1f), {6, 4, 3, 3});
  }
  b.node("Conv", {in, w}, {"y"}, "/conv/Conv");
  return b;
}

// x [1, 4, 8] -> MatMul (weight [8, 16]) -> y.
OnnxBuilder matmul_graph(bool quantize_input, int weight_axis, bool quantize_weight = true) {
  OnnxBuilder b(13);
  b.input("x", kFloat, {1, 4, 8});
  b.output("y", kFloat);
  const std::string in = quantize_input ? qdq(b, "x", "/fc/input_quantizer") : "x";
  std::string w = "fc.weight";
  if (quantize_weight) w = weight_dq(b, "fc.weight.q", {8, 16}, weight_axis);
  else b.initializer("fc.weight", std::vector<float>(8 * 16, 0.1f), {8, 16});
  b.node("MatMul", {in, w}, {"y"}, "/fc/MatMul");
  return b;
}

// softmax(q k) v over q [1, 2, S, H], k [1, 2, H, S], v [1, 2, S, H]; INT8 Q/DQ on both inputs of
// both matmuls unless `quantize_k` is false; `quantize_out` adds one on the BMM2 output.
OnnxBuilder attention_graph(std::int64_t s, std::int64_t h, bool quantize_k = true, bool quantize_out = true) {
  OnnxBuilder b(13);
  b.input("q", kFloat, {1, 2, s, h});
  b.input("k", kFloat, {1, 2, h, s});
  b.input("v", kFloat, {1, 2, s, h});
  b.output("out", kFloat);
  const std::string q = qdq(b, "q", "/attn/MatMul/q_bmm_quantizer");
  const std::string k = quantize_k ? qdq(b, "k", "/attn/MatMul/k_bmm_quantizer") : "k";
  b.node("MatMul", {q, k}, {"scores"}, "/attn/MatMul");
  int_attr(b.node("Softmax", {"scores"}, {"probs"}, "/attn/Softmax"), "axis", -1);
  const std::string p = qdq(b, "probs", "/attn/MatMul_1/softmax_quantizer");
  const std::string v = qdq(b, "v", "/attn/MatMul_1/v_bmm_quantizer");
  b.node("MatMul", {p, v}, {quantize_out ? "o" : "out"}, "/attn/MatMul_1");
  if (quantize_out) {
    const std::string o = qdq(b, "o", "/attn/to_out/input_quantizer");
    b.node("Identity", {o}, {"out"}, "/attn/Identity");
  }
  return b;
}

// ---- qeval's own exports ------------------------------------------------------------------------

std::map<std::string, Tensor> unet_block_inputs() {
  const fs::path dir = testing::data_dir() / "onnx/unet_block/inputs";
  std::map<std::string, Tensor> in;
  for (const char* name : {"sample", "timestep_embedding", "encoder_hidden_states"})
    in.emplace(name, datasets::read_npy(dir / (std::string(name) + ".npy")));
  return in;
}

// The unet_block test model quantized in memory by a recipe (calibrated on its one input sample).
Graph quantized_unet_block(const Recipe& recipe) {
  const Graph g = load_onnx(testing::data_dir() / "onnx/unet_block/model.onnx");
  const Selection sel = select_nodes(g, recipe);
  TensorCalibrationSet set({unet_block_inputs()});
  return apply_recipe(g, sel, recipe, calibrate(g, sel, recipe, set)).graph;
}

const std::map<std::string, Shape> kUnetBlock16{
    {"sample", {1, 64, 16, 16}}, {"timestep_embedding", {1, 128}}, {"encoder_hidden_states", {1, 8, 64}}};

TEST(LintQevalExports, Int8Level3ExportIsCleanOnEveryTarget) {
  // The committed export of recipes/int8-level3.json (tools/make_quant_ort_fixture.sh).
  const Graph q = load_onnx(testing::data_dir() / "quant/unet_block_int8/quantized.onnx");
  for (int target : {0, 75, 86, 90}) {
    LintOptions o;
    o.target_sm = target;
    const LintReport r = lint_graph(q, o);
    EXPECT_EQ(r.findings.size(), 0u) << target << ": " << rules(r);
    EXPECT_EQ(r.qdq_nodes, 15 * 2 + 15);  // 15 activation Q/DQ pairs, 15 weight DQs
    EXPECT_EQ(r.count(ComputeState::kQuantized), 15);
  }
  const LintReport r = lint_graph(q, {});
  // Level 3: the 4 attention matmuls are level 4 (not selected); conv_in/conv_out-like names are
  // the demo's default exclusions.
  EXPECT_EQ(r.count(HighPrecisionReason::kNotSelected), 4) << r.to_text();
  EXPECT_EQ(r.count(HighPrecisionReason::kUnfusable), 0);
  const LintNode& qk = lint_node(r, "/attention/transformer_blocks.0/attn1/MatMul");
  EXPECT_EQ(qk.category, NodeCategory::kAttentionQK);
  EXPECT_EQ(qk.reason, HighPrecisionReason::kNotSelected);
  EXPECT_EQ(qk.detail, "category attention_qk (level 4); the graph's quantized nodes go up to level 3");
  const LintNode& to_q = lint_node(r, "/attention/transformer_blocks.0/attn1/to_q/MatMul");
  EXPECT_EQ(to_q.state, ComputeState::kQuantized);
  EXPECT_EQ(to_q.format, "int8");
  EXPECT_EQ(to_q.category, NodeCategory::kQkvProjection);
  EXPECT_EQ(r.count(ComputeState::kHighPrecision), static_cast<int>(r.nodes.size()) - 15);
  EXPECT_EQ(r.count(HighPrecisionReason::kExcluded), r.count(ComputeState::kHighPrecision) - 4);
  EXPECT_GT(r.count(HighPrecisionReason::kExcluded), 0);
  for (const auto& n : r.nodes) {
    if (n.reason != HighPrecisionReason::kExcluded) continue;
    EXPECT_TRUE(n.name.find("conv_in") != std::string::npos || n.name.find("conv_out") != std::string::npos ||
                n.name.find("conv_shortcut") != std::string::npos || n.name.find("proj_out") != std::string::npos ||
                n.name.find("time_emb_proj") != std::string::npos)
        << n.name;
  }
}

TEST(LintQevalExports, Fp8Level4IsAnErrorBelowSm89) {
  const Graph q = quantized_unet_block(load_recipe(testing::source_dir() / "recipes/fp8-level4.json"));
  LintOptions o;
  o.input_shapes = kUnetBlock16;
  o.target_sm = 86;
  const LintReport r86 = lint_graph(q, o);
  ASSERT_EQ(findings_of(r86, "fp8-target").size(), 1u) << rules(r86);
  const LintFinding& f = *findings_of(r86, "fp8-target")[0];
  EXPECT_EQ(f.severity, Severity::kError);
  EXPECT_EQ(r86.count(Severity::kError), 1) << rules(r86);
  EXPECT_NE(f.message.find("sm86 has no FP8 tensor cores"), std::string::npos) << f.message;
  EXPECT_EQ(f.related.size() + 1, static_cast<std::size_t>(r86.qdq_nodes));  // every Q/DQ node is FP8
  // On sm86 nothing FP8 runs quantized: the 19 selected nodes are unfusable there.
  EXPECT_EQ(r86.count(ComputeState::kQuantized), 0);
  EXPECT_EQ(r86.count(HighPrecisionReason::kUnfusable), 19);

  o.target_sm = 89;
  const LintReport r89 = lint_graph(q, o);
  EXPECT_EQ(r89.findings.size(), 0u) << rules(r89);    // FP8 attention: the INT8 MHA rules do not apply
  EXPECT_EQ(r89.count(ComputeState::kQuantized), 19);  // 5 conv, 2 ff, 6 qkv, 2 other, 2 qk, 2 av
  EXPECT_EQ(lint_node(r89, "/attention/transformer_blocks.0/attn1/MatMul_1").format, "fp8_e4m3fn");

  o.target_sm = 0;
  const LintReport none = lint_graph(q, o);
  ASSERT_EQ(none.findings.size(), 1u) << rules(none);
  EXPECT_EQ(none.findings[0].severity, Severity::kInfo);
  EXPECT_EQ(none.findings[0].rule, "fp8-target");
}

TEST(LintQevalExports, Int8AttentionBeyondTheFusedMhaLimits) {
  const Recipe r = parse_recipe(base::JsonConfig::parse(
      R"({"name": "int8-l4", "format": "int8", "level": 4, "calibration": {"method": "max"}})", "r.json"));
  const Graph q = quantized_unet_block(r);
  LintOptions o;
  // Dynamic inputs without --shape: the attention checks cannot run.
  try {
    lint_graph(q, o);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("input 'sample' is [batch, 64, height, width]: pass --shape sample="),
              std::string::npos)
        << e.what();
  }
  o.input_shapes = kUnetBlock16;  // 16 x 16: sequence 256, 8 cross-attention tokens
  const LintReport r16 = lint_graph(q, o);
  o.input_shapes["sample"] = {1, 64, 32, 32};  // sequence 1024
  const LintReport r32 = lint_graph(q, o);
  // At 32 x 32 every attention matmul exceeds 512 (self: S_q = S_kv = 1024; cross: S_q = 1024).
  const auto big = findings_of(r32, "attention-int8");
  ASSERT_EQ(big.size(), 4u) << rules(r32);
  for (const auto* f : big) {
    EXPECT_NE(f->message.find("sequence length 1024 exceeds 512"), std::string::npos) << f->message;
    EXPECT_NE(f->message.find("head size 16)"), std::string::npos) << f->message;  // 64 channels, 4 heads
  }
  EXPECT_NE(big[2]->message.find("(S_q 1024, S_kv 8, head size 16)"), std::string::npos) << big[2]->message;
  EXPECT_EQ(r32.count(Severity::kError), 0);
  // At 16 x 16 (sequence 256, head size 16) the fused MHA takes it.
  EXPECT_TRUE(r16.findings.empty()) << rules(r16);
  // Level 4 quantizes the to_out input after BMM2, so the placement rule is satisfied.
  EXPECT_TRUE(findings_of(r32, "attention-int8-placement").empty()) << rules(r32);
  EXPECT_EQ(r32.count(ComputeState::kQuantized), 19);
}

TEST(LintQevalExports, TinySdUnetSummaryAgreesWithTheRecipeSelection) {
  // Lint sees only the Q/DQ export, yet its quantized / excluded / not-selected counts must be
  // those select_nodes decided on the FP32 UNet.
  const Graph g = load_onnx(testing::source_dir() / "models/tiny-sd/unet.onnx");
  const Recipe recipe = load_recipe(testing::source_dir() / "recipes/int8-level3.json");
  const Selection sel = select_nodes(g, recipe);
  TensorCalibrationSet set(
      {{{"sample", testing::floats({1, 4, 16, 16}, testing::seeded_values(1024, 3, 1.0f))},
        {"timestep", testing::floats({1}, {500.0f})},
        {"encoder_hidden_states", testing::floats({1, 77, 128}, testing::seeded_values(77 * 128, 4, 1.0f))}}});
  const Graph q = apply_recipe(g, sel, recipe, calibrate(g, sel, recipe, set)).graph;
  LintOptions o;
  o.target_sm = 75;
  const LintReport r = lint_graph(q, o);
  EXPECT_EQ(r.count(Severity::kError) + r.count(Severity::kWarning), 0) << rules(r);
  EXPECT_EQ(r.count(ComputeState::kQuantized), static_cast<int>(sel.targets.size()));
  for (std::size_t c = 0; c < kNodeCategoryCount; ++c) {
    int quantized = 0, total = 0;
    for (const auto& n : r.nodes) {
      if (static_cast<std::size_t>(n.category) != c) continue;
      ++total;
      quantized += n.state == ComputeState::kQuantized;
    }
    EXPECT_EQ(quantized, sel.selected[c]) << category_name(static_cast<NodeCategory>(c));
    if (c != 0 && c != static_cast<std::size_t>(NodeCategory::kOtherMatMul)) {
      EXPECT_EQ(total, sel.candidates[c]) << category_name(static_cast<NodeCategory>(c));
    }
  }
  EXPECT_EQ(r.count(HighPrecisionReason::kExcluded), sel.excluded_by_default);
  EXPECT_EQ(r.count(HighPrecisionReason::kNotSelected),
            sel.candidates[static_cast<std::size_t>(NodeCategory::kAttentionQK)] +
                sel.candidates[static_cast<std::size_t>(NodeCategory::kAttentionAV)]);
}

// ---- one hand-built graph per finding -------------------------------------------------------------

TEST(LintRules, CleanInt8ConvAndMatMul) {
  for (const auto& b : {conv_graph(true, 0), matmul_graph(true, 1), matmul_graph(true, -1)}) {
    const LintReport r = lint(b, 75);
    EXPECT_TRUE(r.findings.empty()) << rules(r);
    ASSERT_EQ(r.nodes.size(), 1u);
    EXPECT_EQ(r.nodes[0].state, ComputeState::kQuantized);
    EXPECT_EQ(r.nodes[0].format, "int8");
  }
}

TEST(LintRules, NonZeroZeroPointIsAnError) {
  OnnxBuilder b(13);
  b.input("x", kFloat, {1, 4, 8});
  b.output("y", kFloat);
  const std::string in = qdq(b, "x", "/fc/input_quantizer", 3);
  b.node("MatMul", {in, weight_dq(b, "w", {8, 16}, 1)}, {"y"}, "/fc/MatMul");
  const LintReport r = lint(b);
  const auto f = findings_of(r, "zero-point");
  ASSERT_EQ(f.size(), 1u) << rules(r);  // reported once for the Q/DQ pair
  EXPECT_EQ(f[0]->severity, Severity::kError);
  EXPECT_EQ(f[0]->node, "/fc/input_quantizer/QuantizeLinear");
  EXPECT_NE(f[0]->message.find("zero point '/fc/input_quantizer/zero_point': 1 of 1 value is non-zero (first: 3)"),
            std::string::npos)
      << f[0]->message;
  EXPECT_EQ(lint_node(r, "/fc/MatMul").reason, HighPrecisionReason::kUnfusable);
  EXPECT_EQ(lint_node(r, "/fc/MatMul").detail, "zero-point");
}

TEST(LintRules, Uint8QuantizationIsAnError) {
  OnnxBuilder b(13);
  b.input("x", kFloat, {1, 4, 8});
  b.output("y", kFloat);
  b.initializer("s", {0.05f}, {});
  b.initializer_raw<std::uint8_t>("zp", onnx::TensorProto::UINT8, {0}, {});
  b.node("QuantizeLinear", {"x", "s", "zp"}, {"xq"}, "Q");
  b.node("DequantizeLinear", {"xq", "s", "zp"}, {"xd"}, "DQ");
  b.node("MatMul", {"xd", weight_dq(b, "w", {8, 16}, 1)}, {"y"}, "/fc/MatMul");
  const LintReport r = lint(b);
  const auto f = findings_of(r, "unsupported-type");
  ASSERT_EQ(f.size(), 1u) << rules(r);
  EXPECT_EQ(f[0]->node, "Q");
  EXPECT_NE(f[0]->message.find("quantizes to uint8"), std::string::npos) << f[0]->message;
  EXPECT_EQ(lint_node(r, "/fc/MatMul").reason, HighPrecisionReason::kUnfusable);
}

TEST(LintRules, PerChannelActivationIsAnError) {
  OnnxBuilder b(13);
  b.input("x", kFloat, {1, 4, 8, 8});
  b.output("y", kFloat);
  b.initializer("s", {0.1f, 0.2f, 0.3f, 0.4f}, {4});
  b.initializer_raw<std::int8_t>("zp", onnx::TensorProto::INT8, {0, 0, 0, 0}, {4});
  int_attr(b.node("QuantizeLinear", {"x", "s", "zp"}, {"xq"}, "Q"), "axis", 1);
  int_attr(b.node("DequantizeLinear", {"xq", "s", "zp"}, {"xd"}, "DQ"), "axis", 1);
  b.node("Conv", {"xd", weight_dq(b, "w", {6, 4, 3, 3}, 0)}, {"y"}, "/conv/Conv");
  const LintReport r = lint(b);
  const auto f = findings_of(r, "activation-per-channel");
  ASSERT_EQ(f.size(), 1u) << rules(r);
  EXPECT_EQ(f[0]->severity, Severity::kError);
  EXPECT_NE(f[0]->message.find("per-axis scales on an activation ('x')"), std::string::npos) << f[0]->message;
}

TEST(LintRules, WeightScalesMustRunAlongTheOutputChannels) {
  // Conv [out, in, kH, kW]: axis 0; MatMul [K, N]: axis 1. A missing axis means 1 to ONNX and 0 to
  // TensorRT's parser, so it is reported too.
  struct Case {
    OnnxBuilder b;
    bool error;
    const char* text;
  };
  const std::vector<Case> cases{{conv_graph(true, 0), false, ""},
                                {conv_graph(true, 1), true, "[out, in, kH, kW] is quantized per channel with axis 1"},
                                {conv_graph(true, -2), true, "no axis attribute"},
                                {matmul_graph(true, 1), false, ""},
                                {matmul_graph(true, 0), true, "[K, N] is quantized per channel with axis 0"}};
  for (const auto& c : cases) {
    const LintReport r = lint(c.b);
    const auto f = findings_of(r, "weight-axis");
    if (!c.error) {
      EXPECT_TRUE(f.empty()) << rules(r);
      continue;
    }
    ASSERT_EQ(f.size(), 1u) << rules(r);
    EXPECT_EQ(f[0]->severity, Severity::kError);
    EXPECT_NE(f[0]->message.find(c.text), std::string::npos) << f[0]->message;
    EXPECT_EQ(r.nodes[0].reason, HighPrecisionReason::kUnfusable);
  }
}

TEST(LintRules, TrtFp8OpsNeedSm89) {
  OnnxBuilder b(17);
  b.domain("trt", 1);
  b.input("x", kFloat, {1, 4, 8});
  b.output("y", kFloat);
  b.initializer("s", {0.01f}, {});
  b.node("TRT_FP8QuantizeLinear", {"x", "s"}, {"xq"}, "Q", "trt");
  b.node("TRT_FP8DequantizeLinear", {"xq", "s"}, {"xd"}, "DQ", "trt");
  b.initializer_raw<std::uint8_t>("w8", onnx::TensorProto::UINT8, std::vector<std::uint8_t>(8 * 16, 0x38), {8, 16});
  b.node("TRT_FP8DequantizeLinear", {"w8", "s"}, {"wd"}, "WDQ", "trt");
  b.node("MatMul", {"xd", "wd"}, {"y"}, "/fc/MatMul");
  const LintReport r80 = lint(b, 80);
  const auto f = findings_of(r80, "fp8-target");
  ASSERT_EQ(f.size(), 1u) << rules(r80);
  EXPECT_EQ(f[0]->severity, Severity::kError);
  EXPECT_EQ(f[0]->node, "Q");
  EXPECT_EQ(f[0]->related, (std::vector<std::string>{"DQ", "WDQ"}));
  EXPECT_TRUE(findings_of(r80, "unsupported-type").empty()) << rules(r80);  // uint8 codes of the trt ops are FP8
  const LintReport r90 = lint(b, 90);
  EXPECT_TRUE(r90.findings.empty()) << rules(r90);
  EXPECT_EQ(r90.nodes[0].format, "fp8_e4m3fn");
}

TEST(LintRules, WeightOnlyConvIsNeverFused) {
  const LintReport r = lint(conv_graph(false, 0), 90);
  const auto f = findings_of(r, "weight-only");
  ASSERT_EQ(f.size(), 1u) << rules(r);
  EXPECT_EQ(f[0]->severity, Severity::kWarning);
  EXPECT_NE(f[0]->message.find("no weight-only convolution kernels"), std::string::npos);
  EXPECT_EQ(r.nodes[0].state, ComputeState::kHighPrecision);
  EXPECT_EQ(r.nodes[0].reason, HighPrecisionReason::kUnfusable);
}

TEST(LintRules, WeightOnlyGemmNeedsAmpere) {
  const LintReport turing = lint(matmul_graph(false, 1), 75);
  ASSERT_EQ(findings_of(turing, "weight-only").size(), 1u) << rules(turing);
  EXPECT_EQ(turing.findings[0].severity, Severity::kWarning);
  EXPECT_EQ(turing.nodes[0].reason, HighPrecisionReason::kUnfusable);
  const LintReport ampere = lint(matmul_graph(false, 1), 86);
  ASSERT_EQ(findings_of(ampere, "weight-only").size(), 1u) << rules(ampere);
  EXPECT_EQ(ampere.findings[0].severity, Severity::kInfo);
  EXPECT_EQ(ampere.nodes[0].state, ComputeState::kWeightOnly);
}

TEST(LintRules, ActivationOnlyQdqLeavesTheNodeUnfused) {
  const LintReport r = lint(matmul_graph(true, 1, false));
  const auto f = findings_of(r, "activation-only");
  ASSERT_EQ(f.size(), 1u) << rules(r);
  EXPECT_EQ(f[0]->severity, Severity::kWarning);
  EXPECT_NE(f[0]->message.find("the weight input 1 'fc.weight' is not"), std::string::npos) << f[0]->message;
  EXPECT_EQ(r.nodes[0].reason, HighPrecisionReason::kUnfusable);
}

TEST(LintRules, OneQuantizedOperandOfABatchedMatMul) {
  const LintReport r = lint(attention_graph(64, 64, /*quantize_k=*/false));
  const auto f = findings_of(r, "one-input-quantized");
  ASSERT_EQ(f.size(), 1u) << rules(r);
  EXPECT_EQ(f[0]->node, "/attn/MatMul");
  EXPECT_NE(f[0]->message.find("input 1 'k' is not"), std::string::npos) << f[0]->message;
  EXPECT_EQ(lint_node(r, "/attn/MatMul").reason, HighPrecisionReason::kUnfusable);
  EXPECT_EQ(lint_node(r, "/attn/MatMul_1").state, ComputeState::kQuantized);
}

TEST(LintRules, MixedOperandTypes) {
  OnnxBuilder b(19);
  b.input("x", kFloat, {1, 4, 8});
  b.output("y", kFloat);
  const std::string in = qdq(b, "x", "/fc/input_quantizer");
  b.initializer_raw<std::uint8_t>("w", kE4M3FN, std::vector<std::uint8_t>(8 * 16, 0x38), {8, 16});
  b.initializer("ws", {0.01f}, {});
  b.initializer_raw<std::uint8_t>("wz", kE4M3FN, {0}, {});
  b.node("DequantizeLinear", {"w", "ws", "wz"}, {"wd"}, "WDQ");
  b.node("MatMul", {in, "wd"}, {"y"}, "/fc/MatMul");
  const LintReport r = lint(b, 90);
  const auto f = findings_of(r, "mixed-formats");
  ASSERT_EQ(f.size(), 1u) << rules(r);
  EXPECT_EQ(r.nodes[0].format, "int8+fp8_e4m3fn");
  EXPECT_EQ(r.nodes[0].reason, HighPrecisionReason::kUnfusable);
}

TEST(LintRules, DqSharedWithAnOpThatHasNoInt8Kernel) {
  OnnxBuilder b(17);
  b.input("x", kFloat, {1, 4, 8});
  b.output("y", kFloat);
  b.output("n", kFloat);
  const std::string in = qdq(b, "x", "/fc/input_quantizer");
  b.node("MatMul", {in, weight_dq(b, "w", {8, 16}, 1)}, {"y"}, "/fc/MatMul");
  b.initializer("gamma", std::vector<float>(8, 1.0f), {8});
  b.node("LayerNormalization", {in, "gamma"}, {"n"}, "/norm/LayerNormalization");
  const LintReport r = lint(b);
  const auto f = findings_of(r, "shared-dq");
  ASSERT_EQ(f.size(), 1u) << rules(r);
  EXPECT_EQ(f[0]->node, "/fc/input_quantizer/DequantizeLinear");
  EXPECT_NE(
      f[0]->message.find("/fc/MatMul (MatMul) can fuse the DQ, /norm/LayerNormalization (LayerNormalization) cannot"),
      std::string::npos)
      << f[0]->message;
  EXPECT_TRUE(findings_of(r, "qdq-no-int8-op").empty());
  EXPECT_EQ(r.nodes[0].state, ComputeState::kQuantized);  // the MatMul itself still fuses
}

TEST(LintRules, QdqAroundAnOpWithoutInt8Kernel) {
  OnnxBuilder b(17);
  b.input("x", kFloat, {1, 4, 8});
  b.output("n", kFloat);
  const std::string in = qdq(b, "x", "/norm/input_quantizer");
  b.node("Transpose", {in}, {"t"}, "/norm/Transpose");  // looked through: data movement
  b.initializer("gamma", std::vector<float>(4, 1.0f), {4});
  b.node("LayerNormalization", {"t", "gamma"}, {"n"}, "/norm/LayerNormalization");
  const LintReport r = lint(b);
  const auto f = findings_of(r, "qdq-no-int8-op");
  ASSERT_EQ(f.size(), 1u) << rules(r);
  EXPECT_NE(f[0]->message.find("only feeds /norm/LayerNormalization (LayerNormalization), which has no INT8"),
            std::string::npos)
      << f[0]->message;
  EXPECT_TRUE(r.nodes.empty());
}

TEST(LintRules, Int8AttentionSequenceAndHeadSizeLimits) {
  EXPECT_TRUE(lint(attention_graph(512, 64)).findings.empty()) << rules(lint(attention_graph(512, 64)));
  EXPECT_TRUE(lint(attention_graph(77, 16)).findings.empty());
  const LintReport longer = lint(attention_graph(513, 64));
  const auto f = findings_of(longer, "attention-int8");
  ASSERT_EQ(f.size(), 2u) << rules(longer);  // BMM1 and BMM2
  EXPECT_EQ(f[0]->node, "/attn/MatMul");
  EXPECT_NE(f[0]->message.find(
                "INT8 attention BMM1 (Q K^T) (S_q 513, S_kv 513, head size 64): sequence length 513 exceeds 512"),
            std::string::npos)
      << f[0]->message;
  const LintReport head = lint(attention_graph(64, 40));
  ASSERT_EQ(findings_of(head, "attention-int8").size(), 2u) << rules(head);
  EXPECT_NE(head.findings[0].message.find("head size 40 is not 16, 32 or 64"), std::string::npos);
  EXPECT_EQ(lint_node(head, "/attn/MatMul").state, ComputeState::kQuantized);  // INT8, just not fused MHA
}

TEST(LintRules, Int8AttentionNeedsQdqAfterBmm2) {
  const LintReport r = lint(attention_graph(64, 64, true, /*quantize_out=*/false));
  const auto f = findings_of(r, "attention-int8-placement");
  ASSERT_EQ(f.size(), 1u) << rules(r);
  EXPECT_EQ(f[0]->node, "/attn/MatMul_1");
  EXPECT_TRUE(lint(attention_graph(64, 64)).findings.empty());
}

TEST(LintRules, AttentionChecksNeedOpsQevalCanInfer) {
  OnnxBuilder b = attention_graph(1024, 64);
  b.domain("custom", 1);
  b.proto().mutable_graph()->mutable_output(0)->set_name("plugin_out");
  b.node("MyPlugin", {"out"}, {"plugin_out"}, "/plugin", "custom");
  ImportOptions lenient;
  lenient.require_supported_ops = false;
  const auto bytes = b.bytes();
  const LintReport r = lint_graph(parse_onnx(bytes, "plugin.onnx", ".", lenient), {});
  const auto f = findings_of(r, "attention-shapes");
  ASSERT_EQ(f.size(), 1u) << rules(r);
  EXPECT_NE(f[0]->message.find("cannot infer shapes through custom::MyPlugin"), std::string::npos) << f[0]->message;
  EXPECT_TRUE(findings_of(r, "attention-int8").empty());
  EXPECT_EQ(r.count(ComputeState::kQuantized), 2);  // the rest of the lint still runs
}

TEST(LintRules, OnnxRuntimeOperatorFormatHasNoTensorRtImporter) {
  ImportOptions lenient;
  lenient.require_supported_ops = false;
  const Graph g = load_onnx(testing::data_dir() / "qdq/ort_qlinearconv_perchannel/model.onnx", lenient);
  const LintReport r = lint_graph(g, {});
  const auto f = findings_of(r, "qoperator-format");
  ASSERT_EQ(f.size(), 1u) << rules(r);
  EXPECT_EQ(f[0]->severity, Severity::kError);
  EXPECT_EQ(f[0]->op_type, "QLinearConv");
  EXPECT_TRUE(findings_of(r, "no-qdq").empty());
}

TEST(LintRules, ModelWithoutQdq) {
  const Graph g = testing::mini_unet_block().graph();
  const LintReport r = lint_graph(g, {});
  ASSERT_EQ(r.findings.size(), 1u) << rules(r);
  EXPECT_EQ(r.findings[0].rule, "no-qdq");
  EXPECT_EQ(r.count(ComputeState::kQuantized), 0);
  EXPECT_EQ(r.count(HighPrecisionReason::kExcluded), 2);  // conv_in, conv_out
  EXPECT_EQ(lint_node(r, "/block/conv1/Conv").detail,
            "category conv (level 1); the graph quantizes no Conv/MatMul/Gemm");
}

// ---- the command line -----------------------------------------------------------------------------

TEST(LintCli, ExitCodesTextAndJson) {
  testing::ScratchDir dir("lint-cli");
  const std::string int8 = (testing::data_dir() / "quant/unet_block_int8/quantized.onnx").string();
  auto r = testing::run_qeval("lint --model " + int8 + " --target sm75 --json " + (dir / "int8.json").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("0 errors, 0 warnings, 0 notes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Conv/MatMul/Gemm: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("15 quantized (int8 15)"), std::string::npos) << r.out;
  const auto j = testing::read_json(dir / "int8.json");
  EXPECT_EQ(j["schema_version"], 1);
  EXPECT_EQ(j["target"], "sm75");
  EXPECT_EQ(j["summary"]["quantized"], 15);
  EXPECT_EQ(j["summary"]["formats"]["int8"], 15);
  EXPECT_EQ(j["nodes"].size(), j["summary"]["compute_nodes"]);

  // An error-level finding: exit 1, and the JSON lists it.
  const Graph fp8 = quantized_unet_block(load_recipe(testing::source_dir() / "recipes/fp8-level3.json"));
  save_onnx(fp8, dir / "fp8.onnx");
  r = testing::run_qeval("lint --model " + (dir / "fp8.onnx").string() + " --target sm86 --json " +
                         (dir / "fp8.json").string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("error   fp8-target"), std::string::npos) << r.out;
  EXPECT_EQ(testing::read_json(dir / "fp8.json")["findings"][0]["rule"], "fp8-target");
  EXPECT_EQ(testing::run_qeval("lint --model " + (dir / "fp8.onnx").string() + " --target sm90").code, 0);

  // Bad input: exit 2.
  r = testing::run_qeval("lint --model " + (dir / "missing.onnx").string());
  EXPECT_EQ(r.code, 2) << r.out;
  r = testing::run_qeval("lint --model " + int8 + " --target sm70");
  EXPECT_EQ(r.code, 2) << r.out;
  r = testing::run_qeval("lint --model " + int8 + " --shape nosuch=1,2");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("the model has no input named 'nosuch'"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace qeval::eval::quant
