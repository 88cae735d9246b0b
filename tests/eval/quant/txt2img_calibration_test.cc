#include "eval/quant/txt2img_calibration.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "eval/exec/onnx_export.h"
#include "eval/quant/apply.h"
#include "test_util.h"

namespace qeval::eval::quant {
namespace {

double psnr01(const Tensor& a, const Tensor& b) {
  double mse = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double d = double(a.data<float>()[i]) - double(b.data<float>()[i]);
    mse += d * d;
  }
  mse /= static_cast<double>(a.numel());
  return 10 * std::log10(1.0 / mse);
}

// tiny-sd end to end: per-step calibration through the pipeline, the recipe applied in memory
// and exported, the exported UNet giving the same image as the in-memory variant.
TEST(Txt2ImgCalibration, TinySdPerStepCalibrationAppliedAndExported) {
  const Txt2ImgModels models = Txt2ImgModels::load(testing::source_dir() / "models/tiny-sd");
  const auto prompts = read_prompt_lines(testing::source_dir() / "prompts/tiny_calib.txt", 2);
  ASSERT_EQ(prompts.size(), 2u);
  const Recipe recipe = load_recipe(testing::source_dir() / "recipes/int8-level2.5.json");
  const Selection sel = select_nodes(*models.unet, recipe);
  Txt2ImgCalibrationSet set(models, prompts, 6);
  const CalibrationResult cal = calibrate(*models.unet, sel, recipe, set);
  EXPECT_EQ(cal.total_steps, 6);
  EXPECT_EQ(cal.calls, 12);  // 2 prompts x 6 steps, uncond + cond batched in one call
  for (const auto& a : cal.activations) {
    ASSERT_EQ(a.step_max.size(), 6u) << a.node;
    for (float v : a.step_max) EXPECT_TRUE(std::isfinite(v)) << a.node;
  }
  EXPECT_EQ(cal.smoothing.size(), 56u);  // 14 feed-forward + 42 q/k/v
  EXPECT_NE(set.fingerprint(), Txt2ImgCalibrationSet(models, prompts, 5).fingerprint());

  const AppliedRecipe applied = apply_recipe(*models.unet, sel, recipe, cal);
  testing::ScratchDir dir("txt2img-calib");
  save_onnx(applied.graph, dir / "unet_int8.onnx");
  auto request = default_request(models.config, "a small red circle in the center on a plain white background", 7);
  request.steps = 6;
  Txt2ImgSessions sessions = Txt2ImgSessions::create(models);
  const Tensor fp32 = generate(models, sessions, request).image;
  sessions.unet = Txt2ImgSessions::make(std::make_shared<const Graph>(applied.graph));
  const Tensor mem = generate(models, sessions, request).image;
  sessions.unet = Txt2ImgSessions::make(load_txt2img_graph(models.config, Txt2ImgModel::kUnet, dir / "unet_int8.onnx"));
  const Tensor file = generate(models, sessions, request).image;
  EXPECT_EQ(std::memcmp(mem.raw(), file.raw(), mem.nbytes()), 0);
  const double psnr = psnr01(mem, fp32);
  std::printf("  int8-level2.5 vs FP32 (6 steps): PSNR %.2f dB\n", psnr);
  EXPECT_GT(psnr, 20.0);
  EXPECT_LT(psnr, 80.0);  // quantized: not the FP32 image
}

TEST(Txt2ImgCalibration, PromptFilesSkipCommentsAndBlankLines) {
  testing::ScratchDir dir("prompts");
  const std::string text = "# calibration\na cat\n\n  \nb dog\r\nc\n";
  testing::write_bytes(dir / "p.txt", {text.begin(), text.end()});
  EXPECT_EQ(read_prompt_lines(dir / "p.txt"), (std::vector<std::string>{"a cat", "b dog", "c"}));
  EXPECT_EQ(read_prompt_lines(dir / "p.txt", 2).size(), 2u);
  testing::write_bytes(dir / "e.txt", {'#', '\n'});
  EXPECT_THROW(read_prompt_lines(dir / "e.txt"), InputError);
}

}  // namespace
}  // namespace qeval::eval::quant
