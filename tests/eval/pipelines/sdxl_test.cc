// SDXL txt2img (eval/pipelines/txt2img.h with text_encoder_2; the Optimum SDXL export folder of
// eval/pipelines/diffusers_folder.h): an untrained tiny-sdxl (tests/data/tiny_sdxl_random, made by
// tools/export_tiny_sdxl.py --random-init 0) against the PyTorch reference pipeline
// (tools/tiny_sdxl_pipeline.py: diffusers' StableDiffusionXLPipeline step by step), the same bits
// from the folder and from its pipeline.json, the VAE's force_upcast, and the folder's refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "eval/input_error.h"
#include "datasets/npy.h"
#include "eval/pipelines/diffusers_folder.h"
#include "eval/pipelines/noise.h"
#include "eval/pipelines/txt2img.h"
#include "kernels/error.h"
#include "metrics/psnr.h"
#include "metrics/tensor_error.h"
#include "sdxl.h"
#include "test_util.h"

namespace qeval::testing {
namespace {

namespace fs = std::filesystem;
using namespace qeval::eval;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

using testing::input_error;  // "" when nothing is thrown

double rel_l2(const Tensor& want, const Tensor& got) {
  EXPECT_EQ(want.numel(), got.numel());
  return metrics::tensor_error(want.reshaped(got.shape()), got).rel_l2.value_or(INFINITY);
}

TEST(SdxlFolder, ReadsEverySettingAsDiffusersDoes) {
  const Txt2ImgConfig c = read_txt2img_config(tiny_sdxl_random_dir());
  ASSERT_TRUE(c.sdxl());
  EXPECT_EQ(c.text_encoder.output, "hidden_states.2");  // hidden_states[-2] of 4 (3 layers)
  EXPECT_EQ(c.text_encoder_2.output, "hidden_states.2");
  EXPECT_EQ(c.text_encoder_2.pooled_output, "text_embeds");
  EXPECT_EQ(c.unet.text_embeds, "text_embeds");
  EXPECT_EQ(c.unet.time_ids, "time_ids");
  EXPECT_EQ(c.tokenizer.pad_token, "<|endoftext|>");
  EXPECT_EQ(c.tokenizer_2.pad_token, "!");
  EXPECT_TRUE(c.vae_decoder.force_upcast);
  EXPECT_EQ(c.vae_decoder.scaling_factor, 0.13025);
  EXPECT_TRUE(c.sdxl_conditioning.force_zeros_for_empty_prompt);
  EXPECT_EQ(c.latent_shape(), (Shape{1, 4, 16, 16}));
  EXPECT_EQ(c.image_height, 64);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kEulerDiscrete);
  EXPECT_EQ(c.scheduler.timestep_spacing, TimestepSpacing::kLeading);
  EXPECT_EQ(c.scheduler.steps_offset, 1);
  EXPECT_EQ(c.default_guidance_scale, 5.0);  // StableDiffusionXLPipeline.__call__'s
  EXPECT_EQ(c.time_ids(), (std::vector<float>{64, 64, 0, 0, 64, 64}));
  const Txt2ImgModels& m = tiny_sdxl_random();
  EXPECT_EQ(m.config.text_encoder.input_type, DType::kInt64);  // from the graphs
  EXPECT_EQ(m.config.text_encoder_2.input_type, DType::kInt64);
}

// The PyTorch reference (`dir`/README.md), from the same seeded noise: prompt embeddings, pooled
// embeddings and time ids as the UNet gets them, the latent after every Euler step and the decoded
// image. ref0 has an empty negative prompt (zeros), ref1 a real one.
void expect_every_stage_as_pytorch(const Txt2ImgModels& models, const fs::path& dir) {
  const Txt2ImgSessions sessions = Txt2ImgSessions::create(models);
  for (int k = 0; k < 2; ++k) {
    const std::string ref_name = "ref" + std::to_string(k);
    const auto ref = read_json(dir / (ref_name + ".json"));
    SCOPED_TRACE(ref_name);
    Txt2ImgRequest req = default_request(models.config, ref["prompt"], ref["seed"]);
    req.negative_prompt = ref["negative_prompt"];
    req.steps = ref["steps"];
    req.guidance_scale = ref["guidance_scale"];
    EXPECT_TRUE(same_bits(datasets::read_npy(dir / (ref_name + "_noise.npy")),
                          seeded_noise(req.seed, models.config.latent_shape())));
    EXPECT_EQ(models.tokenizer.encode(req.prompt), ref["input_ids"].get<std::vector<std::int64_t>>());
    EXPECT_EQ(models.tokenizer_2.encode(req.prompt), ref["input_ids_2"].get<std::vector<std::int64_t>>());

    std::vector<Tensor> latents;
    Txt2ImgHooks hooks;
    hooks.on_step = [&](Txt2ImgStep& s) { latents.push_back(s.latent_after); };
    const Txt2ImgResult r = generate(models, sessions, req, hooks);
    Txt2ImgRun run(models, req);
    EXPECT_EQ(run.zero_negative(), req.negative_prompt.empty());
    EXPECT_EQ(r.timesteps, ref["timesteps"].get<std::vector<double>>());

    const Tensor want_embeds = datasets::read_npy(dir / (ref_name + "_prompt_embeds.npy"));
    const Tensor want_pooled = datasets::read_npy(dir / (ref_name + "_pooled.npy"));
    ASSERT_EQ(r.text_embeddings.shape(), want_embeds.shape());
    ASSERT_EQ(r.pooled_embeddings.shape(), want_pooled.shape());
    const double e_embeds = rel_l2(want_embeds, r.text_embeddings);
    const double e_pooled = rel_l2(want_pooled, r.pooled_embeddings);
    EXPECT_LT(e_embeds, 1e-5);
    EXPECT_LT(e_pooled, 1e-5);
    if (req.negative_prompt.empty()) {  // zeros exactly, not an encoded ""
      const std::int64_t half = r.text_embeddings.numel() / 2;
      EXPECT_TRUE(std::all_of(r.text_embeddings.data<float>(), r.text_embeddings.data<float>() + half,
                              [](float v) { return v == 0.0f; }));
      EXPECT_EQ(r.pooled_embeddings.data<float>()[0], 0.0f);
    }
    EXPECT_TRUE(same_bits(run.time_ids(), datasets::read_npy(dir / (ref_name + "_time_ids.npy"))));

    const Tensor want_latents = datasets::read_npy(dir / (ref_name + "_latents.npy"));
    ASSERT_EQ(std::int64_t(latents.size()), want_latents.dim(0));
    const std::int64_t per = want_latents.numel() / want_latents.dim(0);
    for (std::size_t i = 0; i < latents.size(); ++i) {
      Tensor w(DType::kFloat32, latents[i].shape());
      std::memcpy(w.raw(), want_latents.data<float>() + std::int64_t(i) * per, std::size_t(per) * sizeof(float));
      const double e = rel_l2(w, latents[i]);
      std::printf("%s step %zu: latent relative L2 %.2e\n", ref_name.c_str(), i, e);
      EXPECT_LT(e, 1e-5) << "step " << i;
    }
    Tensor want = datasets::read_npy(dir / (ref_name + "_image.npy")).reshaped({3, 64, 64});
    for (float& v : want.span<float>()) v = std::clamp(v / 2 + 0.5f, 0.0f, 1.0f);
    const double psnr = metrics::psnr(want, r.image, 1.0).psnr_db.value_or(INFINITY);
    std::printf("%s: prompt embeddings rel L2 %.2e, pooled %.2e, image PSNR %.1f dB\n", ref_name.c_str(), e_embeds,
                e_pooled, psnr);
    EXPECT_GE(psnr, 120.0);
  }
}

TEST(SdxlReference, EveryStageMatchesThePyTorchPipeline) {
  expect_every_stage_as_pytorch(tiny_sdxl_random(), tiny_sdxl_random_dir() / "reference");
}

// The shipped, trained tiny-sdxl (models/tiny-sdxl) against its references made from the same
// checkpoint (tests/data/tiny_sdxl/reference, tools/ship_tiny_sdxl.sh).
TEST(SdxlReference, TheShippedTinySdxlMatchesThePyTorchPipeline) {
  expect_every_stage_as_pytorch(tiny_sdxl(), data_dir() / "tiny_sdxl" / "reference");
}

// The same run from the folder and from the equivalent pipeline.json (docs/pipelines.md, "SDXL"):
// the same bits. And the pipeline.json form's SDXL keys are checked.
TEST(SdxlPipelineJson, TheEquivalentPipelineJsonGivesTheSameBitsAsTheFolder) {
  ScratchDir dir("sdxl-json");
  const fs::path f = tiny_sdxl_random_dir();
  const std::string json = R"({
    "format": "qeval.pipeline", "version": 1, "task": "txt2img", "name": "tiny-sdxl-random",
    "tokenizer": {"vocab": ")" +
                           (f / "tokenizer/vocab.json").string() + R"(", "merges": ")" +
                           (f / "tokenizer/merges.txt").string() + R"(", "max_length": 77},
    "tokenizer_2": {"vocab": ")" +
                           (f / "tokenizer_2/vocab.json").string() + R"(", "merges": ")" +
                           (f / "tokenizer_2/merges.txt").string() + R"(", "max_length": 77, "pad_token": "!"},
    "text_encoder": {"model": ")" +
                           (f / "text_encoder/model.onnx").string() +
                           R"(", "input_type": "int64", "output": "hidden_states.2"},
    "text_encoder_2": {"model": ")" +
                           (f / "text_encoder_2/model.onnx").string() +
                           R"(", "input_type": "int64", "output": "hidden_states.2", "pooled_output": "text_embeds"},
    "sdxl": {"original_size": [64, 64], "crop_top_left": [0, 0], "target_size": [64, 64],
             "force_zeros_for_empty_prompt": true},
    "unet": {"model": ")" + (f / "unet/model.onnx").string() +
                           R"(", "timestep_type": "float32", "text_embeds": "text_embeds", "time_ids": "time_ids"},
    "vae_decoder": {"model": ")" +
                           (f / "vae_decoder/model.onnx").string() +
                           R"(", "scaling_factor": 0.13025, "force_upcast": true},
    "latent": {"channels": 4, "height": 16, "width": 16},
    "image": {"channels": 3, "height": 64, "width": 64, "range": [-1, 1]},
    "scheduler": {"type": "euler", "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
                  "timestep_spacing": "leading", "steps_offset": 1},
    "defaults": {"steps": 50, "guidance_scale": 5.0}
  })";
  write_text(dir, "pipeline.json", json);
  const Txt2ImgModels from_json = Txt2ImgModels::load(dir.path());
  const Txt2ImgModels& from_folder = tiny_sdxl_random();
  for (const char* negative : {"", "a plain white background"}) {
    Txt2ImgRequest req = default_request(from_folder.config, "a large green ring on the right", 11);
    req.negative_prompt = negative;
    req.steps = 2;
    const auto a = generate(from_folder, Txt2ImgSessions::create(from_folder), req);
    const auto b = generate(from_json, Txt2ImgSessions::create(from_json), req);
    EXPECT_TRUE(same_bits(a.text_embeddings, b.text_embeddings)) << negative;
    EXPECT_TRUE(same_bits(a.pooled_embeddings, b.pooled_embeddings)) << negative;
    EXPECT_TRUE(same_bits(a.image, b.image)) << negative;
  }
  // Another crop changes the time ids the UNet gets, hence the image.
  {
    ScratchDir d2("sdxl-json-crop");
    std::string cropped = json;
    cropped.replace(cropped.find("\"crop_top_left\": [0, 0]"), 23, "\"crop_top_left\": [8, 4]");
    write_text(d2, "pipeline.json", cropped);
    const Txt2ImgModels m = Txt2ImgModels::load(d2.path());
    EXPECT_EQ(m.config.time_ids(), (std::vector<float>{64, 64, 8, 4, 64, 64}));
  }
  // SDXL keys without text_encoder_2 are refused, naming the key.
  {
    ScratchDir d3("sdxl-json-bad");
    std::string bad = json;
    const auto at = bad.find("\"text_encoder_2\"");
    bad.replace(at, bad.find("\"sdxl\"") - at, "");
    write_text(d3, "pipeline.json", bad);
    const std::string e = input_error([&] { read_txt2img_config(d3.path()); });
    EXPECT_NE(e.find("tokenizer_2"), std::string::npos) << e;
    EXPECT_NE(e.find("text_encoder_2"), std::string::npos) << e;
  }
}

// diffusers upcasts a force_upcast VAE to FP32: an FP16 run decodes in FP32 (finite: the
// tiny-sdxl VAE's trunk exceeds 65504), and the same run with the VAE in FP16 is not finite.
TEST(SdxlVae, ForceUpcastRunsTheDecoderInFp32UnderFp16) {
  const Txt2ImgModels& models = tiny_sdxl_random();
  EXPECT_EQ(txt2img_model_precision(models.config, Txt2ImgModel::kVaeDecoder, Precision::kFp16), Precision::kFp32);
  EXPECT_EQ(txt2img_model_precision(models.config, Txt2ImgModel::kUnet, Precision::kFp16), Precision::kFp16);
  SessionOptions fp16;
  fp16.precision = Precision::kFp16;
  const Txt2ImgSessions upcast = Txt2ImgSessions::create(models, fp16);
  Txt2ImgRequest req = default_request(models.config, "a small red circle", 3);
  req.steps = 2;
  const Txt2ImgResult a = generate(models, upcast, req);
  Txt2ImgSessions forced = upcast;
  forced.vae_decoder = Txt2ImgSessions::make(models.vae_decoder, fp16);
  const Tensor latent = a.final_latent;
  const Tensor in_fp16 = decode_latent(models, *forced.vae_decoder, latent);
  const Tensor in_fp32 = decode_latent(models, *upcast.vae_decoder, latent);
  EXPECT_TRUE(same_bits(in_fp32, a.image));
  EXPECT_TRUE(std::all_of(a.image.data<float>(), a.image.data<float>() + a.image.numel(),
                          [](float v) { return std::isfinite(v); }));
  const auto err = metrics::tensor_error(in_fp32, in_fp16);
  EXPECT_GT(err.diverged, 0) << "the FP16 VAE should overflow";
}

// An SD export folder whose UNet wants added conditioning, and SDXL folders with settings qeval
// does not implement: refused with the file and the key.
TEST(SdxlFolder, UnsupportedSettingsAreRefusedWithTheFileAndKey) {
  struct Case {
    std::string file, body, want;
  };
  const fs::path src = tiny_sdxl_random_dir();
  auto unet_config = read_text(src / "unet" / "config.json");
  auto with = [](std::string text, const std::string& key, const std::string& value) {
    const auto at = text.find("\"" + key + "\"");
    const auto end = text.find_first_of(",\n}", text.find(':', at));
    return text.replace(at, end - at, "\"" + key + "\": " + value);
  };
  const std::vector<Case> cases = {
      {"unet/config.json", with(unet_config, "addition_embed_type", "\"image\""), "addition_embed_type"},
      {"unet/config.json", with(unet_config, "time_cond_proj_dim", "256"), "time_cond_proj_dim"},
      {"unet/config.json", with(unet_config, "projection_class_embeddings_input_dim", "200"), "projection_dim"},
      {"vae_decoder/config.json",
       with(read_text(src / "vae_decoder" / "config.json"), "force_upcast", "true, \"latents_mean\": [0, 0, 0, 0]"),
       "latents_mean"},
      {"text_encoder/config.json", "{\"hidden_size\": 64}", "num_hidden_layers"},
      {"model_index.json", "{\"_class_name\": \"StableDiffusionXLImg2ImgPipeline\"}",
       "StableDiffusionXLImg2ImgPipeline"},
  };
  for (const Case& c : cases) {
    ScratchDir d("sdxl-bad");
    fs::copy(src, d.path(), fs::copy_options::recursive);
    std::ofstream(d / c.file) << c.body;
    const std::string e = input_error([&] { Txt2ImgModels::load(d.path()); });
    SCOPED_TRACE(c.file + ": " + e);
    EXPECT_NE(e.find(c.want), std::string::npos);
    EXPECT_NE(e.find(fs::path(c.file).filename().string()), std::string::npos);
  }
}

}  // namespace
}  // namespace qeval::testing
