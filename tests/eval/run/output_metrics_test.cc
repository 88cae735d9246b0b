// Per-output judging of a single model (`"outputs"` in the run config): each named output gets the
// metrics of its kind under "<output>.<metric>" keys, gates check those keys, bad configs exit 2;
// and PP-OCRv4's detection map judged as a mask tells fp16 from fp16-strict.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "datasets/npy.h"
#include "eval/onnx_builder.h"
#include "metrics/psnr.h"
#include "metrics/segmentation.h"
#include "metrics/ssim.h"
#include "metrics/tensor_error.h"
#include "reports/json_schema.h"
#include "test_util.h"

namespace qeval {
namespace {

namespace fs = std::filesystem;
using testing::run_qeval;
constexpr int kF32 = onnx::TensorProto::FLOAT;
constexpr int kSide = 16;
// Names with '/', ':' and '.', as exporters write them.
const std::string kLogits = "head/logits:0", kProb = "prob.map", kExtra = "extra", kRows = "rows",
                  kRowsAny = "rows_any";

std::vector<float> input_values() {
  std::vector<float> x(kSide * kSide);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = 2.0f * std::sin(0.37f * float(i % kSide) + 0.21f * float(i / kSide));
  return x;
}

// logits = x + bias, prob = Sigmoid(logits), extra = -logits, rows = logits as [2, 8, 16] (and
// rows_any: the same, declared with symbolic dimensions).
fs::path write_model(const testing::ScratchDir& dir, const std::string& file, float bias) {
  testing::OnnxBuilder b;
  b.input("x", kF32, {1, 1, kSide, kSide})
      .output(kLogits, kF32, {1, 1, kSide, kSide})
      .output(kProb, kF32, {1, 1, kSide, kSide})
      .output(kExtra, kF32, {1, 1, kSide, kSide})
      .output(kRows, kF32, {2, kSide / 2, kSide})
      .output(kRowsAny, kF32, {-1, -1, -1});
  b.initializer("bias", {bias}, {});
  b.node("Add", {"x", "bias"}, {kLogits}, "/head/Add");
  b.node("Sigmoid", {kLogits}, {kProb}, "/prob/Sigmoid");
  b.node("Neg", {kLogits}, {kExtra}, "/extra/Neg");
  b.initializer_i64("rows_shape", {2, kSide / 2, kSide});
  b.node("Reshape", {kLogits, "rows_shape"}, {kRows}, "/rows/Reshape");
  b.node("Identity", {kRows}, {kRowsAny}, "/rows/Identity");
  const auto bytes = b.bytes();
  return testing::write_text(dir, file, std::string(bytes.begin(), bytes.end()));
}

struct Fixture {
  testing::ScratchDir dir{"output-metrics"};
  fs::path ref, shifted;
  Fixture(float shift = 0.3f) {
    ref = write_model(dir, "model.onnx", 0.0f);
    shifted = write_model(dir, "shifted.onnx", shift);
    fs::create_directories(dir / "inputs" / "s0");
    datasets::write_npy(dir / "inputs" / "s0" / "x.npy", testing::floats({1, 1, kSide, kSide}, input_values()));
  }
  // A config comparing the model with its shifted export; `outputs` is the JSON of the key.
  fs::path config(const std::string& name, const std::string& outputs, const std::string& extra = "") const {
    return testing::write_text(dir, name,
                               R"({"pipeline": ")" + ref.string() + R"(", "inputs": ")" + (dir / "inputs").string() +
                                   R"(", "observe": {"layers": false},
      "variants": [{"name": "fp32"}, {"name": "shifted", "onnx": ")" +
                                   shifted.string() + R"("}])" + (outputs.empty() ? "" : ", \"outputs\": " + outputs) +
                                   extra + "}");
  }
};

std::string schema_errors(const fs::path& report) {
  const testing::JsonSchema schema(testing::read_json(testing::source_dir() / "docs" / "report.schema.json"));
  std::string all;
  for (const auto& e : schema.validate(testing::read_json(report))) all += e + "\n";
  return all;
}

// The shifted variant's metrics on the one sample.
nlohmann::json variant_metrics(const nlohmann::json& report) {
  for (const auto& res : report.at("samples").at(0).at("results"))
    if (res.at("variant") == "shifted") return res.at("metrics");
  return {};
}

TEST(OutputMetrics, EachNamedOutputIsJudgedByItsKindAndTheOthersNotAtAll) {
  Fixture f;
  const auto cfg = f.config("c.json", R"({")" + kLogits + R"(": {"kind": "tensor"},
      ")" + kProb + R"(": {"kind": "mask", "threshold": 0.5}})");
  const auto r = run_qeval("run --config " + cfg.string() + " --out " + (f.dir / "out").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto report = testing::read_json(f.dir / "out/report.json");
  EXPECT_EQ(schema_errors(f.dir / "out/report.json"), "");
  const auto m = variant_metrics(report);
  ASSERT_TRUE(m.is_object()) << report.dump();

  // The same comparisons computed here: logits x vs x + 0.3, the masks where they are > 0.
  const auto x = input_values();
  std::vector<float> shifted(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) shifted[i] = x[i] + 0.3f;
  const Tensor a = testing::floats({kSide, kSide}, x), b = testing::floats({kSide, kSide}, shifted);
  const auto te = metrics::tensor_error(a, b);
  ASSERT_TRUE(te.sqnr_db && te.cosine && te.rel_l2);
  EXPECT_NEAR(m.at(kLogits + ".sqnr_db").get<double>(), *te.sqnr_db, 1e-9);
  EXPECT_NEAR(m.at(kLogits + ".cosine").get<double>(), *te.cosine, 1e-12);
  EXPECT_NEAR(m.at(kLogits + ".rel_l2").get<double>(), *te.rel_l2, 1e-12);
  EXPECT_NEAR(m.at(kLogits + ".max_abs").get<double>(), te.max_abs, 1e-7);
  EXPECT_EQ(m.at(kLogits + ".nonfinite").get<double>(), 0.0);

  // Sigmoid(v) > 0.5 exactly where v > 0: the mask comparison of the logits at 0.
  const auto cmp = metrics::compare_mask_logits(a, b, 0.0f);
  ASSERT_GT(cmp.flipped_pixels, 0);  // the shift moves the boundary: not a trivial 1.0
  EXPECT_LT(cmp.iou.iou, 0.99);
  EXPECT_DOUBLE_EQ(m.at(kProb + ".mask_iou").get<double>(), cmp.iou.iou);
  EXPECT_DOUBLE_EQ(m.at(kProb + ".boundary_f").get<double>(), cmp.boundary.f);
  EXPECT_DOUBLE_EQ(m.at(kProb + ".flipped_fraction").get<double>(), cmp.flipped_fraction);
  EXPECT_TRUE(m.at(kProb + ".sqnr_db").is_number());
  EXPECT_EQ(m.at("output_nonfinite").get<double>(), 0.0);

  // Nothing of the unlisted output, no pooled keys; the metric list says the same.
  for (const auto& [key, value] : m.items()) {
    EXPECT_EQ(key.rfind(kExtra, 0), std::string::npos) << key;
    EXPECT_EQ(key.rfind("output_sqnr", 0), std::string::npos) << key;
  }
  std::vector<std::string> keys;
  for (const auto& info : report.at("metrics")) keys.push_back(info.at("key"));
  EXPECT_EQ(keys, (std::vector<std::string>{kLogits + ".sqnr_db", kLogits + ".cosine", kLogits + ".rel_l2",
                                            kLogits + ".max_abs", kLogits + ".nonfinite", kProb + ".mask_iou",
                                            kProb + ".boundary_f", kProb + ".flipped_fraction", kProb + ".sqnr_db",
                                            kProb + ".nonfinite", "output_nonfinite"}));
}

TEST(OutputMetrics, AnImageOutputGetsPsnrAndSsimOnItsRange) {
  Fixture f;
  const auto cfg = f.config("c.json", R"({")" + kLogits + R"(": {"kind": "image", "range": [-1, 1.5]}})");
  const auto r = run_qeval("run --config " + cfg.string() + " --out " + (f.dir / "out").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto m = variant_metrics(testing::read_json(f.dir / "out/report.json"));
  // Clamped to [-1, 1.5] and moved to [0, 2.5]: what metrics/ takes.
  auto on_range = [](float v) { return float(std::clamp(double(v), -1.0, 1.5) + 1.0); };
  std::vector<float> ra, rb;
  for (float v : input_values()) ra.push_back(on_range(v)), rb.push_back(on_range(v + 0.3f));
  const Tensor a = testing::floats({1, kSide, kSide}, ra), b = testing::floats({1, kSide, kSide}, rb);
  const auto psnr = metrics::psnr(a, b, 2.5).psnr_db;
  const auto ssim = metrics::ssim(a, b, metrics::SsimConvention::kWang, 2.5).ssim;
  ASSERT_TRUE(psnr && ssim);
  EXPECT_NEAR(m.at(kLogits + ".psnr_db").get<double>(), *psnr, 1e-9);
  EXPECT_NEAR(m.at(kLogits + ".ssim").get<double>(), *ssim, 1e-12);
  EXPECT_LT(*ssim, 0.999);
}

TEST(OutputMetrics, AGateChecksAPerOutputKey) {
  Fixture f;
  const auto cfg = f.config("c.json", R"({")" + kProb + R"(": {"kind": "mask", "threshold": 0.5}})");
  const auto run_with = [&](const std::string& gate) {
    const auto g = testing::write_text(f.dir, "gate.json", gate);
    return run_qeval("run --config " + cfg.string() + " --gate " + g.string() + " --out " + (f.dir / "out").string());
  };
  // The measured IoU (see above) is below 0.99 and above 0.5.
  const std::string key = kProb + ".mask_iou";
  auto r = run_with(R"({"checks": [{"metric": ")" + key + R"(", "stat": "min", "min": 0.5}]})");
  EXPECT_EQ(r.code, 0) << r.out;
  r = run_with(R"({"checks": [{"metric": ")" + key + R"(", "stat": "min", "min": 0.99}]})");
  EXPECT_EQ(r.code, 1) << r.out;
  const auto report = testing::read_json(f.dir / "out/report.json");
  bool found = false;
  for (const auto& c : report.at("gate").at("checks"))
    if (c.at("metric") == key) {
      found = true;
      EXPECT_FALSE(c.at("passed").get<bool>()) << c.dump();
    }
  EXPECT_TRUE(found) << report.at("gate").dump();
  r = run_with(R"({"per_pair": {")" + key + R"(": {"min": 0.99}}})");
  EXPECT_EQ(r.code, 1) << r.out;
  // A metric this run does not measure: the pooled key, another kind's metric of the output.
  for (const std::string& bad : std::vector<std::string>{"output_sqnr_db", kProb + ".psnr_db", kLogits + ".sqnr_db"}) {
    r = run_with(R"({"checks": [{"metric": ")" + bad + R"(", "min": 0}]})");
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find("gate.json"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("unknown metric '" + bad + "'"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(key), std::string::npos) << r.out;  // lists what the run measures
  }
}

TEST(OutputMetrics, BadOutputsConfigsExitTwoNamingTheFileAndKey) {
  Fixture f;
  struct Case {
    std::string outputs, expect;
  };
  const std::vector<Case> cases = {
      {R"({"nope": {"kind": "tensor"}})", "has no output 'nope'"},
      {R"({")" + kProb + R"(": {"kind": "heatmap"}})", "'heatmap' is not one of"},
      {R"({")" + kProb + R"(": {"kind": "mask"}})", "needs 'threshold'"},
      {R"({")" + kProb + R"(": {"kind": "mask", "threshold": "high"}})", "must be a number"},
      {R"({")" + kProb + R"(": {"kind": "tensor", "threshold": 0.5}})", "only applies to kind 'mask' or 'matte'"},
      {R"({")" + kLogits + R"(": {"kind": "image", "range": [1, 0]}})", "finite lo < hi"},
      {R"({")" + kLogits + R"(": {"kind": "image"}})", "needs 'range'"},
      {R"({")" + kLogits + R"(": {"kind": "tensor", "thresh": 1}})", "unknown key"},
      {R"({})", "non-empty object"},
      {R"({")" + kRows + R"(": {"kind": "matte"}})", "declared [2, 8, 16]: kind 'matte' needs one [H, W] plane"},
      {R"([")" + kLogits + R"("])", "must be an object"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto cfg = f.config("bad" + std::to_string(i) + ".json", cases[i].outputs);
    const auto r = run_qeval("run --config " + cfg.string() + " --out " + (f.dir / "out").string());
    EXPECT_EQ(r.code, 2) << cases[i].outputs << ": " << r.out;
    EXPECT_NE(r.out.find(cfg.filename().string()), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("outputs"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(cases[i].expect), std::string::npos) << cases[i].outputs << ": " << r.out;
  }
  // An unknown output's message lists the model's outputs.
  const auto r = run_qeval("run --config " + f.config("bad-list.json", R"({"nope": {"kind": "tensor"}})").string() +
                           " --out " + (f.dir / "out").string());
  for (const auto& name : {kLogits, kProb, kExtra, kRows}) EXPECT_NE(r.out.find(name), std::string::npos) << r.out;
}

TEST(OutputMetrics, AnOutputWhoseShapeDoesNotFitItsKindIsAnErrorOfTheSample) {
  // Declared with unknown dimensions, so only the run sees that it holds two planes.
  Fixture f;
  const auto cfg = f.config("c.json", R"({")" + kRowsAny + R"(": {"kind": "matte"}})");
  const auto r = run_qeval("run --config " + cfg.string() + " --out " + (f.dir / "out").string());
  EXPECT_EQ(r.code, 1) << r.out;  // the gate's error budget (max_errors 0)
  const auto report = testing::read_json(f.dir / "out/report.json");
  bool found = false;
  for (const auto& res : report.at("samples").at(0).at("results"))
    if (res.at("variant") == "shifted") {
      found = true;
      EXPECT_EQ(res.at("status"), "error");
      EXPECT_NE(res.at("error").get<std::string>().find("has shape [2, 8, 16]: kind 'matte' needs one [H, W] plane"),
                std::string::npos)
          << res.dump();
    }
  EXPECT_TRUE(found);
}

TEST(OutputMetrics, WithoutOutputsEveryFloatOutputIsPooledAsBefore) {
  Fixture f;
  const auto r = run_qeval("run --config " + f.config("c.json", "").string() + " --out " + (f.dir / "out").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto m = variant_metrics(testing::read_json(f.dir / "out/report.json"));
  EXPECT_TRUE(m.contains("output_sqnr_db") && m.contains("output_nonfinite")) << m.dump();
  EXPECT_FALSE(m.contains(kLogits + ".sqnr_db")) << m.dump();
}

TEST(OutputMetrics, ADivergedOutputIsUnboundedAndFailsTheGateUnlessAllowedOrNotJudged) {
  // logits + inf: the logits (and Neg) are all infinite where the reference's are finite; the
  // Sigmoid map is 1 everywhere, finite.
  Fixture f(std::numeric_limits<float>::infinity());
  const std::string key = kProb + ".mask_iou";
  const auto run_with = [&](const std::string& outputs, const std::string& gate) {
    const auto g = testing::write_text(f.dir, "gate.json", gate);
    return run_qeval("run --config " + f.config("c.json", outputs).string() + " --gate " + g.string() + " --out " +
                     (f.dir / "out").string());
  };
  const std::string both =
      R"({")" + kLogits + R"(": {"kind": "tensor"}, ")" + kProb + R"(": {"kind": "mask", "threshold": 0.5}})";
  const std::string check = R"("checks": [{"metric": ")" + key + R"(", "stat": "min", "min": 0}])";
  auto r = run_with(both, "{" + check + "}");
  EXPECT_EQ(r.code, 1) << r.out;
  auto m = variant_metrics(testing::read_json(f.dir / "out/report.json"));
  const double n = kSide * kSide;
  EXPECT_EQ(m.at(kLogits + ".sqnr_db"), "-inf");
  EXPECT_EQ(m.at(kLogits + ".max_abs"), "inf");
  EXPECT_TRUE(m.at(kLogits + ".cosine").is_null());
  EXPECT_EQ(m.at(kLogits + ".nonfinite").get<double>(), n);
  EXPECT_EQ(m.at(kProb + ".nonfinite").get<double>(), 0.0);
  EXPECT_EQ(m.at("output_nonfinite").get<double>(), n);  // over the judged outputs
  r = run_with(both, "{" + check + R"(, "allow_nonfinite": true})");
  EXPECT_EQ(r.code, 0) << r.out;
  // The logits not judged: their infinities do not count.
  r = run_with(R"({")" + kProb + R"(": {"kind": "mask", "threshold": 0.5}})", "{" + check + "}");
  EXPECT_EQ(r.code, 0) << r.out;
  m = variant_metrics(testing::read_json(f.dir / "out/report.json"));
  EXPECT_EQ(m.at("output_nonfinite").get<double>(), 0.0);
}

TEST(OutputMetrics, AMergedShardGivesThePerOutputMetricsOfTheRun) {
  Fixture f;
  const auto cfg = f.config("c.json", R"({")" + kProb + R"(": {"kind": "matte"}, ")" + kLogits +
                                          R"(": {"kind": "image", "range": [-2, 2]}})");
  auto r = run_qeval("run --config " + cfg.string() + " --shard 1/1 --out " + (f.dir / "shard").string());
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_qeval("merge " + (f.dir / "shard").string() + " --out " + (f.dir / "merged").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto a = variant_metrics(testing::read_json(f.dir / "shard/report.json"));
  EXPECT_TRUE(a.contains(kProb + ".mask_iou") && a.contains(kLogits + ".psnr_db")) << a.dump();
  EXPECT_EQ(a, variant_metrics(testing::read_json(f.dir / "merged/report.json")));
}

// PP-OCRv4's detector judged on its probability map at DB's 0.3 box threshold: fp16 (BatchNorm
// folded first, as deployments do) keeps the text mask, fp16-strict (running variances of ~1e8
// overflow) loses it; the same gate on the per-output key passes the one and fails the other.
TEST(OutputMetrics, PpOcrDetectionMaskTellsFp16FromFp16Strict) {
  QEVAL_REAL_MODEL(model, "ppocr/ch_PP-OCRv4_det_infer.onnx");
  testing::ScratchDir dir("output-metrics-ppocr");
  const fs::path inputs = testing::source_dir() / "tests/data/real_models/ppocr_det/inputs";
  const std::string key = "sigmoid_0.tmp_0.mask_iou";
  const auto cfg = testing::write_text(
      dir, "c.json",
      R"({"pipeline": ")" + model.string() + R"(", "inputs": ")" + inputs.string() + R"(", "observe": {"layers": false},
    "outputs": {"sigmoid_0.tmp_0": {"kind": "mask", "threshold": 0.3}},
    "variants": [{"name": "fp32"}, {"name": "fp16", "precision": "fp16"}, {"name": "strict", "precision": "fp16-strict"}]})");
  const auto gate = [&](const std::string& variant) {
    return testing::write_text(dir, "gate-" + variant + ".json",
                               R"({"checks": [{"metric": ")" + key + R"(", "stat": "min", "min": 0.99, "variant": ")" +
                                   variant + R"("}], "allow_nonfinite": true})");
  };
  auto r = run_qeval("run --config " + cfg.string() + " --gate " + gate("fp16").string() + " --out " +
                     (dir / "out").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto report = testing::read_json(dir / "out/report.json");
  std::map<std::string, nlohmann::json> m;
  for (const auto& res : report.at("samples").at(0).at("results")) m[res.at("variant")] = res.at("metrics");
  ASSERT_TRUE(m["fp16"].contains(key) && m["strict"].contains(key)) << report.at("samples").dump();
  const double fp16 = m["fp16"][key].get<double>(), strict = m["strict"][key].get<double>();
  std::printf("PP-OCRv4 det mask IoU at 0.3: fp16 %.6f, fp16-strict %.6f; boundary F %s / %s; flipped %s / %s\n", fp16,
              strict, m["fp16"]["sigmoid_0.tmp_0.boundary_f"].dump().c_str(),
              m["strict"]["sigmoid_0.tmp_0.boundary_f"].dump().c_str(),
              m["fp16"]["sigmoid_0.tmp_0.flipped_fraction"].dump().c_str(),
              m["strict"]["sigmoid_0.tmp_0.flipped_fraction"].dump().c_str());
  EXPECT_GE(fp16, 0.99);
  EXPECT_LT(strict, 0.5);
  r = run_qeval("run --config " + cfg.string() + " --gate " + gate("strict").string() + " --out " +
                (dir / "out").string());
  EXPECT_EQ(r.code, 1) << r.out;
}

}  // namespace
}  // namespace qeval
