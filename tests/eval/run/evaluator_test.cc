// The evaluator on the shipped models: lockstep comparison (an identical variant has no error, the
// accumulated error of a node is exactly the error between two independent runs), teacher forcing,
// local error, results independent of the thread count, segmentation.
#include "eval/run/evaluator.h"

#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <cmath>

#include "eval/pipelines/txt2img.h"
#include "eval/fake_device.h"
#include "metrics/tensor_error.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

RunSpec tiny_sd_spec(int prompts, int steps, std::vector<VariantSpec> variants) {
  RunSpec s;
  s.pipeline = testing::source_dir() / "models" / "tiny-sd";
  s.kind = "txt2img";
  s.count = prompts;
  s.steps = steps;
  s.variants = std::move(variants);
  s.reference = s.variants[0].name;
  return s;
}

VariantSpec precision(const std::string& name, Precision p) {
  VariantSpec v;
  v.name = name;
  v.precision = p;
  return v;
}

VariantSpec int8_level3() {  // a recipe variant: quantized nodes between the float ones
  VariantSpec v;
  v.name = "int8";
  v.recipe = testing::source_dir() / "recipes" / "int8-level3.json";
  return v;
}

// Variant v's cells of two runs are the same to the bit; else the first few that differ, and how.
void expect_same_cells(const RunResult& a, const RunResult& b, std::size_t v) {
  EXPECT_TRUE(a.layers[v] == b.layers[v]) << v;
  const LayerSpace& space = *a.observation.space;
  int shown = 0;
  for (std::size_t l = 0; l < space.layers(); ++l)
    for (int t = 0; t < space.cells_of(l); ++t) {
      const LayerCell *x = a.layers[v].find(l, t), *y = b.layers[v].find(l, t);
      if ((!x && !y) || (x && y && *x == *y) || ++shown > 5) continue;
      ADD_FAILURE() << "variant " << v << " layer " << l << " " << space.node_of(l).name << " step " << t
                    << (!x || !y ? ": in one run only" : !(x->act == y->act) ? ": act" : !(x->acc == y->acc) ? ": acc" : ": local");
    }
}

RunResult run(const RunSpec& spec, int threads = 1, bool interleave = true, std::size_t lockstep_window = 1) {
  const auto driver = make_run_driver(spec);
  RunResult r;
  tbb::task_arena arena(threads);
  arena.execute([&] {
    EvaluatorOptions o;
    o.workers = threads;
    o.interleave = interleave;
    o.lockstep_window = lockstep_window;
    r = evaluate(spec, *driver, build_variants(spec, *driver), o);
  });
  return r;
}

// Captures one node's output (storage values) in one model call.
class NodeGrab : public ModelCallObserver, public Observer {
 public:
  NodeGrab(std::string node, int step) : node_(std::move(node)), step_(step) {}
  Observer* begin(const ModelCall& c) override { return c.model == "unet" && c.step == step_ ? this : nullptr; }
  void on_node(const NodeEvent& e) override {
    if (e.node.name == node_) value = *e.outputs[0];
  }
  Tensor value;

 private:
  std::string node_;
  int step_;
};

// One node's output at `step` in two separate generate() runs of `prompt` (seed 0): FP32 and FP16.
std::pair<Tensor, Tensor> grab_fp32_fp16(const Txt2ImgModels& models, const std::string& prompt, int steps,
                                         const std::string& node, int step) {
  Txt2ImgRequest req = default_request(models.config, prompt, 0);
  req.steps = steps;
  NodeGrab ref_grab(node, step), half_grab(node, step);
  Txt2ImgHooks hooks;
  hooks.observer = &ref_grab;
  generate(models, Txt2ImgSessions::create(models), req, hooks);
  hooks.observer = &half_grab;
  generate(models, Txt2ImgSessions::create(models, SessionOptions{Precision::kFp16}), req, hooks);
  return {std::move(ref_grab.value), std::move(half_grab.value)};
}

TEST(Evaluator, LockstepErrorsAreExactAndAnIdenticalVariantHasNone) {
  const RunSpec spec = tiny_sd_spec(
      1, 3,
      {precision("fp32", Precision::kFp32), precision("same", Precision::kFp32), precision("fp16", Precision::kFp16)});
  const RunResult r = run(spec);
  ASSERT_EQ(r.units.size(), 1u);
  const SampleOutcome& s = r.units[0].samples[0];
  EXPECT_TRUE(s.variants[1].identical);
  EXPECT_FALSE(s.variants[2].identical);
  ASSERT_FALSE(s.variants[2].metrics.empty());
  EXPECT_EQ(s.variants[2].metrics[0].key, "psnr_db");
  EXPECT_GT(*s.variants[2].metrics[0].value, 40.0);

  const LayerSpace& space = *r.observation.space;
  const int unet = space.model_index("unet");
  ASSERT_GE(unet, 0);
  std::size_t compared = 0, fp16_differs = 0, local_measured = 0;
  for (std::size_t l = 0; l < space.layers(); ++l)
    for (int t = 0; t < space.cells_of(l); ++t) {
      const LayerCell* same = r.layers[1].find(l, t);
      const LayerCell* half = r.layers[2].find(l, t);
      if (!same || same->acc.calls == 0) continue;
      ++compared;
      EXPECT_EQ(same->acc.err_sq, 0.0) << space.node_of(l).name;  // same graph, same options: same bits
      EXPECT_EQ(same->local().err_sq, 0.0) << space.node_of(l).name;
      EXPECT_EQ(same->act, r.layers[0].find(l, t)->act);  // and the same drift statistics
      fp16_differs += half->acc.err_sq > 0;
      local_measured += half->local().calls > 0;
    }
  EXPECT_GT(compared, 1000u);
  EXPECT_GT(fp16_differs, compared / 2);
  EXPECT_GT(local_measured, compared / 2);

  // The accumulated error of a node at step 1 is the error between two separate generate() runs.
  const std::string node = "/down_blocks.1/resnets.0/conv2/Conv";
  const Txt2ImgModels models = Txt2ImgModels::load(spec.pipeline);
  const auto [ref_value, half_value] = grab_fp32_fp16(models, r.units[0].samples[0].prompt, 3, node, 1);
  const auto e = metrics::tensor_error(ref_value, half_value);
  std::size_t layer = space.layers();
  for (std::size_t l = 0; l < space.layers(); ++l)
    if (space.node_of(l).name == node && int(space.model_of(l)) == unet) layer = l;
  ASSERT_LT(layer, space.layers());
  const LayerCell* cell = r.layers[2].find(layer, 1);
  ASSERT_TRUE(cell);
  EXPECT_EQ(cell->acc.calls, 1u);
  // The observer's one-pass energies (float lanes of <= 8 terms, then double): ~1e-7 relative.
  EXPECT_NEAR(cell->acc.err_sq, e.sum_err_sq, 1e-6 * e.sum_err_sq);
  EXPECT_NEAR(cell->acc.ref_sq, e.sum_ref_sq, 1e-6 * e.sum_ref_sq);
  EXPECT_NEAR(cell->acc.max_abs, e.max_abs, 1e-6 * e.max_abs);
  // Local error (the node alone on the reference's input) is below the accumulated error there.
  EXPECT_GT(cell->local().err_sq, 0.0);
  EXPECT_LT(cell->local().err_sq, cell->acc.err_sq);

  // Teacher forcing: at step 0 every variant starts from the same latent (equal to free-running);
  // later the free-running noise prediction error includes the drift.
  const auto& series = r.series[2];
  ASSERT_EQ(series.size(), 3u);
  EXPECT_EQ(series[2].mode, "teacher-forced");
  EXPECT_EQ(series[0].steps[0], series[2].steps[0]);
  EXPECT_GT(series[0].steps[2].err_sq, series[2].steps[2].err_sq);
  EXPECT_TRUE(r.series[1].empty() || r.series[1][0].steps[2].err_sq == 0.0);
  EXPECT_FALSE(r.first_nonfinite[0]);  // the text encoder's causal mask (-inf) is not an anomaly
}

TEST(Evaluator, ResultsAreIdenticalForAnyThreadCount) {
  const RunSpec spec = tiny_sd_spec(3, 2, {precision("fp32", Precision::kFp32), precision("bf16", Precision::kBf16)});
  const RunResult one = run(spec, 1), two = run(spec, 2);
  ASSERT_EQ(one.units.size(), 3u);
  ASSERT_EQ(two.units.size(), 3u);
  for (std::size_t v = 0; v < 2; ++v) {
    EXPECT_TRUE(one.layers[v] == two.layers[v]) << v;
    ASSERT_EQ(one.series[v].size(), two.series[v].size());
    for (std::size_t k = 0; k < one.series[v].size(); ++k) EXPECT_EQ(one.series[v][k].steps, two.series[v][k].steps);
  }
  for (std::size_t u = 0; u < 3; ++u) {
    const auto& a = one.units[u].samples[0].variants[1].metrics;
    const auto& b = two.units[u].samples[0].variants[1].metrics;
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t k = 0; k < a.size(); ++k) EXPECT_EQ(a[k].value, b[k].value);
  }
}

// The variants' UNet calls run node by node beside the reference's (borrowing its values) or one
// after the other (copying them): the same statistics to the bit, also for a Q/DQ graph whose node
// order differs from the reference's, with local error and teacher forcing.
TEST(Evaluator, InterleavedModelCallsGiveTheSameResultsAsOneAfterTheOther) {
  testing::ScratchDir cache("run-interleave-cache");
  const VariantSpec int8 = int8_level3();
  RunSpec spec = tiny_sd_spec(1, 2, {precision("fp32", Precision::kFp32), precision("fp16", Precision::kFp16), int8});
  spec.calibration.count = 2;
  spec.calibration.cache = cache.path();
  const RunResult a = run(spec, 1, true), b = run(spec, 1, false);
  std::size_t layers = 0;
  for (std::size_t v = 0; v < 3; ++v) {
    expect_same_cells(a, b, v);
    for (std::size_t l = 0; l < a.layers[v].layers(); ++l) layers += a.layers[v].has(l);
    ASSERT_EQ(a.series[v].size(), b.series[v].size());
    for (std::size_t k = 0; k < a.series[v].size(); ++k) EXPECT_EQ(a.series[v][k].steps, b.series[v][k].steps);
    EXPECT_EQ(a.first_nonfinite[v], b.first_nonfinite[v]);
    const auto& x = a.units[0].samples[0].variants[v].metrics;
    const auto& y = b.units[0].samples[0].variants[v].metrics;
    ASSERT_EQ(x.size(), y.size());
    for (std::size_t k = 0; k < x.size(); ++k) EXPECT_EQ(x[k].value, y[k].value);
  }
  EXPECT_GT(layers, 2000u);  // layers with statistics, over the three variants
  // The int8 variant's layers were compared and re-run locally.
  std::size_t compared = 0, local = 0;
  for (std::size_t l = 0; l < a.layers[2].layers(); ++l)
    for (int t = 0; a.layers[2].has(l) && t < a.observation.space->cells_of(l); ++t) {
      compared += a.layers[2].find(l, t)->acc.calls > 0;
      local += a.layers[2].find(l, t)->local().calls > 0;
    }
  EXPECT_GT(compared, 1000u);
  EXPECT_GT(local, 200u);

  // Without local error the reference's execution does not retain its values: each goes back to
  // the pool once the variants' matching nodes have read it. Catching up only every 16 reference
  // nodes makes the reference release many values before the variants read them: the capture
  // holds them from views and takes them over on release (thousands per call).
  spec.observe.local_error = false;
  const RunResult c = run(spec, 1, true), d = run(spec, 1, false), e = run(spec, 1, true, 16);
  for (std::size_t v = 0; v < 3; ++v) {
    EXPECT_TRUE(c.layers[v] == d.layers[v]) << v;
    EXPECT_TRUE(c.layers[v] == e.layers[v]) << v;
    for (std::size_t k = 0; k < c.series[v].size(); ++k) {
      EXPECT_EQ(c.series[v][k].steps, d.series[v][k].steps);
      EXPECT_EQ(c.series[v][k].steps, e.series[v][k].steps);
    }
    for (std::size_t l = 0; l < c.layers[v].layers(); ++l)
      for (int t = 0; c.layers[v].has(l) && t < c.observation.space->cells_of(l); ++t) {
        // The same accumulated error as the run with local error, which retained every value.
        ASSERT_TRUE(a.layers[v].find(l, t) && c.layers[v].find(l, t)) << v << " " << l;
        EXPECT_TRUE(a.layers[v].find(l, t)->acc == c.layers[v].find(l, t)->acc) << v << " " << l;
        EXPECT_TRUE(a.layers[v].find(l, t)->act == c.layers[v].find(l, t)->act) << v << " " << l;
      }
  }
}

// A variant's elementwise chains stream their intermediates' statistics (never written whole):
// the same cells as a run with a node hook, which sees every node's output and so streams nothing.
TEST(Evaluator, StreamedChainStatisticsEqualThoseOfWrittenOutputs) {
  testing::ScratchDir cache("run-stream-cache");
  const VariantSpec int8 = int8_level3();
  RunSpec spec = tiny_sd_spec(1, 2, {precision("fp32", Precision::kFp32), precision("fp16", Precision::kFp16), int8});
  spec.calibration.count = 2;
  spec.calibration.cache = cache.path();
  spec.observe.local_error = false;
  const auto driver = make_run_driver(spec);
  EvaluatorOptions o;
  o.workers = 1;
  RunResult streamed = start_run(spec, *driver, build_variants(spec, *driver), o);
  RunResult written = start_run(spec, *driver, build_variants(spec, *driver), o);
  std::size_t events = 0;
  written.observation.node_hook = [&](const std::string&, const ModelCall&, const NodeEvent&) { ++events; };
  tbb::task_arena arena(1);
  arena.execute([&] {
    run_units(spec, *driver, streamed, o);
    run_units(spec, *driver, written, o);
  });
  EXPECT_GT(events, 1000u);
  for (std::size_t v = 0; v < 3; ++v) EXPECT_TRUE(streamed.layers[v] == written.layers[v]) << v;
}

// On a device backend every observer sees the values in device memory (qeval run's shape hook
// reads shapes alone): the fake device (tests/eval/fake_device.h) refuses host access to them, so
// a path that reads device bytes on the host throws; its kernels are the CPU ops, so the
// statistics, accumulated and local error must be the CPU run's, bit for bit.
TEST(Evaluator, ObservedRunOnADeviceReadsNoDeviceBytesOnTheHostAndGivesTheCpuStatistics) {
  testing::ScratchDir cache("run-device-cache");
  const VariantSpec int8 = int8_level3();
  RunSpec sam;  // segmentation: its calls in lockstep, local runs as soon as their inputs exist
  sam.pipeline = testing::source_dir() / "models" / "tiny-sam";
  sam.kind = "segmentation";
  sam.count = 2;
  for (RunSpec spec : {tiny_sd_spec(1, 2, {precision("fp32", Precision::kFp32)}), sam}) {
    SCOPED_TRACE(spec.pipeline.filename().string());
    spec.variants = {precision("fp32", Precision::kFp32), precision("fp16", Precision::kFp16), int8};
    spec.reference = "fp32";
    spec.calibration.count = 2;
    spec.calibration.cache = cache.path();
    spec.observe.local_error = true;
    const auto driver = make_run_driver(spec);
    EvaluatorOptions o;
    o.workers = 1;
    auto observed = [&](bool interleave) {
      o.interleave = interleave;  // false: the variants' calls one after the other, the capture copying
      RunResult r = start_run(spec, *driver, build_variants(spec, *driver), o);
      r.observation.node_hook = [](const std::string&, const ModelCall&, const NodeEvent&) {};
      r.observation.node_hook_reads_values = false;
      tbb::task_arena(1).execute([&] { run_units(spec, *driver, r, o); });
      return r;
    };
    const RunResult cpu = observed(true);
    // Every node on the device (with nodes on the CPU between them, a view there does not find
    // its input's statistics by address and computes its own: the same values, other sampled bins).
    const auto fake = std::make_shared<testing_fake::FakeDeviceBackend>(false);
    set_default_backend(fake);
    struct Restore {
      ~Restore() { set_default_backend(nullptr); }
    } restore;
    const RunResult device = observed(true), device_in_turn = observed(false);
    EXPECT_GT(fake->device_runs, 1000);
    const LayerSpace& space = *cpu.observation.space;
    for (std::size_t v = 0; v < 3; ++v) {
      expect_same_cells(cpu, device, v);
      expect_same_cells(cpu, device_in_turn, v);
      std::size_t local = 0;
      for (std::size_t l = 0; l < space.layers(); ++l)
        for (int t = 0; t < space.cells_of(l); ++t)
          if (const LayerCell* a = cpu.layers[v].find(l, t)) local += a->local().calls > 0;
      if (v) EXPECT_GT(local, 20u) << v;
    }
  }
}

// Views (Reshape, Transpose, ...) take their input's statistics instead of computing them: they
// must be what computing them on the view's own output gives.
TEST(Evaluator, ViewStatisticsEqualThoseOfTheirOwnOutput) {
  const RunSpec spec = tiny_sd_spec(1, 2, {precision("fp32", Precision::kFp32), precision("fp16", Precision::kFp16)});
  const RunResult r = run(spec);
  const LayerSpace& space = *r.observation.space;
  const int unet = space.model_index("unet");
  ASSERT_GE(unet, 0);
  const Txt2ImgModels models = Txt2ImgModels::load(spec.pipeline);
  std::size_t checked = 0;
  for (const std::string op : {"Reshape", "Transpose"}) {
    // The first such node of the UNet that reads another node's float output.
    std::size_t layer = space.layers();
    for (std::size_t l = 0; l < space.layers() && layer == space.layers(); ++l)
      if (int(space.model_of(l)) == unet && space.node_of(l).op_type == op && r.layers[0].has(l) &&
          r.layers[0].find(l, 1)->act.calls > 0)
        layer = l;
    ASSERT_LT(layer, space.layers()) << op;
    const std::string node = space.node_of(layer).name;
    const auto [ref_value, half_value] = grab_fp32_fp16(models, r.units[0].samples[0].prompt, 2, node, 1);
    metrics::ActivationStats direct;
    direct.add(ref_value.data<float>(), ref_value.numel());
    const metrics::ActivationStats& seen = r.layers[0].find(layer, 1)->act;
    EXPECT_EQ(seen.count, direct.count) << node;
    EXPECT_EQ(seen.absmax, direct.absmax) << node;
    EXPECT_NEAR(seen.sum_sq, direct.sum_sq, 1e-6 * direct.sum_sq) << node;
    if (op == "Reshape") {
      EXPECT_EQ(seen.abs_hist, direct.abs_hist) << node;  // same values, same order
    }
    const metrics::TensorError e = metrics::tensor_error(ref_value, half_value);
    const metrics::ErrorStats& acc = r.layers[1].find(layer, 1)->acc;
    EXPECT_EQ(acc.calls, 1u) << node;
    EXPECT_NEAR(acc.err_sq, e.sum_err_sq, 1e-6 * e.sum_err_sq) << node;
    EXPECT_NEAR(acc.max_abs, e.max_abs, 1e-6 * e.max_abs) << node;
    ++checked;
  }
  EXPECT_EQ(checked, 2u);
}

TEST(Evaluator, Txt2ImgRecipeVariantIsCalibratedPerStepAndQuantizesTheUnet) {
  testing::ScratchDir cache("run-recipe-cache");
  const VariantSpec int8 = int8_level3();
  RunSpec spec = tiny_sd_spec(1, 2, {precision("fp32", Precision::kFp32), int8});
  spec.calibration.count = 2;
  spec.calibration.cache = cache.path();
  spec.observe.models = {"unet"};
  spec.observe.local_error = false;
  const RunResult r = run(spec);
  const BuiltVariant& v = r.variants[1];
  EXPECT_EQ(v.kind, reports::VariantKind::kRecipe);
  EXPECT_FALSE(v.calibration_cache_hit);
  EXPECT_NE(v.graphs.at("unet"), r.variants[0].graphs.at("unet"));
  EXPECT_EQ(v.graphs.at("vae_decoder"), r.variants[0].graphs.at("vae_decoder"));
  // Quantized layers carry their quantizer ranges; the drift statistics count clipping there.
  const ObservedModel& om = r.observation.variants[1].models[0];
  std::size_t ranged = 0, int8_nodes = 0;
  for (std::size_t i = 0; i < om.clip_amax.size(); ++i) {
    ranged += std::isfinite(om.clip_amax[i]) && om.layer_of_node[i] >= 0;
    int8_nodes += om.format[i] == "int8";
  }
  EXPECT_GT(ranged, 20u);
  EXPECT_GT(int8_nodes, 50u);
  EXPECT_GT(om.match.plumbing, 100u);
  EXPECT_TRUE(om.match.unmatched.empty());
  const auto& m = r.units[0].samples[0].variants[1].metrics;
  EXPECT_GT(*m[0].value, 15.0);  // PSNR dB: quantized, but the image survives
  // Calibrated once: the second build reads the cache.
  const auto driver = make_run_driver(spec);
  EXPECT_TRUE(build_variants(spec, *driver)[1].calibration_cache_hit);
}

TEST(Evaluator, SegmentationComparesMasksPerPrompt) {
  RunSpec spec;
  spec.pipeline = testing::source_dir() / "models" / "tiny-sam";
  spec.kind = "segmentation";
  spec.count = 5;
  spec.variants = {precision("fp32", Precision::kFp32), precision("fp16", Precision::kFp16)};
  spec.reference = "fp32";
  const RunResult r = run(spec);
  std::size_t samples = 0;
  for (const auto& u : r.units) samples += u.samples.size();
  EXPECT_EQ(samples, 5u);
  EXPECT_LT(r.units.size(), 5u);  // prompts on the same image share one unit (one encoding)
  const auto& m = r.units[0].samples[0].variants[1].metrics;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0].key, "mask_iou");
  EXPECT_EQ(m[4].key, "output_nonfinite");
  EXPECT_EQ(*m[4].value, 0.0);
  EXPECT_GT(*m[0].value, 0.95);
  EXPECT_GT(*m[2].value, 20.0);  // logit SQNR dB
  EXPECT_GE(r.observation.space->model_index("image_encoder"), 0);
  EXPECT_GE(r.observation.space->model_index("mask_decoder"), 0);
}

// Segmentation's encoder and decoder calls run node by node beside the reference's (the capture
// borrowing its values, local error node by node) or one after the other (copying them): the same
// statistics to the bit, local error of the int8 recipe's and the FP16 variant's layers included.
TEST(Evaluator, SegmentationCallsInLockstepGiveTheSameResultsAsOneAfterTheOther) {
  testing::ScratchDir cache("run-segmentation-lockstep-cache");
  const VariantSpec int8 = int8_level3();
  RunSpec spec;
  spec.pipeline = testing::source_dir() / "models" / "tiny-sam";
  spec.kind = "segmentation";
  spec.count = 4;
  spec.calibration.count = 4;
  spec.calibration.cache = cache.path();
  spec.variants = {precision("fp32", Precision::kFp32), precision("fp16", Precision::kFp16), int8};
  spec.reference = "fp32";
  const RunResult a = run(spec, 1, true), b = run(spec, 1, false), c = run(spec, 1, true, 16);
  ASSERT_EQ(a.units.size(), b.units.size());
  for (std::size_t v = 0; v < 3; ++v) {
    EXPECT_TRUE(a.layers[v] == b.layers[v]) << v;
    EXPECT_TRUE(a.layers[v] == c.layers[v]) << v;
    for (std::size_t u = 0; u < a.units.size(); ++u)
      for (std::size_t k = 0; k < a.units[u].samples.size(); ++k) {
        const auto& x = a.units[u].samples[k].variants[v].metrics;
        const auto& y = b.units[u].samples[k].variants[v].metrics;
        ASSERT_EQ(x.size(), y.size());
        for (std::size_t m = 0; m < x.size(); ++m) EXPECT_EQ(x[m].value, y[m].value) << v << " " << m;
      }
  }
  for (std::size_t v = 1; v < 3; ++v) {
    std::size_t local = 0;
    for (std::size_t l = 0; l < a.layers[v].layers(); ++l)
      for (int t = 0; a.layers[v].has(l) && t < a.observation.space->cells_of(l); ++t)
        local += a.layers[v].find(l, t)->local().calls > 0;
    EXPECT_GT(local, 20u) << v;  // both models' layers re-run locally
  }
}

}  // namespace
}  // namespace qeval::eval
