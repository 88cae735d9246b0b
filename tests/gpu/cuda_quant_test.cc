// Quantization on the device: QuantizeLinear / DequantizeLinear (int8, uint8, int32, float8 E4M3FN;
// per-tensor and per-axis) and the fused Q/DQ Conv and MatMul (int8 x int8 -> int32) give the CPU
// ops' bits exactly, on cuBLAS's integer GEMM and on kernels/cuda's own, and the same bits every run.
// Skips, saying why, without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "eval/exec/cuda/cuda_backend.h"
#include "eval/exec/graph.h"
#include "eval/exec/qdq_fusion.h"
#include "eval/quant/device_calibration.h"
#include "gpu/gpu_test_util.h"
#include "kernels/numeric.h"

namespace qeval::eval {
namespace {

using gpu_test::same_bits;

struct Input {
  Tensor value;
  bool constant = false;
  DType declared = DType::kFloat32;  // the ONNX type (float8 values are stored as float32)
};

// Runs `node` on the CPU op and compiled on the device (three runs); expects a device kernel and
// the CPU's bits every run.
void expect_cpu_bits(const Node& node, const std::vector<Input>& inputs, const std::string& what) {
  SCOPED_TRACE(what);
  std::string why;
  auto backend = gpu_test::cuda_or_reason(why);
  ASSERT_NE(backend, nullptr) << why;
  const int schema_opset = node.domain == quant::kFusedDomain ? 1 : node.opset;
  const OpSchema* schema = find_op(node.domain, node.op_type, schema_opset);
  ASSERT_NE(schema, nullptr) << node.op_type;
  auto op = schema->make(node);
  std::vector<ValueMeta> metas;
  for (const auto& in : inputs)
    metas.push_back(ValueMeta{in.value.dtype(), in.declared, in.value.shape(),
                              in.constant ? std::make_shared<const Tensor>(in.value) : nullptr});
  std::vector<const ValueMeta*> in_metas;
  std::vector<const Tensor*> host_in;
  for (std::size_t i = 0; i < inputs.size(); ++i) in_metas.push_back(&metas[i]), host_in.push_back(&inputs[i].value);
  const auto out_metas = op->infer(in_metas);
  Tensor want(out_metas[0].dtype, out_metas[0].shape);
  Tensor* want_out[] = {&want};
  op->run(host_in, want_out);
  const std::vector<Rounding> exact(inputs.size(), Rounding::kNone);
  auto k = backend->compile(node, *op, in_metas, exact, out_metas, why);
  ASSERT_NE(k, nullptr) << "not compiled for the device: " << why;
  const auto mem = backend->memory();
  std::vector<Tensor> dev;
  for (const auto& in : inputs) dev.push_back(in.value.to_device(mem));
  std::vector<const Tensor*> dev_in;
  for (const auto& d : dev) dev_in.push_back(&d);
  for (int run = 0; run < 3; ++run) {
    Tensor got(out_metas[0].dtype, out_metas[0].shape, mem);
    Tensor* outs[] = {&got};
    k->run(dev_in, outs);
    const Tensor back = got.to_host();
    ASSERT_TRUE(same_bits(want, back)) << "run " << run << ": the device's output differs from the CPU's";
  }
}

Tensor floats(const Shape& shape, std::uint32_t seed, float scale) {
  Tensor t = gpu_test::normal(shape, seed, scale);
  // Values the quantizers must get right: ties (x / scale = k + 0.5 for scale 0.5: x = 0.25 * odd),
  // beyond the range, zeros, and non-finite ones.
  float* v = t.data<float>();
  const std::int64_t n = t.numel();
  const float specials[] = {0.25f, -0.75f, 1.25f, 0.0f, -0.0f, 1e9f, -1e9f, 500.0f, -464.0f, 460.0f,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 1e-7f, -3e-3f};
  for (std::size_t i = 0; i < std::size(specials) && std::int64_t(i) * 7 < n; ++i) v[i * 7] = specials[i];
  return t;
}

Tensor scales(const Shape& shape, std::uint32_t seed) {
  Tensor t(DType::kFloat32, shape);
  const std::int64_t n = t.numel();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(0.01f, 0.2f);
  for (float& x : t.span<float>()) x = d(rng);
  if (n == 1) t.data<float>()[0] = 0.5f;  // ties at the quarter values above
  return t;
}

template <class T>
Tensor integers(const Shape& shape, std::uint32_t seed, int lo, int hi) {
  Tensor t(dtype_of<T>::value, shape);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  for (T& x : t.span<T>()) x = T(d(rng));
  return t;
}

Node quant_node(const std::string& op, int opset, std::int64_t axis, std::size_t inputs) {
  Node n;
  n.name = op + "_test";
  n.op_type = op;
  n.opset = opset;
  if (axis != 1) n.attributes["axis"] = Attribute::of_int(axis);
  for (std::size_t i = 0; i < inputs; ++i) n.inputs.push_back("in" + std::to_string(i));
  n.outputs = {"out"};
  return n;
}

// The scale forms of the [2, 24, 33] inputs below along axis 1.
struct ScaleForm {
  Shape shape;
  std::string name;
};
const ScaleForm kScaleForms[] = {{Shape{}, "per-tensor"}, {Shape{24}, "per-axis"}};

TEST(CudaQuant, QuantizeLinearGivesTheCpuBits) {
  QEVAL_CUDA_OR_SKIP(backend);
  const Shape x{2, 24, 33};
  for (const auto& [s, form] : kScaleForms) {
    const Tensor scale = scales(s, 3);
    Tensor zp8 = integers<std::int8_t>(s, 5, -20, 20), zpu8 = integers<std::uint8_t>(s, 6, 100, 150);
    expect_cpu_bits(quant_node("QuantizeLinear", 13, 1, 3),
                    {{floats(x, 1, 8.0f)}, {scale, true}, {zp8, true, DType::kInt8}}, form + " int8");
    expect_cpu_bits(quant_node("QuantizeLinear", 13, 1, 3),
                    {{floats(x, 2, 8.0f)}, {scale, true}, {zpu8, true, DType::kUInt8}}, form + " uint8");
    expect_cpu_bits(quant_node("QuantizeLinear", 13, 1, 2), {{floats(x, 3, 8.0f)}, {scale, true}},
                    form + " uint8 without a zero point");
    // float8 E4M3FN (opset 19): the zero point a float8 zero, saturating and not.
    Tensor zf8(DType::kFloat32, s);
    for (int sat : {1, 0}) {
      Node q = quant_node("QuantizeLinear", 19, 1, 3);
      q.attributes["saturate"] = Attribute::of_int(sat);
      expect_cpu_bits(q, {{floats(x, 4, 300.0f)}, {scale, true}, {zf8, true, DType::kFloat8E4M3FN}},
                      form + " float8 e4m3fn saturate " + std::to_string(sat));
    }
  }
  // per-axis along the last axis
  const Tensor last = scales({33}, 9);
  expect_cpu_bits(quant_node("QuantizeLinear", 13, -1, 3),
                  {{floats(x, 7, 4.0f)}, {last, true}, {integers<std::int8_t>({33}, 8, -5, 5), true, DType::kInt8}},
                  "per-axis, axis -1");
}

TEST(CudaQuant, DequantizeLinearGivesTheCpuBits) {
  QEVAL_CUDA_OR_SKIP(backend);
  const Shape x{2, 24, 33};
  for (const auto& [s, form] : kScaleForms) {
    const Tensor scale = scales(s, 13);
    expect_cpu_bits(quant_node("DequantizeLinear", 13, 1, 3),
                    {{integers<std::int8_t>(x, 1, -128, 127), false, DType::kInt8},
                     {scale, true},
                     {integers<std::int8_t>(s, 2, -9, 9), true, DType::kInt8}},
                    form + " int8");
    expect_cpu_bits(quant_node("DequantizeLinear", 13, 1, 3),
                    {{integers<std::uint8_t>(x, 3, 0, 255), false, DType::kUInt8},
                     {scale, true},
                     {integers<std::uint8_t>(s, 4, 120, 135), true, DType::kUInt8}},
                    form + " uint8");
    expect_cpu_bits(quant_node("DequantizeLinear", 13, 1, 2),
                    {{integers<std::int32_t>(x, 5, -1 << 20, 1 << 20), false, DType::kInt32}, {scale, true}},
                    form + " int32");
    // float8 values (stored as float32): the codes of a QuantizeLinear to E4M3FN.
    Tensor f8 = floats(x, 6, 100.0f);
    for (float& v : f8.span<float>()) v = round_to_float8_e4m3fn(v, true);
    expect_cpu_bits(quant_node("DequantizeLinear", 19, 1, 2), {{f8, false, DType::kFloat8E4M3FN}, {scale, true}},
                    form + " float8 e4m3fn");
  }
}

// The fused Q/DQ products (eval/exec/qdq_fusion.h's inputs), on both int8 GEMMs.
class CudaQuantProducts : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (*GetParam()) setenv("QEVAL_CUDA_INT8_GEMM", GetParam(), 1);
    else unsetenv("QEVAL_CUDA_INT8_GEMM");
  }
  void TearDown() override { unsetenv("QEVAL_CUDA_INT8_GEMM"); }
};

Node fused_node(const std::string& op, std::map<std::string, Attribute> attributes, std::size_t inputs) {
  Node n;
  n.name = op + "_int8";
  n.op_type = op;
  n.domain = quant::kFusedDomain;
  n.opset = 17;
  n.attributes = std::move(attributes);
  for (std::size_t i = 0; i < inputs; ++i) n.inputs.push_back("in" + std::to_string(i));
  n.outputs = {"out"};
  return n;
}

TEST_P(CudaQuantProducts, FusedConvGivesTheCpuBits) {
  QEVAL_CUDA_OR_SKIP(backend);
  struct ConvCase {
    Shape x, w;
    std::map<std::string, Attribute> attributes;
  };
  const std::vector<ConvCase> cases = {
      {{2, 32, 17, 17}, {48, 32, 3, 3}, {{"pads", Attribute::of_ints({1, 1, 1, 1})}}},
      {{2, 20, 17, 17},
       {24, 20, 3, 3},
       {{"strides", Attribute::of_ints({2, 2})}, {"pads", Attribute::of_ints({1, 1, 1, 1})}}},
      {{1, 3, 16, 16}, {8, 3, 3, 3}, {{"pads", Attribute::of_ints({1, 1, 1, 1})}}},  // k = 27
      {{2, 64, 8, 8}, {96, 64, 1, 1}, {}},                                              // pointwise
  };
  std::uint32_t seed = 40;
  for (const auto& c : cases) {
    const std::int64_t oc = c.w[0];
    for (bool u8 : {false, true})
      for (bool per_channel : {false, true}) {
        Input x = u8 ? Input{integers<std::uint8_t>(c.x, seed++, 0, 255), false, DType::kUInt8}
                     : Input{integers<std::int8_t>(c.x, seed++, -128, 127), false, DType::kInt8};
        Tensor za = u8 ? integers<std::uint8_t>({}, seed++, 110, 140) : integers<std::int8_t>({}, seed++, -9, 9);
        Tensor ws = scales(per_channel ? Shape{oc} : Shape{}, seed++);
        std::vector<Input> in = {x,
                                 {scales({}, seed++), true},
                                 {za, true, u8 ? DType::kUInt8 : DType::kInt8},
                                 {integers<std::int8_t>(c.w, seed++, -127, 127), true, DType::kInt8},
                                 {ws, true},
                                 {Tensor(DType::kInt8, ws.shape()), true, DType::kInt8},
                                 {gpu_test::normal({oc}, seed++)}};
        expect_cpu_bits(fused_node("Conv", c.attributes, 7), in,
                        "x " + shape_to_string(c.x) + " w " + shape_to_string(c.w) + (u8 ? " uint8" : " int8") +
                            (per_channel ? " per-channel" : " per-tensor"));
      }
  }
}

TEST_P(CudaQuantProducts, FusedMatMulGivesTheCpuBits) {
  QEVAL_CUDA_OR_SKIP(backend);
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{2, 77, 40}, {40, 24}}, {{2, 8, 64, 320}, {320, 1280}}, {{5, 30}, {30, 7}}};
  std::uint32_t seed = 80;
  for (const auto& [a, b] : cases)
    for (bool u8 : {false, true}) {
      Input x = u8 ? Input{integers<std::uint8_t>(a, seed++, 0, 255), false, DType::kUInt8}
                   : Input{integers<std::int8_t>(a, seed++, -128, 127), false, DType::kInt8};
      Tensor za = u8 ? integers<std::uint8_t>({}, seed++, 110, 140) : integers<std::int8_t>({}, seed++, -9, 9);
      Tensor bs = scales({b[1]}, seed++);
      std::vector<Input> in = {x,
                               {scales({}, seed++), true},
                               {za, true, u8 ? DType::kUInt8 : DType::kInt8},
                               {integers<std::int8_t>(b, seed++, -127, 127), true, DType::kInt8},
                               {bs, true},
                               {Tensor(DType::kInt8, bs.shape()), true, DType::kInt8}};
      expect_cpu_bits(fused_node("MatMul", {}, 6), in,
                      "a " + shape_to_string(a) + " b " + shape_to_string(b) + (u8 ? " uint8" : " int8"));
    }
}

INSTANTIATE_TEST_SUITE_P(Gemms, CudaQuantProducts, ::testing::Values("", "own"),
                         [](const auto& p) { return std::string(*p.param ? "own_gemm" : "cublas"); });

// Calibration on the GPU (amax by queued device scans, SmoothQuant's channel ranges folded on the
// device, histograms and alpha-search rows from host copies): the CPU's ranges and scales within
// the FP32 kernels' differences.
TEST(CudaQuant, CalibrationOnTheDeviceGivesTheCpuRanges) {
  QEVAL_CUDA_OR_SKIP(cuda);
  quant::testing_device::expect_device_calibration_is_the_cpus(cuda, 1e-5);
}

}  // namespace
}  // namespace qeval::eval
