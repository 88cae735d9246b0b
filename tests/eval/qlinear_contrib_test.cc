// ONNX Runtime's com.microsoft QLinear ops (eval/exec/ops/qlinear_contrib.cc, QGemm in qlinear.cc)
// against hand-computed values, ties and saturation included, and their bad-input errors naming node
// and tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "eval/exec/session.h"
#include "kernels/error.h"
#include "onnx_builder.h"

namespace qeval::eval {
namespace {

using testing::OnnxBuilder;

constexpr int kI8 = onnx::TensorProto::INT8;
constexpr int kU8 = onnx::TensorProto::UINT8;
constexpr const char* kMs = "com.microsoft";

template <class T>
Tensor bytes(const Shape& shape, const std::vector<T>& v) {
  Tensor t(sizeof(T) == 1 && std::is_signed_v<T> ? DType::kInt8 : DType::kUInt8, shape);
  std::memcpy(t.raw(), v.data(), v.size());
  return t;
}
template <class T>
std::vector<int> values(const Tensor& t) {
  std::vector<int> v;
  for (std::int64_t i = 0; i < t.numel(); ++i) v.push_back(int(t.data<T>()[i]));
  return v;
}

// A scale `name` and its 8-bit zero point `name`_zp.
void params(OnnxBuilder& b, const std::string& name, float scale, int zp, int type = kU8) {
  b.initializer(name, {scale}, {});
  if (type == kU8) b.initializer_raw<std::uint8_t>(name + "_zp", kU8, {std::uint8_t(zp)}, {});
  else b.initializer_raw<std::int8_t>(name + "_zp", kI8, {std::int8_t(zp)}, {});
}

// A graph with one com.microsoft node `op` named "qnode" on inputs a (and b), output y.
Graph binary(const std::string& op, const Shape& a, const Shape& b, float sa, int za, float sb, int zb, float sc,
             int zc, int type = kU8) {
  OnnxBuilder g(13);
  g.domain(kMs, 1);
  g.input("a", type, a).input("b", type, b).output("y", type);
  g.node(op, {"a", "sa", "sa_zp", "b", "sb", "sb_zp", "sc", "sc_zp"}, {"y"}, "qnode", kMs);
  params(g, "sa", sa, za, type);
  params(g, "sb", sb, zb, type);
  params(g, "sc", sc, zc, type);
  return g.graph();
}

std::vector<int> run_u8(const Graph& g, const std::map<std::string, Tensor>& in) {
  Session s(g);
  return values<std::uint8_t>(s.run(in).at("y"));
}

TEST(QLinearContrib, AddRoundsAfterTheZeroPointAndSaturates) {
  // a' = 0.5 (a - 10), b' = 0.25 (b - 20); c = saturate(round_half_even((a' + b') / 0.5 + 5)).
  // Element 2: (2.5 + 0.25) / 0.5 + 5 = 10.5 -> 10; element 4: (-5 + 58.75) / 0.5 + 5 = 112.5 -> 112
  // (ORT rounds after adding the zero point: round(107.5) + 5 would give 113).
  const Graph g = binary("QLinearAdd", {7}, {7}, 0.5f, 10, 0.25f, 20, 0.5f, 5);
  const auto y = run_u8(g, {{"a", bytes<std::uint8_t>({7}, {10, 12, 15, 255, 0, 255, 0})},
                            {"b", bytes<std::uint8_t>({7}, {20, 24, 21, 0, 255, 255, 0})}});
  EXPECT_EQ(y, (std::vector<int>{5, 9, 10, 240, 112, 255, 0}));
}

TEST(QLinearContrib, AddBroadcastsAPerChannelOperand) {
  // B [2, 1] against A [2, 3]: b' = 1 for row 0, -1 for row 1.
  const Graph g = binary("QLinearAdd", {2, 3}, {2, 1}, 0.5f, 10, 0.25f, 20, 0.5f, 5);
  const auto y = run_u8(
      g, {{"a", bytes<std::uint8_t>({2, 3}, {10, 12, 15, 10, 12, 0})}, {"b", bytes<std::uint8_t>({2, 1}, {24, 16})}});
  // row 0: (a' + 1) / 0.5 + 5 = [7, 9, 12]; row 1: (a' - 1) / 0.5 + 5 = [3, 5, -15 -> 0]
  EXPECT_EQ(y, (std::vector<int>{7, 9, 12, 3, 5, 0}));
}

TEST(QLinearContrib, MulOfUint8AndInt8) {
  // (a - 10)(b - 20) * (0.5 * 0.25 / 0.25) + 3: [0, 8, 5, 245 * 235, 200] * 0.5 + 3
  // = [3, 7, 5.5 -> 6, saturated, 103].
  const Graph g = binary("QLinearMul", {5}, {5}, 0.5f, 10, 0.25f, 20, 0.25f, 3);
  EXPECT_EQ(run_u8(g, {{"a", bytes<std::uint8_t>({5}, {10, 12, 15, 255, 0})},
                       {"b", bytes<std::uint8_t>({5}, {20, 24, 21, 255, 0})}}),
            (std::vector<int>{3, 7, 6, 255, 103}));
  // int8: (a + 1)(b - 2) * (0.5 * 0.5 / 1) - 4 = [0, 4 * 2, -3 * 5, 128 * -130] / 4 - 4 = [-4, -2, -7.75 -> -8, -128]
  const Graph s = binary("QLinearMul", {4}, {4}, 0.5f, -1, 0.5f, 2, 1.0f, -4, kI8);
  Session session(s);
  const Tensor y =
      session.run({{"a", bytes<std::int8_t>({4}, {-1, 3, -4, 127})}, {"b", bytes<std::int8_t>({4}, {2, 4, 7, -128})}})
          .at("y");
  EXPECT_EQ(values<std::int8_t>(y), (std::vector<int>{-4, -2, -8, -128}));
}

Graph unary(const std::string& op, const Shape& shape, float sx, int zx, float sy, int zy, float alpha = -1,
            int type = kU8) {
  OnnxBuilder g(13);
  g.domain(kMs, 1);
  g.input("a", type, shape).output("y", type);
  auto& n = g.node(op, {"a", "sx", "sx_zp", "sy", "sy_zp"}, {"y"}, "qnode", kMs);
  if (alpha >= 0) {
    auto* attr = n.add_attribute();
    attr->set_name("alpha");
    attr->set_type(onnx::AttributeProto::FLOAT);
    attr->set_f(alpha);
  }
  params(g, "sx", sx, zx, type);
  params(g, "sy", sy, zy, type);
  return g.graph();
}

TEST(QLinearContrib, SigmoidAndLeakyReluByTable) {
  // x' = 0.1 (x - 128): sigmoid [0, 1, -1, 12.7, -12.8] * 256 = [128, 187.1, 68.9, 255.99, 0.0007]
  EXPECT_EQ(run_u8(unary("QLinearSigmoid", {5}, 0.1f, 128, 1.0f / 256, 0),
                   {{"a", bytes<std::uint8_t>({5}, {128, 138, 118, 255, 0})}}),
            (std::vector<int>{128, 187, 69, 255, 0}));
  // x' = 0.5 (x - 100) = [0, 2, -5, -50]; alpha 0.1: [0, 2, -0.5, -5] / 0.25 + 50
  EXPECT_EQ(run_u8(unary("QLinearLeakyRelu", {4}, 0.5f, 100, 0.25f, 50, 0.1f),
                   {{"a", bytes<std::uint8_t>({4}, {100, 104, 90, 0})}}),
            (std::vector<int>{50, 58, 48, 30}));
  // int8 codes index the table by their byte: x' = 0.5 (x + 2) = [-1, 0.5, 64.5]; alpha 0.5 -> / 0.5
  const Graph int8 = unary("QLinearLeakyRelu", {3}, 0.5f, -2, 0.5f, 0, 0.5f, kI8);
  Session s(int8);
  EXPECT_EQ(values<std::int8_t>(s.run({{"a", bytes<std::int8_t>({3}, {-4, -1, 127})}}).at("y")),
            (std::vector<int>{-1, 1, 127}));
}

TEST(QLinearContrib, GlobalAveragePoolSumsExactlyAndRoundsHalfToEven) {
  // Channel 0: (10 + 11 + 12 + 13 - 4 * 10) * 0.5 / (0.25 * 4) = 3 -> 6; channel 1: 41 * 0.5 = 20.5 -> 20 -> 23.
  const Graph g = unary("QLinearGlobalAveragePool", {1, 2, 2, 2}, 0.5f, 10, 0.25f, 3);
  Session s(g);
  const Tensor y = s.run({{"a", bytes<std::uint8_t>({1, 2, 2, 2}, {10, 11, 12, 13, 20, 20, 20, 21})}}).at("y");
  EXPECT_EQ(y.shape(), (Shape{1, 2, 1, 1}));
  EXPECT_EQ(values<std::uint8_t>(y), (std::vector<int>{6, 23}));
}

TEST(QLinearContrib, AveragePoolSumsDequantizedValuesAndRoundsAfterTheZeroPoint) {
  // x' = 0.5 (x - 10) = [[0, 1, 2], [3, 4, 5], [6, 7, 8]]; y = v / 0.25 + 3.
  auto build = [](std::vector<std::int64_t> pads, std::int64_t stride, std::int64_t include_pad) {
    OnnxBuilder g(13);
    g.domain(kMs, 1);
    g.input("a", kU8, {1, 1, 3, 3}).output("y", kU8);
    auto& n = g.node("QLinearAveragePool", {"a", "sx", "sx_zp", "sy", "sy_zp"}, {"y"}, "qnode", kMs);
    auto ints = [&](const char* name, std::vector<std::int64_t> v) {
      auto* attr = n.add_attribute();
      attr->set_name(name);
      attr->set_type(onnx::AttributeProto::INTS);
      for (auto x : v) attr->add_ints(x);
    };
    ints("kernel_shape", {2, 2});
    ints("pads", pads);
    ints("strides", {stride, stride});
    auto* attr = n.add_attribute();
    attr->set_name("count_include_pad");
    attr->set_type(onnx::AttributeProto::INT);
    attr->set_i(include_pad);
    params(g, "sx", 0.5f, 10);
    params(g, "sy", 0.25f, 3);
    return g.graph();
  };
  const std::map<std::string, Tensor> in{
      {"a", bytes<std::uint8_t>({1, 1, 3, 3}, {10, 12, 14, 16, 18, 20, 22, 24, 26})}};
  // 2x2 windows, stride 1: means 2, 3, 5, 6.
  EXPECT_EQ(run_u8(build({0, 0, 0, 0}, 1, 0), in), (std::vector<int>{11, 15, 23, 27}));
  // Padded by 1, stride 2: windows {0}, {1, 2}, {3, 6}, {4, 5, 7, 8}; means over what is inside
  // (0, 1.5, 4.5, 6) or over the kernel's 4 (0, 0.75, 2.25, 6).
  EXPECT_EQ(run_u8(build({1, 1, 1, 1}, 2, 0), in), (std::vector<int>{3, 9, 21, 27}));
  EXPECT_EQ(run_u8(build({1, 1, 1, 1}, 2, 1), in), (std::vector<int>{3, 6, 12, 27}));
}

TEST(QLinearContrib, ConcatCopiesOrRequantizesEachInput) {
  OnnxBuilder g(13);
  g.domain(kMs, 1);
  g.input("a", kU8, {1, 2}).input("b", kU8, {1, 2}).output("y", kU8);
  auto& n = g.node("QLinearConcat", {"sy", "sy_zp", "a", "sa", "sa_zp", "b", "sb", "sb_zp"}, {"y"}, "qnode", kMs);
  auto* axis = n.add_attribute();
  axis->set_name("axis");
  axis->set_type(onnx::AttributeProto::INT);
  axis->set_i(1);
  params(g, "sy", 0.5f, 0);
  params(g, "sa", 0.5f, 0);   // the output's: copied
  params(g, "sb", 0.25f, 8);  // b' = 0.25 (b - 8) = [0, 1.25] -> / 0.5 = [0, 2.5 -> 2]
  const Graph graph = g.graph();
  Session s(graph);
  const Tensor y =
      s.run({{"a", bytes<std::uint8_t>({1, 2}, {3, 4})}, {"b", bytes<std::uint8_t>({1, 2}, {8, 13})}}).at("y");
  EXPECT_EQ(y.shape(), (Shape{1, 4}));
  EXPECT_EQ(values<std::uint8_t>(y), (std::vector<int>{3, 4, 0, 2}));
}

TEST(QLinearContrib, QGemmSumsExactlyAddsTheInt32BiasAndRequantizes) {
  // a - za = [2, 4]; B given transposed (n x k) [[1, 2], [3, -4]]; C = [4, -8]:
  // acc = [4 + 2 + 8, -8 + 6 - 16] = [14, -18], times 0.5 * 0.25 / 0.25 = [7, -9], + 128.
  auto build = [](bool quantized_output) {
    OnnxBuilder g(13);
    g.domain(kMs, 1);
    g.input("a", kU8, {1, 2}).output("y", quantized_output ? kU8 : onnx::TensorProto::FLOAT);
    std::vector<std::string> in{"a", "sa", "sa_zp", "w", "sw", "sw_zp", "c"};
    if (quantized_output) in.insert(in.end(), {"sy", "sy_zp"});
    auto& n = g.node("QGemm", in, {"y"}, "qnode", kMs);
    auto* t = n.add_attribute();
    t->set_name("transB");
    t->set_type(onnx::AttributeProto::INT);
    t->set_i(1);
    params(g, "sa", 0.5f, 10);
    params(g, "sw", 0.25f, 0, kI8);
    params(g, "sy", 0.25f, 128);
    g.initializer_raw<std::int8_t>("w", kI8, {1, 2, 3, -4}, {2, 2});
    g.initializer_raw<std::int32_t>("c", onnx::TensorProto::INT32, {4, -8}, {2});
    return g.graph();
  };
  const Tensor a = bytes<std::uint8_t>({1, 2}, {12, 14});
  EXPECT_EQ(run_u8(build(true), {{"a", a}}), (std::vector<int>{135, 119}));
  const Graph f = build(false);  // no y_scale: float acc * 0.5 * 0.25
  Session s(f);
  const Tensor y = s.run({{"a", a}}).at("y");
  ASSERT_EQ(y.dtype(), DType::kFloat32);
  EXPECT_EQ(y.data<float>()[0], 1.75f);
  EXPECT_EQ(y.data<float>()[1], -2.25f);
}

TEST(QLinearContrib, SoftmaxOfCodesAsOnnxRuntimeComputesIt) {
  // x' = 0.1 (x - zx): the zero point cancels. Weights 1, 1, e^-1 over their sum, times
  // floor(1 / y_scale) = 256: [108.11, 108.11, 39.77] -> [108, 108, 40]; y_scale 1/255 would give
  // floor(255.00001) = 255.
  OnnxBuilder g(13);
  g.domain(kMs, 1);
  g.input("a", kU8, {2, 3}).output("y", kU8);
  auto& n = g.node("QLinearSoftmax", {"a", "sx", "sx_zp", "sy", "sy_zp"}, {"y"}, "qnode", kMs);
  for (const auto& [name, v] : std::vector<std::pair<const char*, int>>{{"opset", 13}, {"axis", -1}}) {
    auto* attr = n.add_attribute();
    attr->set_name(name);
    attr->set_type(onnx::AttributeProto::INT);
    attr->set_i(v);
  }
  params(g, "sx", 0.1f, 77);
  params(g, "sy", 1.0f / 256, 0);
  // Row 1: equal codes share 256 three ways (85.33 -> 85).
  EXPECT_EQ(run_u8(g.graph(), {{"a", bytes<std::uint8_t>({2, 3}, {200, 200, 190, 40, 40, 40})}}),
            (std::vector<int>{108, 108, 40, 85, 85, 85}));
}

std::string error_of(const Graph& g, const std::map<std::string, Tensor>& in) {
  try {
    Session s(g);
    s.run(in);
  } catch (const UnsupportedError& e) {
    return std::string("unsupported: ") + e.what();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(QLinearContrib, BadScalesAndZeroPointsAreInputErrorsNamingNodeAndTensor) {
  const std::map<std::string, Tensor> in{{"a", bytes<std::uint8_t>({2}, {1, 2})},
                                         {"b", bytes<std::uint8_t>({2}, {1, 2})}};
  const std::string zero = error_of(binary("QLinearAdd", {2}, {2}, 0.5f, 0, 0.5f, 0, 0.0f, 0), in);
  EXPECT_NE(zero.find("qnode"), std::string::npos) << zero;
  EXPECT_NE(zero.find("'sc' is 0"), std::string::npos) << zero;

  OnnxBuilder shape(13);
  shape.domain(kMs, 1);
  shape.input("a", kU8, {2}).input("b", kU8, {2}).output("y", kU8);
  shape.node("QLinearMul", {"a", "sa", "sa_zp", "b", "sb", "sb_zp", "sc", "sc_zp"}, {"y"}, "qnode", kMs);
  shape.initializer("sa", {0.5f, 0.5f}, {2});  // per-channel: not what QLinearMul takes
  shape.initializer_raw<std::uint8_t>("sa_zp", kU8, {0}, {});
  params(shape, "sb", 0.5f, 0);
  params(shape, "sc", 0.5f, 0, kI8);  // and an int8 zero point for uint8 operands
  const std::string per_channel = error_of(shape.graph(), in);
  EXPECT_NE(per_channel.find("qnode"), std::string::npos) << per_channel;
  EXPECT_NE(per_channel.find("scale 'sa' has shape [2]; one value expected"), std::string::npos) << per_channel;

  OnnxBuilder zp(13);
  zp.domain(kMs, 1);
  zp.input("a", kU8, {2}).input("b", kU8, {2}).output("y", kU8);
  zp.node("QLinearAdd", {"a", "sa", "sa_zp", "b", "sb", "sb_zp", "sc", "sc_zp"}, {"y"}, "qnode", kMs);
  params(zp, "sa", 0.5f, 0);
  params(zp, "sb", 0.5f, 0);
  params(zp, "sc", 0.5f, 0, kI8);
  const std::string type = error_of(zp.graph(), in);
  EXPECT_NE(type.find("zero point 'sc_zp' has type int8; uint8 expected"), std::string::npos) << type;

  const std::string rank = error_of(unary("QLinearGlobalAveragePool", {4}, 0.5f, 0, 0.5f, 0),
                                    {{"a", bytes<std::uint8_t>({4}, {1, 2, 3, 4})}});
  EXPECT_NE(rank.find("qnode"), std::string::npos) << rank;
  EXPECT_NE(rank.find("at least 3 dimensions"), std::string::npos) << rank;
}

}  // namespace
}  // namespace qeval::eval
