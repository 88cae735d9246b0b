#include "eval/pipelines/txt2img.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "eval/exec/onnx_import.h"
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

const ValueInfo* find_value(const std::vector<ValueInfo>& values, const std::string& name) {
  for (const auto& v : values)
    if (v.name == name) return &v;
  return nullptr;
}

// Checks that the graph has exactly `inputs` (name -> allowed types) and the output `output`.
void check_io(const Graph& g, const Txt2ImgConfig& c, std::string_view section,
              const std::vector<std::pair<std::string, std::vector<DType>>>& inputs, const std::string& output) {
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
  if (!find_value(g.outputs, output))
    throw InputError(where + ": the model has no output '" + output + "' (its outputs: " + list_values(g.outputs) +
                     ")");
}

const std::vector<DType> kFloatTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
// The types qeval feeds token ids and timesteps in (pipeline.json's input_type and timestep_type).
const std::vector<DType> kIdTypes = {DType::kInt32, DType::kInt64};
const std::vector<DType> kTimestepTypes = {DType::kInt64, DType::kInt32, DType::kFloat32, DType::kFloat16};

DType input_type(const Graph& g, const std::string& name) { return find_value(g.inputs, name)->dtype; }

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
  }
  return "?";
}

const std::shared_ptr<const Graph>& Txt2ImgModels::graph(Txt2ImgModel m) const {
  return m == Txt2ImgModel::kTextEncoder ? text_encoder : m == Txt2ImgModel::kUnet ? unet : vae_decoder;
}

std::shared_ptr<const Graph> load_txt2img_graph(const Txt2ImgConfig& c, Txt2ImgModel model, const fs::path& file) {
  const std::string section(txt2img_model_name(model));
  require_file(file, key_of(c, section + ".model"));
  auto g = std::make_shared<const Graph>(load_onnx(file));
  switch (model) {
    case Txt2ImgModel::kTextEncoder:
      check_io(*g, c, section,
               {{c.text_encoder.input, c.input_types_from_graphs ? kIdTypes : std::vector{c.text_encoder.input_type}}},
               c.text_encoder.output);
      break;
    case Txt2ImgModel::kUnet:
      check_io(*g, c, section,
               {{c.unet.sample, kFloatTypes},
                {c.unet.timestep, c.input_types_from_graphs ? kTimestepTypes : std::vector{c.unet.timestep_type}},
                {c.unet.encoder_hidden_states, kFloatTypes}},
               c.unet.output);
      break;
    case Txt2ImgModel::kVaeDecoder:
      check_io(*g, c, section, {{c.vae_decoder.input, kFloatTypes}}, c.vae_decoder.output);
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
  require_file(c.tokenizer.vocab, key_of(c, "tokenizer.vocab"));
  require_file(c.tokenizer.merges, key_of(c, "tokenizer.merges"));
  ClipTokenizerOptions topt;
  topt.max_length = c.tokenizer.max_length;
  topt.pad_token = c.tokenizer.pad_token;
  m.tokenizer = ClipTokenizer::from_files(c.tokenizer.vocab, c.tokenizer.merges, topt);
  auto file = [&](const ModelFiles& f) {
    auto it = f.variant_models.find(variant);
    return it == f.variant_models.end() ? f.model : it->second;
  };
  m.text_encoder = load_txt2img_graph(c, Txt2ImgModel::kTextEncoder, file(c.text_encoder));
  m.unet = load_txt2img_graph(c, Txt2ImgModel::kUnet, file(c.unet));
  m.vae_decoder = load_txt2img_graph(c, Txt2ImgModel::kVaeDecoder, file(c.vae_decoder));
  if (m.config.input_types_from_graphs) {
    // From here on (variants' graphs included) the types are the reference graphs' own.
    m.config.text_encoder.input_type = input_type(*m.text_encoder, c.text_encoder.input);
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
  return {make(models.text_encoder, options), make(models.unet, options), make(models.vae_decoder, options)};
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

std::map<std::string, Tensor> encoder_inputs_of(const Txt2ImgModels& models, const Graph& g,
                                                const std::vector<std::string>& texts) {
  const Txt2ImgConfig& c = models.config;
  const auto batch = static_cast<std::int64_t>(texts.size());
  const std::int64_t len = models.tokenizer.max_length();
  const DType id_type = input_type(g, c.text_encoder.input);
  Tensor ids(id_type, {batch, len});
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::vector<std::int64_t> e = models.tokenizer.encode(texts[std::size_t(b)]);
    for (std::int64_t k = 0; k < len; ++k) {
      if (id_type == DType::kInt64) ids.data<std::int64_t>()[b * len + k] = e[std::size_t(k)];
      else ids.data<std::int32_t>()[b * len + k] = static_cast<std::int32_t>(e[std::size_t(k)]);
    }
  }
  std::map<std::string, Tensor> in;
  in.emplace(c.text_encoder.input, std::move(ids));
  return in;
}

Tensor embeddings_of(const Txt2ImgModels& models, const Graph& g, std::map<std::string, Tensor>& out,
                     std::int64_t batch) {
  const Txt2ImgConfig& c = models.config;
  const std::int64_t len = models.tokenizer.max_length();
  Tensor h = take_output(out, g, c.text_encoder.output);
  if (h.rank() != 3 || h.dim(0) != batch || h.dim(1) != len)
    throw InputError(g.source + ": output '" + c.text_encoder.output + "' has shape " + shape_text(h.shape()) +
                     ", expected [" + std::to_string(batch) + ", " + std::to_string(len) + ", width]");
  return h;
}

}  // namespace

Tensor encode_texts(const Txt2ImgModels& models, Session& session, const std::vector<std::string>& texts,
                    ModelCallObserver* observer, std::string_view context) {
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

std::vector<std::string> Txt2ImgRun::texts() const {
  if (guided()) return {request_.negative_prompt, request_.prompt};
  return {request_.prompt};
}

void Txt2ImgRun::encode(Session& text_encoder, ModelCallObserver* observer, std::string_view context) {
  text_embeddings_ = encode_texts(models_, text_encoder, texts(), observer, context);
}

std::map<std::string, Tensor> Txt2ImgRun::encoder_inputs(const Graph& text_encoder) const {
  return encoder_inputs_of(models_, text_encoder, texts());
}

void Txt2ImgRun::set_text_embeddings(const Graph& text_encoder, std::map<std::string, Tensor>& outputs) {
  text_embeddings_ = embeddings_of(models_, text_encoder, outputs, std::int64_t(texts().size()));
}

void Txt2ImgRun::set_text_embeddings(Tensor embeddings) {
  if (embeddings.rank() != 3 || embeddings.dim(0) != std::int64_t(texts().size()))
    throw std::invalid_argument("Txt2ImgRun::set_text_embeddings: expected [" + std::to_string(texts().size()) +
                                ", L, D], got " + shape_to_string(embeddings.shape()));
  text_embeddings_ = std::move(embeddings);
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
  in.emplace(c.unet.timestep, timestep_tensor(t, c.unet.timestep_type, batch));
  return in;
}

Txt2ImgRun::Prediction Txt2ImgRun::prediction(const Graph& ug, std::map<std::string, Tensor>& out) const {
  const Shape latent_shape = models_.config.latent_shape();
  const Shape sample_shape = {guided() ? 2 : 1, latent_shape[1], latent_shape[2], latent_shape[3]};
  Prediction p;
  p.unet_output = take_output(out, ug, models_.config.unet.output);
  if (p.unet_output.shape() != sample_shape)
    throw InputError(ug.source + ": output '" + models_.config.unet.output + "' has shape " +
                     shape_text(p.unet_output.shape()) + ", expected the sample's " + shape_text(sample_shape));
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
  if (!sessions.text_encoder || !sessions.unet || !sessions.vae_decoder)
    throw std::invalid_argument("generate: every model needs a session");
  Txt2ImgRun run(models, req);
  Txt2ImgResult r;
  r.timesteps = run.scheduler().timesteps();
  auto t0 = Clock::now();
  run.encode(*sessions.text_encoder, hooks.observer, hooks.context);
  r.text_encoder_ms = ms_since(t0);
  t0 = Clock::now();
  while (run.next_step() < run.steps()) run.step(*sessions.unet, hooks);
  r.unet_ms = ms_since(t0);
  t0 = Clock::now();
  r.image = run.decode(*sessions.vae_decoder, hooks.observer, hooks.context);
  r.vae_decoder_ms = ms_since(t0);
  r.text_embeddings = run.text_embeddings();
  r.final_latent = run.latent();
  return r;
}

}  // namespace qeval::eval
