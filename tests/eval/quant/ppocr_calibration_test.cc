// PaddleOCR's PP-OCRv4 text detector (opset 11, a real third-party model) calibrated and quantized:
// the opset upgrade to 13 on the way, Q/DQ inserted, the export valid and its text map close to
// FP32's; `qeval calibrate` and `qeval run` on the plain .onnx.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "datasets/npy.h"
#include "eval/exec/onnx_import.h"
#include "eval/exec/ops/op.h"
#include "eval/exec/opset_upgrade.h"
#include "eval/exec/session.h"
#include "eval/quant/calibrate_run.h"
#include "test_util.h"

namespace qeval::eval::quant {
namespace {

namespace fs = std::filesystem;

constexpr int kH = 96, kW = 160;

// A page-like image: light paper with lines of dark glyph-like strokes, normalised as PaddleOCR's
// detector expects ((x / 255 - mean) / std per channel), as [1, 3, H, W].
Tensor text_page(unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<float> gray(static_cast<std::size_t>(kH * kW), 235.0f);
  for (int line = 0; line < 4; ++line) {
    const int top = 10 + line * 22 + static_cast<int>(rng() % 4), height = 9 + static_cast<int>(rng() % 4);
    int x = 8 + static_cast<int>(rng() % 10);
    const int end = kW - 8 - static_cast<int>(rng() % 40);
    while (x < end) {
      const int glyph = 4 + static_cast<int>(rng() % 5);
      for (int y = top; y < top + height && y < kH; ++y)
        for (int dx = 0; dx < glyph && x + dx < kW; ++dx)
          if ((dx == 0 || dx == glyph - 1 || y == top || y == top + height / 2 || (rng() % 5 == 0)))
            gray[static_cast<std::size_t>(y * kW + x + dx)] = 30.0f + static_cast<float>(rng() % 40);
      x += glyph + 2 + static_cast<int>(rng() % 3) + ((rng() % 6 == 0) ? 6 : 0);
    }
  }
  const float mean[3] = {0.485f, 0.456f, 0.406f}, std_[3] = {0.229f, 0.224f, 0.225f};
  Tensor t(DType::kFloat32, {1, 3, kH, kW});
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < kH * kW; ++i)
      t.data<float>()[c * kH * kW + i] = (gray[static_cast<std::size_t>(i)] / 255.0f - mean[c]) / std_[c];
  return t;
}

Tensor run_det(const Graph& g, const Tensor& x) {
  Session s(g);
  auto out = s.run(std::map<std::string, Tensor>{{g.inputs.at(0).name, x}});
  return std::move(out.at(g.outputs.at(0).name));
}

struct MapAgreement {
  double sqnr_db = 0;
  double text_iou = 0;    // of the pixels above DB's 0.3 threshold
  double text_share = 0;  // share of FP32's pixels above it
};

MapAgreement agreement(const Tensor& ref, const Tensor& test) {
  double signal = 0, noise = 0;
  std::int64_t both = 0, either = 0, text = 0;
  for (std::int64_t i = 0; i < ref.numel(); ++i) {
    const double r = ref.data<float>()[i], t = test.data<float>()[i];
    signal += r * r;
    noise += (r - t) * (r - t);
    both += r > 0.3 && t > 0.3;
    either += r > 0.3 || t > 0.3;
    text += r > 0.3;
  }
  return {10 * std::log10(signal / std::max(noise, 1e-30)), either ? double(both) / double(either) : 1.0,
          double(text) / double(ref.numel())};
}

TEST(PpOcrCalibration, DetectorAtOpset11IsUpgradedCalibratedAndStaysClose) {
  QEVAL_REAL_MODEL(det, "ppocr/ch_PP-OCRv4_det_infer.onnx");
  testing::ScratchDir dir("ppocr-calib");
  for (int i = 0; i < 2; ++i) {
    fs::create_directories(dir / "calib" / std::to_string(i));
    datasets::write_npy(dir / "calib" / std::to_string(i) / "x.npy", text_page(100 + i));
  }
  const Graph fp32 = load_onnx(det);
  ASSERT_EQ(fp32.opsets.at(""), 11);
  const Tensor page = text_page(7);  // not a calibration sample
  const Tensor ref = run_det(fp32, page);
  ASSERT_EQ(ref.shape(), (Shape{1, 1, kH, kW}));

  for (const char* recipe : {"int8-level3", "fp8-level3"}) {
    SCOPED_TRACE(recipe);
    const bool int8 = std::string(recipe).rfind("int8", 0) == 0;
    CalibrateOptions o;
    o.recipe = testing::source_dir() / "recipes" / (std::string(recipe) + ".json");
    o.model = det;
    o.data = dir / "calib";
    o.out = dir / recipe;
    const CalibrateSummary s = run_calibrate(o);
    ASSERT_EQ(s.models.size(), 1u);
    const CalibratedModel& m = s.models[0];
    EXPECT_EQ(m.opset_from, 11);
    EXPECT_EQ(m.opset_to, int8 ? 13 : 19);
    EXPECT_EQ(m.calibration.calls, 2);
    EXPECT_GE(m.selection.targets.size(), 60u);  // 62 Conv and 2 ConvTranspose, less default exclusions
    EXPECT_EQ(m.quantized_weights, static_cast<int>(m.selection.targets.size()));
    EXPECT_EQ(m.quantized_activations, static_cast<int>(m.selection.targets.size()));

    // The export: opset 13 / 19 throughout, Q/DQ around every selected node, every node registered.
    const Graph q = load_onnx(o.out / "quantized.onnx");
    EXPECT_EQ(q.opsets.at(""), int8 ? 13 : 19);
    int quantize = 0, dequantize = 0;
    for (const Node& n : q.nodes) {
      EXPECT_EQ(n.opset, int8 ? 13 : 19) << n.describe();
      EXPECT_NE(find_op(n.domain, n.op_type, n.opset), nullptr) << n.describe();
      quantize += n.op_type == "QuantizeLinear";
      dequantize += n.op_type == "DequantizeLinear";
    }
    EXPECT_EQ(quantize, m.quantized_activations);
    EXPECT_EQ(dequantize, m.quantized_activations + m.quantized_weights);

    // The probability map on an unseen page: close to FP32's, and the text regions DB
    // post-processing would extract (threshold 0.3) nearly the same.
    const MapAgreement a = agreement(ref, run_det(q, page));
    std::printf("  %s: SQNR %.2f dB, text IoU %.4f (FP32 text share %.3f)\n", recipe, a.sqnr_db, a.text_iou,
                a.text_share);
    EXPECT_GT(a.text_share, 0.05);  // the page has text the detector finds
    EXPECT_LT(a.text_share, 0.6);
    EXPECT_GT(a.sqnr_db, int8 ? 15.0 : 12.0);
    EXPECT_GT(a.text_iou, 0.9);
  }
}

// The detector through `qeval calibrate` (FP8: opset 11 -> 19) and `qeval run` with the
// export and a recipe variant side by side.
TEST(PpOcrCalibration, CalibrateAndRunCommandsOnTheDetector) {
  QEVAL_REAL_MODEL(det, "ppocr/ch_PP-OCRv4_det_infer.onnx");
  testing::ScratchDir dir("ppocr-cli");
  for (int i = 0; i < 2; ++i) {
    fs::create_directories(dir / "calib" / std::to_string(i));
    datasets::write_npy(dir / "calib" / std::to_string(i) / "x.npy", text_page(100 + i));
  }
  fs::create_directories(dir / "eval" / "0");
  datasets::write_npy(dir / "eval" / "0" / "x.npy", text_page(7));
  const auto cal =
      testing::run_qeval("calibrate --recipe " + (testing::source_dir() / "recipes/fp8-level3.json").string() +
                         " --model " + det.string() + " --data " + (dir / "calib").string() + " --out " +
                         (dir / "fp8").string() + " --cache " + (dir / "cache").string());
  ASSERT_EQ(cal.code, 0) << cal.out;
  EXPECT_NE(cal.out.find("opset 11 -> 19"), std::string::npos) << cal.out;
  EXPECT_EQ(testing::read_json(dir / "fp8/scales.json").at("opset").at("to"), 19);

  const auto config = testing::write_text(dir, "c.json",
                                          R"({
    "pipeline": ")" + det.string() + R"(", "inputs": ")" +
                                              (dir / "eval").string() + R"(",
    "calibration": {"prompts": ")" + (dir / "calib").string() +
                                              R"(", "cache": ")" + (dir / "cache").string() + R"("},
    "observe": {"local_error": false},
    "variants": [{"name": "fp32"},
                 {"name": "int8", "recipe": ")" +
                                              (testing::source_dir() / "recipes/int8-level3.json").string() + R"("},
                 {"name": "fp8-export", "onnx": ")" +
                                              (dir / "fp8/quantized.onnx").string() + R"("}]})");
  const auto run = testing::run_qeval("run --config " + config.string() + " --out " + (dir / "out").string());
  ASSERT_EQ(run.code, 0) << run.out;
  const auto j = testing::read_json(dir / "out/report.json");
  EXPECT_EQ(j.at("config").at("pipeline"), "single-model");
  const auto& results = j.at("samples").at(0).at("results");
  ASSERT_EQ(results.size(), 3u);
  for (std::size_t v : {1u, 2u}) {
    const double sqnr = results.at(v).at("metrics").at("output_sqnr_db").get<double>();
    std::printf("  qeval run, %s: output SQNR %.2f dB\n", j.at("variants").at(v).at("name").get<std::string>().c_str(),
                sqnr);
    EXPECT_GT(sqnr, 12.0) << v;
  }
  EXPECT_GT(j.at("variants").at(1).at("quantized_nodes").get<int>(), 60);
}

// The opset-9 recognizer and direction classifier: Clip bounds, Slice/Squeeze attributes and
// Softmax's 2-D coercion are rewritten on the way to 13 and 19 (ReduceMean axes too at 19); the
// upgraded graphs give the original's outputs, and INT8 calibration works on them.
TEST(PpOcrCalibration, Opset9RecognizerAndClassifierUpgradeAndQuantize) {
  QEVAL_REAL_MODEL(rec, "ppocr/ch_PP-OCRv4_rec_infer.onnx");
  QEVAL_REAL_MODEL(cls, "ppocr/ch_ppocr_mobile_v2.0_cls_infer.onnx");
  struct Case {
    fs::path model;
    Shape input;
    int min_rewritten;  // at 13
  };
  // rec: 28 Clip, 10 Slice, 7 Squeeze, 3 Softmax; cls: 18 Clip, 1 Slice, 1 Softmax.
  for (const Case& c : {Case{rec, {1, 3, 48, 160}, 48}, Case{cls, {1, 3, 48, 192}, 20}}) {
    SCOPED_TRACE(c.model.filename().string());
    const Graph g = load_onnx(c.model);
    ASSERT_EQ(g.opsets.at(""), 9);
    Tensor x(DType::kFloat32, c.input);
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-1, 1);
    for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = u(rng);
    const Tensor want = run_det(g, x);
    for (int target : {13, 19}) {
      Graph up = g;
      const OpsetUpgrade r = upgrade_opset(up, target);
      EXPECT_GE(r.rewritten_nodes, c.min_rewritten) << target;
      const Tensor got = run_det(up, x);
      ASSERT_EQ(got.shape(), want.shape());
      double max_diff = 0;
      for (std::int64_t i = 0; i < want.numel(); ++i)
        max_diff = std::max(max_diff, double(std::fabs(got.data<float>()[i] - want.data<float>()[i])));
      EXPECT_LE(max_diff, 1e-6) << "opset " << target;
    }
  }
  // INT8 on the classifier (opset 9 -> 13 inside calibrate): the export runs and its 0/180 degree
  // probabilities stay near FP32's (on noise input both are near 0.5, so only their distance is
  // asserted, not a decision).
  testing::ScratchDir dir("ppocr-cls");
  for (int i = 0; i < 2; ++i) {
    fs::create_directories(dir / "calib" / std::to_string(i));
    Tensor x(DType::kFloat32, {1, 3, 48, 192});
    std::mt19937 rng(10 + i);
    std::uniform_real_distribution<float> u(-1, 1);
    for (std::int64_t k = 0; k < x.numel(); ++k) x.data<float>()[k] = u(rng);
    datasets::write_npy(dir / "calib" / std::to_string(i) / "x.npy", x);
  }
  CalibrateOptions o;
  o.recipe = testing::source_dir() / "recipes/int8-level3.json";
  o.model = cls;
  o.data = dir / "calib";
  o.out = dir / "int8";
  const CalibrateSummary s = run_calibrate(o);
  ASSERT_EQ(s.models.size(), 1u);
  EXPECT_EQ(s.models[0].opset_from, 9);
  EXPECT_EQ(s.models[0].opset_to, 13);
  EXPECT_GE(s.models[0].opset_rewritten_nodes, 20);
  EXPECT_GT(s.models[0].quantized_weights, 40);
  const Graph q = load_onnx(o.out / "quantized.onnx");
  EXPECT_EQ(q.opsets.at(""), 13);
  Tensor x(DType::kFloat32, {1, 3, 48, 192});
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> u(-1, 1);
  for (std::int64_t k = 0; k < x.numel(); ++k) x.data<float>()[k] = u(rng);
  const Tensor p32 = run_det(load_onnx(cls), x), p8 = run_det(q, x);
  ASSERT_EQ(p32.shape(), (Shape{1, 2}));
  std::printf("  cls: FP32 [%.4f %.4f], INT8 [%.4f %.4f]\n", p32.data<float>()[0], p32.data<float>()[1],
              p8.data<float>()[0], p8.data<float>()[1]);
  EXPECT_NEAR(p8.data<float>()[0] + p8.data<float>()[1], 1.0f, 1e-5f);  // still a softmax
  EXPECT_NEAR(p8.data<float>()[0], p32.data<float>()[0], 0.05);
}

}  // namespace
}  // namespace qeval::eval::quant
