#include "eval/pipelines/pipeline_config.h"

#include <cmath>
#include <set>
#include <tuple>

#include "base/json_config.h"
#include "eval/pipelines/diffusers_folder.h"
#include "kernels/error.h"

namespace qeval::eval {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "qeval.pipeline";
constexpr long long kVersion = 1;

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

base::JsonConfig load_root(const fs::path& dir_or_file) {
  const fs::path path = pipeline_json_path(dir_or_file);
  if (!fs::exists(path))
    throw InputError(path.string() + ": no such file" +
                     (fs::is_directory(dir_or_file) ? " (a pipeline folder holds a pipeline.json)" : "") + " (see " +
                     kPipelineDoc + ")");
  base::JsonConfig root = base::JsonConfig::load(path, kPipelineDoc);
  if (root.get_string("format") != kFormat)
    root.fail("\"format\" must be \"" + std::string(kFormat) + "\", got \"" + root.get_string("format") + "\"");
  if (root.get_int("version") != kVersion)
    root.fail("\"version\" " + std::to_string(root.get_int("version")) +
              " is not supported (this qeval reads version " + std::to_string(kVersion) + ")");
  return root;
}

int positive_int(const base::JsonConfig& c, const std::string& key, long long max,
                 std::optional<long long> fallback = {}) {
  long long v = fallback && !c.has(key) ? *fallback : c.get_int(key);
  if (v < 1 || v > max)
    base::JsonConfig(c.value().at(key), c.source(), c.path().empty() ? key : c.path() + "." + key, kPipelineDoc)
        .fail("must be an integer in [1, " + std::to_string(max) + "], got " + std::to_string(v));
  return static_cast<int>(v);
}

base::JsonConfig at(const base::JsonConfig& c, const std::string& key) {
  return base::JsonConfig(c.value().at(key), c.source(), c.path().empty() ? key : c.path() + "." + key, kPipelineDoc);
}

void read_model_files(const base::JsonConfig& c, ModelFiles& m) {
  m.model = c.get_path("model");
  if (auto variants = c.optional_object("variants")) {
    for (const auto& [name, value] : variants->value().items()) {
      if (name.empty()) variants->fail("a variant name must not be empty");
      m.variant_models[name] = variants->get_path(name);
    }
  }
}

DType read_dtype(const base::JsonConfig& c, const std::string& key, const std::vector<std::string>& choices,
                 const std::string& fallback) {
  const std::string s = c.get_choice(key, choices, fallback);
  if (s == "int32") return DType::kInt32;
  if (s == "int64") return DType::kInt64;
  if (s == "float16") return DType::kFloat16;
  return DType::kFloat32;
}

SchedulerConfig read_scheduler(const base::JsonConfig& c) {
  c.allow_keys({"type", "num_train_timesteps", "beta_start", "beta_end", "beta_schedule", "prediction_type",
                "timestep_spacing", "steps_offset", "set_alpha_to_one", "clip_sample", "clip_sample_range"});
  SchedulerConfig s;
  s.type = parse_scheduler_type(c.get_choice("type", {"ddim", "euler"}));
  s.num_train_timesteps = positive_int(c, "num_train_timesteps", 100000, 1000);
  s.beta_start = c.get_number("beta_start", s.beta_start);
  s.beta_end = c.get_number("beta_end", s.beta_end);
  if (!(s.beta_start > 0 && s.beta_start < 1)) at(c, "beta_start").fail("must be in (0, 1)");
  if (!(s.beta_end > 0 && s.beta_end < 1)) at(c, "beta_end").fail("must be in (0, 1)");
  if (s.beta_end < s.beta_start) at(c, "beta_end").fail("must not be below beta_start");
  s.beta_schedule = c.get_choice("beta_schedule", {"linear", "scaled_linear"}, "scaled_linear") == "linear"
                        ? BetaSchedule::kLinear
                        : BetaSchedule::kScaledLinear;
  const std::string p = c.get_choice("prediction_type", {"epsilon", "v_prediction", "sample"}, "epsilon");
  s.prediction_type = p == "epsilon"        ? PredictionType::kEpsilon
                      : p == "v_prediction" ? PredictionType::kVPrediction
                                            : PredictionType::kSample;
  s.timestep_spacing = parse_timestep_spacing(c.get_choice("timestep_spacing", {"leading", "trailing", "linspace"},
                                                           s.type == SchedulerType::kDdim ? "leading" : "linspace"));
  const long long offset = c.get_int("steps_offset", s.steps_offset);
  if (offset < 0 || offset >= s.num_train_timesteps) at(c, "steps_offset").fail("must be in [0, num_train_timesteps)");
  s.steps_offset = static_cast<int>(offset);
  s.set_alpha_to_one = c.get_bool("set_alpha_to_one", s.set_alpha_to_one);
  s.clip_sample = c.get_bool("clip_sample", s.clip_sample);
  s.clip_sample_range = c.get_number("clip_sample_range", s.clip_sample_range);
  if (!(s.clip_sample_range > 0)) at(c, "clip_sample_range").fail("must be positive");
  return s;
}

TokenizerConfig read_tokenizer(const base::JsonConfig& t) {
  TokenizerConfig tok;
  t.allow_keys({"type", "vocab", "merges", "max_length", "pad_token"});
  t.get_choice("type", {"clip_bpe"}, "clip_bpe");
  tok.vocab = t.get_path("vocab");
  tok.merges = t.get_path("merges");
  tok.max_length = positive_int(t, "max_length", 4096, 77);
  if (tok.max_length < 2) at(t, "max_length").fail("must be at least 2 (BOS and EOS)");
  tok.pad_token = t.get_string("pad_token", tok.pad_token);
  return tok;
}

// `second`: SDXL's text_encoder_2, which also gives the pooled embedding.
void read_text_encoder(const base::JsonConfig& t, TextEncoderConfig& e, bool second) {
  if (second) t.allow_keys({"model", "variants", "input", "input_type", "output", "pooled_output"});
  else t.allow_keys({"model", "variants", "input", "input_type", "output"});
  read_model_files(t, e);
  e.input = t.get_string("input", e.input);
  e.input_type = read_dtype(t, "input_type", {"int32", "int64"}, "int32");
  e.output = t.get_string("output", e.output);
  if (second) e.pooled_output = t.get_string("pooled_output", "text_embeds");
}

std::pair<int, int> size_pair(const base::JsonConfig& c, const std::string& key, int lo) {
  const std::vector<double> v = c.get_numbers(key);
  if (v.size() != 2 || v[0] != std::floor(v[0]) || v[1] != std::floor(v[1]) || v[0] < lo || v[1] < lo || v[0] > 65536 ||
      v[1] > 65536)
    at(c, key).fail("must be two integers [height, width]" + std::string(lo > 0 ? " >= 1" : " >= 0"));
  return {int(v[0]), int(v[1])};
}

SdxlConditioning read_sdxl(const base::JsonConfig& x) {
  x.allow_keys({"original_size", "crop_top_left", "target_size", "force_zeros_for_empty_prompt"});
  SdxlConditioning s;
  if (x.has("original_size")) std::tie(s.original_height, s.original_width) = size_pair(x, "original_size", 1);
  if (x.has("crop_top_left")) std::tie(s.crop_top, s.crop_left) = size_pair(x, "crop_top_left", 0);
  if (x.has("target_size")) std::tie(s.target_height, s.target_width) = size_pair(x, "target_size", 1);
  s.force_zeros_for_empty_prompt = x.get_bool("force_zeros_for_empty_prompt", s.force_zeros_for_empty_prompt);
  return s;
}

}  // namespace

std::vector<float> Txt2ImgConfig::time_ids() const {
  const SdxlConditioning& s = sdxl_conditioning;
  auto or_image = [](int v, int image) { return float(v > 0 ? v : image); };
  return {or_image(s.original_height, image_height),
          or_image(s.original_width, image_width),
          float(s.crop_top),
          float(s.crop_left),
          or_image(s.target_height, image_height),
          or_image(s.target_width, image_width)};
}

std::string_view pipeline_task_name(PipelineTask t) { return t == PipelineTask::kTxt2Img ? "txt2img" : "segmentation"; }

fs::path pipeline_json_path(const fs::path& dir_or_file) {
  return fs::is_directory(dir_or_file) ? dir_or_file / "pipeline.json" : dir_or_file;
}

PipelineTask read_pipeline_task(const fs::path& dir_or_file) {
  if (is_diffusers_folder(dir_or_file)) return PipelineTask::kTxt2Img;
  base::JsonConfig root = load_root(dir_or_file);
  return root.get_choice("task", {"txt2img", "segmentation"}) == "txt2img" ? PipelineTask::kTxt2Img
                                                                           : PipelineTask::kSegmentation;
}

std::string_view scheduler_type_name(SchedulerType t) { return t == SchedulerType::kDdim ? "ddim" : "euler"; }

std::string_view timestep_spacing_name(TimestepSpacing s) {
  switch (s) {
    case TimestepSpacing::kLeading: return "leading";
    case TimestepSpacing::kTrailing: return "trailing";
    case TimestepSpacing::kLinspace: return "linspace";
  }
  return "?";
}

std::string_view prediction_type_name(PredictionType p) {
  switch (p) {
    case PredictionType::kEpsilon: return "epsilon";
    case PredictionType::kVPrediction: return "v_prediction";
    case PredictionType::kSample: return "sample";
  }
  return "?";
}

std::string_view beta_schedule_name(BetaSchedule b) { return b == BetaSchedule::kLinear ? "linear" : "scaled_linear"; }

SchedulerType parse_scheduler_type(const std::string& name) {
  if (name == "ddim") return SchedulerType::kDdim;
  if (name == "euler") return SchedulerType::kEulerDiscrete;
  throw InputError("unknown scheduler '" + name + "' (valid: ddim, euler)");
}

TimestepSpacing parse_timestep_spacing(const std::string& name) {
  if (name == "leading") return TimestepSpacing::kLeading;
  if (name == "trailing") return TimestepSpacing::kTrailing;
  if (name == "linspace") return TimestepSpacing::kLinspace;
  throw InputError("unknown timestep spacing '" + name + "' (valid: leading, trailing, linspace)");
}

const fs::path& ModelFiles::file_for(const std::string& variant, const std::string& where) const {
  if (variant.empty()) return model;
  auto it = variant_models.find(variant);
  if (it != variant_models.end()) return it->second;
  std::vector<std::string> names;
  for (const auto& [k, _] : variant_models) names.push_back(k);
  throw InputError(where + ": no variant '" + variant + "' (" +
                   (names.empty() ? std::string("this model lists no variants") : "variants: " + join(names)) + ")");
}

std::vector<Txt2ImgModel> Txt2ImgConfig::models() const {
  if (sdxl())
    return {Txt2ImgModel::kTextEncoder, Txt2ImgModel::kTextEncoder2, Txt2ImgModel::kUnet, Txt2ImgModel::kVaeDecoder};
  return {Txt2ImgModel::kTextEncoder, Txt2ImgModel::kUnet, Txt2ImgModel::kVaeDecoder};
}

const ModelFiles& Txt2ImgConfig::files(Txt2ImgModel m) const {
  switch (m) {
    case Txt2ImgModel::kTextEncoder: return text_encoder;
    case Txt2ImgModel::kTextEncoder2: return text_encoder_2;
    case Txt2ImgModel::kUnet: return unet;
    case Txt2ImgModel::kVaeDecoder: break;
  }
  return vae_decoder;
}

std::vector<std::string> Txt2ImgConfig::variant_names() const {
  std::set<std::string> names;
  for (Txt2ImgModel m : models())
    for (const auto& [k, _] : files(m).variant_models) names.insert(k);
  return {names.begin(), names.end()};
}

Txt2ImgConfig read_txt2img_config(const fs::path& dir_or_file, std::optional<SchedulerType> scheduler) {
  if (is_diffusers_folder(dir_or_file)) return read_diffusers_txt2img(dir_or_file, scheduler);
  base::JsonConfig root = load_root(dir_or_file);
  root.allow_keys({"format", "version", "task", "name", "tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2",
                   "sdxl", "unet", "vae_decoder", "latent", "image", "scheduler", "defaults", "noise", "prompts"});
  const std::string task = root.get_choice("task", {"txt2img", "segmentation"});
  if (task != "txt2img") at(root, "task").fail("is \"" + task + "\": this is not a text-to-image pipeline");

  Txt2ImgConfig c;
  c.source = pipeline_json_path(dir_or_file);
  c.name = root.get_string("name", c.source.parent_path().filename().string());

  c.tokenizer = read_tokenizer(root.object("tokenizer"));
  read_text_encoder(root.object("text_encoder"), c.text_encoder, false);
  if (root.has("text_encoder_2")) {
    // SDXL: the second encoder, its tokenizer, and the UNet's added conditioning.
    if (!root.has("tokenizer_2")) root.fail("\"text_encoder_2\" needs \"tokenizer_2\" (SDXL's second tokenizer)");
    c.tokenizer_2 = read_tokenizer(root.object("tokenizer_2"));
    read_text_encoder(root.object("text_encoder_2"), c.text_encoder_2, true);
    if (auto x = root.optional_object("sdxl")) c.sdxl_conditioning = read_sdxl(*x);
  } else {
    for (const char* key : {"tokenizer_2", "sdxl"})
      if (root.has(key)) at(root, key).fail("is SDXL's and needs \"text_encoder_2\"");
  }
  {
    base::JsonConfig u = root.object("unet");
    u.allow_keys({"model", "variants", "sample", "timestep", "timestep_type", "encoder_hidden_states", "output",
                  "text_embeds", "time_ids"});
    read_model_files(u, c.unet);
    c.unet.sample = u.get_string("sample", c.unet.sample);
    c.unet.timestep = u.get_string("timestep", c.unet.timestep);
    c.unet.timestep_type = read_dtype(u, "timestep_type", {"int64", "int32", "float32", "float16"}, "float32");
    c.unet.encoder_hidden_states = u.get_string("encoder_hidden_states", c.unet.encoder_hidden_states);
    c.unet.output = u.get_string("output", c.unet.output);
    if (c.sdxl()) {
      c.unet.text_embeds = u.get_string("text_embeds", "text_embeds");
      c.unet.time_ids = u.get_string("time_ids", "time_ids");
    } else {
      for (const char* key : {"text_embeds", "time_ids"})
        if (u.has(key)) at(u, key).fail("is SDXL's added conditioning and needs \"text_encoder_2\"");
    }
  }
  {
    base::JsonConfig v = root.object("vae_decoder");
    v.allow_keys({"model", "variants", "input", "output", "scaling_factor", "force_upcast"});
    read_model_files(v, c.vae_decoder);
    c.vae_decoder.input = v.get_string("input", c.vae_decoder.input);
    c.vae_decoder.output = v.get_string("output", c.vae_decoder.output);
    c.vae_decoder.scaling_factor = v.get_number("scaling_factor");
    if (!(c.vae_decoder.scaling_factor > 0)) at(v, "scaling_factor").fail("must be positive");
    c.vae_decoder.force_upcast = v.get_bool("force_upcast", false);
    // diffusers' SD pipelines never read force_upcast (only SDXL's upcast the VAE): refused, not ignored.
    if (c.vae_decoder.force_upcast && !c.sdxl())
      at(v, "force_upcast")
          .fail(
              "only an SDXL pipeline (with \"text_encoder_2\") upcasts the VAE; for an FP32 VAE in an FP16 "
              "variant give the run config's \"model_precision\": {\"vae_decoder\": \"fp32\"} (docs/run-config.md)");
  }
  {
    base::JsonConfig l = root.object("latent");
    l.allow_keys({"channels", "height", "width"});
    c.latent_channels = positive_int(l, "channels", 64);
    c.latent_height = positive_int(l, "height", 1024);
    c.latent_width = positive_int(l, "width", 1024);
  }
  {
    base::JsonConfig im = root.object("image");
    im.allow_keys({"channels", "height", "width", "range"});
    c.image_channels = positive_int(im, "channels", 4);
    if (c.image_channels != 3) at(im, "channels").fail("must be 3 (RGB)");
    c.image_height = positive_int(im, "height", 8192);
    c.image_width = positive_int(im, "width", 8192);
    if (im.has("range")) {
      std::vector<double> r = im.get_numbers("range");
      if (r.size() != 2 || !(r[0] < r[1])) at(im, "range").fail("must be [low, high] with low < high, e.g. [-1, 1]");
      c.image_min = r[0];
      c.image_max = r[1];
    }
  }
  c.scheduler = read_scheduler(root.object("scheduler"));
  if (auto d = root.optional_object("defaults")) {
    d->allow_keys({"steps", "guidance_scale", "negative_prompt"});
    c.default_steps = positive_int(*d, "steps", c.scheduler.num_train_timesteps, c.default_steps);
    c.default_guidance_scale = d->get_number("guidance_scale", c.default_guidance_scale);
    if (!(c.default_guidance_scale >= 0)) at(*d, "guidance_scale").fail("must be >= 0");
    c.default_negative_prompt = d->get_string("negative_prompt", "");
  }
  if (auto n = root.optional_object("noise")) {
    n->allow_keys({"generator", "doc"});
    n->get_choice("generator", {"splitmix64_box_muller"}, "splitmix64_box_muller");
    n->get_string("doc", "");
  }
  if (auto p = root.optional_object("prompts")) {
    p->allow_keys({"calibration", "evaluation"});
    if (p->has("calibration")) c.calibration_prompts = p->get_path("calibration");
    if (p->has("evaluation")) c.evaluation_prompts = p->get_path("evaluation");
  }
  return c;
}

}  // namespace qeval::eval
