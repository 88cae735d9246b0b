// Q/DQ fusion: which patterns fuse (TensorRT's: DQ(int8 activation) and DQ(int8 weight) into Conv,
// MatMul, Gemm), that the fused node keeps its name and outputs, that fused results equal the
// exact integer computation, differ from the unfused float path only by float rounding, and agree
// with ONNX Runtime on a hand-built QDQ model within one quantization step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "../onnx_builder.h"
#include "datasets/npy.h"
#include "eval/exec/onnx_import.h"
#include "eval/exec/qdq_fusion.h"
#include "eval/exec/session.h"
#include "kernels/numeric.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

using testing::OnnxBuilder;
constexpr int kF32 = onnx::TensorProto::FLOAT;
constexpr int kI8 = onnx::TensorProto::INT8;
constexpr int kU8 = onnx::TensorProto::UINT8;

std::vector<float> normal(std::size_t n, unsigned seed, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
std::vector<std::int8_t> int8s(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-128, 127);
  std::vector<std::int8_t> v(n);
  for (auto& x : v) x = std::int8_t(d(rng));
  return v;
}
Tensor tensor(const Shape& shape, const std::vector<float>& v) { return testing::floats(shape, v); }

void add_int_attr(onnx::NodeProto& n, const std::string& name, std::int64_t v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}
void add_ints_attr(onnx::NodeProto& n, const std::string& name, const std::vector<std::int64_t>& v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (auto x : v) a->add_ints(x);
}

// x [1, C, H, W] -> Q/DQ (int8, scale sx) -> Conv(W = DQ(int8 per-channel), B, pads 1) -> y.
struct ConvCase {
  std::int64_t c = 5, m = 6, h = 9, w = 7;
  float sx = 0.03f;
  std::vector<std::int8_t> wq;
  std::vector<float> sw, bias;
  Graph graph;
};

ConvCase conv_case(unsigned seed) {
  ConvCase k;
  k.wq = int8s(std::size_t(k.m * k.c * 9), seed);
  k.wq[0] = -128;
  k.sw = normal(std::size_t(k.m), seed + 1, 0.002f);
  for (auto& s : k.sw) s = std::fabs(s) + 0.001f;
  k.bias = normal(std::size_t(k.m), seed + 2, 0.1f);
  OnnxBuilder b(13);
  b.input("x", kF32, {1, k.c, k.h, k.w}).output("y", kF32);
  b.node("QuantizeLinear", {"x", "sx", "zx"}, {"xq"}, "x_q");
  b.node("DequantizeLinear", {"xq", "sx", "zx"}, {"xd"}, "x_dq");
  add_int_attr(b.node("DequantizeLinear", {"wq", "sw"}, {"wd"}, "w_dq"), "axis", 0);
  add_ints_attr(b.node("Conv", {"xd", "wd", "bias"}, {"y"}, "conv1"), "pads", {1, 1, 1, 1});
  b.initializer("sx", {k.sx}, {});
  b.initializer_raw<std::int8_t>("zx", kI8, {0}, {});
  b.initializer_raw<std::int8_t>("wq", kI8, k.wq, {k.m, k.c, 3, 3});
  b.initializer("sw", k.sw, {k.m});
  b.initializer("bias", k.bias, {k.m});
  k.graph = b.graph();
  return k;
}

// Records the nodes an observer sees.
class NameRecorder : public Observer {
 public:
  void on_node(const NodeEvent& e) override { names.push_back(e.node.name + ":" + e.node.op_type); }
  std::vector<std::string> names;
};

TEST(QdqFusion, ConvKeepsItsNameAndOutputsAndDropsTheDqNodes) {
  ConvCase k = conv_case(1);
  Session s(k.graph);
  ASSERT_EQ(s.fused_nodes().size(), 1u);
  EXPECT_EQ(s.fused_nodes()[0].name, "conv1");
  EXPECT_EQ(s.fused_nodes()[0].removed, (std::vector<std::string>{"x_dq", "w_dq"}));
  NameRecorder rec;
  s.run({{"x", tensor({1, k.c, k.h, k.w}, normal(std::size_t(k.c * k.h * k.w), 3, 1.0f))}}, &rec);
  EXPECT_EQ(rec.names, (std::vector<std::string>{"x_q:QuantizeLinear", "conv1:Conv"}));
  EXPECT_EQ(s.nodes().back().domain, quant::kFusedDomain);
  EXPECT_EQ(s.nodes().back().outputs, (std::vector<std::string>{"y"}));
  // Off: every node runs as written.
  Session plain(k.graph, SessionOptions{Precision::kFp32, false});
  EXPECT_TRUE(plain.fused_nodes().empty());
  EXPECT_EQ(plain.nodes().size(), 4u);
}

TEST(QdqFusion, FusedConvEqualsTheExactIntegerComputation) {
  ConvCase k = conv_case(7);
  const auto xv = normal(std::size_t(k.c * k.h * k.w), 8, 1.5f);
  Session s(k.graph);
  const Tensor y = s.run({{"x", tensor({1, k.c, k.h, k.w}, xv)}}).at("y");
  // The reference: quantize x as QuantizeLinear does, sum int products in int64, rescale with the
  // fused op's formula float(acc) * (sx * sw) + b.
  std::vector<std::int32_t> xq(xv.size());
  for (std::size_t i = 0; i < xv.size(); ++i) xq[i] = quantize_int8(xv[i], k.sx, 0);
  const float* py = y.data<float>();
  for (std::int64_t oc = 0; oc < k.m; ++oc)
    for (std::int64_t oh = 0; oh < k.h; ++oh)
      for (std::int64_t ow = 0; ow < k.w; ++ow) {
        std::int64_t acc = 0;
        for (std::int64_t c = 0; c < k.c; ++c)
          for (std::int64_t kh = 0; kh < 3; ++kh)
            for (std::int64_t kw = 0; kw < 3; ++kw) {
              const std::int64_t ih = oh - 1 + kh, iw = ow - 1 + kw;
              if (ih < 0 || ih >= k.h || iw < 0 || iw >= k.w) continue;
              acc += std::int64_t(xq[std::size_t((c * k.h + ih) * k.w + iw)]) *
                     k.wq[std::size_t(((oc * k.c + c) * 3 + kh) * 3 + kw)];
            }
        // Multiply, then add, each rounded (kernels::Int8Epilogue: no fused multiply-add).
        const volatile float product = float(acc) * (k.sx * k.sw[std::size_t(oc)]);
        const float want = product + k.bias[std::size_t(oc)];
        ASSERT_EQ(py[(oc * k.h + oh) * k.w + ow], want) << "oc " << oc << " (" << oh << ", " << ow << ")";
      }
}

// The fused ops keep what they derive from constant scales and zero points (per-channel
// multipliers, zero-point vectors) across runs; scales computed at run time (DynamicQuantizeLinear's,
// ONNX Runtime's dynamic INT8 form) change from run to run and must be read afresh every time: a
// session run on inputs of other ranges gives what a fresh session gives, bit for bit, for the
// fused Conv (constant activation scale) and the fused MatMul (run-time scale and zero point).
TEST(QdqFusion, FusedOpsRunAgainWithOtherRunTimeScalesGiveAFreshSessionsBytes) {
  ConvCase k = conv_case(17);
  OnnxBuilder b(13);
  b.input("x", kF32, {3, 8}).output("y", kF32);
  b.node("DynamicQuantizeLinear", {"x"}, {"xq", "xs", "xz"}, "x_q");
  b.node("DequantizeLinear", {"xq", "xs", "xz"}, {"xd"}, "x_dq");
  b.node("DequantizeLinear", {"wq", "sw", "zw"}, {"wd"}, "w_dq");
  b.node("MatMul", {"xd", "wd"}, {"y"}, "mm");
  b.initializer_raw<std::int8_t>("wq", kI8, int8s(8 * 5, 18), {8, 5});
  b.initializer("sw", {0.02f}, {});
  b.initializer_raw<std::int8_t>("zw", kI8, {0}, {});
  const Graph mm = b.graph();
  Session conv_session(k.graph), mm_session(mm);
  for (float spread : {1.0f, 40.0f, 0.05f, 3.0f}) {
    const Tensor x = tensor({1, k.c, k.h, k.w}, normal(std::size_t(k.c * k.h * k.w), 19, spread));
    const Tensor a = tensor({3, 8}, normal(24, 20, spread));
    Session fresh_conv(k.graph), fresh_mm(mm);
    const Tensor yc = conv_session.run({{"x", x}}).at("y"), want_c = fresh_conv.run({{"x", x}}).at("y");
    const Tensor ym = mm_session.run({{"x", a}}).at("y"), want_m = fresh_mm.run({{"x", a}}).at("y");
    ASSERT_EQ(std::memcmp(yc.raw(), want_c.raw(), std::size_t(yc.numel()) * 4), 0) << "conv, spread " << spread;
    ASSERT_EQ(std::memcmp(ym.raw(), want_m.raw(), std::size_t(ym.numel()) * 4), 0) << "matmul, spread " << spread;
  }
  // The MatMul did fuse (its scale is DynamicQuantizeLinear's): the unfused float path differs.
  NameRecorder rec;
  mm_session.run({{"x", tensor({3, 8}, normal(24, 21, 1.0f))}}, &rec);
  EXPECT_NE(std::find(rec.names.begin(), rec.names.end(), "mm:MatMul"), rec.names.end());
  EXPECT_EQ(std::find(rec.names.begin(), rec.names.end(), "w_dq:DequantizeLinear"), rec.names.end());
}

// Fused vs unfused: the float path sums the same dequantized products with float rounding; the
// difference is bounded by k float ulps of the sum of |products|.
void expect_within_float_rounding(const Tensor& fused, const Tensor& plain, double sum_abs_bound, std::int64_t k) {
  ASSERT_EQ(fused.shape(), plain.shape());
  const double tol = double(k) * 1.2e-7 * sum_abs_bound;
  double max_diff = 0;
  int differ = 0;
  for (std::int64_t i = 0; i < fused.numel(); ++i) {
    const double d = std::fabs(double(fused.data<float>()[i]) - double(plain.data<float>()[i]));
    max_diff = std::max(max_diff, d);
    differ += d > 0;
  }
  EXPECT_LE(max_diff, tol) << differ << " of " << fused.numel() << " elements differ";
}

TEST(QdqFusion, FusedConvMatchesTheFloatPathWithinFloatRounding) {
  ConvCase k = conv_case(11);
  const Tensor x = tensor({1, k.c, k.h, k.w}, normal(std::size_t(k.c * k.h * k.w), 12, 1.0f));
  Session fused(k.graph), plain(k.graph, SessionOptions{Precision::kFp32, false});
  const Tensor yf = fused.run({{"x", x}}).at("y"), yp = plain.run({{"x", x}}).at("y");
  double max_sw = 0;
  for (float s : k.sw) max_sw = std::max(max_sw, double(s));
  // Every product is at most 128 * 128 * sx * sw.
  const std::int64_t kk = k.c * 9;
  expect_within_float_rounding(yf, yp, double(kk) * 128 * 128 * k.sx * max_sw, kk);
}

TEST(QdqFusion, MatMulGemmAndUint8ActivationsFuseAndMatchTheFloatPath) {
  // A [2, 3, 40] uint8 (zero point 131) x W [40, 12] int8 per column; Gemm transB with C; a
  // MatMul of two activations.
  OnnxBuilder b(13);
  b.input("a", kF32, {2, 3, 40}).input("g", kF32, {5, 40}).input("r", kF32, {40, 6});
  b.output("mm", kF32).output("gemm", kF32).output("aa", kF32).output("ar", kF32);
  b.node("QuantizeLinear", {"a", "sa", "za"}, {"aq"}, "a_q");
  b.node("DequantizeLinear", {"aq", "sa", "za"}, {"ad"}, "a_dq");
  add_int_attr(b.node("DequantizeLinear", {"wq", "sw"}, {"wd"}, "w_dq"), "axis", 1);
  b.node("MatMul", {"ad", "wd"}, {"mm"}, "matmul");
  b.node("QuantizeLinear", {"g", "sg"}, {"gq"}, "g_q");  // uint8, no zero point input
  b.node("DequantizeLinear", {"gq", "sg"}, {"gd"}, "g_dq");
  add_int_attr(b.node("DequantizeLinear", {"vq", "sv"}, {"vd"}, "v_dq"), "axis", 0);
  auto& gemm = b.node("Gemm", {"gd", "vd", "c"}, {"gemm"}, "gemm");
  add_int_attr(gemm, "transB", 1);
  b.node("QuantizeLinear", {"a", "sa2"}, {"aq2"}, "a_q2");
  b.node("DequantizeLinear", {"aq2", "sa2"}, {"ad2"}, "a_dq2");
  // An activation operand behind a float op: not fused.
  add_ints_attr(b.node("Transpose", {"ad2"}, {"at"}, "transpose"), "perm", {0, 2, 1});
  b.node("MatMul", {"ad", "at"}, {"aa"}, "self_matmul");
  // Two quantized activations (B packed on every run).
  b.node("QuantizeLinear", {"r", "sr", "zr"}, {"rq"}, "r_q");
  b.node("DequantizeLinear", {"rq", "sr", "zr"}, {"rd"}, "r_dq");
  b.node("MatMul", {"ad", "rd"}, {"ar"}, "act_matmul");
  b.initializer("sa", {0.02f}, {});
  b.initializer_raw<std::uint8_t>("za", kU8, {131}, {});
  b.initializer_raw<std::int8_t>("wq", kI8, int8s(40 * 12, 21), {40, 12});
  std::vector<float> sw = normal(12, 22, 0.004f);
  for (auto& s : sw) s = std::fabs(s) + 0.001f;
  b.initializer("sw", sw, {12});
  b.initializer("sg", {0.015f}, {});
  b.initializer_raw<std::int8_t>("vq", kI8, int8s(7 * 40, 23), {7, 40});
  std::vector<float> sv = normal(7, 24, 0.004f);
  for (auto& s : sv) s = std::fabs(s) + 0.001f;
  b.initializer("sv", sv, {7});
  b.initializer("c", normal(7, 25, 0.5f), {7});
  b.initializer("sa2", {0.05f}, {});
  b.initializer("sr", {0.03f}, {});
  b.initializer_raw<std::int8_t>("zr", kI8, {-4}, {});
  Graph g = b.graph();
  Session fused(g), plain(g, SessionOptions{Precision::kFp32, false});
  std::vector<std::string> names;
  for (const auto& f : fused.fused_nodes()) names.push_back(f.name);
  EXPECT_EQ(names, (std::vector<std::string>{"matmul", "gemm", "act_matmul"}));
  std::map<std::string, Tensor> in{{"a", tensor({2, 3, 40}, normal(240, 26, 1.0f))},
                                   {"g", tensor({5, 40}, normal(200, 27, 1.0f))},
                                   {"r", tensor({40, 6}, normal(240, 28, 1.0f))}};
  auto yf = fused.run(in), yp = plain.run(in);
  expect_within_float_rounding(yf.at("mm"), yp.at("mm"), 40.0 * 255 * 128 * 0.02 * 0.005, 40);
  expect_within_float_rounding(yf.at("gemm"), yp.at("gemm"), 40.0 * 255 * 128 * 0.015 * 0.005 + 2, 40);
  expect_within_float_rounding(yf.at("ar"), yp.at("ar"), 40.0 * 255 * 132 * 0.02 * 0.03, 40);
  // A second run with new activations: runtime B operands are repacked (the pool reuses buffers,
  // so a cache keyed on addresses would return the first run's B).
  in["r"] = tensor({40, 6}, normal(240, 29, 2.0f));
  in["a"] = tensor({2, 3, 40}, normal(240, 30, 0.5f));
  yf = fused.run(in);
  yp = plain.run(in);
  expect_within_float_rounding(yf.at("ar"), yp.at("ar"), 40.0 * 255 * 132 * 0.02 * 0.03, 40);
  expect_within_float_rounding(yf.at("mm"), yp.at("mm"), 40.0 * 255 * 128 * 0.02 * 0.005, 40);
  // self_matmul reads a fused DQ's output and a float op's: it runs unfused, identically.
  ASSERT_EQ(yf.at("aa").nbytes(), yp.at("aa").nbytes());
  EXPECT_EQ(std::memcmp(yf.at("aa").raw(), yp.at("aa").raw(), yf.at("aa").nbytes()), 0);
}

TEST(QdqFusion, Float8OperandsRunUnfusedWithE4M3RoundedValues) {
  // FP8 (E4M3FN zero points): E4M3-rounded values with float accumulation, the unfused path.
  OnnxBuilder b(19);
  b.input("x", kF32, {2, 8}).output("y", kF32);
  b.node("QuantizeLinear", {"x", "s", "z"}, {"xq"}, "x_q");
  b.node("DequantizeLinear", {"xq", "s", "z"}, {"xd"}, "x_dq");
  b.node("DequantizeLinear", {"wq", "s", "z"}, {"wd"}, "w_dq");
  b.node("MatMul", {"xd", "wd"}, {"y"}, "fp8_matmul");
  b.initializer("s", {0.5f}, {});
  b.initializer_raw<std::uint8_t>("z", 17, {0}, {});
  b.initializer_raw<std::uint8_t>("wq", 17, std::vector<std::uint8_t>(8 * 3, 0x38), {8, 3});  // 1.0
  Graph g = b.graph();
  Session s(g);
  EXPECT_TRUE(s.fused_nodes().empty());
  auto y = s.run({{"x", tensor({2, 8}, {1, 2, 3, 4, 5, 6, 7, 8, 0.3f, 0, 0, 0, 0, 0, 0, 1000})}}).at("y");
  // Row 0: E4M3(x / 0.5) * 0.5 = x exactly, times w = 0.5: sum 36 * 0.5; row 1: 0.3 -> 0.3125, 1000 -> 448*0.5.
  EXPECT_EQ(y.data<float>()[0], 18.0f);
  EXPECT_EQ(y.data<float>()[3], (0.3125f + 224.0f) * 0.5f);
}

// The committed ORT outputs of tools/make_qdq_references.py's qdq_conv_matmul_* models (ORT runs DQ
// -> float Conv/MatMul as written): qeval's fused run agrees within one step of the output scale.
TEST(QdqFusion, HandBuiltQdqModelsAgreeWithOnnxRuntimeWithinOneStep) {
  for (const char* name : {"qdq_conv_matmul_s8", "qdq_conv_matmul_u8"}) {
    SCOPED_TRACE(name);
    const auto dir = testing::data_dir() / "qdq" / name;
    Graph g = load_onnx(dir / "model.onnx");
    Session s(g);
    std::vector<std::string> fused;
    for (const auto& f : s.fused_nodes()) fused.push_back(f.name);
    EXPECT_EQ(fused, (std::vector<std::string>{"conv1", "fc"}));
    const Tensor y = s.run({{"x", datasets::read_npy(dir / "inputs" / "x.npy")}}).at("y");
    const Tensor want = datasets::read_npy(dir / "outputs" / "y.npy");
    ASSERT_EQ(y.shape(), want.shape());
    const float step = 0.01f;  // the output's scale
    int equal = 0;
    for (std::int64_t i = 0; i < y.numel(); ++i) {
      const float d = std::fabs(y.data<float>()[i] - want.data<float>()[i]);
      EXPECT_LE(d, step * 1.0001f) << "element " << i;
      equal += d == 0;
    }
    EXPECT_GE(equal, y.numel() * 9 / 10) << "fewer than 90% of outputs identical";
  }
}

TEST(QdqFusion, InspectAndInferSayWhatRunsOnInt8Kernels) {
  const auto model = testing::data_dir() / "qdq" / "qdq_conv_matmul_s8" / "model.onnx";
  auto inspect = testing::run_qeval("inspect --model " + model.string());
  EXPECT_EQ(inspect.code, 0) << inspect.out;
  EXPECT_NE(inspect.out.find("integer execution (Q/DQ fusion): 2 nodes"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("conv1 (Conv), replaces x_dq, w1_dq"), std::string::npos) << inspect.out;
  testing::ScratchDir dir("qdq-infer");
  const std::string args = "infer --model " + model.string() + " --inputs " +
                           (model.parent_path() / "inputs").string() + " --out " + (dir / "out").string();
  auto fused = testing::run_qeval(args);
  EXPECT_EQ(fused.code, 0) << fused.out;
  EXPECT_NE(fused.out.find("int8 kernels (Q/DQ fusion) for 2 nodes: conv1, fc"), std::string::npos) << fused.out;
  auto plain = testing::run_qeval(args + " --float-qdq");
  EXPECT_EQ(plain.code, 0) << plain.out;
  EXPECT_EQ(plain.out.find("Q/DQ fusion"), std::string::npos) << plain.out;
}

}  // namespace
}  // namespace qeval::eval
