// The verbs on an SDXL export folder (the untrained tiny-sdxl, tests/data/tiny_sdxl_random): a
// one-prompt two-step `qeval run` with an FP16 and an INT8 recipe variant (text_encoder_2 named in
// the report with its layers; the VAE upcast to FP32 under force_upcast), the FP16 VAE's overflow
// located by model, node and step and failing the gate, and generate / calibrate /
// compare-recipes / triage running on the folder.
#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "eval/run/evaluator.h"
#include "test_util.h"

namespace qeval {
namespace {

namespace fs = std::filesystem;
using testing::run_qeval;

std::string sdxl_dir() { return (testing::data_dir() / "tiny_sdxl_random").string(); }
std::string src(const std::string& rel) { return (testing::source_dir() / rel).string(); }

// A run config over one prompt, two steps, calibrated on the same prompt; `variants` a JSON list.
fs::path write_config(const testing::ScratchDir& dir, const std::string& variants) {
  const fs::path prompts =
      testing::write_text(dir, "prompts.txt", "a large green ring on the right on a gradient orange background\n");
  return testing::write_text(dir, "c.json",
                             R"({"pipeline": ")" + sdxl_dir() + R"(", "prompts": ")" + prompts.string() +
                                 R"(", "steps": 2,
    "calibration": {"prompts": ")" +
                                 prompts.string() + R"(", "cache": ")" + (dir / "cache").string() + R"("},
    "variants": )" + variants + "}");
}

std::set<std::string> models_of_layers(const nlohmann::json& report) {
  std::set<std::string> models;
  for (const auto& l : report["layers"]["nodes"]) models.insert(l["component"].get<std::string>());
  return models;
}

TEST(SdxlRunCli, Fp16AndInt8VariantsRunAndTheReportNamesTextEncoder2) {
  testing::ScratchDir dir("sdxl-run");
  const fs::path config = write_config(dir, R"([{"name": "fp32"}, {"name": "fp16", "precision": "fp16"},
      {"name": "int8-l3", "recipe": ")" + src("recipes/int8-level3.json") +
                                                R"(", "precision": "fp16"}])");
  const auto r = run_qeval("run --config " + config.string() + " --out " + (dir / "out").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = testing::read_json(dir / "out/report.json");
  const std::set<std::string> models = models_of_layers(j);
  for (const char* m : {"text_encoder", "text_encoder_2", "unet", "vae_decoder"})
    EXPECT_TRUE(models.count(m)) << m << " has no layers in report.json";
  // Each variant's quantization lists every model; the recipe quantizes the UNet only.
  for (const auto& v : j["variants"]) {
    std::vector<std::string> names;
    for (const auto& q : v["quantization"]) names.push_back(q["model"]);
    EXPECT_EQ(names, (std::vector<std::string>{"text_encoder", "text_encoder_2", "unet", "vae_decoder"}));
  }
  EXPECT_GT(j["variants"][2]["quantization"][2]["quantized_nodes"].get<int>(), 0);
  EXPECT_EQ(j["variants"][2]["quantization"][1]["quantized_nodes"].get<int>(), 0);
  // The report says the VAE ran in FP32 under force_upcast.
  bool upcast_setting = false;
  for (const auto& s : j["config"]["settings"])
    upcast_setting |= s["key"] == "vae_decoder" && s["value"].get<std::string>().find("fp32") != std::string::npos;
  EXPECT_TRUE(upcast_setting) << j["config"]["settings"].dump();
  // Every output finite: the FP16 variants decode in FP32 (force_upcast), so no NaN anywhere.
  EXPECT_TRUE(j["nonfinite"].empty()) << j["nonfinite"].dump();
  ASSERT_EQ(j["samples"].size(), 1u);
}

// The tiny-sdxl VAE overflows FP16 as SDXL's does: a variant that asks for its VAE in FP16 gets it,
// and the run names the first non-finite node output (model vae_decoder, after the last step) and
// fails the gate.
TEST(SdxlRunCli, AnFp16VaeOverflowIsLocatedByModelNodeAndStepAndFailsTheGate) {
  testing::ScratchDir dir("sdxl-vae16");
  const fs::path config = write_config(dir, R"([{"name": "fp32"},
      {"name": "fp16-vae16", "precision": "fp16", "model_precision": {"vae_decoder": "fp16"}}])");
  const fs::path gate = testing::write_text(
      dir, "g.json", R"({"checks": [{"metric": "psnr_db", "stat": "min", "min": 10}], "max_nonfinite": 0})");
  const auto r =
      run_qeval("run --config " + config.string() + " --gate " + gate.string() + " --out " + (dir / "out").string());
  EXPECT_EQ(r.code, 1) << r.out;
  const auto j = testing::read_json(dir / "out/report.json");
  ASSERT_EQ(j["nonfinite"].size(), 1u) << j["nonfinite"].dump();
  const auto& hit = j["nonfinite"][0];
  EXPECT_EQ(hit["variant"], "fp16-vae16");
  EXPECT_EQ(hit["model"], "vae_decoder");
  EXPECT_EQ(hit["step"], -1);  // the decoder runs once, after the denoising steps
  EXPECT_FALSE(hit["node"].get<std::string>().empty());
  EXPECT_GT(hit["nan_count"].get<std::uint64_t>() + hit["inf_count"].get<std::uint64_t>(), 0u);
  EXPECT_NE(r.out.find("vae_decoder " + hit["node"].get<std::string>()), std::string::npos) << r.out;
  // The same FP16 variant without model_precision keeps the VAE in FP32: finite, gate passes.
  testing::ScratchDir dir2("sdxl-vae-upcast");
  const fs::path config2 = write_config(dir2, R"([{"name": "fp32"}, {"name": "fp16", "precision": "fp16"}])");
  const auto ok = run_qeval("run --config " + config2.string() + " --gate " + gate.string() + " --out " +
                            (dir2 / "out").string() + " --no-layers");
  EXPECT_EQ(ok.code, 0) << ok.out;
}

TEST(SdxlVerbsCli, GenerateCalibrateCompareRecipesAndTriageRunOnTheFolder) {
  testing::ScratchDir dir("sdxl-verbs");
  const auto gen = run_qeval("generate --pipeline " + sdxl_dir() +
                             " --prompt 'a small red circle' --seed 3 --steps 2 --out " + (dir / "g.png").string());
  ASSERT_EQ(gen.code, 0) << gen.out;
  EXPECT_TRUE(fs::exists(dir / "g.png"));
  EXPECT_EQ(gen.out.find("force_upcast"), std::string::npos) << gen.out;
  // --precision fp16: the VAE still decodes in FP32 (force_upcast), and says so; the image is finite
  // (an FP16 decode of this VAE is all NaN: SdxlVae.ForceUpcastRunsTheDecoderInFp32UnderFp16).
  const auto half =
      run_qeval("generate --pipeline " + sdxl_dir() +
                " --prompt 'a small red circle' --seed 3 --steps 2 --precision fp16 --out " + (dir / "h.png").string());
  ASSERT_EQ(half.code, 0) << half.out;
  EXPECT_NE(half.out.find("fp16 (vae_decoder fp32: force_upcast)"), std::string::npos) << half.out;
  const fs::path prompts = testing::write_text(dir, "p.txt", "a small red circle\na blue square\n");
  const auto cal =
      run_qeval("calibrate --recipe " + src("recipes/int8-level3.json") + " --pipeline " + sdxl_dir() + " --prompts " +
                prompts.string() + " --steps 2 --no-cache --out " + (dir / "cal").string());
  ASSERT_EQ(cal.code, 0) << cal.out;
  const fs::path config = write_config(dir, R"([{"name": "fp32"},
      {"name": "int8", "recipe": ")" + src("recipes/int8-level3.json") +
                                                R"("}])");
  const auto cmp = run_qeval("compare-recipes --config " + config.string() + " --recipes " +
                             src("recipes/int8-level3.json") + " --out " + (dir / "cmp").string());
  EXPECT_EQ(cmp.code, 0) << cmp.out;
  const fs::path gate =
      testing::write_text(dir, "g.json", R"({"checks": [{"metric": "psnr_db", "stat": "min", "min": 10}]})");
  // --rank local: one run (sensitivity ranking makes two per quantized node, ~45 s here).
  const auto tri = run_qeval("triage --config " + config.string() + " --variant int8 --gate " + gate.string() +
                             " --rank local --out " + (dir / "tri").string());
  EXPECT_EQ(tri.code, 0) << tri.out;
  EXPECT_TRUE(fs::exists(dir / "tri" / "triage.json")) << tri.out;
}

// text_encoder_2 is a txt2img model name the run config accepts, but an SD pipeline has none: a
// variant naming it (an export, a precision) is refused, never ignored.
TEST(SdxlRunCli, ASecondTextEncoderNamedForAnSdPipelineIsRefused) {
  testing::ScratchDir dir("sd-te2");
  for (const std::string& variant :
       {R"({"name": "x", "onnx": {"text_encoder_2": ")" + src("models/tiny-sd/text_encoder.onnx") + R"("}})",
        std::string(R"({"name": "x", "model_precision": {"text_encoder_2": "fp16"}})")}) {
    const fs::path config = testing::write_text(dir, "c.json",
                                                R"({"pipeline": ")" + src("models/tiny-sd") +
                                                    R"(", "count": 1, "steps": 1,
      "variants": [{"name": "fp32"}, )" + variant + "]}");
    const auto r = run_qeval("run --config " + config.string() + " --out " + (dir / "out").string());
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find("variant 'x'"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("no model 'text_encoder_2' (models: text_encoder, unet, vae_decoder)"), std::string::npos)
        << r.out;
  }
}

// Observed, the variants' calls of both text encoders run in lockstep with the reference's (or
// one after the other): the same statistics to the bit; an FP32 variant (same graphs and options as
// the reference) shares the reference's embeddings and has no error anywhere.
TEST(SdxlEvaluator, BothTextEncodersRunInLockstepWithTheSameResultsAsOneAfterTheOther) {
  testing::ScratchDir dir("sdxl-lockstep");
  eval::RunSpec spec;
  spec.pipeline = sdxl_dir();
  spec.kind = "txt2img";
  spec.inputs = testing::write_text(dir, "p.txt", "a small red circle\n");
  spec.steps = 2;
  spec.negative_prompt = "a blue square";  // encoded, not zeros: both halves of the batch run
  eval::VariantSpec fp32, same, fp16;
  fp32.name = "fp32";
  same.name = "fp32-again";
  fp16.name = "fp16";
  fp16.precision = eval::Precision::kFp16;
  spec.variants = {fp32, same, fp16};
  spec.reference = "fp32";
  auto run = [&](bool interleave) {
    const auto driver = eval::make_run_driver(spec);
    EXPECT_EQ(driver->models(), (std::vector<std::string>{"text_encoder", "text_encoder_2", "unet", "vae_decoder"}));
    eval::RunResult r;
    tbb::task_arena arena(1);
    arena.execute([&] {
      eval::EvaluatorOptions o;
      o.workers = 1;
      o.interleave = interleave;
      r = eval::evaluate(spec, *driver, eval::build_variants(spec, *driver), o);
    });
    return r;
  };
  const eval::RunResult a = run(true), b = run(false);
  // The FP16 variant's VAE runs in FP32 (force_upcast); the others have no override.
  EXPECT_EQ(a.variants[2].model_precision,
            (std::map<std::string, eval::Precision>{{"vae_decoder", eval::Precision::kFp32}}));
  EXPECT_TRUE(a.variants[1].model_precision.empty());
  for (std::size_t v = 0; v < 3; ++v) {
    EXPECT_TRUE(a.layers[v] == b.layers[v]) << v;
    EXPECT_EQ(a.first_nonfinite[v], b.first_nonfinite[v]);
    const auto& x = a.units[0].samples[0].variants[v].metrics;
    const auto& y = b.units[0].samples[0].variants[v].metrics;
    ASSERT_EQ(x.size(), y.size());
    for (std::size_t k = 0; k < x.size(); ++k) EXPECT_EQ(x[k].value, y[k].value);
  }
  EXPECT_TRUE(a.units[0].samples[0].variants[1].identical);
  EXPECT_FALSE(a.units[0].samples[0].variants[2].identical);
  // text_encoder_2's layers were observed and compared for the FP16 variant.
  const eval::LayerSpace& space = *a.observation.space;
  std::size_t te2 = 0;
  for (std::size_t l = 0; l < a.layers[2].layers(); ++l)
    if (a.layers[2].has(l) && space.models()[space.model_of(l)].name == "text_encoder_2") ++te2;
  EXPECT_GT(te2, 10u);
}

}  // namespace
}  // namespace qeval
