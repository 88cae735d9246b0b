// pipeline.json: which models a pipeline runs, how they connect, its tokenizer, scheduler and
// sizes. The format (task txt2img here; segmentation has its own reader) is docs/pipelines.md.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/tensor.h"

namespace qeval::eval {

inline constexpr const char* kPipelineDoc = "docs/pipelines.md";

enum class PipelineTask { kTxt2Img, kSegmentation };
std::string_view pipeline_task_name(PipelineTask t);

// `dir_or_file` may be the pipeline's folder (its pipeline.json is read) or the file itself.
std::filesystem::path pipeline_json_path(const std::filesystem::path& dir_or_file);
// Reads only "format", "version" and "task", so callers can dispatch before the task's own reader
// validates the rest. InputError for a missing file, another format, a version qeval does not
// know, or an unknown task.
PipelineTask read_pipeline_task(const std::filesystem::path& dir_or_file);

enum class BetaSchedule { kLinear, kScaledLinear };
enum class TimestepSpacing { kLeading, kTrailing, kLinspace };
enum class PredictionType { kEpsilon, kVPrediction, kSample };
enum class SchedulerType { kDdim, kEulerDiscrete };

std::string_view scheduler_type_name(SchedulerType t);      // "ddim", "euler"
std::string_view timestep_spacing_name(TimestepSpacing s);  // "leading", ...
std::string_view prediction_type_name(PredictionType p);    // "epsilon", "v_prediction", "sample"
std::string_view beta_schedule_name(BetaSchedule b);        // "linear", "scaled_linear"
// The inverse of the names above; InputError listing the valid names.
SchedulerType parse_scheduler_type(const std::string& name);
TimestepSpacing parse_timestep_spacing(const std::string& name);

// diffusers' scheduler_config.json fields (DDIMScheduler / EulerDiscreteScheduler), with
// diffusers' meaning. The defaults are Stable Diffusion 1.x's.
struct SchedulerConfig {
  SchedulerType type = SchedulerType::kDdim;
  int num_train_timesteps = 1000;
  double beta_start = 0.00085;
  double beta_end = 0.012;
  BetaSchedule beta_schedule = BetaSchedule::kScaledLinear;
  PredictionType prediction_type = PredictionType::kEpsilon;
  TimestepSpacing timestep_spacing = TimestepSpacing::kLeading;
  int steps_offset = 1;
  bool set_alpha_to_one = false;  // DDIM: the alpha after the last step is 1 (else alphas_cumprod[0])
  bool clip_sample = false;       // DDIM: clamp the predicted x0 to [-clip_sample_range, +range]
  double clip_sample_range = 1.0;
};

// The models of a txt2img pipeline (txt2img_model_name, eval/pipelines/txt2img.h, names them).
enum class Txt2ImgModel { kTextEncoder, kUnet, kVaeDecoder, kTextEncoder2 };

// The graph input/output names of one model and the file it is read from.
struct ModelFiles {
  std::filesystem::path model;                                  // resolved against pipeline.json's folder
  std::map<std::string, std::filesystem::path> variant_models;  // "variants": name -> another export
  // The file for a variant ("" = the main model); InputError when the pipeline has no such variant.
  const std::filesystem::path& file_for(const std::string& variant, const std::string& where) const;
};

struct TextEncoderConfig : ModelFiles {
  std::string input = "input_ids";
  DType input_type = DType::kInt32;  // int32 or int64
  // The hidden states the UNet gets: last_hidden_state (SD 1.x/2.x) or, for SDXL, the penultimate
  // layer's "hidden_states.<layers - 1>" (no final layer norm).
  std::string output = "last_hidden_state";
  std::string pooled_output;  // SDXL's text_encoder_2: "text_embeds" (the UNet's text_embeds); "" = none
};

struct UnetConfig : ModelFiles {
  std::string sample = "sample", timestep = "timestep", encoder_hidden_states = "encoder_hidden_states";
  DType timestep_type = DType::kFloat32;  // int64, int32, float32 or float16
  std::string output = "out_sample";
  // SDXL's added conditioning ("text_time"): the pooled text embedding and the 6 time ids. Empty
  // for SD 1.x/2.x.
  std::string text_embeds, time_ids;
};

struct VaeDecoderConfig : ModelFiles {
  std::string input = "latent_sample", output = "sample";
  double scaling_factor = 0.18215;  // the decoder gets latent / scaling_factor
  // SDXL: the decoder runs in FP32 whatever the variant's precision (diffusers upcasts a float16
  // VAE whose config says force_upcast), unless the variant names the VAE's precision itself.
  bool force_upcast = false;
};

// SDXL's micro-conditioning and negative-prompt rule (diffusers' StableDiffusionXLPipeline).
struct SdxlConditioning {
  // add_time_ids = original_size + crop_top_left + target_size, (height, width) order; the
  // defaults (0 = not given) are the image size and (0, 0).
  int original_height = 0, original_width = 0;
  int crop_top = 0, crop_left = 0;
  int target_height = 0, target_width = 0;
  // An empty negative prompt gives zero prompt and pooled embeddings instead of encoding "".
  bool force_zeros_for_empty_prompt = true;
};

struct TokenizerConfig {
  std::filesystem::path vocab, merges;
  int max_length = 77;
  std::string pad_token = "<|endoftext|>";
};

struct Txt2ImgConfig {
  std::filesystem::path source;  // the pipeline.json read
  std::string name;
  TokenizerConfig tokenizer;
  TextEncoderConfig text_encoder;
  // SDXL: a second tokenizer and text encoder (CLIP bigG with its pooled projection); the UNet gets
  // both encoders' hidden states concatenated on the last axis. Empty model = SD 1.x/2.x.
  TokenizerConfig tokenizer_2;
  TextEncoderConfig text_encoder_2;
  SdxlConditioning sdxl_conditioning;
  UnetConfig unet;
  VaeDecoderConfig vae_decoder;
  int latent_channels = 4, latent_height = 64, latent_width = 64;
  int image_channels = 3, image_height = 512, image_width = 512;
  double image_min = -1.0, image_max = 1.0;  // the decoder's output range ("range")
  SchedulerConfig scheduler;
  int default_steps = 50;
  double default_guidance_scale = 7.5;
  std::string default_negative_prompt;
  std::filesystem::path calibration_prompts, evaluation_prompts;  // empty when not given
  // An export folder declares no input types: Txt2ImgModels::load takes input_ids' and timestep's
  // from the graphs (pipeline.json's are checked against them).
  bool input_types_from_graphs = false;
  std::vector<std::string> variant_names() const;  // every name under any model's "variants"

  bool sdxl() const { return !text_encoder_2.model.empty(); }
  // The models of this pipeline in call order: text_encoder[, text_encoder_2], unet, vae_decoder.
  std::vector<Txt2ImgModel> models() const;
  // A model's files: its section of pipeline.json (or of the export folder).
  const ModelFiles& files(Txt2ImgModel m) const;
  // The 6 add_time_ids values with the defaults filled in.
  std::vector<float> time_ids() const;

  Shape latent_shape() const { return {1, latent_channels, latent_height, latent_width}; }
};

// Reads and validates a txt2img pipeline.json: every key known (unknown keys are errors listing the
// valid ones), types, ranges and choices checked, paths resolved against the file's folder. Does
// not open the model or tokenizer files (Txt2ImgModels::load does). InputError names the file and
// the key path. A folder with model_index.json and no pipeline.json is read as an optimum-cli
// export (eval/pipelines/diffusers_folder.h); `scheduler` (the run config's) replaces its
// scheduler class there.
Txt2ImgConfig read_txt2img_config(const std::filesystem::path& dir_or_file,
                                  std::optional<SchedulerType> scheduler = std::nullopt);

}  // namespace qeval::eval
