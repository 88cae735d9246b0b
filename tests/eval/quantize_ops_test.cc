// Quantization ops beyond the ONNX 1.12 node tests: opset 19/21 Q/DQ forms, ONNX Runtime quantizer
// forms (QLinearConv/MatMul per-channel, *Integer with zero points, dynamic quantization) and
// ModelOpt's FP8 forms against ONNX Runtime (tests/data/qdq, tools/make_qdq_references.py), and the
// bad-input errors (scale 0/NaN/inf, axis, zero point range and shape) naming node and tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "datasets/npy.h"
#include "eval/exec/onnx_import.h"
#include "eval/exec/session.h"
#include "kernels/error.h"
#include "onnx_builder.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

namespace fs = std::filesystem;
using testing::floats;
using testing::OnnxBuilder;

constexpr int kF32 = onnx::TensorProto::FLOAT;
constexpr int kI8 = onnx::TensorProto::INT8;
constexpr int kU8 = onnx::TensorProto::UINT8;
constexpr int kI32 = onnx::TensorProto::INT32;
constexpr int kE4M3FN = 17;

std::string safe_name(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') c = '_';
  return s;
}

// Bitwise equality, NaN matching any NaN (payloads differ between implementations).
std::string bit_difference(const Tensor& expected, const Tensor& actual) {
  if (expected.dtype() != actual.dtype())
    return "type " + std::string(dtype_name(actual.dtype())) + ", expected " +
           std::string(dtype_name(expected.dtype()));
  if (expected.shape() != actual.shape())
    return "shape " + shape_to_string(actual.shape()) + ", expected " + shape_to_string(expected.shape());
  const std::size_t es = dtype_size(expected.dtype());
  for (std::int64_t i = 0; i < expected.numel(); ++i) {
    const std::byte* e = expected.raw() + i * std::int64_t(es);
    const std::byte* a = actual.raw() + i * std::int64_t(es);
    if (std::memcmp(e, a, es) == 0) continue;
    if (expected.dtype() == DType::kFloat32) {
      float ef, af;
      std::memcpy(&ef, e, 4);
      std::memcpy(&af, a, 4);
      if (std::isnan(ef) && std::isnan(af)) continue;
      return "element " + std::to_string(i) + " is " + std::to_string(af) + ", expected " + std::to_string(ef);
    }
    if (expected.dtype() == DType::kFloat16) {
      std::uint16_t eb, ab;
      std::memcpy(&eb, e, 2);
      std::memcpy(&ab, a, 2);
      if ((eb & 0x7c00) == 0x7c00 && (eb & 0x3ff) && (ab & 0x7c00) == 0x7c00 && (ab & 0x3ff)) continue;
    }
    return "element " + std::to_string(i) + " differs";
  }
  return "";
}

TEST(QdqReferences, QuantizedFormsMatchOnnxRuntimeBitForBit) {
  const fs::path root = testing::data_dir() / "qdq";
  int cases = 0;
  for (const auto& entry : fs::directory_iterator(root)) {
    const fs::path dir = entry.path();
    // Fused Q/DQ models agree within a quantization step, not bit for bit (QdqFusion.*).
    if (dir.filename().string().rfind("qdq_conv_matmul", 0) == 0) continue;
    SCOPED_TRACE(dir.filename().string());
    Graph g = load_onnx(dir / "model.onnx");
    Session s(g);
    std::map<std::string, Tensor> inputs;
    for (const auto& in : g.inputs)
      inputs.emplace(in.name, datasets::read_npy(dir / "inputs" / (safe_name(in.name) + ".npy")));
    auto outputs = s.run(inputs);
    // trt-domain cases: ORT cannot run them; their reference is the equivalent standard graph's.
    fs::path expected_dir = dir / "outputs";
    if (fs::exists(dir / "reference.txt")) {
      std::ifstream f(dir / "reference.txt");
      std::string other;
      f >> other;
      expected_dir = root / other / "outputs";
    }
    for (const auto& out : g.outputs) {
      Tensor expected = datasets::read_npy(expected_dir / (safe_name(out.name) + ".npy"));
      EXPECT_EQ(bit_difference(expected, outputs.at(out.name)), "") << out.name;
    }
    ++cases;
  }
  EXPECT_GE(cases, 22);
}

// x -> Q -> DQ with the given scale/zero point initializers (added by `add`), opset `opset`.
template <class AddInits>
Graph qdq_graph(int opset, const std::vector<std::int64_t>& x_dims, int q_type, AddInits add,
                const std::vector<std::pair<std::string, std::int64_t>>& attrs = {}, bool with_zp = true) {
  OnnxBuilder b(opset);
  b.input("x", kF32, x_dims).output("y", kF32);
  auto& q =
      b.node("QuantizeLinear",
             with_zp ? std::vector<std::string>{"x", "x_scale", "x_zp"} : std::vector<std::string>{"x", "x_scale"},
             {"xq"}, "quant_x");
  auto& dq =
      b.node("DequantizeLinear",
             with_zp ? std::vector<std::string>{"xq", "x_scale", "x_zp"} : std::vector<std::string>{"xq", "x_scale"},
             {"y"}, "dequant_x");
  for (const auto& [k, v] : attrs) {
    for (auto* n : {&q, &dq}) {
      auto* a = n->add_attribute();
      a->set_name(k);
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(v);
    }
  }
  (void)q_type;
  add(b);
  return b.graph();
}

// The InputError text of planning and running the graph once on x.
std::string error_of(const Graph& g, const Tensor& x) {
  try {
    Session s(g);
    s.run({{"x", x}});
  } catch (const UnsupportedError& e) {
    return std::string("unsupported: ") + e.what();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

void expect_error(const std::string& what, std::initializer_list<const char*> parts) {
  ASSERT_FALSE(what.empty()) << "no error";
  EXPECT_EQ(what.rfind("unsupported: ", 0), std::string::npos) << what;
  for (const char* p : parts) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
}

TEST(QuantizeLinear, BadScalesAreInputErrorsNamingNodeAndTensor) {
  const Tensor x = floats({2, 3}, {1, 2, 3, 4, 5, 6});
  for (float bad : {0.0f, std::nanf(""), INFINITY, -INFINITY}) {
    Graph g = qdq_graph(13, {2, 3}, kI8, [&](OnnxBuilder& b) {
      b.initializer("x_scale", {bad}, {});
      b.initializer_raw<std::int8_t>("x_zp", kI8, {0}, {});
    });
    expect_error(error_of(g, x), {"quant_x", "y_scale 'x_scale'", "finite and nonzero"});
  }
  // Per-axis: the element is named.
  Graph g = qdq_graph(13, {2, 3}, kI8, [&](OnnxBuilder& b) {
    b.initializer("x_scale", {0.1f, 0.0f, 0.2f}, {3});
    b.initializer_raw<std::int8_t>("x_zp", kI8, {0, 0, 0}, {3});
  });
  expect_error(error_of(g, x), {"quant_x", "'x_scale' element 1 is 0"});
}

TEST(QuantizeLinear, RuntimeScaleOfZeroFailsAtRun) {
  OnnxBuilder b(13);
  b.input("x", kF32, {3}).input("s", kF32, {}).output("q", kU8);
  b.node("QuantizeLinear", {"x", "s"}, {"q"}, "q_runtime");
  Graph g = b.graph();
  Session s(g);
  Tensor zero = floats({}, {0.0f});
  try {
    s.run({{"x", floats({3}, {1, 2, 3})}, {"s", zero}});
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("q_runtime"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'s' is 0"), std::string::npos) << e.what();
  }
  auto ok = s.run({{"x", floats({3}, {1, 2, 3})}, {"s", floats({}, {0.5f})}});
  EXPECT_EQ(ok.at("q").data<std::uint8_t>()[2], 6);
}

TEST(QuantizeLinear, AxisOutOfRangeIsAnInputError) {
  Graph g = qdq_graph(13, {2, 3}, kI8,
                      [&](OnnxBuilder& b) {
                        b.initializer("x_scale", {0.1f, 0.2f, 0.3f}, {3});
                        b.initializer_raw<std::int8_t>("x_zp", kI8, {0, 0, 0}, {3});
                      },
                      {{"axis", 2}});
  expect_error(error_of(g, floats({2, 3}, {1, 2, 3, 4, 5, 6})), {"quant_x", "axis 2 is out of range", "x 'x'"});
}

TEST(QuantizeLinear, ScaleAndZeroPointShapeMismatchesAreInputErrors) {
  const Tensor x = floats({2, 3}, {1, 2, 3, 4, 5, 6});
  // Per-axis scale of the wrong length.
  Graph wrong_len = qdq_graph(13, {2, 3}, kI8, [&](OnnxBuilder& b) {
    b.initializer("x_scale", {0.1f, 0.2f}, {2});
    b.initializer_raw<std::int8_t>("x_zp", kI8, {0, 0}, {2});
  });
  expect_error(error_of(wrong_len, x), {"quant_x", "y_scale 'x_scale' has shape [2]", "must have shape [3]"});
  // Zero point shape differs from the scale's.
  Graph zp_shape = qdq_graph(13, {2, 3}, kI8, [&](OnnxBuilder& b) {
    b.initializer("x_scale", {0.1f, 0.2f, 0.3f}, {3});
    b.initializer_raw<std::int8_t>("x_zp", kI8, {0}, {});
  });
  expect_error(error_of(zp_shape, x), {"quant_x", "y_zero_point 'x_zp' has shape []", "[3]"});
  // Blocked scale with the wrong number of blocks (block 2 along axis 1 of [2, 3] needs [2, 2]).
  Graph blocked = qdq_graph(21, {2, 3}, kI8,
                            [&](OnnxBuilder& b) {
                              b.initializer("x_scale", {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f}, {2, 3});
                              b.initializer_raw<std::int8_t>("x_zp", kI8, {0, 0, 0, 0, 0, 0}, {2, 3});
                            },
                            {{"axis", 1}, {"block_size", 2}});
  expect_error(error_of(blocked, x), {"quant_x", "blocked scales", "must have shape [2, 2]"});
  // Opset 10 has no per-axis scales.
  Graph opset10 = qdq_graph(10, {2, 3}, kI8, [&](OnnxBuilder& b) {
    b.initializer("x_scale", {0.1f, 0.2f, 0.3f}, {3});
    b.initializer_raw<std::int8_t>("x_zp", kI8, {0, 0, 0}, {3});
  });
  expect_error(error_of(opset10, x), {"quant_x", "takes a scalar scale"});
}

TEST(DequantizeLinear, ZeroPointsOutsideTheTypesRangeAreInputErrors) {
  // int32 values must have zero point 0.
  OnnxBuilder b(13);
  b.input("x", kI32, {3}).output("y", kF32);
  b.node("DequantizeLinear", {"x", "s", "zp"}, {"y"}, "dq_int32");
  b.initializer("s", {0.5f}, {});
  b.initializer_raw<std::int32_t>("zp", kI32, {5}, {});
  Tensor xi(DType::kInt32, {3});
  Graph gi = b.graph();
  try {
    Session s(gi);
    s.run({{"x", xi}});
    FAIL() << "no error";
  } catch (const InputError& e) {
    expect_error(e.what(), {"dq_int32", "x_zero_point 'zp'", "is 5", "must be 0"});
  }
  // A NaN float8 zero point (ModelOpt's FLOAT8E4M3FN-typed zero points must hold 0).
  Graph g = qdq_graph(19, {2}, kE4M3FN, [&](OnnxBuilder& b2) {
    b2.initializer("x_scale", {0.5f}, {});
    b2.initializer_raw<std::uint8_t>("x_zp", kE4M3FN, {0x7f}, {});
  });
  expect_error(error_of(g, floats({2}, {1, 2})), {"quant_x", "y_zero_point 'x_zp'", "NaN", "outside the range"});
  // Zero point type differing from x in DequantizeLinear.
  OnnxBuilder c(13);
  c.input("x", kI8, {2}).output("y", kF32);
  c.node("DequantizeLinear", {"x", "s", "zp"}, {"y"}, "dq_types");
  c.initializer("s", {0.5f}, {});
  c.initializer_raw<std::uint8_t>("zp", kU8, {128}, {});
  Graph gc = c.graph();
  try {
    Session s(gc);
    s.run({{"x", Tensor(DType::kInt8, {2})}});
    FAIL() << "no error";
  } catch (const InputError& e) {
    expect_error(e.what(), {"dq_types", "x_zero_point 'zp' has type uint8", "must match"});
  }
}

TEST(QuantizeLinear, ModelOptFp8ZeroPointGivesFloat8OutputsAndFp8QdqRoundsToE4M3) {
  // Q(x) with a FLOAT8E4M3FN zero point: the output is float8 (declared), DQ gives code * scale.
  Graph g = qdq_graph(19, {6}, kE4M3FN, [&](OnnxBuilder& b) {
    b.initializer("x_scale", {0.25f}, {});
    b.initializer_raw<std::uint8_t>("x_zp", kE4M3FN, {0}, {});
  });
  Session s(g);
  auto metas = s.infer_metas({{"x", {6}}});
  EXPECT_EQ(metas.at("xq").declared, DType::kFloat8E4M3FN);
  // 1000 saturates to 448 * 0.25; 0.3/0.25 = 1.2 -> 1.25 (E4M3 has 3 mantissa bits).
  auto y = s.run({{"x", floats({6}, {1000, -1000, 0.3f, 0.0f, -0.01f, 5.0f})}}).at("y");
  const float* p = y.data<float>();
  EXPECT_EQ(p[0], 112.0f);
  EXPECT_EQ(p[1], -112.0f);
  EXPECT_EQ(p[2], 0.3125f);
  EXPECT_EQ(p[3], 0.0f);
  EXPECT_EQ(p[5], 5.0f);
}

TEST(TrtFp8Ops, QuantizeGivesE4M3FnCodesAsUint8) {
  OnnxBuilder b(17);
  b.domain("trt", 1);
  b.input("x", kF32, {4}).output("q", kU8);
  b.node("TRT_FP8QuantizeLinear", {"x", "s"}, {"q"}, "trt_q", "trt");
  b.initializer("s", {0.5f}, {});
  Graph g = b.graph();
  Session s(g);
  auto q = s.run({{"x", floats({4}, {1.0f, -1.0f, 1e6f, 0.0f})}}).at("q");
  ASSERT_EQ(q.dtype(), DType::kUInt8);
  const std::uint8_t* p = q.data<std::uint8_t>();
  EXPECT_EQ(p[0], 0x40);  // 2.0
  EXPECT_EQ(p[1], 0xC0);  // -2.0
  EXPECT_EQ(p[2], 0x7E);  // 448, saturated
  EXPECT_EQ(p[3], 0x00);
}

}  // namespace
}  // namespace qeval::eval

namespace qeval::eval {
namespace {

TEST(QuantizeLinearCli, ZeroScaleExitsTwoNamingNodeAndTensor) {
  testing::ScratchDir dir("qdq-cli");
  testing::OnnxBuilder b(13);
  b.input("x", kF32, {2}).output("y", kF32);
  b.node("QuantizeLinear", {"x", "act_scale"}, {"xq"}, "conv1_input_q");
  b.node("DequantizeLinear", {"xq", "act_scale"}, {"y"}, "conv1_input_dq");
  b.initializer("act_scale", {0.0f}, {});
  testing::write_bytes(dir / "m.onnx", b.bytes());
  std::filesystem::create_directories(dir / "in");
  datasets::write_npy(dir / "in" / "x.npy", floats({2}, {1, 2}));
  auto r = testing::run_qeval("infer --model " + (dir / "m.onnx").string() + " --inputs " + (dir / "in").string() +
                              " --out " + (dir / "out").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("conv1_input_q"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("'act_scale' is 0"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace qeval::eval

namespace qeval::eval {
namespace {

TEST(QLinearOps, BadScalesAndShapesAreInputErrorsNamingNodeAndTensor) {
  auto build = [](float y_scale, std::int64_t b_scales) {
    testing::OnnxBuilder b(13);
    b.input("a", kU8, {2, 3}).output("y", kU8);
    b.node("QLinearMatMul", {"a", "as", "az", "w", "ws", "wz", "ys", "yz"}, {"y"}, "qmm");
    b.initializer("as", {0.1f}, {});
    b.initializer_raw<std::uint8_t>("az", kU8, {128}, {});
    b.initializer_raw<std::int8_t>("w", kI8, std::vector<std::int8_t>(12, 1), {3, 4});
    b.initializer("ws", std::vector<float>(std::size_t(b_scales), 0.01f), {b_scales});
    b.initializer_raw<std::int8_t>("wz", kI8, std::vector<std::int8_t>(std::size_t(b_scales), 0), {b_scales});
    b.initializer("ys", {y_scale}, {});
    b.initializer_raw<std::uint8_t>("yz", kU8, {128}, {});
    return b.graph();
  };
  Tensor a(DType::kUInt8, {2, 3});
  auto error = [&](const Graph& g) {
    try {
      Session s(g);
      s.run({{"a", a}});
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string zero = error(build(0.0f, 4));
  EXPECT_NE(zero.find("qmm"), std::string::npos) << zero;
  EXPECT_NE(zero.find("'ys' is 0"), std::string::npos) << zero;
  const std::string shape = error(build(0.5f, 3));
  EXPECT_NE(shape.find("b_scale 'ws' has shape [3]; expected one value or [4]"), std::string::npos) << shape;
  EXPECT_EQ(error(build(0.5f, 4)), "");
}

}  // namespace
}  // namespace qeval::eval
