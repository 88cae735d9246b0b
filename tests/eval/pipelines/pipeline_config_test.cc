// pipeline.json for txt2img: the shipped tiny-sd file, the SD 1.5 example of docs/, and bad files.
#include <gtest/gtest.h>

#include <fstream>

#include "eval/pipelines/pipeline_config.h"
#include "kernels/error.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

TEST(PipelineConfig, ReadsTheShippedTinySd) {
  const fs::path dir = testing::source_dir() / "models" / "tiny-sd";
  EXPECT_EQ(read_pipeline_task(dir), PipelineTask::kTxt2Img);
  const Txt2ImgConfig c = read_txt2img_config(dir);
  EXPECT_EQ(c.name, "tiny-sd");
  EXPECT_EQ(c.text_encoder.model, dir / "text_encoder.onnx");
  EXPECT_EQ(c.tokenizer.vocab, dir / "tokenizer/vocab.json");
  EXPECT_EQ(c.text_encoder.input_type, DType::kInt32);
  EXPECT_EQ(c.unet.timestep_type, DType::kFloat32);
  EXPECT_EQ(c.latent_shape(), (Shape{1, 4, 16, 16}));
  EXPECT_EQ(c.image_height, 64);
  EXPECT_DOUBLE_EQ(c.vae_decoder.scaling_factor, 0.814783);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kDdim);
  EXPECT_EQ(c.scheduler.timestep_spacing, TimestepSpacing::kLeading);
  EXPECT_EQ(c.scheduler.steps_offset, 1);
  EXPECT_FALSE(c.scheduler.set_alpha_to_one);
  EXPECT_EQ(c.default_steps, 20);
  EXPECT_DOUBLE_EQ(c.default_guidance_scale, 5.0);
  EXPECT_TRUE(fs::exists(c.evaluation_prompts)) << c.evaluation_prompts;
}

TEST(PipelineConfig, ReadsTheStableDiffusion15Example) {
  const fs::path file = testing::source_dir() / "docs" / "examples" / "sd15-pipeline.json";
  const Txt2ImgConfig c = read_txt2img_config(file);
  EXPECT_EQ(c.name, "stable-diffusion-v1-5");
  EXPECT_EQ(c.text_encoder.input_type, DType::kInt64);
  EXPECT_EQ(c.unet.timestep_type, DType::kInt64);
  EXPECT_EQ(c.unet.model, file.parent_path() / "unet/model.onnx");
  EXPECT_EQ(c.unet.file_for("fp16", "unet"), file.parent_path() / "unet_fp16/model.onnx");
  EXPECT_EQ(c.text_encoder.file_for("", "text_encoder"), c.text_encoder.model);
  EXPECT_THROW(c.text_encoder.file_for("fp16", "text_encoder"), InputError);
  EXPECT_EQ(c.variant_names(), std::vector<std::string>{"fp16"});
  EXPECT_EQ(c.latent_shape(), (Shape{1, 4, 64, 64}));
  EXPECT_EQ(c.image_width, 512);
  EXPECT_DOUBLE_EQ(c.vae_decoder.scaling_factor, 0.18215);
  EXPECT_DOUBLE_EQ(c.scheduler.beta_start, 0.00085);
  EXPECT_EQ(c.scheduler.beta_schedule, BetaSchedule::kScaledLinear);
  EXPECT_EQ(c.default_steps, 50);
  EXPECT_DOUBLE_EQ(c.default_guidance_scale, 7.5);
}

// Writes tiny-sd's pipeline.json with one change (a JSON pointer and a value, or removal).
class BadPipelineConfig : public ::testing::Test {
 protected:
  std::string error_for(const std::string& pointer, const json* value) {
    json j = testing::read_json(testing::source_dir() / "models" / "tiny-sd" / "pipeline.json");
    if (value) j[json::json_pointer(pointer)] = *value;
    else j[json::json_pointer(pointer).parent_pointer()].erase(json::json_pointer(pointer).back());
    const fs::path p = dir_ / "pipeline.json";
    std::ofstream(p) << j.dump(1);
    try {
      read_txt2img_config(dir_.path());
    } catch (const InputError& e) {
      return e.what();
    }
    return "no error";
  }
  std::string set(const std::string& pointer, json value) { return error_for(pointer, &value); }
  std::string remove(const std::string& pointer) { return error_for(pointer, nullptr); }
  testing::ScratchDir dir_{"pipeline-config"};
};

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST_F(BadPipelineConfig, NamesTheKeyAndWhatWasExpected) {
  EXPECT_HAS(set("/unet/timestep_type", "float64"),
             "unet.timestep_type: 'float64' is not one of: int64, int32, float32, float16");
  EXPECT_HAS(set("/text_encoder/input_type", "float32"),
             "text_encoder.input_type: 'float32' is not one of: int32, int64");
  EXPECT_HAS(set("/unet/modle", "x.onnx"), "unknown key 'modle'");
  EXPECT_HAS(remove("/vae_decoder/scaling_factor"), "vae_decoder: missing required key 'scaling_factor'");
  EXPECT_HAS(set("/vae_decoder/scaling_factor", -1), "vae_decoder.scaling_factor: must be positive");
  EXPECT_HAS(set("/latent/height", 0), "latent.height: must be an integer in [1, 1024], got 0");
  EXPECT_HAS(set("/latent/width", 16.5), "latent.width: must be an integer");
  EXPECT_HAS(set("/image/range", json::array({1, -1})), "image.range: must be [low, high]");
  EXPECT_HAS(set("/image/channels", 4), "image.channels: must be 3");
  EXPECT_HAS(set("/scheduler/type", "pndm"), "scheduler.type: 'pndm' is not one of: ddim, euler");
  EXPECT_HAS(set("/scheduler/timestep_spacing", "lead"), "scheduler.timestep_spacing: 'lead' is not one of");
  EXPECT_HAS(set("/scheduler/beta_end", 0.0001), "scheduler.beta_end: must not be below beta_start");
  EXPECT_HAS(set("/scheduler/prediction_type", "flow"), "scheduler.prediction_type");
  EXPECT_HAS(set("/defaults/steps", 0), "defaults.steps: must be an integer in [1, 1000]");
  EXPECT_HAS(set("/defaults/guidance_scale", -2), "defaults.guidance_scale: must be >= 0");
  EXPECT_HAS(set("/tokenizer/type", "sentencepiece"), "tokenizer.type");
  EXPECT_HAS(remove("/unet"), "missing required key 'unet'");
  EXPECT_HAS(set("/task", "segmentation"), "this is not a text-to-image pipeline");
  EXPECT_HAS(set("/task", "upscale"), "task: 'upscale' is not one of: txt2img, segmentation");
  EXPECT_HAS(set("/version", 2), "\"version\" 2 is not supported");
  EXPECT_HAS(set("/format", "diffusers"), "\"format\" must be \"qeval.pipeline\"");
  EXPECT_HAS(set("/noise/generator", "philox"), "noise.generator");
  EXPECT_HAS(set("/unet/variants", json{{"int8", 3}}), "unet.variants.int8: must be a string");
  // Every message points at the format's documentation.
  EXPECT_HAS(set("/latent/channels", "4"), "(see docs/pipelines.md)");
}

TEST_F(BadPipelineConfig, MissingFileAndFolder) {
  try {
    read_pipeline_task(dir_.path());
    FAIL();
  } catch (const InputError& e) {
    EXPECT_HAS(std::string(e.what()), "pipeline.json: no such file (a pipeline folder holds a pipeline.json)");
  }
  std::ofstream(dir_ / "pipeline.json") << "{\"format\": \"qeval.pipeline\", ";
  EXPECT_THROW(read_pipeline_task(dir_.path()), InputError);
}

TEST_F(BadPipelineConfig, PathsResolveAgainstTheFilesFolder) {
  set("/unet/model", "sub/unet.onnx");
  const Txt2ImgConfig c = read_txt2img_config(dir_ / "pipeline.json");
  EXPECT_EQ(c.unet.model, dir_ / "sub/unet.onnx");
  set("/unet/model", "/abs/unet.onnx");
  EXPECT_EQ(read_txt2img_config(dir_.path()).unet.model, fs::path("/abs/unet.onnx"));
}

TEST_F(BadPipelineConfig, TaskReaderIgnoresTheRest) {
  // Only format, version and task are read: a segmentation file dispatches without txt2img keys.
  std::ofstream(dir_ / "pipeline.json")
      << R"({"format": "qeval.pipeline", "version": 1, "task": "segmentation", "image_encoder": {}})";
  EXPECT_EQ(read_pipeline_task(dir_.path()), PipelineTask::kSegmentation);
  EXPECT_EQ(read_pipeline_task(testing::source_dir() / "models" / "tiny-sam"), PipelineTask::kSegmentation);
}

}  // namespace
}  // namespace qeval::eval
