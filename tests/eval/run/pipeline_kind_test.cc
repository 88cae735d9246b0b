// Pipeline kinds (eval/run/pipeline_kind.h): the built-in registry, and a kind defined and
// registered in this file alone ("fake": the ViT block run on scaled copies of its input) that
// the run config reader, the evaluator, recipe variants and the report take like a built-in one.
#include "eval/run/pipeline_kind.h"

#include <gtest/gtest.h>

#include <fstream>

#include "eval/exec/onnx_import.h"
#include "eval/run/evaluator.h"
#include "eval/run/recipe_variant.h"
#include "eval/run/run_report_build.h"
#include "kernels/error.h"
#include "metrics/tensor_error.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

namespace fs = std::filesystem;

const fs::path kVit = testing::source_dir() / "tests/data/onnx/vit_block";

// A ".fake" file holds the number of units: unit k runs the ViT block on its input times (k + 1).
struct FakeThread : DriverThread {
  std::vector<std::unique_ptr<Session>> sessions;  // per variant
};

class FakeDriver : public RunDriver {
 public:
  explicit FakeDriver(const RunSpec& spec)
      : RunDriver(pipeline_kind("fake")), graph_(std::make_shared<const Graph>(load_onnx(kVit / "model.onnx"))) {
    std::ifstream in(spec.pipeline);
    if (!(in >> units_) || units_ < 1) throw InputError(spec.pipeline.string() + ": expected a unit count");
    input_ = quant::read_tensor_sample(kVit / "inputs", *graph_);
    description_.name = spec.pipeline.stem().string();
    description_.inputs = {"scales", spec.pipeline.string(), ""};
    description_.metrics = {{"fake_max_abs", "max |err|", false}};
    description_.settings = {{"units", std::to_string(units_)}};
  }

  std::shared_ptr<const Graph> reference_graph(const std::string&) const override { return graph_; }
  std::map<std::string, std::shared_ptr<const Graph>> variant_graphs(const VariantSpec&) const override {
    return {{"model", graph_}};
  }
  CalibrationData calibration_data(const VariantSpec&, const RunSpec& spec, bool) const override {
    auto set = [this](const std::string&) -> std::unique_ptr<quant::CalibrationSet> {
      return std::make_unique<quant::TensorCalibrationSet>(std::vector<std::map<std::string, Tensor>>{input(0)});
    };
    return {{"fake calibration", spec.pipeline.string(), ""}, {"model"}, set};
  }

  std::size_t units() const override { return std::size_t(units_); }
  UnitInfo unit(std::size_t i) const override { return {"x" + std::to_string(i + 1), {}}; }
  std::unique_ptr<DriverThread> make_thread(const std::vector<BuiltVariant>& variants) const override {
    auto t = std::make_unique<FakeThread>();
    for (const auto& v : variants) t->sessions.push_back(std::make_unique<Session>(*v.graphs.at("model"), v.options));
    return t;
  }
  void run_unit(std::size_t index, DriverThread& thread, const UnitContext& ctx, UnitOutcome& out) const override {
    auto& th = static_cast<FakeThread&>(thread);
    const std::size_t nv = ctx.variants->size(), r = ctx.reference;
    const auto in = input(index);
    std::vector<std::map<std::string, Tensor>> outputs(nv);
    for (std::size_t v = 0; v < nv; ++v) outputs[v] = th.sessions[v]->run(in);
    SampleOutcome& s = out.samples.emplace_back();
    s.id = unit(index).id;
    s.prompt = "input x " + std::to_string(index + 1);
    s.variants.resize(nv);
    for (std::size_t v = 0; v < nv; ++v) {
      if (v == r) continue;
      double max_abs = 0;
      for (const auto& [name, t] : outputs[r])
        max_abs = std::max(max_abs, metrics::tensor_error(t, outputs[v].at(name)).max_abs);
      s.variants[v].metrics.push_back({"fake_max_abs", max_abs, {}, ""});
      s.variants[v].identical = max_abs == 0;
    }
    if (ctx.tick) ctx.tick();
  }

 private:
  std::map<std::string, Tensor> input(std::size_t unit) const {
    std::map<std::string, Tensor> in;
    for (const auto& [name, t] : input_) {
      Tensor scaled = t;  // a copy of the values
      for (float& x : scaled.span<float>()) x *= float(unit + 1);
      in.emplace(name, std::move(scaled));
    }
    return in;
  }

  std::shared_ptr<const Graph> graph_;
  int units_ = 0;
  std::map<std::string, Tensor> input_;
};

PipelineKind fake_kind() {
  PipelineKind k;
  k.name = "fake";
  k.what = "a fake pipeline";
  k.models = {"model"};
  k.main_model = "model";
  k.claims = [](const fs::path& p) { return fs::is_regular_file(p) && p.extension() == ".fake"; };
  k.load = [](const RunSpec& spec) -> std::unique_ptr<RunDriver> { return std::make_unique<FakeDriver>(spec); };
  return k;
}

// The registration: one line, in this file only.
const bool kFakeRegistered = register_pipeline_kind(fake_kind());

TEST(PipelineKinds, TheBuiltInOnesComeFirstAndNamesAreUnique) {
  ASSERT_TRUE(kFakeRegistered);
  std::vector<std::string> names;
  for (const PipelineKind* k : pipeline_kinds()) names.push_back(k->name);
  ASSERT_GE(names.size(), 4u);
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + 3),
            (std::vector<std::string>{"single-model", "txt2img", "segmentation"}));
  EXPECT_NE(std::find(names.begin(), names.end(), "fake"), names.end());
  EXPECT_THROW(register_pipeline_kind(fake_kind()), std::logic_error);
  EXPECT_THROW(pipeline_kind("no-such-kind"), std::logic_error);
  // Every model a txt2img pipeline may have (text_encoder_2: SDXL); a loaded driver lists its own.
  EXPECT_EQ(pipeline_kind("txt2img").models,
            (std::vector<std::string>{"text_encoder", "text_encoder_2", "unet", "vae_decoder"}));
  EXPECT_EQ(pipeline_kind_of(testing::source_dir() / "models/tiny-sam")->name, "segmentation");
  EXPECT_EQ(pipeline_kind_of(kVit / "model.onnx")->name, "single-model");
  EXPECT_EQ(pipeline_kind_of(kVit / "inputs/image.npy"), nullptr);
}

std::string error_of(const std::string& config_json) {
  try {
    parse_run_config(config_json, "c.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(PipelineKinds, TheConfigReaderTakesAKindsKeysFromItsRegistration) {
  testing::ScratchDir dir("pipeline-kind-config");
  const fs::path pipe = testing::write_text(dir, "two.fake", "2\n");
  const std::string head = R"({"pipeline": ")" + pipe.string() + R"(", )";
  const RunSpec s = parse_run_config(
      head + R"("variants": [{"name": "a"}, {"name": "b", "onnx": ")" + (kVit / "model.onnx").string() + R"("}]})",
      "c.json");
  EXPECT_EQ(s.kind, "fake");
  EXPECT_EQ(s.variants[1].onnx.count("model"), 1u);  // "onnx": FILE replaces the kind's main model
  // Keys for other kinds name the kinds they apply to.
  EXPECT_NE(error_of(head + R"("steps": 4, "variants": [{"name": "a"}, {"name": "b"}]})")
                .find("steps: only applies to a txt2img pipeline; this one is fake"),
            std::string::npos);
  EXPECT_NE(error_of(head + R"("variants": [{"name": "a"}, {"name": "b", "pipeline_variant": "x"}]})")
                .find("a fake pipeline has no pipeline.json variants"),
            std::string::npos);
  EXPECT_NE(error_of(head + R"("variants": [{"name": "a"}, {"name": "b", "onnx": {"unet": "x.onnx"}}]})").find("unet"),
            std::string::npos);
  // A file no kind claims, and a folder without pipeline.json, are named.
  const fs::path npy = kVit / "inputs/image.npy";
  EXPECT_NE(error_of(R"({"pipeline": ")" + npy.string() + R"(", "variants": [{"name": "a"}, {"name": "b"}]})")
                .find("is no pipeline qeval runs (kinds: single-model, txt2img, segmentation, "),
            std::string::npos);
  EXPECT_NE(error_of(R"({"pipeline": ")" + dir.path().string() + R"(", "variants": [{"name": "a"}, {"name": "b"}]})")
                .find("pipeline.json: no such file (a pipeline folder holds a pipeline.json"),
            std::string::npos);
}

// The fake kind end to end: make_run_driver finds its driver by the config's kind; a recipe
// variant is selected, calibrated on the driver's data and applied by apply_pipeline_recipe; the
// evaluator runs the units and the report names the kind.
TEST(PipelineKinds, AKindRegisteredByATestRunsThroughTheRegistry) {
  testing::ScratchDir dir("pipeline-kind-run");
  const fs::path pipe = testing::write_text(dir, "two.fake", "2\n");
  const RunSpec spec = parse_run_config(R"({"pipeline": ")" + pipe.string() + R"(",
      "observe": {"layers": false}, "calibration": {"cache": ")" +
                                            (dir / "cache").string() + R"("},
      "variants": [{"name": "fp32"}, {"name": "fp16", "precision": "fp16"},
                   {"name": "int8", "recipe": ")" +
                                            (testing::source_dir() / "recipes/int8-level3.json").string() + R"("}]})",
                                        dir / "c.json");
  const auto driver = make_run_driver(spec);
  ASSERT_NE(dynamic_cast<const FakeDriver*>(driver.get()), nullptr);
  const std::vector<BuiltVariant> variants = build_variants(spec, *driver);
  ASSERT_EQ(variants.size(), 3u);
  const BuiltVariant& int8 = variants[2];
  EXPECT_EQ(int8.kind, reports::VariantKind::kRecipe);
  EXPECT_NE(int8.graphs.at("model"), variants[0].graphs.at("model"));  // the recipe's graph
  ASSERT_TRUE(int8.calibration.has_value());
  EXPECT_EQ(int8.calibration->name, "fake calibration");
  EXPECT_EQ(int8.calibration->fingerprint.rfind("fnv1a64:", 0), 0u);
  EXPECT_FALSE(int8.calibration_cache_hit);
  EXPECT_TRUE(build_variants(spec, *driver)[2].calibration_cache_hit);  // calibrated once, then cached

  EvaluatorOptions options;
  options.workers = 1;
  const RunResult result = evaluate(spec, *driver, variants, options);
  ReportContext rc;
  rc.fingerprints = false;
  const reports::RunReport report = build_run_report(spec, *driver, result, rc);
  EXPECT_EQ(report.config.pipeline, "fake");
  EXPECT_EQ(report.config.model.name, "two");
  ASSERT_EQ(report.samples.size(), 2u);
  EXPECT_EQ(report.samples[1].id, "x2");
  ASSERT_EQ(report.metrics.size(), 1u);
  EXPECT_EQ(report.metrics[0].key, "fake_max_abs");
  // fp16 and int8 differ from fp32, int8 more (on the input scaled x2 too).
  for (const auto& sample : report.samples) {
    auto max_abs = [&](std::size_t v) { return *sample.results.at(v).metrics.at(0).value; };
    EXPECT_GT(max_abs(1), 0.0) << sample.id;
    EXPECT_GT(max_abs(2), max_abs(1)) << sample.id;
  }
}

// A kind whose driver has no calibration data: a recipe variant is unsupported, naming the kind.
TEST(PipelineKinds, RecipeVariantsOfAKindWithoutCalibrationDataAreUnsupported) {
  class NoCalibration : public FakeDriver {
   public:
    using FakeDriver::FakeDriver;
    CalibrationData calibration_data(const VariantSpec&, const RunSpec&, bool) const override { return {}; }
  };
  testing::ScratchDir dir("pipeline-kind-unsupported");
  RunSpec spec;
  spec.pipeline = testing::write_text(dir, "one.fake", "1\n");
  spec.kind = "fake";
  const NoCalibration driver(spec);
  VariantSpec v{"int8", Precision::kFp32, testing::source_dir() / "recipes/int8-level3.json", {}, {}, {}};
  try {
    apply_pipeline_recipe(driver, v, spec, false);
    ADD_FAILURE() << "no error";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("recipe variants of a fake pipeline need a calibration set"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace qeval::eval
