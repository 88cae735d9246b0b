// qeval run end to end: tiny-sd (2 prompts x 2 steps) and tiny-sam through the CLI: exit codes,
// the report against its published schema, images, the gate, input errors.
#include <gtest/gtest.h>

#include <fstream>

#include "reports/json_schema.h"
#include "test_util.h"

namespace qeval {
namespace {

namespace fs = std::filesystem;
using testing::run_qeval;

std::string schema_errors(const fs::path& report) {
  const testing::JsonSchema schema(testing::read_json(testing::source_dir() / "docs" / "report.schema.json"));
  std::string all;
  for (const auto& e : schema.validate(testing::read_json(report))) all += e + "\n";
  return all;
}

TEST(RunCli, TinySdTwoPromptsWritesAValidReportAndPassesTheDefaultGate) {
  testing::ScratchDir dir("run-cli-sd");
  const auto config = testing::write_text(dir, "c.json",
                                          R"({
    "pipeline": ")" + (testing::source_dir() / "models/tiny-sd").string() +
                                              R"(",
    "count": 2, "steps": 2,
    "variants": [{"name": "fp32"}, {"name": "fp16", "precision": "fp16"}]})");
  const auto r = run_qeval("run --config " + config.string() + " --out " + (dir / "out").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("PASS"), std::string::npos) << r.out;
  for (const char* f : {"report.json", "report.html", "junit.xml", "images/p001-s0/fp32.png", "images/p001-s0/fp16.png",
                        "images/p002-s0/fp16_diff.png"})
    EXPECT_TRUE(fs::exists(dir / "out" / f)) << f;
  EXPECT_EQ(schema_errors(dir / "out/report.json"), "");
  const auto j = testing::read_json(dir / "out/report.json");
  EXPECT_EQ(j["samples"].size(), 2u);
  EXPECT_GT(j["layers"]["nodes"].size(), 500u);
  EXPECT_EQ(j["config"]["steps"], 2);

  // A gate the fp16 images cannot meet: exit 1, the failed check in junit.xml and on stdout.
  const auto gate = testing::write_text(dir, "g.json", R"({"checks": [{"metric": "psnr_db", "stat": "min", "min": 200}],
                                                    "layers": [{"column": "acc_sqnr_db", "stat": "min", "min": 0}]})");
  const auto failed = run_qeval("run --config " + config.string() + " --gate " + gate.string() + " --out " +
                                (dir / "out2").string() + " --no-layers");
  EXPECT_EQ(failed.code, 1) << failed.out;
  EXPECT_NE(failed.out.find("FAIL"), std::string::npos) << failed.out;
  std::ifstream junit(dir / "out2/junit.xml");
  const std::string xml((std::istreambuf_iterator<char>(junit)), std::istreambuf_iterator<char>());
  EXPECT_NE(xml.find("psnr_db min &gt;= 200"), std::string::npos) << xml;
  EXPECT_NE(xml.find("<failure"), std::string::npos);
}

// `qeval run --no-layers` under the shipped gate: fp16 passes; the layer and NaN/Inf checks it
// did not measure say "not measured" (they used to fail with "value 0"). The report records the
// thread count given (--threads 1 was written as the core count).
TEST(RunCli, NoLayersWithTheShippedGatePassesFp16AndSaysWhatWasNotMeasured) {
  testing::ScratchDir dir("run-cli-no-layers");
  const auto config = testing::write_text(dir, "c.json",
                                          R"({
    "pipeline": ")" + (testing::source_dir() / "models/tiny-sd").string() +
                                              R"(",
    "count": 1, "steps": 2,
    "variants": [{"name": "fp32"}, {"name": "fp16", "precision": "fp16"}]})");
  const auto r = run_qeval("--threads 1 run --config " + config.string() + " --gate " +
                           (testing::source_dir() / "models/tiny-sd/gate.json").string() + " --out " +
                           (dir / "out").string() + " --no-layers");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("qeval run: PASS - 4 of 4 gate checks passed, 3 not measured"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("not measured (neither pass nor fail):"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
  EXPECT_EQ(schema_errors(dir / "out/report.json"), "");
  const auto j = testing::read_json(dir / "out/report.json");
  EXPECT_EQ(j["config"]["threads"], 1);
  EXPECT_TRUE(j["gate"]["passed"].get<bool>());
  std::size_t unmeasured = 0;
  for (const auto& c : j["gate"]["checks"])
    if (c.at("measured") == false) ++unmeasured;
  EXPECT_EQ(unmeasured, 3u);  // two layer checks and max_nonfinite
  EXPECT_NE(testing::read_text(dir / "out/report.html").find("not measured"), std::string::npos);
}

TEST(RunCli, TinySamPointPromptsCompareMasks) {
  testing::ScratchDir dir("run-cli-sam");
  const auto config = testing::write_text(dir, "c.json",
                                          R"({
    "pipeline": ")" + (testing::source_dir() / "models/tiny-sam").string() +
                                              R"(", "count": 4,
    "variants": [{"name": "fp32"}, {"name": "bf16", "precision": "bf16"}]})");
  const auto r = run_qeval("run --config " + config.string() + " --out " + (dir / "out").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(schema_errors(dir / "out/report.json"), "");
  const auto j = testing::read_json(dir / "out/report.json");
  EXPECT_EQ(j["samples"].size(), 4u);
  EXPECT_EQ(j["config"]["pipeline"], "segmentation");
  EXPECT_TRUE(j["samples"][0]["results"][1]["metrics"].contains("mask_iou"));
}

TEST(RunCli, TinySamRecipeVariantCalibratesBothModelsAndGivesMaskIou) {
  testing::ScratchDir dir("run-cli-sam-recipe");
  const auto config =
      testing::write_text(dir, "c.json",
                          R"({
    "pipeline": ")" + (testing::source_dir() / "models/tiny-sam").string() +
                              R"(", "count": 4,
    "calibration": {"count": 12, "cache": ")" +
                              (dir / "cache").string() + R"("},
    "variants": [{"name": "fp32"},
                 {"name": "int8", "recipe": ")" +
                              (testing::source_dir() / "recipes/int8-level3.json").string() + R"("}]})");
  const auto r = run_qeval("run --config " + config.string() + " --out " + (dir / "out").string() + " --no-layers");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(schema_errors(dir / "out/report.json"), "");
  const auto j = testing::read_json(dir / "out/report.json");
  const auto& int8 = j["variants"][1];
  EXPECT_EQ(int8["kind"], "recipe");
  EXPECT_GT(int8["quantized_nodes"].get<int>(), 60);  // encoder and decoder
  EXPECT_EQ(int8["summary"]["timings"][1]["name"], "calibration_s");
  ASSERT_EQ(j["samples"].size(), 4u);
  for (const auto& sample : j["samples"]) {
    const double iou = sample["results"][1]["metrics"]["mask_iou"].get<double>();
    EXPECT_GT(iou, 0.5) << sample["id"];
    EXPECT_LE(iou, 1.0) << sample["id"];
  }
  EXPECT_EQ(testing::read_json(dir / "out/report.json")["config"]["pipeline"], "segmentation");
}

TEST(RunCli, SingleModelWithARecipeVariantCalibratesOnceThenReadsTheCache) {
  testing::ScratchDir dir("run-cli-single");
  const fs::path vit = testing::source_dir() / "tests/data/onnx/vit_block";
  const auto config =
      testing::write_text(dir, "c.json",
                          R"({
    "pipeline": ")" + (vit / "model.onnx").string() +
                              R"(", "inputs": ")" + (vit / "inputs").string() + R"(",
    "calibration": {"prompts": ")" +
                              (vit / "inputs").string() + R"(", "cache": ")" + (dir / "cache").string() + R"("},
    "variants": [{"name": "fp32"}, {"name": "fp16", "precision": "fp16"},
                 {"name": "int8", "recipe": ")" +
                              (testing::source_dir() / "recipes/int8-level3.json").string() + R"("}]})");
  for (int run = 0; run < 2; ++run) {
    const auto r = run_qeval("run --config " + config.string() + " --out " + (dir / "out").string());
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(schema_errors(dir / "out/report.json"), "");
    const auto j = testing::read_json(dir / "out/report.json");
    EXPECT_EQ(j["config"]["pipeline"], "single-model");
    const auto& int8 = j["variants"][2];
    EXPECT_EQ(int8["kind"], "recipe");
    EXPECT_GT(int8["quantized_nodes"].get<int>(), 0);
    // What level 3 leaves in float (vit_block's attention matmuls, level 4) is listed with why.
    ASSERT_FALSE(int8["unquantized"].empty());
    EXPECT_NE(int8["unquantized"][0]["reason"].get<std::string>().find("recipe level 3 < 4"), std::string::npos)
        << int8["unquantized"].dump();
    EXPECT_EQ(int8["summary"]["timings"][1]["name"], run == 0 ? "calibration_s" : "calibration_s_cached");
    const auto& sqnr = j["samples"][0]["results"][2]["metrics"]["output_sqnr_db"];
    EXPECT_GT(sqnr.get<double>(), 20.0);
    EXPECT_LT(sqnr.get<double>(), j["samples"][0]["results"][1]["metrics"]["output_sqnr_db"].get<double>());
    // The quantized layers: their format, and clip rates against the calibrated ranges.
    const auto& table = j["layers"]["tables"][2];
    bool int8_layer = false;
    for (const auto& f : table["format"]) int8_layer |= f == "int8";
    EXPECT_TRUE(int8_layer);
    ASSERT_TRUE(table["stats"].contains("clip_rate")) << "run " << run;
    // Behind SmoothQuant's pre-scale the ranges are per channel: every quantized MatMul's input
    // producer (the LayerNorms, the attention output, the GELU) has a measured clip rate.
    int measured = 0;
    for (const auto& c : table["stats"]["clip_rate"]) measured += c.is_number();
    EXPECT_GE(measured, 8) << "run " << run;
  }
}

TEST(RunCli, BadInputIsExitTwoWithTheReason) {
  testing::ScratchDir dir("run-cli-bad");
  const auto config = testing::write_text(dir, "c.json", R"({"pipeline": "/nonexistent/model", "variants": []})");
  auto r = run_qeval("run --config " + config.string() + " --out " + (dir / "out").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("pipeline"), std::string::npos) << r.out;
  r = run_qeval("run --config " + (dir / "missing.json").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("missing.json"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "out/report.json"));
  // An --out that cannot be a folder (under a file) is named, before any work.
  const auto blocker = testing::write_text(dir, "blocker", "a file");
  r = run_qeval("run --out " + (blocker / "out").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("cannot create the folder"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace qeval
