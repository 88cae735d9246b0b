// Export folders as optimum-cli writes them (eval/pipelines/diffusers_folder.h): the shipped
// tiny-sd laid out as an SD 1.5 ONNX export (model_index.json, <model>/model.onnx + config.json,
// tokenizer/, scheduler/scheduler_config.json; the file and key names of optimum-onnx's
// exporters and diffusers' configs) reads as its pipeline.json and generates the same bits.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "eval/input_error.h"
#include "eval/pipelines/diffusers_folder.h"
#include "eval/pipelines/txt2img.h"
#include "kernels/error.h"
#include "test_util.h"
#include "tiny_sd.h"

namespace qeval::testing {
namespace {

namespace fs = std::filesystem;
using eval::read_txt2img_config;
using eval::SchedulerType;
using eval::Txt2ImgConfig;

constexpr const char* kDdimScheduler = R"({
  "_class_name": "DDIMScheduler", "_diffusers_version": "0.30.0",
  "beta_end": 0.012, "beta_schedule": "scaled_linear", "beta_start": 0.00085, "clip_sample": false,
  "num_train_timesteps": 1000, "prediction_type": "epsilon", "set_alpha_to_one": false, "steps_offset": 1,
  "timestep_spacing": "leading", "trained_betas": null, "thresholding": false, "rescale_betas_zero_snr": false
})";

// tiny-sd as an optimum-cli export of an SD 1.5 pipeline (16x16 latents, a 3-level VAE: 64x64).
void write_export(const fs::path& dir, const std::string& scheduler = kDdimScheduler) {
  const fs::path sd = tiny_sd_dir();
  for (const char* sub : {"text_encoder", "unet", "vae_decoder", "tokenizer", "scheduler"})
    fs::create_directories(dir / sub);
  fs::copy_file(sd / "text_encoder.onnx", dir / "text_encoder" / "model.onnx");
  fs::copy_file(sd / "unet.onnx", dir / "unet" / "model.onnx");
  fs::copy_file(sd / "vae_decoder.onnx", dir / "vae_decoder" / "model.onnx");
  fs::copy_file(sd / "tokenizer" / "vocab.json", dir / "tokenizer" / "vocab.json");
  fs::copy_file(sd / "tokenizer" / "merges.txt", dir / "tokenizer" / "merges.txt");
  auto write = [&](const fs::path& p, const std::string& body) {
    std::ofstream(p) << body;
  };
  write(dir / "model_index.json", R"({"_class_name": "StableDiffusionPipeline", "_diffusers_version": "0.30.0",
    "scheduler": ["diffusers", "DDIMScheduler"], "text_encoder": ["transformers", "CLIPTextModel"],
    "tokenizer": ["transformers", "CLIPTokenizer"], "unet": ["diffusers", "UNet2DConditionModel"],
    "vae_decoder": ["diffusers", "AutoencoderKL"]})");
  write(dir / "tokenizer" / "tokenizer_config.json", R"({"model_max_length": 77, "do_lower_case": true,
    "pad_token": {"content": "<|endoftext|>", "lstrip": false, "normalized": true}})");
  write(dir / "unet" / "config.json", R"({"_class_name": "UNet2DConditionModel", "sample_size": 16,
    "in_channels": 4, "out_channels": 4, "cross_attention_dim": 64, "addition_embed_type": null})");
  write(dir / "vae_decoder" / "config.json", R"({"_class_name": "AutoencoderKL", "scaling_factor": 0.814783,
    "block_out_channels": [32, 64, 64], "latent_channels": 4, "out_channels": 3})");
  write(dir / "scheduler" / "scheduler_config.json", scheduler);
}

using testing::input_error;  // "" when nothing is thrown

TEST(DiffusersFolder, AnOptimumExportReadsAsTheEquivalentPipelineJson) {
  ScratchDir dir("optimum-sd");
  write_export(dir.path());
  EXPECT_TRUE(eval::is_diffusers_folder(dir.path()));
  EXPECT_FALSE(eval::is_diffusers_folder(tiny_sd_dir()));
  EXPECT_EQ(eval::read_pipeline_task(dir.path()), eval::PipelineTask::kTxt2Img);
  const Txt2ImgConfig a = read_txt2img_config(dir.path());
  const Txt2ImgConfig b = read_txt2img_config(tiny_sd_dir());
  EXPECT_EQ(a.name, dir.path().filename().string());
  EXPECT_EQ(a.latent_shape(), b.latent_shape());
  EXPECT_EQ(a.image_height, b.image_height);
  EXPECT_EQ(a.image_width, b.image_width);
  EXPECT_EQ(a.vae_decoder.scaling_factor, b.vae_decoder.scaling_factor);
  EXPECT_EQ(a.tokenizer.max_length, b.tokenizer.max_length);
  EXPECT_EQ(a.tokenizer.pad_token, b.tokenizer.pad_token);
  const eval::SchedulerConfig &s = a.scheduler, &t = b.scheduler;
  EXPECT_EQ(s.type, t.type);
  EXPECT_EQ(s.num_train_timesteps, t.num_train_timesteps);
  EXPECT_EQ(s.beta_start, t.beta_start);
  EXPECT_EQ(s.beta_end, t.beta_end);
  EXPECT_EQ(s.beta_schedule, t.beta_schedule);
  EXPECT_EQ(s.prediction_type, t.prediction_type);
  EXPECT_EQ(s.timestep_spacing, t.timestep_spacing);
  EXPECT_EQ(s.steps_offset, t.steps_offset);
  EXPECT_EQ(s.set_alpha_to_one, t.set_alpha_to_one);
  EXPECT_EQ(s.clip_sample, t.clip_sample);
  // StableDiffusionPipeline's call defaults, not tiny-sd's pipeline.json ones.
  EXPECT_EQ(a.default_steps, 50);
  EXPECT_EQ(a.default_guidance_scale, 7.5);
  EXPECT_TRUE(a.evaluation_prompts.empty());

  // Input types come from the graphs: the ones tiny-sd's pipeline.json declares.
  const eval::Txt2ImgModels m = eval::Txt2ImgModels::load(dir.path());
  EXPECT_EQ(m.config.text_encoder.input_type, b.text_encoder.input_type);
  EXPECT_EQ(m.config.unet.timestep_type, b.unet.timestep_type);

  // The same request gives the same bits from either layout.
  eval::Txt2ImgRequest req = eval::default_request(b, "a red circle above a blue square", 7);
  req.steps = 3;
  const auto from_folder = eval::generate(m, eval::Txt2ImgSessions::create(m, {}), req);
  const auto from_json = eval::generate(tiny_sd(), eval::Txt2ImgSessions::create(tiny_sd(), {}), req);
  ASSERT_EQ(from_folder.image.nbytes(), from_json.image.nbytes());
  EXPECT_EQ(0, std::memcmp(from_folder.image.raw(), from_json.image.raw(), from_json.image.nbytes()));
}

// A scheduler class qeval does not implement (SD 1.5's PNDM) is refused with the way out; with the
// run config's "scheduler" the file's fields are read with that class's defaults, as diffusers'
// from_config does. Options that change the arithmetic are refused, never ignored.
TEST(DiffusersFolder, SchedulersAreReadAsDiffusersReadsThemOrRefused) {
  ScratchDir dir("optimum-sd-pndm");
  write_export(dir.path(), R"({"_class_name": "PNDMScheduler", "beta_end": 0.012, "beta_schedule": "scaled_linear",
    "beta_start": 0.00085, "num_train_timesteps": 1000, "set_alpha_to_one": false, "skip_prk_steps": true,
    "steps_offset": 1, "trained_betas": null, "clip_sample": false})");
  const std::string e = input_error([&] { read_txt2img_config(dir.path()); });
  EXPECT_NE(e.find("scheduler_config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("PNDMScheduler"), std::string::npos) << e;
  EXPECT_NE(e.find("\"scheduler\""), std::string::npos) << e;
  const Txt2ImgConfig ddim = read_txt2img_config(dir.path(), SchedulerType::kDdim);
  EXPECT_EQ(ddim.scheduler.type, SchedulerType::kDdim);
  EXPECT_EQ(ddim.scheduler.beta_schedule, eval::BetaSchedule::kScaledLinear);
  EXPECT_EQ(ddim.scheduler.steps_offset, 1);
  EXPECT_FALSE(ddim.scheduler.set_alpha_to_one);
  EXPECT_EQ(ddim.scheduler.timestep_spacing, eval::TimestepSpacing::kLeading);  // DDIM's default
  const Txt2ImgConfig euler = read_txt2img_config(dir.path(), SchedulerType::kEulerDiscrete);
  EXPECT_EQ(euler.scheduler.timestep_spacing, eval::TimestepSpacing::kLinspace);  // Euler's default

  // EulerDiscreteScheduler's defaults where the file is silent (diffusers' constructor).
  ScratchDir bare("optimum-sd-euler");
  write_export(bare.path(), R"({"_class_name": "EulerDiscreteScheduler"})");
  const eval::SchedulerConfig s = read_txt2img_config(bare.path()).scheduler;
  EXPECT_EQ(s.type, SchedulerType::kEulerDiscrete);
  EXPECT_EQ(s.beta_start, 0.0001);
  EXPECT_EQ(s.beta_end, 0.02);
  EXPECT_EQ(s.beta_schedule, eval::BetaSchedule::kLinear);
  EXPECT_EQ(s.steps_offset, 0);

  for (const char* bad : {R"({"_class_name": "DDIMScheduler", "trained_betas": [0.1, 0.2]})",
                          R"({"_class_name": "EulerDiscreteScheduler", "use_karras_sigmas": true})",
                          R"({"_class_name": "DDIMScheduler", "thresholding": true})",
                          R"({"_class_name": "DDIMScheduler", "beta_schedule": "squaredcos_cap_v2"})"}) {
    ScratchDir d("optimum-sd-bad");
    write_export(d.path(), bad);
    const std::string m = input_error([&] { read_txt2img_config(d.path()); });
    EXPECT_NE(m.find("scheduler_config.json"), std::string::npos) << bad << ": " << m;
    EXPECT_NE(m.find("not implemented"), std::string::npos) << bad << ": " << m;
  }
}

// What the reader refuses, each naming the file and what to do: an SDXL export (for now), a
// diffusers PyTorch folder, a missing config, a VAE whose latent disagrees with the UNet.
TEST(DiffusersFolder, FoldersItCannotRunAreInputErrorsThatSayWhy) {
  {
    ScratchDir d("optimum-sdxl");
    write_export(d.path());
    fs::create_directories(d / "text_encoder_2");
    const std::string m = input_error([&] { read_txt2img_config(d.path()); });
    EXPECT_NE(m.find("SDXL"), std::string::npos) << m;
  }
  {
    ScratchDir d("diffusers-pt");
    write_export(d.path());
    fs::rename(d / "vae_decoder", d / "vae");
    const std::string m = input_error([&] { read_txt2img_config(d.path()); });
    EXPECT_NE(m.find("vae_decoder/model.onnx"), std::string::npos) << m;
    EXPECT_NE(m.find("optimum-cli export onnx"), std::string::npos) << m;
  }
  {
    ScratchDir d("optimum-no-config");
    write_export(d.path());
    fs::remove(d / "unet" / "config.json");
    const std::string m = input_error([&] { read_txt2img_config(d.path()); });
    EXPECT_NE(m.find("unet/config.json"), std::string::npos) << m;
  }
  {
    ScratchDir d("optimum-latents");
    write_export(d.path());
    std::ofstream(d / "vae_decoder" / "config.json") << R"({"latent_channels": 16, "block_out_channels": [1, 2]})";
    const std::string m = input_error([&] { read_txt2img_config(d.path()); });
    EXPECT_NE(m.find("latent_channels"), std::string::npos) << m;
  }
}

// The CLI runs such a folder: `qeval generate` writes the image the pipeline.json gives.
TEST(DiffusersFolder, GenerateRunsAnExportFolder) {
  ScratchDir dir("optimum-sd-cli");
  write_export(dir.path());
  const std::string common = " --prompt 'a green triangle' --seed 3 --steps 2 --guidance 5";
  const CliRun a = run_qeval("generate --pipeline " + dir.path().string() + common + " --out " +
                             (dir / "a.png").string());
  ASSERT_EQ(a.code, 0) << a.out;
  const CliRun b = run_qeval("generate --pipeline " + tiny_sd_dir().string() + common + " --out " +
                             (dir / "b.png").string());
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_EQ(read_bytes(dir / "a.png"), read_bytes(dir / "b.png"));
  const CliRun pndm = [&] {
    std::ofstream(dir / "scheduler" / "scheduler_config.json") << R"({"_class_name": "PNDMScheduler"})";
    return run_qeval("generate --pipeline " + dir.path().string() + common + " --out " + (dir / "c.png").string());
  }();
  EXPECT_EQ(pndm.code, 2) << pndm.out;
  EXPECT_EQ(run_qeval("generate --pipeline " + dir.path().string() + common + " --scheduler ddim --out " +
                      (dir / "c.png").string())
                .code,
            0);
}

}  // namespace
}  // namespace qeval::testing
