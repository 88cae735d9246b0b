#include "eval/pipelines/diffusers_folder.h"

#include <map>
#include <string>
#include <system_error>
#include <vector>

#include "base/json_config.h"
#include "kernels/error.h"

namespace qeval::eval {

namespace fs = std::filesystem;

namespace {

// A key given with a value other than null (diffusers writes unset options as null).
bool given(const base::JsonConfig& c, const std::string& key) {
  return c.value().is_object() && c.value().contains(key) && !c.value().at(key).is_null();
}

base::JsonConfig child_of(const base::JsonConfig& c, const std::string& key) {
  return base::JsonConfig(c.value().at(key), c.source(), key, kPipelineDoc);
}

base::JsonConfig load_json(const fs::path& file, const std::string& what) {
  if (!fs::exists(file))
    throw InputError(file.string() + ": no such file (" + what + " of an optimum-cli ONNX export; see " +
                     kPipelineDoc + ", \"Export folders\")");
  return base::JsonConfig::load(file, kPipelineDoc);
}

fs::path onnx_model(const fs::path& dir, const std::string& sub) {
  const fs::path m = dir / sub / "model.onnx";
  if (!fs::exists(m)) {
    std::string hint;
    if (sub == "vae_decoder" && fs::exists(dir / "vae"))
      hint = ": a diffusers PyTorch folder has vae/ instead; export it with `optimum-cli export onnx --model " +
             dir.string() + " OUT/`";
    throw InputError(m.string() + ": no such file (the " + sub + " of an ONNX export" + hint + ")");
  }
  return m;
}

// The tokenizer's padding token: a string, or an object with "content" (newer transformers).
std::string pad_token_of(const base::JsonConfig& c, const std::string& fallback) {
  if (!given(c, "pad_token")) return fallback;
  const nlohmann::json& v = c.value().at("pad_token");
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content").get<std::string>();
  child_of(c, "pad_token").fail("must be a string or an object with \"content\"");
  return fallback;
}

// diffusers' scheduler classes qeval implements, and their constructors' defaults.
SchedulerConfig scheduler_defaults(SchedulerType t) {
  SchedulerConfig s;
  s.type = t;
  s.beta_start = 0.0001;
  s.beta_end = 0.02;
  s.beta_schedule = BetaSchedule::kLinear;
  s.prediction_type = PredictionType::kEpsilon;
  s.steps_offset = 0;
  if (t == SchedulerType::kDdim) {
    s.timestep_spacing = TimestepSpacing::kLeading;
    s.set_alpha_to_one = true;
    s.clip_sample = true;
  } else {
    s.timestep_spacing = TimestepSpacing::kLinspace;
    s.set_alpha_to_one = false;
    s.clip_sample = false;
  }
  return s;
}

SchedulerConfig read_scheduler_config(const fs::path& file, std::optional<SchedulerType> override_type) {
  const base::JsonConfig c = load_json(file, "the scheduler's settings");
  const std::string cls = c.get_string("_class_name");
  std::optional<SchedulerType> type = override_type;
  if (!type) {
    if (cls == "DDIMScheduler") type = SchedulerType::kDdim;
    else if (cls == "EulerDiscreteScheduler") type = SchedulerType::kEulerDiscrete;
    else
      child_of(c, "_class_name")
          .fail("\"" + cls +
                "\" is not a scheduler qeval runs (DDIMScheduler, EulerDiscreteScheduler); set \"scheduler\": "
                "\"ddim\" or \"euler\" in the run config to run this pipeline with that scheduler and this file's "
                "betas (docs/run-config.md)");
  }
  SchedulerConfig s = scheduler_defaults(*type);
  if (given(c, "num_train_timesteps")) {
    const long long n = c.get_int("num_train_timesteps");
    if (n < 1 || n > 100000) child_of(c, "num_train_timesteps").fail("must be in [1, 100000]");
    s.num_train_timesteps = int(n);
  }
  if (given(c, "beta_start")) s.beta_start = c.get_number("beta_start");
  if (given(c, "beta_end")) s.beta_end = c.get_number("beta_end");
  if (!(s.beta_start > 0 && s.beta_start < 1 && s.beta_end >= s.beta_start && s.beta_end < 1))
    c.fail("beta_start and beta_end must satisfy 0 < beta_start <= beta_end < 1");
  if (given(c, "beta_schedule")) {
    const std::string b = c.get_string("beta_schedule");
    if (b != "linear" && b != "scaled_linear")
      child_of(c, "beta_schedule").fail("\"" + b + "\" is not implemented (linear, scaled_linear)");
    s.beta_schedule = b == "linear" ? BetaSchedule::kLinear : BetaSchedule::kScaledLinear;
  }
  if (given(c, "prediction_type")) {
    const std::string p = c.get_choice("prediction_type", {"epsilon", "v_prediction", "sample"});
    s.prediction_type = p == "epsilon"        ? PredictionType::kEpsilon
                        : p == "v_prediction" ? PredictionType::kVPrediction
                                              : PredictionType::kSample;
  }
  if (given(c, "timestep_spacing"))
    s.timestep_spacing = parse_timestep_spacing(c.get_choice("timestep_spacing", {"leading", "trailing", "linspace"}));
  if (given(c, "steps_offset")) {
    const long long o = c.get_int("steps_offset");
    if (o < 0 || o >= s.num_train_timesteps) child_of(c, "steps_offset").fail("must be in [0, num_train_timesteps)");
    s.steps_offset = int(o);
  }
  if (given(c, "set_alpha_to_one")) s.set_alpha_to_one = c.get_bool("set_alpha_to_one", s.set_alpha_to_one);
  if (given(c, "clip_sample")) s.clip_sample = c.get_bool("clip_sample", s.clip_sample);
  if (given(c, "clip_sample_range")) s.clip_sample_range = c.get_number("clip_sample_range");
  if (!(s.clip_sample_range > 0)) child_of(c, "clip_sample_range").fail("must be positive");
  // Options that change the arithmetic and that qeval does not implement: refused, never ignored.
  if (given(c, "trained_betas")) child_of(c, "trained_betas").fail("explicit betas are not implemented");
  for (const char* flag : {"thresholding", "rescale_betas_zero_snr", "use_karras_sigmas", "use_exponential_sigmas",
                           "use_beta_sigmas"})
    if (given(c, flag) && c.get_bool(flag, false)) child_of(c, flag).fail("true is not implemented");
  if (*type == SchedulerType::kEulerDiscrete) {
    if (given(c, "interpolation_type") && c.get_string("interpolation_type") != "linear")
      child_of(c, "interpolation_type").fail("only \"linear\" is implemented");
    if (given(c, "timestep_type") && c.get_string("timestep_type") != "discrete")
      child_of(c, "timestep_type").fail("only \"discrete\" is implemented");
    if (given(c, "final_sigmas_type") && c.get_string("final_sigmas_type") != "zero")
      child_of(c, "final_sigmas_type").fail("only \"zero\" is implemented");
  }
  return s;
}

int positive(const base::JsonConfig& c, const std::string& key, long long fallback, long long max) {
  const long long v = given(c, key) ? c.get_int(key) : fallback;
  if (v < 1 || v > max) child_of(c, key).fail("must be an integer in [1, " + std::to_string(max) + "]");
  return int(v);
}

TokenizerConfig read_tokenizer(const fs::path& dir) {
  TokenizerConfig tok;
  tok.vocab = dir / "vocab.json";
  tok.merges = dir / "merges.txt";
  if (fs::exists(dir / "tokenizer_config.json")) {
    const base::JsonConfig t = base::JsonConfig::load(dir / "tokenizer_config.json", kPipelineDoc);
    tok.max_length = positive(t, "model_max_length", 77, 4096);
    tok.pad_token = pad_token_of(t, tok.pad_token);
  }
  if (tok.max_length < 2) throw InputError(dir.string() + ": model_max_length must be at least 2");
  return tok;
}

// diffusers' SDXL prompt embeddings are hidden_states[-2]; optimum names the outputs
// hidden_states.0 (the embeddings) .. hidden_states.<num_hidden_layers>.
std::string penultimate_hidden_states(const base::JsonConfig& t) {
  if (!given(t, "num_hidden_layers")) t.fail("\"num_hidden_layers\" is missing (SDXL takes the penultimate layer)");
  const long long n = t.get_int("num_hidden_layers");
  if (n < 1 || n > 1000) child_of(t, "num_hidden_layers").fail("must be in [1, 1000]");
  return "hidden_states." + std::to_string(n - 1);
}

// Quantized UNet exports beside unet/, as the TensorRT demo (demo/Diffusion) and ModelOpt's diffusers
// example leave them: a folder named after the UNet ("unet", or the demo's "unetxl") and a suffix
// that says what was done to it ("unetxl-int8.l2.5.bs2.s30.c32.p1.0.a0.8", "unet_int8.l3.bs2.c32.p1.0.a0.8",
// "unet.opt"), holding model.onnx (the demo before TensorRT 10.9, ModelOpt's --onnx-dir) or
// model_optimized.onnx (the demo since 10.9). Folder name -> model file, sorted by name.
std::map<std::string, fs::path> unet_exports_beside(const fs::path& dir) {
  std::map<std::string, fs::path> found;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_directory(ec)) continue;
    const std::string name = e.path().filename().string();
    std::size_t stem = 0;
    for (const char* s : {"unetxl", "unet"})
      if (name.rfind(s, 0) == 0) {
        stem = std::string(s).size();
        break;
      }
    if (stem == 0 || name.size() <= stem + 1 || std::string("-_.").find(name[stem]) == std::string::npos) continue;
    for (const char* file : {"model.onnx", "model_optimized.onnx"})
      if (fs::is_regular_file(e.path() / file, ec)) {
        found[name] = e.path() / file;
        break;
      }
  }
  return found;
}

}  // namespace

bool is_diffusers_folder(const fs::path& dir_or_file) {
  return fs::is_directory(dir_or_file) && fs::exists(dir_or_file / "model_index.json") &&
         !fs::exists(dir_or_file / "pipeline.json");
}

Txt2ImgConfig read_diffusers_txt2img(const fs::path& dir, std::optional<SchedulerType> scheduler) {
  const base::JsonConfig index = load_json(dir / "model_index.json", "the pipeline's index");
  const std::string cls = index.get_string("_class_name", "");
  const bool sdxl = cls == "StableDiffusionXLPipeline";
  if (!sdxl && cls.find("XL") != std::string::npos)
    child_of(index, "_class_name")
        .fail("\"" + cls + "\" is not a text-to-image pipeline qeval runs (StableDiffusionXLPipeline is)");
  if (!sdxl && fs::exists(dir / "text_encoder_2"))
    child_of(index, "_class_name")
        .fail("\"" + cls + "\" with a text_encoder_2/ folder: an SDXL export says \"StableDiffusionXLPipeline\"");
  Txt2ImgConfig c;
  long long pooled_width = 0;  // from unet/config.json, checked against text_encoder_2's projection_dim
  std::optional<base::JsonConfig> text_encoder_2;  // SDXL: text_encoder_2/config.json
  c.source = dir / "model_index.json";
  c.name = fs::absolute(dir).lexically_normal().filename().string();
  if (c.name.empty()) c.name = fs::absolute(dir).lexically_normal().parent_path().filename().string();
  c.input_types_from_graphs = true;

  c.tokenizer = read_tokenizer(dir / "tokenizer");
  if (sdxl) {
    // StableDiffusionXLPipeline.__init__: force_zeros_for_empty_prompt defaults to true.
    if (given(index, "force_zeros_for_empty_prompt"))
      c.sdxl_conditioning.force_zeros_for_empty_prompt = index.get_bool("force_zeros_for_empty_prompt", true);
    c.tokenizer_2 = read_tokenizer(dir / "tokenizer_2");
    c.text_encoder_2.model = onnx_model(dir, "text_encoder_2");
    // prompt_embeds = hidden_states[-2] of both encoders: "hidden_states.<layers - 1>" in optimum's names.
    c.text_encoder.output =
        penultimate_hidden_states(load_json(dir / "text_encoder" / "config.json", "the text_encoder's settings"));
    text_encoder_2 = load_json(dir / "text_encoder_2" / "config.json", "the text_encoder_2's settings");
    c.text_encoder_2.output = penultimate_hidden_states(*text_encoder_2);
    c.text_encoder_2.pooled_output = "text_embeds";
    c.unet.text_embeds = "text_embeds";
    c.unet.time_ids = "time_ids";
  }

  c.text_encoder.model = onnx_model(dir, "text_encoder");
  c.unet.model = onnx_model(dir, "unet");
  c.unet.variant_models = unet_exports_beside(dir);
  c.vae_decoder.model = onnx_model(dir, "vae_decoder");

  {
    const base::JsonConfig u = load_json(dir / "unet" / "config.json", "the UNet's settings");
    if (given(u, "addition_embed_type")) {
      const std::string type = u.get_string("addition_embed_type");
      if (type != "text_time" || !sdxl)
        child_of(u, "addition_embed_type")
            .fail("\"" + type + "\" is not supported (\"text_time\", in an SDXL pipeline, is)");
    } else if (sdxl) {
      u.fail(
          "\"addition_embed_type\" must be \"text_time\" in an SDXL pipeline (the UNet takes text_embeds and "
          "time_ids)");
    }
    // Settings that add UNet inputs or change what the pipeline feeds: refused, never ignored.
    if (given(u, "time_cond_proj_dim"))
      child_of(u, "time_cond_proj_dim").fail("a timestep_cond input is not supported");
    if (given(u, "class_embed_type")) child_of(u, "class_embed_type").fail("class embeddings are not supported");
    if (sdxl && given(u, "addition_time_embed_dim") && given(u, "projection_class_embeddings_input_dim")) {
      // diffusers' _get_add_time_ids: addition_time_embed_dim x 6 time ids + the pooled width.
      const long long time_dim = u.get_int("addition_time_embed_dim");
      const long long proj = u.get_int("projection_class_embeddings_input_dim");
      if (time_dim < 1 || proj <= 6 * time_dim)
        child_of(u, "projection_class_embeddings_input_dim")
            .fail("is " + std::to_string(proj) + ": must exceed 6 time ids x addition_time_embed_dim " +
                  std::to_string(time_dim) + " (the rest is text_encoder_2's pooled width)");
      pooled_width = proj - 6 * time_dim;
    }
    const int size = positive(u, "sample_size", 64, 1024);
    c.latent_height = c.latent_width = size;
    c.latent_channels = positive(u, "in_channels", 4, 64);
  }
  {
    const base::JsonConfig v = load_json(dir / "vae_decoder" / "config.json", "the VAE decoder's settings");
    c.vae_decoder.scaling_factor = given(v, "scaling_factor") ? v.get_number("scaling_factor") : 0.18215;
    if (!(c.vae_decoder.scaling_factor > 0)) child_of(v, "scaling_factor").fail("must be positive");
    if (given(v, "latent_channels") && v.get_int("latent_channels") != c.latent_channels)
      child_of(v, "latent_channels")
          .fail("is " + std::to_string(v.get_int("latent_channels")) + ", the UNet's in_channels " +
                std::to_string(c.latent_channels));
    // diffusers: vae_scale_factor = 2 ** (len(vae.config.block_out_channels) - 1).
    const std::size_t blocks = given(v, "block_out_channels") ? v.get_numbers("block_out_channels").size() : 1;
    if (blocks < 1 || blocks > 8) child_of(v, "block_out_channels").fail("must list 1 to 8 widths");
    const int factor = 1 << (blocks - 1);
    c.image_height = c.latent_height * factor;
    c.image_width = c.latent_width * factor;
    c.image_channels = positive(v, "out_channels", 3, 4);
    if (c.image_channels != 3) child_of(v, "out_channels").fail("must be 3 (RGB)");
    for (const char* key : {"latents_mean", "latents_std"})
      if (given(v, key)) child_of(v, key).fail("latent normalisation is not supported");
    // Only the SDXL pipeline reads force_upcast (AutoencoderKL's default: true).
    if (sdxl) c.vae_decoder.force_upcast = given(v, "force_upcast") ? v.get_bool("force_upcast", true) : true;
  }
  c.scheduler = read_scheduler_config(dir / "scheduler" / "scheduler_config.json", scheduler);
  // StableDiffusionPipeline.__call__'s defaults (StableDiffusionXLPipeline's guidance: 5.0).
  c.default_steps = 50;
  c.default_guidance_scale = sdxl ? 5.0 : 7.5;
  if (sdxl && pooled_width > 0) {
    const base::JsonConfig& t2 = *text_encoder_2;
    if (given(t2, "projection_dim") && t2.get_int("projection_dim") != pooled_width)
      child_of(t2, "projection_dim")
          .fail("is " + std::to_string(t2.get_int("projection_dim")) +
                ", unet/config.json's projection_class_embeddings_input_dim leaves " + std::to_string(pooled_width) +
                " for the pooled embedding");
  }
  if (c.default_steps > c.scheduler.num_train_timesteps) c.default_steps = c.scheduler.num_train_timesteps;
  return c;
}

}  // namespace qeval::eval
