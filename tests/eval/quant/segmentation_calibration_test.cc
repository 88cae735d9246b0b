// tiny-sam calibrated through the pipeline: both models observed as the pipeline runs them, the
// cache reused, the exports re-imported giving the in-memory variant's bytes; `qeval calibrate`.
#include "eval/quant/segmentation_calibration.h"

#include <gtest/gtest.h>

#include <cstring>

#include "eval/exec/onnx_export.h"
#include "eval/exec/onnx_import.h"
#include "metrics/segmentation.h"
#include "test_util.h"

namespace qeval::eval::quant {
namespace {

namespace fs = std::filesystem;

fs::path tiny_sam() { return testing::source_dir() / "models/tiny-sam"; }
fs::path calib_prompts() { return testing::source_dir() / "datasets/point_prompts/tiny_sam_calib.jsonl"; }

// One prompt through an encoder and a decoder graph.
SegmentationResult segment(const SegmentationPipeline& pipeline, const Graph& encoder, const Graph& decoder,
                           const PointPrompt& prompt, const fs::path& source) {
  Session enc(encoder), dec(decoder);
  const PromptInputs in = load_prompt_inputs(prompt, source, pipeline.config().channels);
  return pipeline.decode(dec, pipeline.encode(enc, in.planes), prompt.points);
}

TEST(SegmentationCalibration, TinySamEncoderPerImageDecoderPerPromptCachedAndExported) {
  const SegmentationPipeline pipeline = SegmentationPipeline::load(tiny_sam());
  const PointPromptSet prompts = read_point_prompts_limited(calib_prompts(), 12);
  ASSERT_EQ(prompts.prompts.size(), 12u);
  const Recipe recipe = load_recipe(testing::source_dir() / "recipes/int8-level3.json");
  testing::ScratchDir dir("segmentation-calib");
  const auto first = calibrate_segmentation(pipeline, recipe, prompts, dir / "cache");
  ASSERT_EQ(first.size(), 2u);
  const SegmentationModelRecipe& enc = first[0];
  const SegmentationModelRecipe& dec = first[1];
  EXPECT_EQ(enc.model, "image_encoder");
  EXPECT_EQ(dec.model, "mask_decoder");
  const std::size_t images = SegmentationCalibrationSet(pipeline, prompts, "image_encoder").images();
  EXPECT_EQ(images, 6u);
  EXPECT_EQ(enc.calibration.calls, long(images));  // once per image
  EXPECT_EQ(dec.calibration.calls, 12);            // once per prompt
  EXPECT_EQ(enc.data_description, "12 point prompts on 6 images");
  EXPECT_GT(enc.selection.targets.size(), 30u);
  EXPECT_GT(dec.selection.targets.size(), 30u);
  for (const auto* r : {&enc, &dec}) {
    EXPECT_FALSE(r->cache_hit);
    EXPECT_GT(r->applied.quantized_activations, 0) << r->model;
    for (const auto& a : r->calibration.activations) {
      ASSERT_EQ(a.step_max.size(), 1u) << a.node;
      EXPECT_GT(a.amax, 0.0f) << a.node;
    }
  }
  // Other prompts: another data fingerprint.
  EXPECT_NE(SegmentationCalibrationSet(pipeline, read_point_prompts_limited(calib_prompts(), 11), "mask_decoder")
                .fingerprint(),
            dec.data_fingerprint);

  // Rerun: both read from the cache, same ranges.
  const auto again = calibrate_segmentation(pipeline, recipe, prompts, dir / "cache");
  ASSERT_EQ(again.size(), 2u);
  for (std::size_t m = 0; m < 2; ++m) {
    EXPECT_TRUE(again[m].cache_hit) << again[m].model;
    ASSERT_EQ(again[m].calibration.activations.size(), first[m].calibration.activations.size());
    for (std::size_t i = 0; i < first[m].calibration.activations.size(); ++i)
      EXPECT_EQ(again[m].calibration.activations[i].amax, first[m].calibration.activations[i].amax);
  }

  // The exports re-imported give the in-memory variant's bytes; the variant is quantized but keeps
  // the masks.
  save_onnx(enc.applied.graph, dir / "image_encoder.onnx");
  save_onnx(dec.applied.graph, dir / "mask_decoder.onnx");
  const Graph enc_file = load_onnx(dir / "image_encoder.onnx"), dec_file = load_onnx(dir / "mask_decoder.onnx");
  double min_iou = 1;
  for (std::size_t i : {0, 3, 7}) {
    const PointPrompt& p = prompts.prompts[i];
    const auto fp32 = segment(pipeline, pipeline.image_encoder(), pipeline.mask_decoder(), p, prompts.source);
    const auto mem = segment(pipeline, enc.applied.graph, dec.applied.graph, p, prompts.source);
    const auto file = segment(pipeline, enc_file, dec_file, p, prompts.source);
    ASSERT_EQ(mem.logits.nbytes(), file.logits.nbytes());
    EXPECT_EQ(std::memcmp(mem.logits.raw(), file.logits.raw(), mem.logits.nbytes()), 0) << p.id;
    EXPECT_EQ(mem.iou_predictions, file.iou_predictions) << p.id;
    const auto cmp = metrics::compare_mask_logits(fp32.logits, mem.logits, 0.0f);
    EXPECT_FALSE(cmp.logits.identical()) << p.id;
    min_iou = std::min(min_iou, cmp.iou.iou);
  }
  std::printf("  int8-level3 tiny-sam vs FP32, 3 calibration prompts: min mask IoU %.4f\n", min_iou);
  EXPECT_GT(min_iou, 0.8);
}

TEST(SegmentationCalibration, RecipeSelectingNothingInOneModelLeavesItFp32) {
  const SegmentationPipeline pipeline = SegmentationPipeline::load(tiny_sam());
  testing::ScratchDir dir("segmentation-calib-none");
  // Level 1 quantizes Conv only; the decoder has none (its ConvTranspose is no target).
  const std::string text = R"({"format": "int8", "level": 1, "calibration": {"method": "max"}})";
  testing::write_bytes(dir / "l1.json", {text.begin(), text.end()});
  const auto r = calibrate_segmentation(pipeline, load_recipe(dir / "l1.json"),
                                        read_point_prompts_limited(calib_prompts(), 2), std::nullopt);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].model, "image_encoder");
  EXPECT_EQ(r[0].selection.selected[static_cast<std::size_t>(NodeCategory::kConv)], int(r[0].selection.targets.size()));
  const std::string none = R"({"format": "int8", "level": 3, "exclude": ["."], "calibration": {"method": "max"}})";
  testing::write_bytes(dir / "none.json", {none.begin(), none.end()});
  try {
    calibrate_segmentation(pipeline, load_recipe(dir / "none.json"), read_point_prompts_limited(calib_prompts(), 2),
                           std::nullopt);
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("selects no node of"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("image encoder or mask decoder"), std::string::npos) << e.what();
  }
}

TEST(QuantCli, CalibratesASegmentationPipelinesEncoderAndDecoder) {
  testing::ScratchDir dir("calibrate-sam");
  const std::string common = "calibrate --pipeline " + tiny_sam().string() + " --recipe " +
                             (testing::source_dir() / "recipes/fp8-level4.json").string() + " --count 4 --cache " +
                             (dir / "cache").string();
  auto r = testing::run_qeval(common + " --out " + (dir / "out").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("max over 4 point prompts on 2 images (2 model runs, 1 steps)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("max over 4 point prompts on 2 images (4 model runs, 1 steps)"), std::string::npos) << r.out;
  for (const char* m : {"image_encoder", "mask_decoder"}) {
    const auto scales = testing::read_json(dir / "out" / m / "scales.json");
    EXPECT_EQ(scales["model_name"], m);
    EXPECT_EQ(scales["quant_format"], "fp8_e4m3");
    EXPECT_GT(scales["activations"].size(), 0u);
    EXPECT_EQ(load_onnx(dir / "out" / m / "quantized.onnx").opsets.at(""), 19) << m;
  }
  r = testing::run_qeval(common + " --out " + (dir / "out2").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto hit = r.out.find("reused from the cache");
  ASSERT_NE(hit, std::string::npos) << r.out;
  EXPECT_NE(r.out.find("reused from the cache", hit + 1), std::string::npos) << r.out;  // both models
  for (const char* m : {"image_encoder", "mask_decoder"})
    EXPECT_EQ(testing::read_bytes(dir / "out" / m / "quantized.onnx"),
              testing::read_bytes(dir / "out2" / m / "quantized.onnx"))
        << m;

  // Level 1 (Conv only): the decoder has no Conv and is left FP32, said so, nothing written for it.
  r = testing::run_qeval("calibrate --pipeline " + tiny_sam().string() + " --recipe " +
                         (testing::source_dir() / "recipes/int8-level1.json").string() +
                         " --count 2 --no-cache --out " + (dir / "l1").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("mask_decoder: the recipe selects no node of it; left FP32, nothing written"), std::string::npos)
      << r.out;
  EXPECT_TRUE(fs::exists(dir / "l1/image_encoder/quantized.onnx"));
  EXPECT_FALSE(fs::exists(dir / "l1/mask_decoder"));
}

}  // namespace
}  // namespace qeval::eval::quant
