// The single-model driver: one ONNX file on a folder of input samples (the `qeval infer --inputs`
// layout); one unit = one sample, every variant's run in lockstep with the reference's.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "eval/exec/onnx_import.h"
#include "eval/exec/pool.h"
#include "eval/quant/calibrate.h"
#include "eval/run/evaluator.h"
#include "eval/run/metric_names.h"
#include "eval/run/node_match.h"
#include "eval/run/recipe_variant.h"
#include "kernels/error.h"
#include "kernels/numeric.h"
#include "metrics/activation_stats.h"
#include "metrics/psnr.h"
#include "metrics/segmentation.h"
#include "metrics/ssim.h"
#include "metrics/tensor_error.h"

namespace qeval::eval {

namespace fs = std::filesystem;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr const char* kDivergedNote = "NaN/Inf where the reference is finite";

std::string shape_text(const Shape& s) {
  std::string t;
  for (auto d : s) t += (t.empty() ? "" : ", ") + std::to_string(d);
  return "[" + t + "]";
}

}  // namespace

// The metrics of one judged output (or, pooled, of all outputs: prefix "output_"), in report order.
std::vector<reports::MetricInfo> output_metric_infos(const std::string& name, OutputKind kind) {
  using namespace metrics::keys;
  std::vector<const char*> keys;
  switch (kind) {
    case OutputKind::kTensor: keys = {kSqnrDb, kCosine, kRelL2, kMaxAbs}; break;
    case OutputKind::kMask:
    case OutputKind::kMatte: keys = {kMaskIou, kBoundaryF, kFlippedFraction, kSqnrDb}; break;
    case OutputKind::kImage: keys = {kPsnrDb, kSsim}; break;
  }
  keys.push_back(kNonfinite);
  std::vector<reports::MetricInfo> out;
  for (const char* key : keys) out.push_back(metric_info(key, name, '.'));
  return out;
}

namespace {

// SQNR, cosine, relative L2 and max-abs of `e` as metrics `key("sqnr_db")`, ... An identical
// comparison's unbounded SQNR is +inf where `inf_when_identical` (one output among others), else
// no value with the note "identical" (the sample as a whole is identical: the report carries it).
template <class Key>
void push_error_metrics(const metrics::ErrorStats& e, bool identical, std::uint64_t diverged, bool inf_when_identical,
                        Key key, std::vector<metrics::MetricValue>& out) {
  const auto sqnr = e.sqnr_db();
  const char* note = identical ? "identical" : diverged ? kDivergedNote : "";
  std::optional<double> sqnr_value = sqnr;
  if (sqnr && *sqnr == kInf && !inf_when_identical) sqnr_value.reset();
  using namespace metrics::keys;
  out.push_back({key(kSqnrDb), sqnr_value, {}, note});
  out.push_back({key(kCosine), e.cosine(), {}, note});
  out.push_back({key(kRelL2), e.rel_l2(), {}, ""});
  out.push_back({key(kMaxAbs), e.count || diverged ? std::optional<double>(e.max_abs) : std::nullopt, {}, ""});
}

// `t` as float32: itself unless it holds float16/bfloat16, whose widened copy goes to `storage`
// (a copy of every float32 output of both sides was the peak of a 1024x1024 matting run: 134 MB).
const Tensor& as_float32(const Tensor& t, Tensor& storage) {
  if (t.dtype() != DType::kFloat16 && t.dtype() != DType::kBFloat16) return t;
  storage = widened_to_float32(t);
  return storage;
}

// One judged output of a variant against the reference's: appends its metrics to `out`; returns
// its values that are NaN/Inf where the reference's are finite, or an error text (shapes that do
// not fit the kind) in `error`.
std::uint64_t compare_output(const OutputSpec& spec, const Tensor& ref, const Tensor& test, bool& identical,
                             std::string& error, std::vector<metrics::MetricValue>& out) {
  auto key = [&](const char* m) { return output_metric_key(spec.name, m); };
  Tensor wide_a, wide_b;
  const Tensor &a = as_float32(ref, wide_a), &b = as_float32(test, wide_b);
  const auto te = metrics::tensor_error(a, b);
  identical = te.identical();
  const std::uint64_t diverged = std::uint64_t(te.diverged);
  const Shape& shape = a.shape();
  switch (spec.kind) {
    case OutputKind::kTensor: {
      metrics::ErrorStats e;
      e.add(te, a.numel());
      push_error_metrics(e, identical, diverged, true, key, out);
      break;
    }
    case OutputKind::kMask:
    case OutputKind::kMatte: {
      // One [H, W] plane: every dimension before the last two must be 1.
      const bool plane =
          shape.size() >= 2 && std::all_of(shape.begin(), shape.end() - 2, [](auto d) { return d == 1; });
      if (!plane) {
        error = fmt::format("output '{}' has shape {}: kind '{}' needs one [H, W] plane (leading dimensions of 1)",
                            spec.name, shape_text(shape), output_kind_name(spec.kind));
        return 0;
      }
      const Shape hw = {shape[shape.size() - 2], shape.back()};
      const auto cmp = metrics::compare_mask_logits(a.reshaped(hw), b.reshaped(hw), spec.threshold);
      out.push_back({key(metrics::keys::kMaskIou), cmp.iou.iou, {}, ""});
      out.push_back({key(metrics::keys::kBoundaryF), cmp.boundary.f, {}, ""});
      out.push_back({key(metrics::keys::kFlippedFraction), cmp.flipped_fraction, {}, ""});
      metrics::ErrorStats e;
      e.add(cmp.logits, a.numel());
      out.push_back({key(metrics::keys::kSqnrDb),
                     e.sqnr_db(),
                     {},
                     identical  ? "identical"
                     : diverged ? kDivergedNote
                                : ""});
      break;
    }
    case OutputKind::kImage: {
      const bool image = shape.size() == 3 || (shape.size() == 4 && shape[0] == 1);
      if (!image) {
        error = fmt::format("output '{}' has shape {}: kind 'image' needs [C, H, W] or [1, C, H, W]", spec.name,
                            shape_text(shape));
        return 0;
      }
      if (diverged || te.nonfinite_ref || te.nonfinite_test) {
        // Unbounded error where the test diverged (as SQNR's -inf); undefined otherwise.
        out.push_back(
            {key(metrics::keys::kPsnrDb), diverged ? std::optional<double>(-kInf) : std::nullopt, {}, kDivergedNote});
        out.push_back(
            {key(metrics::keys::kSsim), std::nullopt, {}, diverged ? kDivergedNote : "NaN/Inf in the reference"});
        break;
      }
      // The metrics take [C, H, W] on [0, peak]: clamp to the range, then shift it to start at 0.
      const Shape chw(shape.end() - 3, shape.end());
      auto on_range = [&](const Tensor& t) {
        Tensor x = t.reshaped(chw);
        for (float& v : x.span<float>()) v = float(std::clamp(double(v), spec.range_lo, spec.range_hi) - spec.range_lo);
        return x;
      };
      const Tensor x = on_range(a), y = on_range(b);
      const double peak = spec.range_hi - spec.range_lo;
      const auto p = metrics::psnr(x, y, peak);
      out.push_back({key(metrics::keys::kPsnrDb),
                     p.psnr_db ? p.psnr_db : std::optional<double>(kInf),
                     {},
                     p.psnr_db ? "" : "identical"});
      const auto ss = metrics::ssim(x, y, metrics::SsimConvention::kWang, peak);
      out.push_back({key(metrics::keys::kSsim), ss.ssim, {}, ss.note});
      break;
    }
  }
  out.push_back({key(metrics::keys::kNonfinite), double(diverged), {}, ""});
  return diverged;
}

struct SingleModelThread : DriverThread {
  std::vector<std::unique_ptr<Session>> sessions;  // per variant
};

class SingleModelDriver : public RunDriver {
 public:
  explicit SingleModelDriver(const RunSpec& spec)
      : RunDriver(pipeline_kind("single-model")),
        model_path_(spec.pipeline),
        graph_(std::make_shared<const Graph>(load_onnx(spec.pipeline))) {
    inputs_ = spec.inputs;
    const auto folders = quant::tensor_sample_folders(inputs_);
    const std::size_t first = std::min<std::size_t>(std::size_t(spec.first), folders.size());
    std::size_t last = folders.size();
    if (spec.count > 0) last = std::min(last, first + std::size_t(spec.count));
    if (first >= last)
      throw InputError(fmt::format("{}: 'first' {} skips every sample", spec.source.string(), spec.first));
    samples_.assign(folders.begin() + std::ptrdiff_t(first), folders.begin() + std::ptrdiff_t(last));
    outputs_ = spec.outputs;
    for (const auto& o : outputs_) {
      const auto& outs = graph_->outputs;
      auto it = std::find_if(outs.begin(), outs.end(), [&](const ValueInfo& v) { return v.name == o.name; });
      std::string list;
      for (const auto& v : outs) list += (list.empty() ? "" : ", ") + v.name;
      const std::string where = fmt::format("{}: outputs.{}", spec.source.string(), o.name);
      if (it == outs.end())
        throw InputError(fmt::format("{}: the model {} has no output '{}' (its outputs: {}; see {})", where,
                                     model_path_.string(), o.name, list, kRunConfigDoc));
      const bool is_float =
          it->dtype == DType::kFloat32 || it->dtype == DType::kFloat16 || it->dtype == DType::kBFloat16;
      if (!is_float)
        throw InputError(fmt::format("{}: output '{}' is {}, not a float tensor: it cannot be judged as '{}' (see {})",
                                     where, o.name, dtype_name(it->dtype), output_kind_name(o.kind), kRunConfigDoc));
      // Shapes the kind cannot take, where the model declares them (-1: unknown, checked per sample).
      if (it->has_shape) {
        const auto& d = it->dims;
        auto ones = [](auto b, auto e) { return std::all_of(b, e, [](std::int64_t x) { return x == 1 || x < 0; }); };
        const bool fits = o.kind == OutputKind::kTensor  ? true
                          : o.kind == OutputKind::kImage ? d.size() == 3 || (d.size() == 4 && (d[0] == 1 || d[0] < 0))
                                                         : d.size() >= 2 && ones(d.begin(), d.end() - 2);
        if (!fits)
          throw InputError(fmt::format(
              "{}: output '{}' is declared {}: kind '{}' needs {} (see {})", where, o.name, shape_text(d),
              output_kind_name(o.kind),
              o.kind == OutputKind::kImage ? "[C, H, W] or [1, C, H, W]" : "one [H, W] plane (leading dimensions of 1)",
              kRunConfigDoc));
      }
    }
    RunDescription& d = description_;
    d.name = model_path_.stem().string();
    d.inputs = {"samples", inputs_.string(), ""};
    if (!outputs_.empty()) {
      for (const auto& o : outputs_)
        for (auto& m : output_metric_infos(o.name, o.kind)) d.metrics.push_back(std::move(m));
      d.metrics.push_back(output_nonfinite_info());  // over the judged outputs: what the gate's NaN/Inf rule reads
    } else {
      using namespace metrics::keys;
      d.metrics = {metric_info(kSqnrDb, kPooledOutputs), metric_info(kCosine, kPooledOutputs),
                   metric_info(kRelL2, kPooledOutputs), metric_info(kMaxAbs, kPooledOutputs), output_nonfinite_info()};
    }
    d.settings = {{"samples", std::to_string(samples_.size())}};
  }

  std::shared_ptr<const Graph> reference_graph(const std::string&) const override { return graph_; }

  std::map<std::string, std::shared_ptr<const Graph>> variant_graphs(const VariantSpec& v) const override {
    if (auto it = v.onnx.find("model"); it != v.onnx.end())
      return {{"model", std::make_shared<const Graph>(load_onnx(it->second))}};
    return {{"model", graph_}};
  }

  // The model, calibrated on the run's calibration samples (a single model has no default set).
  CalibrationData calibration_data(const VariantSpec& v, const RunSpec& spec, bool) const override {
    if (spec.calibration.prompts.empty())
      throw InputError(
          fmt::format("variant '{}': a recipe on a single model needs calibration samples: "
                      "\"calibration\": {{\"prompts\": FOLDER}} (the qeval infer --inputs layout; {})",
                      v.name, kRunConfigDoc));
    const fs::path folder = spec.calibration.prompts;
    auto set = [this, folder](const std::string&) -> std::unique_ptr<quant::CalibrationSet> {
      return std::make_unique<quant::TensorCalibrationSet>(quant::TensorCalibrationSet::from_folder(folder, *graph_));
    };
    return {{"calibration samples", folder.string(), ""}, {"model"}, set};
  }

  std::size_t units() const override { return samples_.size(); }
  UnitInfo unit(std::size_t i) const override { return {samples_[i].filename().string(), {}}; }

  std::unique_ptr<DriverThread> make_thread(const std::vector<BuiltVariant>& variants) const override {
    auto t = std::make_unique<SingleModelThread>();
    // One buffer pool for every variant's session of this thread (they run interleaved): a buffer
    // one variant's execution gives back serves the next, instead of each session keeping a
    // whole run's worth (a 1024x1024 model's peak is ~2 GB a session). Bounded: buffers that fit no
    // request are freed rather than kept beside the live values (eval/exec/pool.h).
    const std::shared_ptr<BufferPool> pool = make_bounded_pool();
    for (const auto& v : variants) {
      SessionOptions options = v.options_for("model");  // an export: in the reference's node order
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
        observers[v] =
            std::make_unique<LockstepObserver>(*ctx.observation, v, out.layers, *ctx.capture, *ctx.nodes, id, index);
    if (ctx.observation && ctx.interleave) {
      // Every variant's call in lockstep with the reference's, node by node (as txt2img's model
      // calls): the capture borrows the reference's values instead of copying every one (a
      // 1024x1024 model held a copy of every reference activation). Local error runs node by node
      // too, so that the reference's execution keeps only what the comparisons still wait for.
      LockstepLocalErrors lockstep_local(*ctx.observation, *ctx.capture, *ctx.local, out.layers);
      outputs = run_call_in_lockstep(
          call, order, r, observers, *ctx.capture,
          [&](std::size_t v, Observer* observer) {
            return std::make_unique<Session::Execution>(*th.sessions[v], inputs, observer);
          },
          {}, ms, ctx.lockstep_window, &lockstep_local);
    } else {
      for (std::size_t v : order) {
        timed(v, [&] { outputs[v] = th.sessions[v]->run(inputs, observers[v] ? observers[v]->begin(call) : nullptr); });
        if (v == r && ctx.observation) local_errors();
      }
    }
    for (std::size_t v = 0; v < nv; ++v) sample.variants[v].elapsed_ms = ms[v];
    for (std::size_t v = 0; v < nv; ++v) {
      if (v == r) continue;
      if (outputs_.empty()) pooled_metrics(outputs[r], outputs[v], sample.variants[v]);
      else judged_metrics(outputs[r], outputs[v], sample.variants[v]);
    }
    if (ctx.tick) ctx.tick();
  }

 private:
  // Every float output, pooled: energies add over outputs.
  static void pooled_metrics(const std::map<std::string, Tensor>& ref, const std::map<std::string, Tensor>& test,
                             VariantOutcome& o) {
    metrics::ErrorStats e;
    bool identical = true;
    std::uint64_t diverged = 0;
    for (const auto& [name, ref_out] : ref) {
      auto it = test.find(name);
      if (it == test.end() || it->second.shape() != ref_out.shape()) {
        o.error = "output '" + name + "' is missing or has another shape";
        return;
      }
      Tensor wide_a, wide_b;
      const Tensor &a = as_float32(ref_out, wide_a), &b = as_float32(it->second, wide_b);
      if (a.dtype() != DType::kFloat32 || b.dtype() != DType::kFloat32) continue;  // integer outputs
      const auto te = metrics::tensor_error(a, b);
      identical = identical && te.identical();
      diverged += std::uint64_t(te.diverged);
      e.add(te, a.numel());
    }
    o.identical = identical;
    // +inf SQNR (identical) is carried by `identical`; -inf (diverged) is a value.
    push_error_metrics(
        e, identical, diverged, false, [](const char* m) { return metric_info(m, kPooledOutputs).key; }, o.metrics);
    o.metrics.push_back({kOutputNonfiniteMetric, double(diverged), {}, ""});
  }

  // The outputs the config names, each by its kind; the others are not judged.
  void judged_metrics(const std::map<std::string, Tensor>& ref, const std::map<std::string, Tensor>& test,
                      VariantOutcome& o) const {
    bool identical = true;
    std::uint64_t diverged = 0;
    for (const auto& spec : outputs_) {
      auto a = ref.find(spec.name), b = test.find(spec.name);
      if (a == ref.end() || b == test.end() || a->second.shape() != b->second.shape()) {
        o.error = "output '" + spec.name + "' is missing or has another shape";
        break;
      }
      bool same = false;
      diverged += compare_output(spec, a->second, b->second, same, o.error, o.metrics);
      if (!o.error.empty()) break;
      identical = identical && same;
    }
    if (!o.error.empty()) {
      o.metrics.clear();
      return;
    }
    o.identical = identical;
    o.metrics.push_back({kOutputNonfiniteMetric, double(diverged), {}, ""});
  }

  fs::path model_path_;
  std::vector<OutputSpec> outputs_;
  std::shared_ptr<const Graph> graph_;
  fs::path inputs_;
  std::vector<fs::path> samples_;
};

}  // namespace

PipelineKind single_model_pipeline_kind() {
  PipelineKind k;
  k.name = "single-model";
  k.what = "a single ONNX model";
  k.models = {"model"};
  k.main_model = "model";
  k.judged_outputs = true;
  k.inputs_required =
      "a single ONNX model needs 'inputs': a folder of samples (one sub-folder per sample with <input name>.npy files)";
  k.claims = [](const fs::path& p) {
    std::error_code ec;
    return p.extension() == ".onnx" && fs::is_regular_file(p, ec);
  };
  k.load = [](const RunSpec& spec) -> std::unique_ptr<RunDriver> { return std::make_unique<SingleModelDriver>(spec); };
  return k;
}

}  // namespace qeval::eval
