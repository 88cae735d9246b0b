// The `qeval run` config: parsing, defaults, and errors that name the file and the key.
#include "eval/run/run_config.h"

#include <gtest/gtest.h>

#include "eval/run/gate.h"
#include "kernels/error.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

namespace fs = std::filesystem;

std::string tiny_sd() { return (testing::source_dir() / "models" / "tiny-sd").string(); }
std::string tiny_sam() { return (testing::source_dir() / "models" / "tiny-sam").string(); }

RunSpec parse(const std::string& body) { return parse_run_config(body, testing::source_dir() / "c.json"); }

std::string error_of(const std::string& body) {
  try {
    parse(body);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(RunConfig, ParsesVariantsOverridesAndObserveOptions) {
  const RunSpec s = parse(R"({
    "pipeline": ")" + tiny_sd() +
                          R"(", "prompts": "prompts/tiny_eval.txt", "first": 2, "count": 3,
    "seeds": [7, 9], "steps": 5, "guidance_scale": 3.5, "scheduler": "euler",
    "variants": [{"name": "ref"}, {"name": "half", "precision": "fp16"},
                 {"name": "qdq", "onnx": {"unet": "models/tiny-sd/unet.onnx"}}],
    "reference": "ref",
    "observe": {"models": ["unet"], "local_error": false, "histograms": 3},
    "save_images": false})");
  EXPECT_EQ(s.kind, "txt2img");
  EXPECT_EQ(s.inputs, testing::source_dir() / "prompts/tiny_eval.txt");  // relative to the config
  EXPECT_EQ(s.first, 2);
  EXPECT_EQ(s.count, 3);
  EXPECT_EQ(s.seeds, (std::vector<std::uint64_t>{7, 9}));
  EXPECT_EQ(*s.steps, 5);
  EXPECT_EQ(*s.guidance_scale, 3.5);
  EXPECT_EQ(*s.scheduler, SchedulerType::kEulerDiscrete);
  ASSERT_EQ(s.variants.size(), 3u);
  EXPECT_EQ(s.variants[1].precision, Precision::kFp16);
  EXPECT_EQ(s.variants[2].onnx.at("unet"), testing::source_dir() / "models/tiny-sd/unet.onnx");
  EXPECT_EQ(s.reference_index(), 0u);
  EXPECT_EQ(s.observe.models, std::vector<std::string>{"unet"});
  EXPECT_FALSE(s.observe.local_error);
  EXPECT_TRUE(s.observe.teacher_forced);
  EXPECT_EQ(s.observe.histograms, 3);
  EXPECT_FALSE(s.save_images);
}

TEST(RunConfig, DefaultsAndTheShippedDefault) {
  const RunSpec s = parse(R"({"pipeline": ")" + tiny_sam() +
                          R"(", "variants": [{"name": "a"}, {"name": "b", "precision": "bf16"}]})");
  EXPECT_EQ(s.kind, "segmentation");
  EXPECT_EQ(s.reference, "a");  // the first variant
  EXPECT_EQ(s.seeds, std::vector<std::uint64_t>{0});
  EXPECT_TRUE(s.observe.layers);
  EXPECT_TRUE(s.observe.local_error);

  const RunSpec d = default_run_config();
  EXPECT_EQ(d.kind, "txt2img");
  EXPECT_EQ(fs::canonical(d.pipeline), fs::canonical(tiny_sd()));
  ASSERT_GE(d.variants.size(), 2u);
  EXPECT_EQ(d.reference, "fp32");
  EXPECT_EQ(d.variants[1].name, "fp16");
  EXPECT_EQ(d.count, 8);
  EXPECT_EQ(d.gate, d.pipeline / "gate.json");
  const Gate g = load_gate(d.gate);  // the shipped gate parses and checks layers and steps
  EXPECT_EQ(g.checks.size(), 2u);
  ASSERT_EQ(g.layer_checks.size(), 2u);
  EXPECT_EQ(g.layer_checks[1].nodes, "^/(conv_in|conv_out|time_embedding)/|/time_emb_proj/");
  EXPECT_EQ(g.step_checks.size(), 1u);
  EXPECT_EQ(*g.max_nonfinite, 0u);
}

TEST(RunConfig, ErrorsNameTheKeyAndWhatWasExpected) {
  const std::string p = R"("pipeline": ")" + tiny_sd() + R"(", )";
  const std::string two = R"("variants": [{"name": "a"}, {"name": "b"}])";
  EXPECT_NE(error_of("{" + p + two + R"(, "sedes": [1]})").find("unknown key 'sedes'"), std::string::npos);
  EXPECT_NE(error_of("{" + p + R"("variants": [{"name": "a"}, {"name": "a"}]})").find("two variants are named 'a'"),
            std::string::npos);
  EXPECT_NE(error_of("{" + p + two + R"(, "reference": "c"})").find("reference"), std::string::npos);
  EXPECT_NE(error_of("{" + p + R"("variants": [{"name": "a"}]})").find("at least two variants"), std::string::npos);
  EXPECT_NE(error_of("{" + p + R"("variants": [{"name": "a"}, {"name": "b", "precision": "int4"}]})")
                .find("variants[1].precision"),
            std::string::npos);
  EXPECT_NE(
      error_of("{" + p + R"("variants": [{"name": "a"}, {"name": "b", "onnx": "nope.onnx"}]})").find("no such file"),
      std::string::npos);
  EXPECT_NE(error_of("{" + p + two + R"(, "seeds": [-1]})").find("seeds"), std::string::npos);
  EXPECT_NE(error_of("{" + p + two + R"(, "steps": 0})").find("steps"), std::string::npos);
  EXPECT_NE(error_of(R"({"pipeline": ")" + tiny_sam() + "\", " + two + R"(, "steps": 4})")
                .find("only applies to a txt2img pipeline"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"pipeline": ")" + tiny_sam() + "\", " + two + R"(, "outputs": {"masks": {"kind": "tensor"}}})")
                .find("outputs: only applies to a single ONNX model"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"pipeline": "/nonexistent", )" + two + "}").find("no such file"), std::string::npos);
  EXPECT_NE(error_of("{" + two + "}").find("'pipeline'"), std::string::npos);
  EXPECT_NE(error_of("not json").find("not valid JSON"), std::string::npos);
  // Every message names the file and the documentation.
  EXPECT_NE(error_of("{" + p + two + R"(, "sedes": 1})").find("c.json"), std::string::npos);
  EXPECT_NE(error_of("{" + p + two + R"(, "sedes": 1})").find("docs/run-config.md"), std::string::npos);
}

}  // namespace
}  // namespace qeval::eval
