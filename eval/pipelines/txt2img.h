// Text-to-image diffusion (tiny-sd, a user's SD 1.5 export; SDXL with its second text encoder and
// added conditioning): tokenize -> text encoder(s) -> UNet loop with classifier-free guidance ->
// VAE decoder -> image. Built for the evaluator: the caller owns
// and may swap the models' sessions per variant, sees and may replace the latent after each step
// (teacher forcing), and attaches observers per model call. docs/pipelines.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "datasets/image_io.h"
#include "eval/exec/graph.h"
#include "eval/exec/session.h"
#include "eval/pipelines/model_call.h"
#include "eval/pipelines/pipeline_config.h"
#include "eval/pipelines/scheduler.h"
#include "eval/pipelines/tokenizer.h"

namespace qeval::eval {

// Txt2ImgModel: eval/pipelines/pipeline_config.h.
// "text_encoder", "unet", "vae_decoder", "text_encoder_2"
std::string_view txt2img_model_name(Txt2ImgModel m);

// The immutable parts: config, tokenizers and the graphs (text_encoder_2 and tokenizer_2: SDXL
// only; null / unused otherwise). Shared by every thread and variant.
struct Txt2ImgModels {
  Txt2ImgConfig config;
  ClipTokenizer tokenizer, tokenizer_2;
  std::shared_ptr<const Graph> text_encoder, unet, vae_decoder, text_encoder_2;
  // An SDXL VAE export with float16/bfloat16 values under force_upcast: vae_decoder is that graph
  // widened to float32 (as diffusers upcasts the VAE; load_txt2img_graph).
  bool vae_decoder_widened = false;

  // The models of this pipeline in call order (Txt2ImgConfig::models).
  std::vector<Txt2ImgModel> models() const { return config.models(); }

  const std::shared_ptr<const Graph>& graph(Txt2ImgModel m) const;
  static std::shared_ptr<const Graph> Txt2ImgModels::*member(Txt2ImgModel m);

  // Reads pipeline.json (folder or file), the tokenizer and the models; `variant` picks, for each
  // model that lists it under "variants", that export instead of "model" ("" = the main models).
  // InputError: bad pipeline.json, a missing file (named with the key that points at it), or a
  // graph whose inputs/outputs disagree with pipeline.json (model, input, expected and found).
  // A folder as optimum-cli exports it is read too (eval/pipelines/diffusers_folder.h); `scheduler`
  // replaces its scheduler class.
  static Txt2ImgModels load(const std::filesystem::path& dir_or_file, const std::string& variant = "",
                            std::optional<SchedulerType> scheduler = std::nullopt);
};

// Loads one model file (e.g. a variant's Q/DQ UNet) and checks its inputs and outputs against the
// config's names and types. An SDXL VAE decoder under force_upcast that declares float16/bfloat16
// values comes back widened to float32 (eval/exec/widen.h), `*widened` set.
std::shared_ptr<const Graph> load_txt2img_graph(const Txt2ImgConfig& config, Txt2ImgModel model,
                                                const std::filesystem::path& file, bool* widened = nullptr);

// One session per model. Session is not thread-safe: one Txt2ImgSessions per thread. Any pointer may
// be replaced between runs (e.g. only the UNet differs between two variants); each keeps its graph
// alive.
struct Txt2ImgSessions {
  std::shared_ptr<Session> text_encoder, unet, vae_decoder, text_encoder_2;  // text_encoder_2: SDXL only

  static std::shared_ptr<Session> make(std::shared_ptr<const Graph> graph, const SessionOptions& options = {});
  // Every model under `options`, except an SDXL VAE decoder whose config says force_upcast: FP32
  // (txt2img_model_precision).
  static Txt2ImgSessions create(const Txt2ImgModels& models, const SessionOptions& options = {});
  static std::shared_ptr<Session> Txt2ImgSessions::*member(Txt2ImgModel m);
};

// The precision a model of this pipeline runs in when its variant's precision is `variant`: FP32
// for the VAE decoder of a force_upcast config (as diffusers' SDXL pipeline upcasts the VAE),
// `variant` otherwise. A caller with an explicit per-model precision uses that instead.
Precision txt2img_model_precision(const Txt2ImgConfig& config, Txt2ImgModel model, Precision variant);

struct Txt2ImgRequest {
  std::string prompt;
  std::string negative_prompt;  // the unconditional text of classifier-free guidance
  std::uint64_t seed = 0;       // initial noise: seeded_noise(seed, latent shape) (noise.h)
  int steps = 20;
  // eps = eps_uncond + g (eps_cond - eps_uncond), uncond and cond batched as [2, ...] in one UNet
  // call; g <= 1 runs the conditional branch alone (batch 1), as diffusers does.
  double guidance_scale = 5.0;
  SchedulerConfig scheduler;
  // Unit-variance noise [1, C, h, w] used instead of the seed's (scaled by init_noise_sigma).
  std::optional<Tensor> initial_noise;
};
// prompt and seed with the pipeline's defaults: steps, guidance, negative prompt, scheduler.
Txt2ImgRequest default_request(const Txt2ImgConfig& config, std::string prompt, std::uint64_t seed);

// What the step hook sees after each scheduler step. Tensors are float32 [1, C, h, w] except
// unet_output ([2, C, h, w]: uncond then cond; [1, ...] without guidance).
struct Txt2ImgStep {
  int index = 0;        // 0-based step
  int count = 0;        // steps in the run
  double timestep = 0;  // the UNet's timestep
  const Tensor& latent_before;
  const Tensor& unet_output;
  const Tensor& noise_pred;  // guided
  Tensor& latent_after;      // the scheduler's result; the hook may overwrite it (same shape)
};

struct Txt2ImgHooks {
  std::function<void(Txt2ImgStep&)> on_step;
  // Told about every model call (eval/pipelines/model_call.h): model "text_encoder", "unet" (call
  // and step = the step index) or "vae_decoder"; the observer it returns sees that call's nodes.
  ModelCallObserver* observer = nullptr;
  std::string_view context;  // passed on in ModelCall::context (e.g. the prompt's id)
};

struct Txt2ImgResult {
  Tensor image;              // float32 [3, H, W] on [0, 1] (the decoder's range mapped and clamped)
  Tensor final_latent;       // float32 [1, C, h, w], before the 1 / scaling_factor of the decoder
  Tensor text_embeddings;    // float32 [2, L, D]: negative prompt then prompt ([1, L, D] without guidance)
  Tensor pooled_embeddings;  // SDXL: float32 [2, P] (negative, prompt) or [1, P]; empty otherwise
  std::vector<double> timesteps;
  double text_encoder_ms = 0, unet_ms = 0, vae_decoder_ms = 0;
};

// One generation advanced step by step: what generate() runs, exposed for callers that run several
// variants in lockstep (the evaluator runs the reference's step t, then each variant's step t).
// Holds the request, the scheduler, the text embeddings and the current latent; the sessions are
// passed to each call, so a run is not tied to one variant's sessions.
class Txt2ImgRun {
 public:
  // Validates the request (InputError as generate()) and draws the initial latent.
  Txt2ImgRun(const Txt2ImgModels& models, Txt2ImgRequest request);

  const Txt2ImgRequest& request() const { return request_; }
  const Scheduler& scheduler() const { return scheduler_; }
  bool guided() const { return request_.guidance_scale > 1.0; }
  int steps() const { return scheduler_.steps(); }
  int next_step() const { return next_step_; }  // steps() when the loop is done

  // The texts the encoders run on, one batch: negative prompt then prompt (prompt alone without
  // guidance, or for SDXL when the negative's embeddings are zeros: zero_negative()).
  std::vector<std::string> texts() const;
  // SDXL with force_zeros_for_empty_prompt and an empty negative prompt: the negative prompt and
  // pooled embeddings are zeros, and the encoders run on the prompt alone (as diffusers does).
  bool zero_negative() const;
  // Runs the text encoder(s) (model calls "text_encoder", then "text_encoder_2" for SDXL).
  void encode(Session& text_encoder, ModelCallObserver* observer = nullptr, std::string_view context = {},
              Session* text_encoder_2 = nullptr);
  // One encoder of encode(): its call (text_encoder_call(context, encoder)) and its embeddings.
  void encode_one(Session& session, Txt2ImgModel encoder, ModelCallObserver* observer = nullptr,
                  std::string_view context = {});
  // encode() in two parts per encoder, as unet_inputs()/prediction() below: an encoder's inputs
  // (model call text_encoder_call()), then the embeddings from its outputs. The embeddings exist
  // once every encoder of the pipeline has given its outputs.
  std::map<std::string, Tensor> encoder_inputs(const Graph& text_encoder,
                                               Txt2ImgModel encoder = Txt2ImgModel::kTextEncoder) const;
  static ModelCall text_encoder_call(std::string_view context, Txt2ImgModel encoder = Txt2ImgModel::kTextEncoder) {
    return ModelCall{txt2img_model_name(encoder), context, 0, -1};
  }
  void set_text_embeddings(const Graph& text_encoder, std::map<std::string, Tensor>& outputs,
                           Txt2ImgModel encoder = Txt2ImgModel::kTextEncoder);
  // Uses another run's embeddings (same texts; e.g. a variant whose text encoders are the
  // reference's); `pooled` for SDXL.
  void set_text_embeddings(Tensor embeddings, Tensor pooled = {});
  const Tensor& text_embeddings() const { return text_embeddings_; }
  const Tensor& pooled_embeddings() const { return pooled_; }  // SDXL: [B, P]; empty otherwise
  // SDXL: float32 [B, 6], the same add_time_ids for the negative and the prompt.
  Tensor time_ids() const;
  const Tensor& latent() const { return latent_; }  // before next_step()

  struct Prediction {
    Tensor unet_output;  // [2, C, h, w] (uncond, cond) or [1, ...] without guidance
    Tensor noise_pred;   // guided, [1, C, h, w]
  };
  // The UNet at step `step` on `latent` (this run's or another's: teacher forcing), without
  // advancing; model call "unet" with call = step = `step`.
  Prediction predict(Session& unet, const Tensor& latent, int step, ModelCallObserver* observer = nullptr,
                     std::string_view context = {}) const;
  // predict() in two parts, for a caller that runs the UNet itself (the evaluator runs the calls of
  // its variants together): the call's inputs (model call unet_call(step)), then the prediction
  // from its outputs.
  std::map<std::string, Tensor> unet_inputs(const Graph& unet, const Tensor& latent, int step) const;
  static ModelCall unet_call(int step, std::string_view context) { return ModelCall{"unet", context, step, step}; }
  Prediction prediction(const Graph& unet, std::map<std::string, Tensor>& outputs) const;
  // The rest of step(), given the prediction at next_step() on the current latent: scheduler step,
  // hooks.on_step (which may replace the latent), advance.
  void advance(const Prediction& p, const Txt2ImgHooks& hooks = {});
  // The scheduler's next latent from `latent` and a prediction at `step`.
  Tensor scheduler_step(int step, const Tensor& latent, const Tensor& noise_pred) const;
  // Runs step next_step(): predict on the current latent, scheduler step, hooks.on_step (which may
  // replace the latent), advance. Returns the prediction.
  Prediction step(Session& unet, const Txt2ImgHooks& hooks = {});
  // Decodes the current latent (model call "vae_decoder").
  Tensor decode(Session& vae_decoder, ModelCallObserver* observer = nullptr, std::string_view context = {}) const;
  // decode() in two parts, as unet_inputs()/prediction(): the decoder's inputs for the current
  // latent (model call vae_call()), then the image [3, H, W] on [0, 1] from its outputs.
  std::map<std::string, Tensor> decoder_inputs(const Graph& vae_decoder) const;
  static ModelCall vae_call(std::string_view context) { return ModelCall{"vae_decoder", context, 0, -1}; }
  Tensor image(const Graph& vae_decoder, std::map<std::string, Tensor>& outputs) const;

 private:
  const Txt2ImgModels& models_;
  Txt2ImgRequest request_;
  Scheduler scheduler_;
  Tensor text_embeddings_, latent_;
  Tensor pooled_;                 // SDXL
  Tensor hidden_[2], pooled_in_;  // SDXL: each encoder's outputs until both are in
  int next_step_ = 0;
};

// Runs the pipeline. Deterministic: the same request gives bit-identical results across runs and
// thread counts (given sessions whose kernels are). InputError on an empty prompt, bad steps or
// guidance, a noise tensor of the wrong shape, and model outputs whose shapes disagree with
// pipeline.json.
Txt2ImgResult generate(const Txt2ImgModels& models, const Txt2ImgSessions& sessions, const Txt2ImgRequest& request,
                       const Txt2ImgHooks& hooks = {});

// The pieces generate() runs, for callers that reuse one (e.g. the same text embeddings for every
// variant whose text encoder is the reference's).
// Texts -> float32 [B, L, D] hidden states, one batch.
Tensor encode_texts(const Txt2ImgModels& models, Session& text_encoder, const std::vector<std::string>& texts,
                    ModelCallObserver* observer = nullptr, std::string_view context = {});
// Latent [1, C, h, w] (before 1 / scaling_factor) -> float32 image [3, H, W] on [0, 1].
Tensor decode_latent(const Txt2ImgModels& models, Session& vae_decoder, const Tensor& latent,
                     ModelCallObserver* observer = nullptr, std::string_view context = {});

// [3, H, W] on [0, 1] -> 8-bit RGB: round(clamp(v, 0, 1) * 255), ties to even (as torch.round).
datasets::Rgb8 image_to_rgb8(const Tensor& image01);

}  // namespace qeval::eval
