// The txt2img driver: one unit = one (prompt, seed); every variant's text encoder, each UNet step
// and the VAE decoder run in lockstep with the reference's.
#include "eval/run/evaluator.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "eval/exec/pool.h"
#include "eval/pipelines/prompt_set.h"
#include "eval/pipelines/txt2img.h"
#include "eval/quant/txt2img_calibration.h"
#include "eval/run/outputs.h"
#include "eval/run/recipe_variant.h"
#include "kernels/error.h"
#include "metrics/tensor_error.h"

namespace qeval::eval {

namespace fs = std::filesystem;

namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void add_error(metrics::ErrorStats& s, const Tensor& ref, const Tensor& test) {
  s.add(metrics::tensor_error(ref, test), ref.numel());
}

struct Txt2ImgThread : DriverThread {
  std::vector<Txt2ImgSessions> sessions;  // per variant
  std::vector<bool> shares_text_encoder;  // same graph and options as the reference's
};

class Txt2ImgDriver : public RunDriver {
 public:
  explicit Txt2ImgDriver(const RunSpec& spec)
      : RunDriver(pipeline_kind("txt2img")), models_(Txt2ImgModels::load(spec.pipeline, "", spec.scheduler)) {
    const Txt2ImgConfig& c = models_.config;
    for (Txt2ImgModel m : models_.models()) pipeline_models_.emplace_back(txt2img_model_name(m));
    prompts_path_ = spec.inputs.empty() ? c.evaluation_prompts : spec.inputs;
    if (prompts_path_.empty())
      throw InputError(c.source.string() +
                       " names no evaluation prompts (\"prompts\": {\"evaluation\": ...}); give "
                       "\"prompts\" in the run config (" +
                       std::string(kRunConfigDoc) + ")");
    TextPromptSet set = read_text_prompts(prompts_path_);
    const std::size_t first = std::min<std::size_t>(std::size_t(spec.first), set.prompts.size());
    std::size_t last = set.prompts.size();
    if (spec.count > 0) last = std::min(last, first + std::size_t(spec.count));
    if (first >= last)
      throw InputError(fmt::format("{}: 'first' {} skips every prompt of {} ({} prompts)", spec.source.string(),
                                   spec.first, prompts_path_.string(), set.prompts.size()));
    prompts_.assign(set.prompts.begin() + std::ptrdiff_t(first), set.prompts.begin() + std::ptrdiff_t(last));
    for (std::size_t p = 0; p < prompts_.size(); ++p) {
      if (prompts_[p].seed) {
        units_.push_back({p, *prompts_[p].seed});
        continue;
      }
      for (std::uint64_t s : spec.seeds) units_.push_back({p, s});
    }
    base_ = default_request(c, "", 0);
    if (spec.steps) base_.steps = *spec.steps;
    if (spec.guidance_scale) base_.guidance_scale = *spec.guidance_scale;
    if (spec.scheduler) base_.scheduler.type = *spec.scheduler;
    if (spec.negative_prompt) base_.negative_prompt = *spec.negative_prompt;
    RunDescription& d = description_;
    d.name = c.name;
    d.inputs = {"prompts", prompts_path_.string(), ""};
    d.metrics = image_metric_infos();
    d.metrics.push_back(output_nonfinite_info());
    d.stepped_model = "unet";
    d.timesteps = Scheduler(base_.scheduler, base_.steps).timesteps();  // InputError on bad steps
    d.scheduler = std::string(scheduler_type_name(base_.scheduler.type));
    d.steps = base_.steps;
    d.settings = {{"guidance_scale", fmt::format("{:g}", base_.guidance_scale)},
                  {"negative_prompt", base_.negative_prompt},
                  {"prompts", std::to_string(prompts_.size())}};
    if (c.sdxl() && c.vae_decoder.force_upcast)
      d.settings.push_back(
          {"vae_decoder",
           std::string("fp32 in every variant (force_upcast") +
               (models_.vae_decoder_widened ? "; its float16 export widened to float32, as diffusers upcasts it" : "") +
               ") unless its model_precision names it"});
  }

  std::shared_ptr<const Graph> reference_graph(const std::string& model) const override { return graph(model); }

  // An SDXL VAE whose config says force_upcast runs in FP32 unless the variant names its precision.
  Precision model_precision(const VariantSpec& v, const std::string& model) const override {
    if (v.model_precision.count(model)) return RunDriver::model_precision(v, model);
    for (Txt2ImgModel m : models_.models())
      if (txt2img_model_name(m) == model) return txt2img_model_precision(models_.config, m, v.precision);
    return v.precision;
  }

  std::map<std::string, std::shared_ptr<const Graph>> variant_graphs(const VariantSpec& v) const override {
    std::map<std::string, std::shared_ptr<const Graph>> out;
    const Txt2ImgConfig& c = models_.config;
    if (!v.pipeline_variant.empty()) {
      const auto names = c.variant_names();
      if (std::find(names.begin(), names.end(), v.pipeline_variant) == names.end())
        throw InputError(
            fmt::format("variant '{}': {} lists no variant '{}'", v.name, c.source.string(), v.pipeline_variant));
    }
    for (Txt2ImgModel m : models_.models()) {
      const std::string name(txt2img_model_name(m));
      const ModelFiles& files = c.files(m);
      if (auto it = v.onnx.find(name); it != v.onnx.end()) {
        out[name] = load_txt2img_graph(c, m, it->second);
      } else if (auto pv = files.variant_models.find(v.pipeline_variant);
                 !v.pipeline_variant.empty() && pv != files.variant_models.end()) {
        out[name] = load_txt2img_graph(c, m, pv->second);
      } else {
        out[name] = graph(name);
      }
    }
    return out;
  }

  // The UNet, calibrated per step on the calibration prompts (the run's steps unless given).
  CalibrationData calibration_data(const VariantSpec& v, const RunSpec& spec, bool progress) const override {
    const fs::path prompts = calibration_prompts(v, spec, models_.config.calibration_prompts, models_.config.source);
    const int steps = spec.calibration.steps > 0 ? spec.calibration.steps : base_.steps;
    const std::size_t count = std::size_t(spec.calibration.count);
    auto set = [this, prompts, steps, count, progress](const std::string&) -> std::unique_ptr<quant::CalibrationSet> {
      return std::make_unique<quant::Txt2ImgCalibrationSet>(models_, quant::read_prompt_lines(prompts, count), steps, 0,
                                                            progress);
    };
    return {{"calibration prompts", prompts.string(), ""}, {"unet"}, set};
  }

  std::size_t units() const override { return units_.size(); }
  UnitInfo unit(std::size_t i) const override {
    const auto& u = units_[i];
    return {fmt::format("{}-s{}", prompts_[u.prompt].id, u.seed), {}};
  }
  int ticks_per_unit() const override { return base_.steps + 2; }

  std::unique_ptr<DriverThread> make_thread(const std::vector<BuiltVariant>& variants) const override {
    auto t = std::make_unique<Txt2ImgThread>();
    // One buffer pool for all of this thread's sessions: they run one at a time or interleaved
    // on this thread, and a buffer one model freed serves the next (the VAE decoder, the next
    // unit's UNet) without new pages. Bounded (eval/exec/pool.h): the VAE decoder's 512x512
    // activations, none of which a UNet buffer fits, no longer come on top of every UNet buffer
    // kept (full-size pipeline, observed at 2 threads: 13.13 -> 10.36 GB peak RSS; tiny-sd's
    // default run at 1 thread the same CPU time within noise, bench/README.md).
    const std::shared_ptr<BufferPool> pool = make_bounded_pool();
    for (const auto& v : variants) {
      Txt2ImgSessions s;
      for (Txt2ImgModel m : models_.models()) {
        const std::string name(txt2img_model_name(m));
        // An SDXL VAE: FP32 under force_upcast; an export: in the reference's node order.
        SessionOptions options = v.options_for(name);
        options.pool = pool;
        s.*s.member(m) = Txt2ImgSessions::make(v.graphs.at(name), options);
      }
      t->sessions.push_back(std::move(s));
    }
    return t;
  }

  void run_unit(std::size_t index, DriverThread& thread, const UnitContext& ctx, UnitOutcome& out) const override {
    auto& th = static_cast<Txt2ImgThread&>(thread);
    const auto& variants = *ctx.variants;
    const std::size_t nv = variants.size(), r = ctx.reference;
    const UnitInfo info = unit(index);
    out.samples.resize(1);
    SampleOutcome& sample = out.samples[0];
    sample.id = info.id;
    sample.prompt = prompts_[units_[index].prompt].prompt;
    sample.seed = units_[index].seed;
    sample.variants.resize(nv);
    out.series.resize(nv);

    Txt2ImgRequest req = base_;
    const TextPrompt& p = prompts_[units_[index].prompt];
    req.prompt = p.prompt;
    req.seed = units_[index].seed;
    if (p.negative_prompt) req.negative_prompt = *p.negative_prompt;

    // The reference first, then the others, at every stage.
    std::vector<std::size_t> order = {r};
    for (std::size_t v = 0; v < nv; ++v)
      if (v != r) order.push_back(v);
    std::vector<Txt2ImgRun> runs;
    runs.reserve(nv);
    for (std::size_t v = 0; v < nv; ++v) runs.emplace_back(models_, req);
    std::vector<std::unique_ptr<LockstepObserver>> observers(nv);
    if (ctx.observation)
      for (std::size_t v = 0; v < nv; ++v)
        observers[v] = std::make_unique<LockstepObserver>(*ctx.observation, v, out.layers, *ctx.capture, *ctx.nodes,
                                                          info.id, index);
    auto observer = [&](std::size_t v) -> ModelCallObserver* { return observers[v].get(); };
    // Local error of the variants in `who` that ran the call (one after the other: after the
    // reference's call, while the capture holds its values).
    auto local_errors = [&](const std::vector<std::size_t>& who) {
      if (!ctx.observation) return;
      for (std::size_t v : who)
        if (v != r) run_local_errors(*ctx.observation, v, *ctx.capture, *ctx.local, out.layers);
    };
    using Clock = std::chrono::steady_clock;
    std::vector<double> ms(nv, 0.0);
    auto timed = [&](std::size_t v, auto&& f) {
      const auto t0 = Clock::now();
      f();
      ms[v] += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    };

    // Observed: one model call of every variant runs together, node by node (run_lockstep), and
    // the capture borrows the reference's values for the comparisons. Local error runs node by
    // node too (LockstepLocalErrors), so a reference value goes back to the pool once its readers
    // (comparisons, local runs) are done, as in an unobserved run: the reference's execution
    // retained every buffer of the call for local error after it until the twenty-fourth session
    // (a full-size UNet call's observed peak on an H100: 64 GB). `model`: which of a variant's
    // sessions runs; inputs_of(v, graph) the inputs of variant v's call; `who`: the variants that
    // run it, the reference first (outputs of the others stay empty).
    auto lockstep_call = [&](const ModelCall& call, std::shared_ptr<Session> Txt2ImgSessions::*model, auto&& inputs_of,
                             const std::vector<std::size_t>& who) {
      std::vector<std::map<std::string, Tensor>> inputs(nv);  // alive until the executions finish
      LockstepLocalErrors lockstep_local(*ctx.observation, *ctx.capture, *ctx.local, out.layers);
      return run_call_in_lockstep(
          call, who, r, observers, *ctx.capture,
          [&](std::size_t v, Observer* watching) {
            Session& session = *(th.sessions[v].*model);
            inputs[v] = inputs_of(v, session.graph());
            return std::make_unique<Session::Execution>(session, inputs[v], watching);
          },
          {}, ms, ctx.lockstep_window, &lockstep_local);
    };
    // Text encoder(s) (SDXL: text_encoder, then text_encoder_2). A variant whose text encoders
    // are the reference's (same graphs, same options) reuses its embeddings; the others run them,
    // observed: in lockstep, as the UNet's calls.
    {
      std::vector<Txt2ImgModel> encoders = {Txt2ImgModel::kTextEncoder};
      if (models_.config.sdxl()) encoders.push_back(Txt2ImgModel::kTextEncoder2);
      std::vector<std::size_t> encoding;
      for (std::size_t v : order) {
        bool shares = v != r;
        for (Txt2ImgModel e : encoders) {
          const std::string name(txt2img_model_name(e));
          shares = shares && variants[v].graphs.at(name) == variants[r].graphs.at(name) &&
                   variants[v].options_for(name).precision == variants[r].options_for(name).precision;
        }
        if (!shares) encoding.push_back(v);
      }
      for (Txt2ImgModel e : encoders) {
        const auto member = Txt2ImgSessions::member(e);
        if (ctx.observation && ctx.interleave) {
          auto outputs = lockstep_call(
              Txt2ImgRun::text_encoder_call(info.id, e), member,
              [&](std::size_t v, const Graph& g) { return runs[v].encoder_inputs(g, e); }, encoding);
          (th.sessions[r].*member)->drop_retained();  // to the pool, for the UNet
          for (std::size_t v : encoding)
            timed(v, [&] { runs[v].set_text_embeddings((th.sessions[v].*member)->graph(), outputs[v], e); });
        } else {
          for (std::size_t v : encoding) {
            timed(v, [&] { runs[v].encode_one(*(th.sessions[v].*member), e, observer(v), info.id); });
            if (v == r) local_errors(encoding);
          }
        }
      }
      for (std::size_t v : order)
        if (std::find(encoding.begin(), encoding.end(), v) == encoding.end())
          timed(v, [&] { runs[v].set_text_embeddings(runs[r].text_embeddings(), runs[r].pooled_embeddings()); });
    }
    if (ctx.tick) ctx.tick();

    // The denoising loop, one step of every variant at a time.
    const int steps = runs[r].steps();
    for (std::size_t v = 0; v < nv; ++v)
      if (v != r) {
        out.series[v] = {{"noise_pred", "free-running", std::vector<metrics::ErrorStats>(std::size_t(steps))},
                         {"latent", "free-running", std::vector<metrics::ErrorStats>(std::size_t(steps))}};
        if (ctx.teacher_forced)
          out.series[v].push_back(
              {"noise_pred", "teacher-forced", std::vector<metrics::ErrorStats>(std::size_t(steps))});
      }
    // One denoising step of variant i, timed and observed.
    auto step = [&](std::size_t i) {
      Txt2ImgRun::Prediction prediction;
      timed(i, [&] {
        Txt2ImgHooks hooks;
        hooks.observer = observer(i);
        hooks.context = info.id;
        prediction = runs[i].step(*th.sessions[i].unet, hooks);
      });
      return prediction;
    };
    auto observed_steps = [&](int t) {
      auto outputs = lockstep_call(
          Txt2ImgRun::unet_call(t, info.id), &Txt2ImgSessions::unet,
          [&](std::size_t v, const Graph& g) { return runs[v].unet_inputs(g, runs[v].latent(), t); }, order);
      std::vector<Txt2ImgRun::Prediction> predictions(nv);
      for (std::size_t v : order) {
        timed(v, [&] {
          predictions[v] = runs[v].prediction(th.sessions[v].unet->graph(), outputs[v]);
          runs[v].advance(predictions[v]);
        });
      }
      return predictions;
    };
    for (int t = 0; t < steps; ++t) {
      // Teacher forcing needs the reference's latent before the step and who started from it.
      Tensor ref_before;
      std::vector<bool> same_start(nv);
      if (ctx.teacher_forced) {
        ref_before = runs[r].latent();
        for (std::size_t v = 0; v < nv; ++v) same_start[v] = v != r && same_bits(runs[v].latent(), ref_before);
      }
      std::vector<Txt2ImgRun::Prediction> predictions;
      if (ctx.observation && ctx.interleave) {
        predictions = observed_steps(t);
      } else {
        predictions.resize(nv);
        for (std::size_t v : order) {
          predictions[v] = step(v);
          if (v == r) local_errors(order);
        }
      }
      const Txt2ImgRun::Prediction& ref_pred = predictions[r];
      for (std::size_t v : order) {
        if (v == r) continue;
        const Txt2ImgRun::Prediction& pred = predictions[v];
        add_error(out.series[v][0].steps[std::size_t(t)], ref_pred.noise_pred, pred.noise_pred);
        add_error(out.series[v][1].steps[std::size_t(t)], runs[r].latent(), runs[v].latent());
        if (ctx.teacher_forced) {
          // From the reference's latent: the UNet's own error at this step. A variant that
          // started this step from the same latent already did exactly that.
          if (same_start[v]) {
            add_error(out.series[v][2].steps[std::size_t(t)], ref_pred.noise_pred, pred.noise_pred);
          } else {
            const auto forced = runs[v].predict(*th.sessions[v].unet, ref_before, t);
            add_error(out.series[v][2].steps[std::size_t(t)], ref_pred.noise_pred, forced.noise_pred);
          }
        }
      }
      if (ctx.tick) ctx.tick();
    }

    th.sessions[r].unet->drop_retained();  // to the pool: the VAE decoder's buffers come from them

    // VAE decoder and the images (observed: in lockstep, as the UNet's calls).
    std::vector<Tensor> decoded(nv);  // [3, H, W] on [0, 1], before 8-bit rounding
    if (ctx.observation && ctx.interleave) {
      auto outputs = lockstep_call(
          Txt2ImgRun::vae_call(info.id), &Txt2ImgSessions::vae_decoder,
          [&](std::size_t v, const Graph& g) { return runs[v].decoder_inputs(g); }, order);
      th.sessions[r].vae_decoder->drop_retained();
      for (std::size_t v : order)
        timed(v, [&] { decoded[v] = runs[v].image(th.sessions[v].vae_decoder->graph(), outputs[v]); });
    } else {
      for (std::size_t v : order) {
        timed(v, [&] { decoded[v] = runs[v].decode(*th.sessions[v].vae_decoder, observer(v), info.id); });
        if (v == r) local_errors(order);
      }
    }
    const datasets::Rgb8 ref_image = image_to_rgb8(decoded[r]);
    for (std::size_t v = 0; v < nv; ++v) {
      sample.variants[v].elapsed_ms = ms[v];
      image_outcome(ref_image, v == r ? ref_image : image_to_rgb8(decoded[v]), v == r, ctx.out_dir, info.id,
                    variants[v].spec.name, sample.variants[v]);
      // A NaN/Inf pixel becomes some 8-bit value: the image metrics alone would not show it.
      if (v != r)
        sample.variants[v].metrics.push_back(
            {kOutputNonfiniteMetric, double(metrics::tensor_error(decoded[r], decoded[v]).diverged), {}, ""});
    }
    if (ctx.tick) ctx.tick();
  }

 private:
  std::shared_ptr<const Graph> graph(const std::string& model) const {
    for (Txt2ImgModel m : models_.models())
      if (txt2img_model_name(m) == model) return models_.graph(m);
    throw std::invalid_argument("txt2img has no model " + model);
  }

  struct Unit {
    std::size_t prompt = 0;
    std::uint64_t seed = 0;
  };
  Txt2ImgModels models_;
  fs::path prompts_path_;
  std::vector<TextPrompt> prompts_;
  std::vector<Unit> units_;
  Txt2ImgRequest base_;
};

}  // namespace

PipelineKind txt2img_pipeline_kind() {
  PipelineKind k;
  k.name = "txt2img";
  k.what = "a txt2img pipeline";
  k.models = {"text_encoder", "text_encoder_2", "unet", "vae_decoder"};  // text_encoder_2: SDXL only
  k.main_model = "unet";
  k.denoising = true;
  k.pipeline_variants = true;
  k.claims = [](const fs::path& p) { return pipeline_json_has_task(p, "txt2img"); };
  k.listed_variants = [](const RunSpec& spec) {
    return read_txt2img_config(spec.pipeline, spec.scheduler).variant_names();
  };
  k.load = [](const RunSpec& spec) -> std::unique_ptr<RunDriver> { return std::make_unique<Txt2ImgDriver>(spec); };
  return k;
}

}  // namespace qeval::eval
