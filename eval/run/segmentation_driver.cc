// The segmentation driver: one unit = one image with every point prompt on it; the image encoder,
// then each prompt's mask decoder call, run in lockstep with the reference's.
#include <fmt/format.h>

#include <chrono>

#include "base/files.h"
#include "datasets/mask_io.h"
#include "eval/exec/onnx_import.h"
#include "eval/pipelines/point_prompts.h"
#include "eval/pipelines/segmentation.h"
#include "eval/quant/segmentation_calibration.h"
#include "eval/run/compare_images.h"
#include "eval/run/evaluator.h"
#include "eval/run/outputs.h"
#include "eval/run/recipe_variant.h"
#include "kernels/error.h"
#include "metrics/segmentation.h"

namespace qeval::eval {

namespace fs = std::filesystem;

namespace {

// The qualifier of the mask decoder's logit error ("logit_sqnr_db").
constexpr char kLogits[] = "logit";

struct SegmentationThread : DriverThread {
  std::vector<SegmentationSessions> sessions;  // per variant
};

class SegmentationDriver : public RunDriver {
 public:
  explicit SegmentationDriver(const RunSpec& spec)
      : RunDriver(pipeline_kind("segmentation")),
        pipeline_(std::make_shared<SegmentationPipeline>(SegmentationPipeline::load(spec.pipeline))) {
    const SegmentationConfig& c = pipeline_->config();
    prompts_path_ = spec.inputs.empty() ? c.evaluation_prompts : spec.inputs;
    if (prompts_path_.empty())
      throw InputError(c.source.string() + " names no evaluation prompts; give \"prompts\" in the run config (" +
                       std::string(kRunConfigDoc) + ")");
    set_ = read_point_prompts(prompts_path_);
    const std::size_t first = std::min<std::size_t>(std::size_t(spec.first), set_.prompts.size());
    std::size_t last = set_.prompts.size();
    if (spec.count > 0) last = std::min(last, first + std::size_t(spec.count));
    if (first >= last)
      throw InputError(fmt::format("{}: 'first' {} skips every prompt of {}", spec.source.string(), spec.first,
                                   prompts_path_.string()));
    std::map<std::string, std::size_t> unit_of_key;
    for (std::size_t i = first; i < last; ++i) {
      const std::string key = set_.prompts[i].image_key();
      auto [it, added] = unit_of_key.emplace(key, units_.size());
      if (added) units_.push_back({key, {}});
      units_[it->second].prompts.push_back(i);
    }
    RunDescription& d = description_;
    d.name = c.name;
    d.inputs = {"point prompts", prompts_path_.string(), ""};
    {
      using namespace metrics::keys;
      d.metrics = {metric_info(kMaskIou), metric_info(kBoundaryF), metric_info(kSqnrDb, kLogits),
                   metric_info(kFlippedFraction), output_nonfinite_info()};
    }
    std::size_t n = 0;
    for (const auto& u : units_) n += u.prompts.size();
    d.settings = {{"images", std::to_string(units_.size())}, {"prompts", std::to_string(n)}};
  }

  std::shared_ptr<const Graph> reference_graph(const std::string& model) const override { return graph(model, ""); }

  std::map<std::string, std::shared_ptr<const Graph>> variant_graphs(const VariantSpec& v) const override {
    std::map<std::string, std::shared_ptr<const Graph>> out;
    for (const std::string m : {"image_encoder", "mask_decoder"}) {
      if (auto it = v.onnx.find(m); it != v.onnx.end()) out[m] = std::make_shared<const Graph>(load_onnx(it->second));
      else out[m] = graph(m, v.pipeline_variant);  // InputError for a variant no model lists
    }
    return out;
  }

  // Both models calibrated through the pipeline on the calibration prompts (encoder per image,
  // decoder per prompt); a model the recipe selects nothing in keeps the reference's graph.
  CalibrationData calibration_data(const VariantSpec& v, const RunSpec& spec, bool progress) const override {
    const SegmentationConfig& c = pipeline_->config();
    const fs::path prompts = calibration_prompts(v, spec, c.calibration_prompts, c.source);
    auto set = std::make_shared<const PointPromptSet>(
        quant::read_point_prompts_limited(prompts, std::size_t(spec.calibration.count)));
    auto make = [this, set, progress](const std::string& model) -> std::unique_ptr<quant::CalibrationSet> {
      return std::make_unique<quant::SegmentationCalibrationSet>(*pipeline_, *set, model, progress);
    };
    return {{"calibration point prompts", prompts.string(), ""}, {"image_encoder", "mask_decoder"}, make};
  }

  std::size_t units() const override { return units_.size(); }
  UnitInfo unit(std::size_t i) const override {
    std::string prompts;
    for (std::size_t p : units_[i].prompts) prompts += (prompts.empty() ? "" : ",") + std::to_string(p);
    return {units_[i].key, prompts};
  }

  std::unique_ptr<DriverThread> make_thread(const std::vector<BuiltVariant>& variants) const override {
    auto t = std::make_unique<SegmentationThread>();
    for (const auto& v : variants) {
      SegmentationSessions s;
      s.image_encoder = std::make_unique<Session>(*v.graphs.at("image_encoder"), v.options_for("image_encoder"));
      s.mask_decoder = std::make_unique<Session>(*v.graphs.at("mask_decoder"), v.options_for("mask_decoder"));
      t->sessions.push_back(std::move(s));
    }
    return t;
  }

  void run_unit(std::size_t index, DriverThread& thread, const UnitContext& ctx, UnitOutcome& out) const override {
    auto& th = static_cast<SegmentationThread&>(thread);
    const auto& variants = *ctx.variants;
    const std::size_t nv = variants.size(), r = ctx.reference;
    const Unit& u = units_[index];
    const SegmentationConfig& c = pipeline_->config();
    std::vector<std::size_t> order = {r};
    for (std::size_t v = 0; v < nv; ++v)
      if (v != r) order.push_back(v);
    std::vector<std::unique_ptr<LockstepObserver>> observers(nv);
    if (ctx.observation)
      for (std::size_t v = 0; v < nv; ++v)
        observers[v] = std::make_unique<LockstepObserver>(*ctx.observation, v, out.layers, *ctx.capture, *ctx.nodes,
                                                          set_.prompts[u.prompts[0]].id, index);
    auto local_errors = [&] {
      if (!ctx.observation) return;
      for (std::size_t v : order)
        if (v != r) run_local_errors(*ctx.observation, v, *ctx.capture, *ctx.local, out.layers);
    };
    using Clock = std::chrono::steady_clock;
    std::vector<double> encode_ms(nv, 0.0);

    const PromptInputs inputs = load_prompt_inputs(set_.prompts[u.prompts[0]], set_.source, c.channels);
    std::vector<ImageEmbedding> emb(nv);
    // Observed: every variant's call runs in lockstep with the reference's, node by node (as the
    // single-model and txt2img drivers do): the capture borrows the reference's values instead of
    // keeping the whole call, and local error runs each node as soon as its inputs exist.
    const bool lockstep = ctx.observation && ctx.interleave;
    auto in_lockstep = [&](const ModelCall& call, std::vector<std::map<std::string, Tensor>>& model_inputs,
                           auto session_of, std::vector<double>& ms) {
      LockstepLocalErrors lockstep_local(*ctx.observation, *ctx.capture, *ctx.local, out.layers);
      return run_call_in_lockstep(
          call, order, r, observers, *ctx.capture,
          [&](std::size_t v, Observer* observer) {
            return std::make_unique<Session::Execution>(session_of(v), model_inputs[v], observer);
          },
          {}, ms, ctx.lockstep_window, &lockstep_local);
    };
    if (lockstep) {
      std::vector<std::map<std::string, Tensor>> model_inputs(nv);
      for (std::size_t v : order) {
        const auto t0 = Clock::now();
        model_inputs[v] = pipeline_->encoder_inputs(th.sessions[v].image_encoder->graph(), inputs.planes, emb[v]);
        encode_ms[v] += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      }
      auto outputs = in_lockstep(
          SegmentationPipeline::encoder_call(u.key), model_inputs,
          [&](std::size_t v) -> Session& { return *th.sessions[v].image_encoder; }, encode_ms);
      for (std::size_t v : order) pipeline_->take_embeddings(th.sessions[v].image_encoder->graph(), outputs[v], emb[v]);
    } else {
      for (std::size_t v : order) {
        const auto t0 = Clock::now();
        emb[v] = pipeline_->encode(*th.sessions[v].image_encoder, inputs.planes, observers[v].get(), u.key);
        encode_ms[v] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (v == r) local_errors();
      }
    }
    out.samples.resize(u.prompts.size());
    for (std::size_t k = 0; k < u.prompts.size(); ++k) {
      const PointPrompt& p = set_.prompts[u.prompts[k]];
      SampleOutcome& sample = out.samples[k];
      sample.id = p.id;
      sample.prompt = p.image.empty() ? fmt::format("scene {}:{}", p.scene->seed, p.scene->index) : p.image.string();
      sample.variants.resize(nv);
      std::vector<SegmentationResult> res(nv);
      if (lockstep) {
        std::vector<std::map<std::string, Tensor>> model_inputs(nv);
        std::vector<double> ms(nv, 0.0);
        for (std::size_t v : order) {
          const auto t0 = Clock::now();
          model_inputs[v] = pipeline_->decoder_inputs(th.sessions[v].mask_decoder->graph(), emb[v], p.points);
          ms[v] += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        }
        auto outputs = in_lockstep(
            SegmentationPipeline::decoder_call(p.id, int(k)), model_inputs,
            [&](std::size_t v) -> Session& { return *th.sessions[v].mask_decoder; }, ms);
        for (std::size_t v : order) {
          const auto t0 = Clock::now();
          res[v] = pipeline_->decoder_result(th.sessions[v].mask_decoder->graph(), emb[v], outputs[v]);
          ms[v] += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
          sample.variants[v].elapsed_ms = ms[v] + encode_ms[v] / double(u.prompts.size());
        }
      } else {
        for (std::size_t v : order) {
          const auto t0 = Clock::now();
          res[v] = pipeline_->decode(*th.sessions[v].mask_decoder, emb[v], p.points, observers[v].get(), p.id, int(k));
          sample.variants[v].elapsed_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() +
                                          encode_ms[v] / double(u.prompts.size());
          if (v == r) local_errors();
        }
      }
      for (std::size_t v = 0; v < nv; ++v) {
        VariantOutcome& o = sample.variants[v];
        image_outcome(datasets::mask_image(res[r].mask), datasets::mask_image(res[v].mask), true, ctx.out_dir, p.id,
                      variants[v].spec.name, o);
        if (v == r) continue;
        const auto cmp = metrics::compare_mask_logits(res[r].logits, res[v].logits, c.mask_threshold);
        o.identical = cmp.logits.identical();
        o.metrics.push_back({metrics::keys::kMaskIou, cmp.iou.iou, {}, ""});
        o.metrics.push_back({metrics::keys::kBoundaryF, cmp.boundary.f, {}, ""});
        o.metrics.push_back({metric_info(metrics::keys::kSqnrDb, kLogits).key,
                             cmp.logits.sqnr_db,
                             {},
                             cmp.logits.sqnr_db ? "" : "identical logits"});
        o.metrics.push_back({metrics::keys::kFlippedFraction, cmp.flipped_fraction, {}, ""});
        o.metrics.push_back({kOutputNonfiniteMetric, double(cmp.logits.diverged), {}, ""});
        // The flipped pixels as a heatmap (bright = flipped).
        const Tensor a = image_planes(datasets::mask_image(res[r].mask), 1, "reference");
        const Tensor b = image_planes(datasets::mask_image(res[v].mask), 1, variants[v].spec.name);
        o.heatmap_png = datasets::encode_png(difference_heatmap(a, b, 255.0, 1).image);
        o.heatmap_legend = "pixels whose mask differs from the reference's: bright";
        if (!ctx.out_dir.empty()) {
          o.heatmap_path = (fs::path("images") / base::file_name_for(p.id) /
                            (base::file_name_for(variants[v].spec.name) + "_diff.png"))
                               .generic_string();
          fs::create_directories((ctx.out_dir / o.heatmap_path).parent_path());
          base::write_file_atomic(ctx.out_dir / o.heatmap_path,
                                  std::string(o.heatmap_png.begin(), o.heatmap_png.end()));
        }
      }
    }
    if (ctx.tick) ctx.tick();
  }

 private:
  std::shared_ptr<const Graph> graph(const std::string& model, const std::string& variant) const {
    const Graph& g = model == "image_encoder" ? pipeline_->image_encoder(variant) : pipeline_->mask_decoder(variant);
    return std::shared_ptr<const Graph>(pipeline_, &g);  // keeps the pipeline alive
  }

  struct Unit {
    std::string key;
    std::vector<std::size_t> prompts;  // indices into set_.prompts
  };
  std::shared_ptr<SegmentationPipeline> pipeline_;
  fs::path prompts_path_;
  PointPromptSet set_;
  std::vector<Unit> units_;
};

}  // namespace

PipelineKind segmentation_pipeline_kind() {
  PipelineKind k;
  k.name = "segmentation";
  k.what = "a segmentation pipeline";
  k.models = {"image_encoder", "mask_decoder"};
  k.main_model = "image_encoder";
  k.pipeline_variants = true;
  k.claims = [](const fs::path& p) { return pipeline_json_has_task(p, "segmentation"); };
  k.load = [](const RunSpec& spec) -> std::unique_ptr<RunDriver> { return std::make_unique<SegmentationDriver>(spec); };
  return k;
}

}  // namespace qeval::eval
