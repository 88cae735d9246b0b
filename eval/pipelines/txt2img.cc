#include "eval/pipelines/txt2img.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "eval/exec/onnx_import.h"
#include "eval/exec/widen.h"
#include "eval/pipelines/noise.h"
#include "eval/pipelines/scheduler.h"
#include "kernels/error.h"
#include "kernels/numeric.h"

namespace qeval::eval {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

std::string key_of(const Txt2ImgConfig& c, const std::string& key) { return c.source.string() + ": " + key; }

void require_file(const fs::path& p, const std::string& where) {
  if (!fs::is_regular_file(p)) throw InputError(where + ": no such file: " + p.string());
}

std::string list_values(const std::vector<ValueInfo>& values) {
  std::string s;
  for (const auto& v : values) s += (s.empty() ? "" : ", ") + v.name + " (" + std::string(dtype_name(v.dtype)) + ")";
  return s.empty() ? "none" : s;
}

// Checks that the graph has exactly `inputs` (name -> allowed types) and the outputs `outputs`.
void check_io(const Graph& g, const Txt2ImgConfig& c, std::string_view section,
              const std::vector<std::pair<std::string, std::vector<DType>>>& inputs,
              const std::vector<std::string>& outputs) {
  const std::string where = g.source + " (" + c.source.filename().string() + " " + std::string(section) + ")";
  for (const auto& [name, types] : inputs) {
    const ValueInfo* v = find_value(g.inputs, name);
    if (!v)
      throw InputError(where + ": the model has no input '" + name + "' (its inputs: " + list_values(g.inputs) +
                       "); fix the name in " + c.source.string());
    if (std::find(types.begin(), types.end(), v->dtype) == types.end()) {
      std::string want;
      for (DType t : types) want += (want.empty() ? "" : " or ") + std::string(dtype_name(t));
      throw InputError(where + ": input '" + name + "' is " + std::string(dtype_name(v->dtype)) +
                       (c.input_types_from_graphs ? ", qeval feeds " : ", pipeline.json says ") + want);
    }
  }
  for (const auto& v : g.inputs)
    if (std::none_of(inputs.begin(), inputs.end(), [&](const auto& in) { return in.first == v.name; }))
      throw InputError(where + ": the model has an input '" + v.name + "' that the pipeline does not feed (" +
                       std::string(section) + " feeds: " +
                       [&] {
                         std::string s;
                         for (const auto& in : inputs) s += (s.empty() ? "" : ", ") + in.first;
                         return s;
                       }() +
                       ")");
  for (const std::string& output : outputs)
    if (!find_value(g.outputs, output))
      throw InputError(where + ": the model has no output '" + output + "' (its outputs: " + list_values(g.outputs) +
                       ")");
}

const std::vector<DType> kFloatTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
// The types qeval feeds token ids and timesteps in (pipeline.json's input_type and timestep_type).
const std::vector<DType> kIdTypes = {DType::kInt32, DType::kInt64};
const std::vector<DType> kTimestepTypes = {DType::kInt64, DType::kInt32, DType::kFloat32, DType::kFloat16};

DType input_type(const Graph& g, const std::string& name) { return find_value(g.inputs, name)->dtype; }

// The UNet's prediction: the output the config names, else a graph's only output whatever its name
// (the TensorRT demo's and ModelOpt's UNet exports call it "latent", optimum's "out_sample").
const std::string& unet_output_of(const Graph& g, const UnetConfig& c) {
  if (!find_value(g.outputs, c.output) && g.outputs.size() == 1) return g.outputs[0].name;
  return c.output;
}

// float32 values -> a tensor of the graph's declared float type.
Tensor to_graph_float(const Tensor& t, DType declared) {
  if (declared == DType::kFloat32) return t;
  Tensor out(declared, t.shape());
  auto* bits = reinterpret_cast<std::uint16_t*>(out.raw());
  const float* v = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    bits[i] = declared == DType::kFloat16 ? to_float16(v[i]).bits : to_bfloat16(v[i]).bits;
  return out;
}

// A model output in float32, whatever float type it was declared as.
Tensor output_as_float(Tensor t, const std::string& what) {
  if (t.dtype() == DType::kFloat32) return t;
  if (t.dtype() != DType::kFloat16 && t.dtype() != DType::kBFloat16)
    throw InputError(what + " is " + std::string(dtype_name(t.dtype())) + ", expected a float tensor");
  return widened_to_float32(t);
}

Tensor take_output(std::map<std::string, Tensor>& outputs, const Graph& g, const std::string& name) {
  auto it = outputs.find(name);
  if (it == outputs.end()) throw InputError(g.source + ": the run gave no output '" + name + "'");
  return output_as_float(std::move(it->second), g.source + ": output '" + name + "'");
}

Tensor timestep_tensor(double t, DType type, std::int64_t batch) {
  Tensor out(type, {batch});
  for (std::int64_t b = 0; b < batch; ++b) {
    switch (type) {
      // numpy's astype truncates, as diffusers' ONNX pipeline does with float timesteps.
      case DType::kInt64: out.data<std::int64_t>()[b] = static_cast<std::int64_t>(t); break;
      case DType::kInt32: out.data<std::int32_t>()[b] = static_cast<std::int32_t>(t); break;
      case DType::kFloat16:
        reinterpret_cast<std::uint16_t*>(out.raw())[b] = to_float16(static_cast<float>(t)).bits;
        break;
      default: out.data<float>()[b] = static_cast<float>(t); break;
    }
  }
  return out;
}

// Runs one model call, telling the observer (may be null) before and after.
std::map<std::string, Tensor> run_call(Session& session, const std::map<std::string, Tensor>& in,
                                       ModelCallObserver* observer, const ModelCall& call) {
  if (!observer) return session.run(in);
  auto out = session.run(in, observer->begin(call));
  observer->end(call, out);
  return out;
}

std::string shape_text(const std::vector<std::int64_t>& s) { return shape_to_string(s); }

}  // namespace

std::string_view txt2img_model_name(Txt2ImgModel m) {
  switch (m) {
    case Txt2ImgModel::kTextEncoder: return "text_encoder";
    case Txt2ImgModel::kUnet: return "unet";
    case Txt2ImgModel::kVaeDecoder: return "vae_decoder";
    case Txt2ImgModel::kTextEncoder2: return "text_encoder_2";
  }
  return "?";
}

std::shared_ptr<const Graph> Txt2ImgModels::*Txt2ImgModels::member(Txt2ImgModel m) {
  switch (m) {
    case Txt2ImgModel::kTextEncoder: return &Txt2ImgModels::text_encoder;
    case Txt2ImgModel::kTextEncoder2: return &Txt2ImgModels::text_encoder_2;
    case Txt2ImgModel::kUnet: return &Txt2ImgModels::unet;
    case Txt2ImgModel::kVaeDecoder: break;
  }
  return &Txt2ImgModels::vae_decoder;
}

const std::shared_ptr<const Graph>& Txt2ImgModels::graph(Txt2ImgModel m) const { return this->*member(m); }

Precision txt2img_model_precision(const Txt2ImgConfig& config, Txt2ImgModel model, Precision variant) {
  return model == Txt2ImgModel::kVaeDecoder && config.sdxl() && config.vae_decoder.force_upcast ? Precision::kFp32
                                                                                                : variant;
}

std::shared_ptr<const Graph> load_txt2img_graph(const Txt2ImgConfig& c, Txt2ImgModel model, const fs::path& file,
                                                bool* widened) {
  if (widened) *widened = false;
  const std::string section(txt2img_model_name(model));
  require_file(file, key_of(c, section + ".model"));
  auto g = std::make_shared<const Graph>(load_onnx(file));
  switch (model) {
    case Txt2ImgModel::kTextEncoder:
      check_io(*g, c, section,
               {{c.text_encoder.input, c.input_types_from_graphs ? kIdTypes : std::vector{c.text_encoder.input_type}}},
               {c.text_encoder.output});
      break;
    case Txt2ImgModel::kTextEncoder2:
      check_io(
          *g, c, section,
          {{c.text_encoder_2.input, c.input_types_from_graphs ? kIdTypes : std::vector{c.text_encoder_2.input_type}}},
          {c.text_encoder_2.output, c.text_encoder_2.pooled_output});
      break;
    case Txt2ImgModel::kUnet: {
      std::vector<std::pair<std::string, std::vector<DType>>> inputs = {
          {c.unet.sample, kFloatTypes},
          {c.unet.timestep, c.input_types_from_graphs ? kTimestepTypes : std::vector{c.unet.timestep_type}},
          {c.unet.encoder_hidden_states, kFloatTypes}};
      if (c.sdxl()) {
        inputs.push_back({c.unet.text_embeds, kFloatTypes});
        inputs.push_back({c.unet.time_ids, kFloatTypes});
      }
      check_io(*g, c, section, inputs, {unet_output_of(*g, c.unet)});
      break;
    }
    case Txt2ImgModel::kVaeDecoder:
      check_io(*g, c, section, {{c.vae_decoder.input, kFloatTypes}}, {c.vae_decoder.output});
      // diffusers' SDXL pipeline upcasts a VAE whose config says force_upcast (vae.to(float32)):
      // an FP16 export (optimum-cli --fp16) then computes in FP32 from its FP16 weights.
      if (c.sdxl() && c.vae_decoder.force_upcast && declares_narrow_floats(*g)) {
        g = std::make_shared<const Graph>(widened_to_float32(*g));
        if (widened) *widened = true;
      }
      break;
  }
  return g;
}

Txt2ImgModels Txt2ImgModels::load(const fs::path& dir_or_file, const std::string& variant,
                                  std::optional<SchedulerType> scheduler) {
  Txt2ImgModels m;
  m.config = read_txt2img_config(dir_or_file, scheduler);
  const Txt2ImgConfig& c = m.config;
  if (!variant.empty()) {
    const auto names = c.variant_names();
    if (std::find(names.begin(), names.end(), variant) == names.end()) {
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      throw InputError(c.source.string() + ": no model lists a variant '" + variant + "' (" +
                       (list.empty() ? std::string("no variants") : "variants: " + list) + ")");
    }
  }
  auto tokenizer = [&](const TokenizerConfig& t, const std::string& key) {
    require_file(t.vocab, key_of(c, key + ".vocab"));
    require_file(t.merges, key_of(c, key + ".merges"));
    ClipTokenizerOptions topt;
    topt.max_length = t.max_length;
    topt.pad_token = t.pad_token;
    return ClipTokenizer::from_files(t.vocab, t.merges, topt);
  };
  m.tokenizer = tokenizer(c.tokenizer, "tokenizer");
  if (c.sdxl()) {
    m.tokenizer_2 = tokenizer(c.tokenizer_2, "tokenizer_2");
    if (m.tokenizer_2.max_length() != m.tokenizer.max_length())
      throw InputError(c.source.string() + ": tokenizer_2's max_length " + std::to_string(m.tokenizer_2.max_length()) +
                       " differs from tokenizer's " + std::to_string(m.tokenizer.max_length()) +
                       " (SDXL concatenates both encoders' hidden states token by token)");
  }
  for (Txt2ImgModel model : c.models()) {
    const ModelFiles& f = c.files(model);
    auto it = f.variant_models.find(variant);
    m.*Txt2ImgModels::member(model) =
        load_txt2img_graph(c, model, it == f.variant_models.end() ? f.model : it->second,
                           model == Txt2ImgModel::kVaeDecoder ? &m.vae_decoder_widened : nullptr);
  }
  if (m.config.input_types_from_graphs) {
    // From here on (variants' graphs included) the types are the reference graphs' own.
    m.config.text_encoder.input_type = input_type(*m.text_encoder, c.text_encoder.input);
    if (c.sdxl()) m.config.text_encoder_2.input_type = input_type(*m.text_encoder_2, c.text_encoder_2.input);
    m.config.unet.timestep_type = input_type(*m.unet, c.unet.timestep);
    m.config.input_types_from_graphs = false;
  }
  return m;
}

std::shared_ptr<Session> Txt2ImgSessions::make(std::shared_ptr<const Graph> graph, const SessionOptions& options) {
  auto* s = new Session(*graph, options);
  return std::shared_ptr<Session>(s, [graph](Session* p) { delete p; });
}

Txt2ImgSessions Txt2ImgSessions::create(const Txt2ImgModels& models, const SessionOptions& options) {
  Txt2ImgSessions s;
  for (Txt2ImgModel m : models.models()) {
    SessionOptions o = options;
    o.precision = txt2img_model_precision(models.config, m, options.precision);
    s.*s.member(m) = make(models.graph(m), o);
  }
  return s;
}

std::shared_ptr<Session> Txt2ImgSessions::*Txt2ImgSessions::member(Txt2ImgModel m) {
  switch (m) {
    case Txt2ImgModel::kTextEncoder: return &Txt2ImgSessions::text_encoder;
    case Txt2ImgModel::kTextEncoder2: return &Txt2ImgSessions::text_encoder_2;
    case Txt2ImgModel::kUnet: return &Txt2ImgSessions::unet;
    case Txt2ImgModel::kVaeDecoder: break;
  }
  return &Txt2ImgSessions::vae_decoder;
}

Txt2ImgRequest default_request(const Txt2ImgConfig& config, std::string prompt, std::uint64_t seed) {
  Txt2ImgRequest r;
  r.prompt = std::move(prompt);
  r.negative_prompt = config.default_negative_prompt;
  r.seed = seed;
  r.steps = config.default_steps;
  r.guidance_scale = config.default_guidance_scale;
  r.scheduler = config.scheduler;
  return r;
}

namespace {

const TextEncoderConfig& encoder_config(const Txt2ImgConfig& c, Txt2ImgModel encoder) {
  return encoder == Txt2ImgModel::kTextEncoder2 ? c.text_encoder_2 : c.text_encoder;
}

std::map<std::string, Tensor> encoder_inputs_of(const Txt2ImgModels& models, const Graph& g,
                                                const std::vector<std::string>& texts,
                                                Txt2ImgModel encoder = Txt2ImgModel::kTextEncoder) {
  const TextEncoderConfig& c = encoder_config(models.config, encoder);
  const ClipTokenizer& tokenizer = encoder == Txt2ImgModel::kTextEncoder2 ? models.tokenizer_2 : models.tokenizer;
  const auto batch = static_cast<std::int64_t>(texts.size());
  const std::int64_t len = tokenizer.max_length();
  const DType id_type = input_type(g, c.input);
  Tensor ids(id_type, {batch, len});
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::vector<std::int64_t> e = tokenizer.encode(texts[std::size_t(b)]);
    for (std::int64_t k = 0; k < len; ++k) {
      if (id_type == DType::kInt64) ids.data<std::int64_t>()[b * len + k] = e[std::size_t(k)];
      else ids.data<std::int32_t>()[b * len + k] = static_cast<std::int32_t>(e[std::size_t(k)]);
    }
  }
  std::map<std::string, Tensor> in;
  in.emplace(c.input, std::move(ids));
  return in;
}

Tensor embeddings_of(const Txt2ImgModels& models, const Graph& g, std::map<std::string, Tensor>& out,
                     std::int64_t batch, Txt2ImgModel encoder = Txt2ImgModel::kTextEncoder) {
  const TextEncoderConfig& c = encoder_config(models.config, encoder);
  const std::int64_t len = models.tokenizer.max_length();
  Tensor h = take_output(out, g, c.output);
  if (h.rank() != 3 || h.dim(0) != batch || h.dim(1) != len)
    throw InputError(g.source + ": output '" + c.output + "' has shape " + shape_text(h.shape()) + ", expected [" +
                     std::to_string(batch) + ", " + std::to_string(len) + ", width]");
  return h;
}

// SDXL's text_encoder_2 pooled output: [batch, P].
Tensor pooled_of(const Txt2ImgModels& models, const Graph& g, std::map<std::string, Tensor>& out, std::int64_t batch) {
  const TextEncoderConfig& c = models.config.text_encoder_2;
  Tensor p = take_output(out, g, c.pooled_output);
  if (p.rank() != 2 || p.dim(0) != batch)
    throw InputError(g.source + ": output '" + c.pooled_output + "' has shape " + shape_text(p.shape()) +
                     ", expected [" + std::to_string(batch) + ", width]");
  return p;
}

// [B, L, D1] and [B, L, D2] -> [B, L, D1 + D2] (torch.concat(dim=-1)).
Tensor concat_last(const Tensor& a, const Tensor& b) {
  if (a.dim(0) != b.dim(0) || a.dim(1) != b.dim(1))
    throw InputError("the text encoders' hidden states " + shape_text(a.shape()) + " and " + shape_text(b.shape()) +
                     " differ in batch or tokens");
  const std::int64_t rows = a.dim(0) * a.dim(1), da = a.dim(2), db = b.dim(2);
  Tensor out(DType::kFloat32, {a.dim(0), a.dim(1), da + db});
  float* o = out.data<float>();
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(o + r * (da + db), a.data<float>() + r * da, std::size_t(da) * sizeof(float));
    std::memcpy(o + r * (da + db) + da, b.data<float>() + r * db, std::size_t(db) * sizeof(float));
  }
  return out;
}

// [B, ...] -> [B + 1, ...] with a leading block of zeros (the zeroed negative prompt).
Tensor with_zero_first(const Tensor& t) {
  Shape s = t.shape();
  s[0] += 1;
  Tensor out(DType::kFloat32, s);
  const std::int64_t row = t.numel() / t.dim(0);
  std::memset(out.raw(), 0, std::size_t(row) * sizeof(float));
  std::memcpy(out.data<float>() + row, t.data<float>(), std::size_t(t.numel()) * sizeof(float));
  return out;
}

}  // namespace

Tensor encode_texts(const Txt2ImgModels& models, Session& session, const std::vector<std::string>& texts,
                    ModelCallObserver* observer, std::string_view context) {
  if (models.config.sdxl())  // two encoders, concatenated: Txt2ImgRun::encode
    throw std::invalid_argument("encode_texts: an SDXL pipeline encodes through Txt2ImgRun::encode");
  const Graph& g = session.graph();
  auto out = run_call(session, encoder_inputs_of(models, g, texts), observer, Txt2ImgRun::text_encoder_call(context));
  return embeddings_of(models, g, out, std::int64_t(texts.size()));
}

namespace {

std::map<std::string, Tensor> decoder_inputs_of(const Txt2ImgConfig& c, const Graph& g, const Tensor& latent) {
  Tensor z(DType::kFloat32, latent.shape());
  const auto scale = static_cast<float>(c.vae_decoder.scaling_factor);
  const float* src = latent.data<float>();
  float* dst = z.data<float>();
  for (std::int64_t i = 0; i < z.numel(); ++i) dst[i] = src[i] / scale;
  std::map<std::string, Tensor> in;
  in.emplace(c.vae_decoder.input, to_graph_float(z, input_type(g, c.vae_decoder.input)));
  return in;
}

Tensor image_of(const Txt2ImgConfig& c, const Graph& g, std::map<std::string, Tensor>& out) {
  Tensor img = take_output(out, g, c.vae_decoder.output);
  const Shape want = {1, c.image_channels, c.image_height, c.image_width};
  if (img.shape() != want)
    throw InputError(g.source + ": output '" + c.vae_decoder.output + "' has shape " + shape_text(img.shape()) +
                     ", pipeline.json's \"image\" says " + shape_text(want) + " (" + c.source.string() + ")");
  // (x - lo) / (hi - lo) as x * s + o: for [-1, 1] that is x / 2 + 0.5 bit for bit.
  const auto s = static_cast<float>(1.0 / (c.image_max - c.image_min));
  const auto o = static_cast<float>(-c.image_min / (c.image_max - c.image_min));
  Tensor image = img.reshaped({c.image_channels, c.image_height, c.image_width});
  for (float& v : image.span<float>()) v = std::clamp(v * s + o, 0.0f, 1.0f);
  return image;
}

}  // namespace

Tensor decode_latent(const Txt2ImgModels& models, Session& session, const Tensor& latent, ModelCallObserver* observer,
                     std::string_view context) {
  const Graph& g = session.graph();
  auto out = run_call(session, decoder_inputs_of(models.config, g, latent), observer, Txt2ImgRun::vae_call(context));
  return image_of(models.config, g, out);
}

datasets::Rgb8 image_to_rgb8(const Tensor& image01) {
  if (image01.rank() != 3 || image01.dim(0) != 3)
    throw std::invalid_argument("image_to_rgb8: expected [3, H, W], got " + shape_to_string(image01.shape()));
  const int h = static_cast<int>(image01.dim(1)), w = static_cast<int>(image01.dim(2));
  datasets::Rgb8 out{w, h, 3, std::vector<std::uint8_t>(std::size_t(w) * h * 3)};
  const float* p = image01.data<float>();
  const std::size_t plane = std::size_t(w) * h;
  // NaN pixels (a diverged variant; its report counts them) are black instead of an undefined cast.
  for (std::size_t i = 0; i < plane; ++i)
    for (std::size_t ch = 0; ch < 3; ++ch) {
      const float x = p[ch * plane + i];
      out.pixels[i * 3 + ch] =
          static_cast<std::uint8_t>(std::nearbyint((x == x ? std::clamp(x, 0.0f, 1.0f) : 0.0f) * 255.0f));
    }
  return out;
}

namespace {

// Validates a request before the scheduler is built from it.
const Txt2ImgRequest& checked(const Txt2ImgRequest& req) {
  if (req.prompt.find_first_not_of(" \t\r\n") == std::string::npos)
    throw InputError("the prompt is empty (a text-to-image pipeline needs a prompt)");
  if (!std::isfinite(req.guidance_scale) || req.guidance_scale < 0)
    throw InputError("guidance scale " + std::to_string(req.guidance_scale) + " must be a finite number >= 0");
  return req;
}

}  // namespace

Txt2ImgRun::Txt2ImgRun(const Txt2ImgModels& models, Txt2ImgRequest request)
    : models_(models), request_(std::move(request)), scheduler_(checked(request_).scheduler, request_.steps) {
  const Shape latent_shape = models_.config.latent_shape();
  if (request_.initial_noise) {
    const Tensor& n = *request_.initial_noise;
    if (n.dtype() != DType::kFloat32 || n.shape() != latent_shape)
      throw InputError("initial noise must be float32 " + shape_to_string(latent_shape) +
                       " (pipeline.json \"latent\"), got " + std::string(dtype_name(n.dtype())) + " " +
                       shape_to_string(n.shape()));
    latent_ = n;
  } else {
    latent_ = seeded_noise(request_.seed, latent_shape);
  }
  if (scheduler_.init_noise_sigma() != 1.0) {
    const auto sigma = static_cast<float>(scheduler_.init_noise_sigma());
    for (float& v : latent_.span<float>()) v = v * sigma;
  }
}

bool Txt2ImgRun::zero_negative() const {
  const Txt2ImgConfig& c = models_.config;
  // diffusers zeroes a negative prompt that is None; qeval's empty negative prompt is that.
  return c.sdxl() && c.sdxl_conditioning.force_zeros_for_empty_prompt && guided() && request_.negative_prompt.empty();
}

std::vector<std::string> Txt2ImgRun::texts() const {
  if (guided() && !zero_negative()) return {request_.negative_prompt, request_.prompt};
  return {request_.prompt};
}

void Txt2ImgRun::encode(Session& text_encoder, ModelCallObserver* observer, std::string_view context,
                        Session* text_encoder_2) {
  encode_one(text_encoder, Txt2ImgModel::kTextEncoder, observer, context);
  if (!models_.config.sdxl()) return;
  if (!text_encoder_2) throw std::invalid_argument("Txt2ImgRun::encode: an SDXL pipeline needs text_encoder_2");
  encode_one(*text_encoder_2, Txt2ImgModel::kTextEncoder2, observer, context);
}

void Txt2ImgRun::encode_one(Session& session, Txt2ImgModel encoder, ModelCallObserver* observer,
                            std::string_view context) {
  auto out = run_call(session, encoder_inputs(session.graph(), encoder), observer, text_encoder_call(context, encoder));
  set_text_embeddings(session.graph(), out, encoder);
}

std::map<std::string, Tensor> Txt2ImgRun::encoder_inputs(const Graph& text_encoder, Txt2ImgModel encoder) const {
  return encoder_inputs_of(models_, text_encoder, texts(), encoder);
}

void Txt2ImgRun::set_text_embeddings(const Graph& text_encoder, std::map<std::string, Tensor>& outputs,
                                     Txt2ImgModel encoder) {
  const auto batch = std::int64_t(texts().size());
  if (!models_.config.sdxl()) {
    text_embeddings_ = embeddings_of(models_, text_encoder, outputs, batch, encoder);
    return;
  }
  // SDXL: prompt embeddings = both encoders' hidden states concatenated, pooled = text_encoder_2's
  // text_embeds; a zeroed negative prompt adds zeros before the prompt's (diffusers' encode_prompt).
  const int k = encoder == Txt2ImgModel::kTextEncoder2 ? 1 : 0;
  hidden_[k] = embeddings_of(models_, text_encoder, outputs, batch, encoder);
  if (k == 1) pooled_in_ = pooled_of(models_, text_encoder, outputs, batch);
  if (hidden_[0].numel() == 0 || hidden_[1].numel() == 0) return;
  text_embeddings_ = concat_last(hidden_[0], hidden_[1]);
  pooled_ = std::move(pooled_in_);
  if (zero_negative()) {
    text_embeddings_ = with_zero_first(text_embeddings_);
    pooled_ = with_zero_first(pooled_);
  }
  hidden_[0] = hidden_[1] = pooled_in_ = Tensor();
}

void Txt2ImgRun::set_text_embeddings(Tensor embeddings, Tensor pooled) {
  const std::int64_t batch = guided() ? 2 : 1;
  if (embeddings.rank() != 3 || embeddings.dim(0) != batch)
    throw std::invalid_argument("Txt2ImgRun::set_text_embeddings: expected [" + std::to_string(batch) +
                                ", L, D], got " + shape_to_string(embeddings.shape()));
  if (models_.config.sdxl() && (pooled.rank() != 2 || pooled.dim(0) != batch))
    throw std::invalid_argument("Txt2ImgRun::set_text_embeddings: SDXL needs pooled embeddings [" +
                                std::to_string(batch) + ", P], got " + shape_to_string(pooled.shape()));
  text_embeddings_ = std::move(embeddings);
  pooled_ = std::move(pooled);
}

Tensor Txt2ImgRun::time_ids() const {
  const std::int64_t batch = guided() ? 2 : 1;
  const std::vector<float> ids = models_.config.time_ids();
  Tensor t(DType::kFloat32, {batch, std::int64_t(ids.size())});
  for (std::int64_t b = 0; b < batch; ++b)
    std::copy(ids.begin(), ids.end(), t.data<float>() + b * std::int64_t(ids.size()));
  return t;
}

std::map<std::string, Tensor> Txt2ImgRun::unet_inputs(const Graph& ug, const Tensor& latent, int step) const {
  const Txt2ImgConfig& c = models_.config;
  if (text_embeddings_.numel() == 0) throw std::logic_error("Txt2ImgRun::predict before encode");
  if (step < 0 || step >= steps()) throw std::out_of_range("Txt2ImgRun::predict: step " + std::to_string(step));
  const Shape latent_shape = c.latent_shape();
  if (latent.shape() != latent_shape || latent.dtype() != DType::kFloat32)
    throw std::invalid_argument("Txt2ImgRun::predict: the latent must be float32 " + shape_to_string(latent_shape));
  const std::int64_t batch = guided() ? 2 : 1;
  const auto n = static_cast<std::size_t>(latent.numel());
  const double t = scheduler_.timesteps()[std::size_t(step)];
  Tensor model_in(DType::kFloat32, {batch, latent_shape[1], latent_shape[2], latent_shape[3]});
  float* mi = model_in.data<float>();
  scheduler_.scale_model_input(step, latent.span<float>(), {mi, n});
  if (guided()) std::memcpy(mi + n, mi, n * sizeof(float));
  std::map<std::string, Tensor> in;
  in.emplace(c.unet.encoder_hidden_states,
             to_graph_float(text_embeddings_, input_type(ug, c.unet.encoder_hidden_states)));
  in.emplace(c.unet.sample, to_graph_float(model_in, input_type(ug, c.unet.sample)));
  // A graph that declares a 0-d timestep (optimum's current exports) gets a scalar.
  const ValueInfo* ti = find_value(ug.inputs, c.unet.timestep);
  const bool scalar = ti && ti->has_shape && ti->dims.empty();
  in.emplace(c.unet.timestep, scalar ? timestep_tensor(t, c.unet.timestep_type, 1).reshaped({})
                                     : timestep_tensor(t, c.unet.timestep_type, batch));
  if (c.sdxl()) {
    in.emplace(c.unet.text_embeds, to_graph_float(pooled_, input_type(ug, c.unet.text_embeds)));
    in.emplace(c.unet.time_ids, to_graph_float(time_ids(), input_type(ug, c.unet.time_ids)));
  }
  return in;
}

Txt2ImgRun::Prediction Txt2ImgRun::prediction(const Graph& ug, std::map<std::string, Tensor>& out) const {
  const Shape latent_shape = models_.config.latent_shape();
  const Shape sample_shape = {guided() ? 2 : 1, latent_shape[1], latent_shape[2], latent_shape[3]};
  Prediction p;
  const std::string& output = unet_output_of(ug, models_.config.unet);
  p.unet_output = take_output(out, ug, output);
  if (p.unet_output.shape() != sample_shape)
    throw InputError(ug.source + ": output '" + output + "' has shape " + shape_text(p.unet_output.shape()) +
                     ", expected the sample's " + shape_text(sample_shape));
  p.noise_pred = Tensor(DType::kFloat32, latent_shape);
  const auto n = static_cast<std::size_t>(p.noise_pred.numel());
  const float* e = p.unet_output.data<float>();
  float* np = p.noise_pred.data<float>();
  if (guided()) {
    const auto g = static_cast<float>(request_.guidance_scale);
    for (std::size_t k = 0; k < n; ++k) np[k] = e[k] + g * (e[n + k] - e[k]);
  } else {
    std::memcpy(np, e, n * sizeof(float));
  }
  return p;
}

Txt2ImgRun::Prediction Txt2ImgRun::predict(Session& unet, const Tensor& latent, int step, ModelCallObserver* observer,
                                           std::string_view context) const {
  auto in = unet_inputs(unet.graph(), latent, step);
  auto out = run_call(unet, in, observer, unet_call(step, context));
  return prediction(unet.graph(), out);
}

Tensor Txt2ImgRun::scheduler_step(int step, const Tensor& latent, const Tensor& noise_pred) const {
  Tensor next(DType::kFloat32, latent.shape());
  scheduler_.step(step, noise_pred.span<float>(), latent.span<float>(), next.span<float>());
  return next;
}

Txt2ImgRun::Prediction Txt2ImgRun::step(Session& unet, const Txt2ImgHooks& hooks) {
  if (next_step_ >= steps()) throw std::logic_error("Txt2ImgRun::step: every step has run");
  Prediction p = predict(unet, latent_, next_step_, hooks.observer, hooks.context);
  advance(p, hooks);
  return p;
}

void Txt2ImgRun::advance(const Prediction& p, const Txt2ImgHooks& hooks) {
  if (next_step_ >= steps()) throw std::logic_error("Txt2ImgRun::advance: every step has run");
  const int i = next_step_;
  Tensor next = scheduler_step(i, latent_, p.noise_pred);
  if (hooks.on_step) {
    Txt2ImgStep ev{i, steps(), scheduler_.timesteps()[std::size_t(i)], latent_, p.unet_output, p.noise_pred, next};
    hooks.on_step(ev);
    if (next.shape() != latent_.shape() || next.dtype() != DType::kFloat32)
      throw std::invalid_argument("generate: the step hook changed the latent's shape or type");
  }
  latent_ = std::move(next);
  ++next_step_;
}

Tensor Txt2ImgRun::decode(Session& vae_decoder, ModelCallObserver* observer, std::string_view context) const {
  return decode_latent(models_, vae_decoder, latent_, observer, context);
}

std::map<std::string, Tensor> Txt2ImgRun::decoder_inputs(const Graph& vae_decoder) const {
  return decoder_inputs_of(models_.config, vae_decoder, latent_);
}

Tensor Txt2ImgRun::image(const Graph& vae_decoder, std::map<std::string, Tensor>& outputs) const {
  return image_of(models_.config, vae_decoder, outputs);
}

Txt2ImgResult generate(const Txt2ImgModels& models, const Txt2ImgSessions& sessions, const Txt2ImgRequest& req,
                       const Txt2ImgHooks& hooks) {
  if (!sessions.text_encoder || !sessions.unet || !sessions.vae_decoder ||
      (models.config.sdxl() && !sessions.text_encoder_2))
    throw std::invalid_argument("generate: every model needs a session");
  Txt2ImgRun run(models, req);
  Txt2ImgResult r;
  r.timesteps = run.scheduler().timesteps();
  auto t0 = Clock::now();
  run.encode(*sessions.text_encoder, hooks.observer, hooks.context, sessions.text_encoder_2.get());
  r.text_encoder_ms = ms_since(t0);
  t0 = Clock::now();
  while (run.next_step() < run.steps()) run.step(*sessions.unet, hooks);
  r.unet_ms = ms_since(t0);
  t0 = Clock::now();
  r.image = run.decode(*sessions.vae_decoder, hooks.observer, hooks.context);
  r.vae_decoder_ms = ms_since(t0);
  r.text_embeddings = run.text_embeddings();
  r.pooled_embeddings = run.pooled_embeddings();
  r.final_latent = run.latent();
  return r;
}

}  // namespace qeval::eval
