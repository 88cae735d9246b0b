// qeval runs the INT8 and FP8 Q/DQ exports of `qeval calibrate` like ONNX Runtime does (fixtures:
// tools/make_quant_ort_fixture.sh), and the `qeval calibrate` command line.
#include <gtest/gtest.h>

#include <cmath>

#include "datasets/npy.h"
#include "eval/exec/onnx_import.h"
#include "eval/exec/session.h"
#include "test_util.h"

namespace qeval::eval::quant {
namespace {

namespace fs = std::filesystem;

std::map<std::string, Tensor> unet_block_inputs() {
  const fs::path dir = testing::data_dir() / "onnx/unet_block/inputs";
  std::map<std::string, Tensor> in;
  for (const char* name : {"sample", "timestep_embedding", "encoder_hidden_states"})
    in.emplace(name, datasets::read_npy(dir / (std::string(name) + ".npy")));
  return in;
}

struct OrtAgreement {
  double max_diff = 0;   // max |qeval - ORT| over the outputs
  double fp32_diff = 0;  // max |qeval FP32 of the unquantized model - ORT|
};

// Runs a fixture's quantized.onnx through qeval (`options`) and compares each output with ORT's
// (ort_outputs/), `step(amax)` being the tolerance at an output whose largest magnitude is amax.
void expect_agreement(const fs::path& dir, const SessionOptions& options, double (*step)(double), const char* what) {
  const Graph q = load_onnx(dir / "quantized.onnx");
  Session session(q, options);
  const auto out = session.run(unet_block_inputs());
  const Graph fp32 = load_onnx(testing::data_dir() / "onnx/unet_block/model.onnx");
  Session ref(fp32);
  const auto fp32_out = ref.run(unet_block_inputs());
  for (const char* name : {"hidden_states", "down_sample", "up_sample"}) {
    const Tensor ort = datasets::read_npy(dir / "ort_outputs" / (std::string(name) + ".npy"));
    const Tensor& ours = out.at(name);
    ASSERT_EQ(ours.shape(), ort.shape()) << name;
    double amax = 0, max_diff = 0, fp32_diff = 0;
    for (std::int64_t i = 0; i < ort.numel(); ++i) {
      amax = std::max(amax, std::fabs(double(ort.data<float>()[i])));
      max_diff = std::max(max_diff, std::fabs(double(ours.data<float>()[i]) - ort.data<float>()[i]));
      fp32_diff = std::max(fp32_diff, std::fabs(double(fp32_out.at(name).data<float>()[i]) - ort.data<float>()[i]));
    }
    EXPECT_LE(max_diff, step(amax)) << what << " " << name;
    EXPECT_GT(fp32_diff, 10 * max_diff) << what << " " << name;  // the comparison can tell quantized from FP32
    std::printf("  %s %s: max |qeval - ORT| = %.3g, tolerance %.3g, max |FP32 - ORT| = %.3g\n", what, name, max_diff,
                step(amax), fp32_diff);
  }
}

TEST(QuantOrtAgreement, Int8ExportMatchesOnnxRuntimeWithinOneQuantizationStep) {
  const fs::path dir = testing::data_dir() / "quant/unet_block_int8";
  int qdq = 0;
  for (const auto& n : load_onnx(dir / "quantized.onnx").nodes) qdq += n.op_type == "QuantizeLinear";
  EXPECT_EQ(qdq, 15);
  expect_agreement(
      dir, {}, [](double amax) { return amax / 127; }, "int8");  // one int8 step at the output's range
}

// FP8 (opset 19, float8e4m3fn Q/DQ, level 4: attention matmuls and the softmax output too): ORT's
// CPU provider runs it (DequantizeLinear, then float ops) and so does qeval (E4M3-rounded operands,
// FP32 accumulation): they agree to float32 rounding of differently ordered sums, far below one
// E4M3 step (amax / 448 at the top of the range).
TEST(QuantOrtAgreement, Fp8ExportMatchesOnnxRuntime) {
  const fs::path dir = testing::data_dir() / "quant/unet_block_fp8";
  const Graph q = load_onnx(dir / "quantized.onnx");
  EXPECT_EQ(q.opsets.at(""), 19);
  int qdq = 0;
  for (const auto& n : q.nodes) qdq += n.op_type == "QuantizeLinear";
  EXPECT_EQ(qdq, 23);  // 15 single-input nodes + 4 attention matmuls x 2 inputs
  auto rel = [](double amax) { return 1e-5 * amax; };
  expect_agreement(dir, {}, rel, "fp8");
  SessionOptions float_qdq;
  float_qdq.integer_qdq = false;
  expect_agreement(dir, float_qdq, rel, "fp8 float-qdq");
}

TEST(QuantCli, CalibrateWritesScalesAndExportAndReusesTheCache) {
  testing::ScratchDir dir("calibrate-cli");
  const std::string common = "calibrate --model " + (testing::data_dir() / "onnx/unet_block/model.onnx").string() +
                             " --data " + (testing::data_dir() / "onnx/unet_block/inputs").string() + " --cache " +
                             (dir / "cache").string();
  const std::string recipe = (testing::source_dir() / "recipes/fp8-level4.json").string();
  auto r = testing::run_qeval(common + " --recipe " + recipe + " --out " + (dir / "out").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("selected 19 nodes (5 conv, 2 feed_forward, 6 qkv_projection, 2 other_linear, "
                       "2 attention_qk, 2 attention_av)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("opset 17 -> 19"), std::string::npos) << r.out;
  const auto scales = testing::read_json(dir / "out/scales.json");
  EXPECT_EQ(scales["format"], "qeval.calibration");
  EXPECT_EQ(scales["activations"].size(), 23u);  // 15 single-input nodes + 4 attention inputs x 2
  EXPECT_EQ(scales["quant_format"], "fp8_e4m3");
  const Graph q = load_onnx(dir / "out/quantized.onnx");
  EXPECT_EQ(q.opsets.at(""), 19);
  Session(q).run(unet_block_inputs());
  r = testing::run_qeval(common + " --recipe " + recipe + " --out " + (dir / "out2").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("reused from the cache"), std::string::npos) << r.out;
  EXPECT_EQ(testing::read_bytes(dir / "out/quantized.onnx"), testing::read_bytes(dir / "out2/quantized.onnx"));

  // Bad input: exit 2 with the reason.
  const std::string bad = R"({"format": "int8", "level": 7, "calibration": {"method": "max"}})";
  testing::write_bytes(dir / "bad.json", {bad.begin(), bad.end()});
  r = testing::run_qeval(common + " --recipe " + (dir / "bad.json").string() + " --out " + (dir / "o3").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("bad.json: level must be one of 1, 2, 2.5, 3, 4, got 7"), std::string::npos) << r.out;
  const std::string none = R"({"format": "int8", "level": 1, "exclude": ["."], "calibration": {"method": "max"}})";
  testing::write_bytes(dir / "none.json", {none.begin(), none.end()});
  r = testing::run_qeval(common + " --recipe " + (dir / "none.json").string() + " --out " + (dir / "o4").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("selects no node"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace qeval::eval::quant

namespace qeval::eval::quant {
namespace {

TEST(QuantCli, CalibratesATxt2ImgPipelinesUnetPerStep) {
  testing::ScratchDir dir("calibrate-pipeline");
  const auto r = testing::run_qeval("calibrate --pipeline " + (testing::source_dir() / "models/tiny-sd").string() +
                                    " --recipe " + (testing::source_dir() / "recipes/fp8-level3.json").string() +
                                    " --count 1 --steps 2 --no-cache --out " + (dir / "out").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("max over 1 prompts x 2 steps (2 model runs, 2 steps)"), std::string::npos) << r.out;
  const auto scales = testing::read_json(dir / "out/scales.json");
  EXPECT_EQ(scales["activations"][0]["step_max"].size(), 2u);
  EXPECT_EQ(scales["selection"]["nodes"].size(), 95u);
}

}  // namespace
}  // namespace qeval::eval::quant
