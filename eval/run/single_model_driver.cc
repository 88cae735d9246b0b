// The single-model driver: one ONNX file on a folder of input samples (the `qeval infer --inputs`
// layout); one unit = one sample, every variant's run in lockstep with the reference's.
#include <fmt/format.h>

#include <chrono>
#include <limits>

#include "eval/onnx_import.h"
#include "eval/quant/apply.h"
#include "eval/quant/calibrate.h"
#include "eval/quant/calibrate_run.h"
#include "eval/run/drivers.h"
#include "kernels/error.h"
#include "kernels/numeric.h"
#include "metrics/tensor_error.h"

namespace qeval::eval {

namespace fs = std::filesystem;

namespace {

struct SingleModelThread : DriverThread {
  std::vector<std::unique_ptr<Session>> sessions;  // per variant
};

class SingleModelDriver : public RunDriver {
 public:
  explicit SingleModelDriver(const RunSpec& spec)
      : model_path_(spec.pipeline), graph_(std::make_shared<const Graph>(load_onnx(spec.pipeline))) {
    inputs_ = spec.inputs;
    const auto folders = quant::tensor_sample_folders(inputs_);
    const std::size_t first = std::min<std::size_t>(std::size_t(spec.first), folders.size());
    std::size_t last = folders.size();
    if (spec.count > 0) last = std::min(last, first + std::size_t(spec.count));
    if (first >= last) throw InputError(fmt::format("{}: 'first' {} skips every sample", spec.source.string(), spec.first));
    samples_.assign(folders.begin() + std::ptrdiff_t(first), folders.begin() + std::ptrdiff_t(last));
  }

  RunPipelineKind kind() const override { return RunPipelineKind::kSingleModel; }
  std::string name() const override { return model_path_.stem().string(); }
  std::vector<std::string> models() const override { return {"model"}; }
  std::shared_ptr<const Graph> reference_graph(const std::string&) const override { return graph_; }

  std::map<std::string, std::shared_ptr<const Graph>> variant_graphs(const VariantSpec& v) const override {
    if (auto it = v.onnx.find("model"); it != v.onnx.end())
      return {{"model", std::make_shared<const Graph>(load_onnx(it->second))}};
    return {{"model", graph_}};
  }

  RecipeGraphs recipe_graphs(const VariantSpec& v, const RunSpec& spec, bool) const override {
    namespace q = quant;
    const auto t0 = std::chrono::steady_clock::now();
    RecipeGraphs out;
    if (spec.calibration.prompts.empty())
      throw InputError(fmt::format("variant '{}': a recipe on a single model needs calibration samples: "
                                   "\"calibration\": {{\"prompts\": FOLDER}} (the qeval infer --inputs layout; {})",
                                   v.name, kRunConfigDoc));
    const q::Recipe recipe = q::load_recipe(v.recipe);
    const q::Selection selection = q::select_nodes(*graph_, recipe);
    q::TensorCalibrationSet set = q::TensorCalibrationSet::from_folder(spec.calibration.prompts, *graph_);
    const fs::path cache = calibration_cache_dir(spec);
    const q::CalibrationResult cal = q::calibrate_cached(*graph_, selection, recipe, set, cache, &out.cache_hit);
    out.graphs["model"] = std::make_shared<const Graph>(q::apply_recipe(*graph_, selection, recipe, cal).graph);
    out.parsed = recipe;
    out.quantized.push_back({"model", graph_, selection, cal});
    out.recipe = {recipe.name, v.recipe.string(), "fnv1a64:" + recipe.fingerprint()};
    out.calibration = reports::Artifact{"calibration samples", spec.calibration.prompts.string(), "fnv1a64:" + set.fingerprint()};
    out.calibration_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }

  std::size_t units() const override { return samples_.size(); }
  UnitInfo unit(std::size_t i) const override { return {samples_[i].filename().string()}; }
  std::vector<reports::MetricInfo> metrics() const override {
    return {{"output_sqnr_db", "output SQNR dB", true},
            {"output_cosine", "output cosine", true},
            {"output_rel_l2", "output rel L2", false},
            {"output_max_abs", "output max |err|", false},
            output_nonfinite_info()};
  }
  reports::Artifact inputs_artifact() const override { return {"samples", inputs_.string(), ""}; }
  std::vector<std::pair<std::string, std::string>> settings() const override {
    return {{"samples", std::to_string(samples_.size())}};
  }

  std::unique_ptr<DriverThread> make_thread(const std::vector<BuiltVariant>& variants) const override {
    auto t = std::make_unique<SingleModelThread>();
    // One buffer pool for every variant's session of this thread (they run interleaved): a buffer
    // one variant's execution gives back serves the next, instead of each session keeping a
    // whole run's worth (a 1024x1024 model's peak is ~2 GB a session).
    const std::shared_ptr<BufferPool> pool = Session::make_pool();
    for (const auto& v : variants) {
      SessionOptions options = v.options;
      options.pool = pool;
      t->sessions.push_back(std::make_unique<Session>(*v.graphs.at("model"), options));
    }
    return t;
  }

  void run_unit(std::size_t index, DriverThread& thread, const UnitContext& ctx, UnitOutcome& out) const override {
    auto& th = static_cast<SingleModelThread&>(thread);
    const std::size_t nv = ctx.variants->size(), r = ctx.reference;
    const std::string id = samples_[index] == inputs_ ? std::string("sample") : samples_[index].filename().string();
    const auto inputs = quant::read_tensor_sample(samples_[index], *graph_);
    std::vector<std::size_t> order = {r};
    for (std::size_t v = 0; v < nv; ++v)
      if (v != r) order.push_back(v);
    out.samples.resize(1);
    SampleOutcome& sample = out.samples[0];
    sample.id = id;
    sample.prompt = samples_[index].string();
    sample.variants.resize(nv);
    std::vector<std::map<std::string, Tensor>> outputs(nv);
    const ModelCall call{"model", id, 0, -1};
    std::vector<double> ms(nv, 0.0);
    auto timed = [&](std::size_t v, auto&& f) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      ms[v] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    auto local_errors = [&] {
      for (std::size_t w : order)
        if (w != r) run_local_errors(*ctx.observation, w, *ctx.capture, *ctx.local, out.layers);
    };
    std::vector<std::unique_ptr<LockstepObserver>> observers(nv);
    if (ctx.observation)
      for (std::size_t v : order)
        observers[v] = std::make_unique<LockstepObserver>(*ctx.observation, v, out.layers, *ctx.capture, *ctx.nodes, id, index);
    if (ctx.observation && ctx.interleave) {
      // Every variant's call in lockstep with the reference's, node by node (as txt2img's model
      // calls): the capture borrows the reference's values instead of copying them, and without
      // local error each goes back to the pool once its readers have compared. A 1024x1024 model
      // no longer holds a copy of every reference activation.
      std::vector<std::unique_ptr<Session::Execution>> runs(nv);
      std::vector<Session::Execution*> executions(nv);
      std::vector<LockstepObserver*> lockstep(nv);
      for (std::size_t v : order) {
        timed(v, [&] {
          runs[v] = std::make_unique<Session::Execution>(*th.sessions[v], inputs, observers[v]->begin(call),
                                                         v == r && ctx.observation->local_error);
        });
        executions[v] = runs[v].get();
        lockstep[v] = observers[v].get();
      }
      {
        struct Borrowing {
          Capture& c;
          explicit Borrowing(Capture& capture) : c(capture) { c.borrowing = true; }
          ~Borrowing() {
            c.borrowing = false;
            c.forget();
          }
        } borrowing(*ctx.capture);
        run_lockstep(r, executions, lockstep, ms, ctx.lockstep_window);
        local_errors();
      }
      for (std::size_t v : order)
        timed(v, [&] {
          outputs[v] = runs[v]->finish();
          observers[v]->end(call, outputs[v]);
        });
      th.sessions[r]->drop_retained();
    } else {
      for (std::size_t v : order) {
        timed(v, [&] { outputs[v] = th.sessions[v]->run(inputs, observers[v] ? observers[v]->begin(call) : nullptr); });
        if (v == r && ctx.observation) local_errors();
      }
    }
    for (std::size_t v = 0; v < nv; ++v) sample.variants[v].elapsed_ms = ms[v];
    // Every float output, pooled: energies add over outputs.
    for (std::size_t v = 0; v < nv; ++v) {
      if (v == r) continue;
      metrics::ErrorStats e;
      bool identical = true;
      std::uint64_t diverged = 0;
      for (const auto& [name, ref_out] : outputs[r]) {
        auto it = outputs[v].find(name);
        if (it == outputs[v].end() || it->second.shape() != ref_out.shape()) {
          sample.variants[v].error = "output '" + name + "' is missing or has another shape";
          break;
        }
        const Tensor a = widened_to_float32(ref_out), b = widened_to_float32(it->second);
        if (a.dtype() != DType::kFloat32 || b.dtype() != DType::kFloat32) continue;  // integer outputs
        const auto te = metrics::tensor_error(a, b);
        identical = identical && te.identical();
        diverged += std::uint64_t(te.diverged);
        e.add(te, a.numel());
      }
      VariantOutcome& o = sample.variants[v];
      if (!o.error.empty()) continue;
      o.identical = identical;
      // +inf SQNR (identical) is carried by `identical`; -inf (diverged) is a value.
      const auto sqnr = e.sqnr_db();
      const char* note = identical ? "identical" : diverged ? "NaN/Inf where the reference is finite" : "";
      o.metrics.push_back({"output_sqnr_db", sqnr && *sqnr != std::numeric_limits<double>::infinity() ? sqnr : std::nullopt,
                           {}, note});
      o.metrics.push_back({"output_cosine", e.cosine(), {}, note});
      o.metrics.push_back({"output_rel_l2", e.rel_l2(), {}, ""});
      o.metrics.push_back({"output_max_abs", e.count || diverged ? std::optional<double>(e.max_abs) : std::nullopt, {}, ""});
      o.metrics.push_back({kOutputNonfiniteMetric, double(diverged), {}, ""});
    }
    if (ctx.tick) ctx.tick();
  }

 private:
  fs::path model_path_;
  std::shared_ptr<const Graph> graph_;
  fs::path inputs_;
  std::vector<fs::path> samples_;
};

}  // namespace

std::unique_ptr<RunDriver> make_single_model_driver(const RunSpec& spec) {
  return std::make_unique<SingleModelDriver>(spec);
}

}  // namespace qeval::eval
