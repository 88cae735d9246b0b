#include "eval/quant/calibrate.h"

#include <gtest/gtest.h>

#include <cmath>

#include "base/json_config.h"
#include "eval/fake_device.h"
#include "eval/quant/device_calibration.h"
#include "eval/quant/mini_block.h"
#include "kernels/error.h"
#include "test_util.h"

namespace qeval::eval::quant {
namespace {

Recipe recipe(const std::string& body) { return parse_recipe(base::JsonConfig::parse("{" + body + "}", "r.json")); }

std::map<std::string, Tensor> sample(unsigned seed, float scale = 1.0f) {
  auto v = testing::seeded_values(32, seed, scale);
  return {{"sample", testing::floats({1, 2, 4, 4}, v)},
          {"temb", testing::floats({1, 3}, testing::seeded_values(3, seed + 1000, 1.0f))}};
}

// Captures every node input's |x| max and per-channel max (last axis) over runs.
struct Capture : Observer {
  std::map<std::string, float> amax;
  std::map<std::string, std::vector<float>> channel_amax;
  void on_node(const NodeEvent& e) override {
    for (std::size_t i = 0; i < e.inputs.size(); ++i) {
      const Tensor* t = e.inputs[i];
      if (!t || t->dtype() != DType::kFloat32 || t->rank() == 0) continue;
      const std::string key = e.node.name + ":" + std::to_string(i);
      const auto k = static_cast<std::size_t>(t->shape().back());
      auto& ch = channel_amax[key];
      ch.resize(k, 0.0f);
      float& m = amax[key];
      const auto v = t->span<float>();
      for (std::size_t j = 0; j < v.size(); ++j) {
        m = std::max(m, std::fabs(v[j]));
        ch[j % k] = std::max(ch[j % k], std::fabs(v[j]));
      }
    }
  }
};

// A diffusion-like set: `calls` x `steps` runs, the sample scaled per (call, step).
class SteppedSet : public CalibrationSet {
 public:
  explicit SteppedSet(std::vector<std::vector<float>> amax) : amax_(std::move(amax)) {}
  std::string fingerprint() const override { return "stepped"; }
  std::string describe() const override { return "stepped"; }
  int run(const Graph& g, RangeCollector& c) override {
    Session s(g);
    for (std::size_t call = 0; call < amax_.size(); ++call)
      for (std::size_t t = 0; t < amax_[call].size(); ++t) {
        auto in = sample(static_cast<unsigned>(call * 100 + t));
        // Rescale the sample so its |x| max is exactly amax_[call][t].
        auto v = in.at("sample").span<float>();
        float m = 0;
        for (float x : v) m = std::max(m, std::fabs(x));
        for (float& x : v) x = x / m * amax_[call][t];
        c.set_step(static_cast<int>(t));
        s.run(in, &c);
      }
    return static_cast<int>(amax_[0].size());
  }

 private:
  std::vector<std::vector<float>> amax_;
};

const ActivationRange& range(const CalibrationResult& r, const std::string& node, std::size_t input = 0) {
  const ActivationRange* a = r.find(node, input);
  if (!a) throw std::runtime_error("no range for " + node);
  return *a;
}

TEST(Calibrate, MaxCalibrationSeesEveryQuantizedInput) {
  const Graph g = testing::mini_unet_block().graph();
  const Recipe r = recipe(R"("format": "int8", "level": 4, "calibration": {"method": "max"})");
  const Selection sel = select_nodes(g, r);
  TensorCalibrationSet set({sample(1), sample(2), sample(3, 2.0f)});
  const CalibrationResult res = calibrate(g, sel, r, set);
  Capture cap;
  Session s(g);
  for (unsigned i : {1u, 2u}) s.run(sample(i), &cap);
  s.run(sample(3, 2.0f), &cap);
  ASSERT_EQ(res.activations.size(), 12u);  // 8 single-input nodes + 2 attention MatMuls x 2
  for (const auto& a : res.activations) {
    EXPECT_EQ(a.amax, cap.amax.at(a.node + ":" + std::to_string(a.input))) << a.node << " " << a.input;
    ASSERT_EQ(a.step_max.size(), 1u);
    EXPECT_EQ(a.step_max[0], a.amax);
  }
  EXPECT_EQ(range(res, "/attn/attn1/MatMul_1", 0).role, "softmax");
  EXPECT_LE(range(res, "/attn/attn1/MatMul_1", 0).amax, 1.0f);
  EXPECT_EQ(res.calls, 3);
  EXPECT_EQ(res.total_steps, 1);
  EXPECT_EQ(res.model_fingerprint, graph_fingerprint(g));
  EXPECT_EQ(res.data_fingerprint, set.fingerprint());
  EXPECT_NE(set.fingerprint(), TensorCalibrationSet({sample(1)}).fingerprint());
}

TEST(Calibrate, PercentileReducesPerStepAmaxLikeModelOpt) {
  const Graph g = testing::mini_unet_block().graph();
  // conv_in reads the sample itself, so its per-call amax is what SteppedSet sets.
  const std::vector<std::vector<float>> amax{{4.0f, 3.0f, 2.0f, 1.5f}, {6.0f, 2.0f, 2.5f, 1.0f}};
  auto run = [&](const std::string& cal) {
    const Recipe r = recipe(R"("format": "int8", "level": 1, "default_exclusions": false, "calibration": )" + cal);
    SteppedSet set(amax);
    return range(calibrate(g, select_nodes(g, r), r, set), "/conv_in/Conv");
  };
  // min-mean over all 4 steps: means 5, 2.5, 2.25, 1.25 -> 1.25.
  EXPECT_FLOAT_EQ(run(R"({"method": "percentile", "percentile": 1.0, "collect": "min-mean"})").amax, 1.25f);
  // first int(4 * 0.5) = 2 steps: min-mean -> 2.5; mean-max: (6 + 3) / 2; global_min -> 2; min-max -> 3.
  EXPECT_FLOAT_EQ(run(R"({"method": "percentile", "percentile": 0.5, "collect": "min-mean"})").amax, 2.5f);
  EXPECT_FLOAT_EQ(run(R"({"method": "percentile", "percentile": 0.5, "collect": "mean-max"})").amax, 4.5f);
  EXPECT_FLOAT_EQ(run(R"({"method": "percentile", "percentile": 0.5, "collect": "global_min"})").amax, 2.0f);
  EXPECT_FLOAT_EQ(run(R"({"method": "percentile", "percentile": 0.5, "collect": "min-max"})").amax, 3.0f);
  const ActivationRange mx = run(R"({"method": "max"})");
  EXPECT_FLOAT_EQ(mx.amax, 6.0f);
  EXPECT_EQ(mx.step_max, (std::vector<float>{6.0f, 3.0f, 2.5f, 1.5f}));
  EXPECT_EQ(mx.step_mean, (std::vector<float>{5.0f, 2.5f, 2.25f, 1.25f}));
}

TEST(Calibrate, HistogramMethodsClipBelowTheMaximum) {
  const Graph g = testing::mini_unet_block().graph();
  std::vector<std::map<std::string, Tensor>> samples;
  for (unsigned i = 0; i < 8; ++i) samples.push_back(sample(i));
  for (const char* method : {"entropy", "mse"}) {
    const Recipe r = recipe(std::string(R"("format": "int8", "level": 3, "calibration": {"method": ")") + method +
                            R"(", "num_bins": 256, "start_bin": 32})");
    TensorCalibrationSet set(samples);
    const CalibrationResult res = calibrate(g, select_nodes(g, r), r, set);
    for (const auto& a : res.activations) {
      EXPECT_GT(a.amax, 0.0f) << method << " " << a.node;
      // A bin edge or centre: at most one bin (1/256 of the first batch's range) above the max.
      EXPECT_LE(a.amax, a.step_max[0] * 1.01f) << method << " " << a.node;
    }
  }
}

TEST(Calibrate, SmoothQuantScalesFollowModelOptsFormula) {
  const Graph g = testing::mini_unet_block().graph();
  const Recipe r =
      recipe(R"("format": "int8", "level": 3, "calibration": {"method": "max"}, "smoothquant": {"alpha": 0.8})");
  const Selection sel = select_nodes(g, r);
  TensorCalibrationSet set({sample(1), sample(2)});
  const CalibrationResult res = calibrate(g, sel, r, set);
  Capture cap;
  Session s(g);
  s.run(sample(1), &cap);
  s.run(sample(2), &cap);
  EXPECT_EQ(res.smoothing.size(), 8u - 1u);  // every selected linear layer (not conv1)
  const Smoothing* sm = res.smoothing_for("/attn/attn1/to_q/MatMul");
  ASSERT_NE(sm, nullptr);
  const auto& x_amax = cap.channel_amax.at("/attn/attn1/to_q/MatMul:0");
  const Tensor& w = g.initializers.at("to_q");  // [K=4, N=4]
  float expected_amax = 0;
  for (std::size_t j = 0; j < 4; ++j) {
    float w_amax = 0;
    for (std::size_t n = 0; n < 4; ++n) w_amax = std::max(w_amax, std::fabs(w.data<float>()[j * 4 + n]));
    const double s_j = std::pow(double(x_amax[j]), 0.8) / std::pow(double(w_amax), 0.2);
    EXPECT_NEAR(sm->scale[j], s_j, 1e-5 * s_j) << j;
    expected_amax = std::max(expected_amax, x_amax[j] * (1.0f / sm->scale[j]));
  }
  EXPECT_FLOAT_EQ(range(res, "/attn/attn1/to_q/MatMul").amax, expected_amax);
  // Gemm with transB: the input channel is the weight's axis 1.
  const Smoothing* gemm = res.smoothing_for("/block/emb_proj/Gemm");
  ASSERT_NE(gemm, nullptr);
  EXPECT_EQ(gemm->scale.size(), 3u);
}

TEST(Calibrate, AlphaSearchNeverLosesToNoSmoothing) {
  const Graph g = testing::mini_unet_block().graph();
  const Recipe r = recipe(R"("format": "int8", "level": 3, "calibration": {"method": "max"},
                             "smoothquant": {"alpha": "search", "alpha_grid": [0, 0.25, 0.5, 0.75, 1], "search_rows": 64})");
  std::vector<std::map<std::string, Tensor>> samples;
  for (unsigned i = 0; i < 6; ++i) samples.push_back(sample(i));
  TensorCalibrationSet set(samples);
  const CalibrationResult res = calibrate(g, select_nodes(g, r), r, set);
  ASSERT_EQ(res.smoothing.size(), 7u);
  for (const auto& [node, sm] : res.smoothing) {
    EXPECT_GT(sm.mse_unsmoothed, 0.0) << node;
    // No grid alpha is exactly "no smoothing", but the best of the grid should not be much worse.
    EXPECT_LE(sm.mse, sm.mse_unsmoothed * 1.5) << node;
    bool in_grid = false;
    for (double a : {0.0, 0.25, 0.5, 0.75, 1.0}) in_grid = in_grid || sm.alpha == a;
    EXPECT_TRUE(in_grid) << node << " alpha " << sm.alpha;
  }
}

TEST(Calibrate, CacheIsKeyedByRecipeModelAndDataAndReused) {
  const Graph g = testing::mini_unet_block().graph();
  testing::ScratchDir dir("calib-cache");
  const Recipe r = recipe(
      R"("format": "int8", "level": 2.5, "calibration": {"method": "percentile", "percentile": 1.0}, "smoothquant": {"alpha": 0.5})");
  TensorCalibrationSet set({sample(1), sample(2)});
  bool hit = true;
  const CalibrationResult first = calibrate_cached(g, select_nodes(g, r), r, set, dir.path(), &hit);
  EXPECT_FALSE(hit);
  const CalibrationResult second = calibrate_cached(g, select_nodes(g, r), r, set, dir.path(), &hit);
  EXPECT_TRUE(hit);
  EXPECT_EQ(first.to_json().dump(), second.to_json().dump());  // floats survive the JSON round trip
  const Recipe other =
      recipe(R"("format": "int8", "level": 2.5, "calibration": {"method": "max"}, "smoothquant": {"alpha": 0.5})");
  calibrate_cached(g, select_nodes(g, other), other, set, dir.path(), &hit);
  EXPECT_FALSE(hit);
  TensorCalibrationSet more({sample(1), sample(2), sample(3)});
  calibrate_cached(g, select_nodes(g, r), r, more, dir.path(), &hit);
  EXPECT_FALSE(hit);
  // A corrupt entry is recomputed and overwritten.
  const auto file = dir / (calibration_cache_key(r.fingerprint(), graph_fingerprint(g), set.fingerprint()) + ".json");
  testing::write_bytes(file, {'{', '}'});
  calibrate_cached(g, select_nodes(g, r), r, set, dir.path(), &hit);
  EXPECT_FALSE(hit);
  calibrate_cached(g, select_nodes(g, r), r, set, dir.path(), &hit);
  EXPECT_TRUE(hit);
}

TEST(Calibrate, BadScalesInACalibrationFileNameTheNode) {
  nlohmann::json j{{"format", "qeval.calibration"},
                   {"recipe_fingerprint", "a"},
                   {"model_fingerprint", "b"},
                   {"data_fingerprint", "c"},
                   {"total_steps", 1},
                   {"smoothquant", nlohmann::json::array()},
                   {"activations", {{{"node", "/conv1/Conv"}, {"input", 0}, {"role", "input"}, {"amax", 0.0}}}}};
  try {
    CalibrationResult::from_json(j, "scales.json");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "scales.json: activations[0] (node '/conv1/Conv' input 0): amax must be finite and > 0, got 0.0");
  }
}

// On a device backend the collector reads the values where they are (host copies where the
// device has no scan, as the fake's): the CPU's ranges and scales, bit for bit.
TEST(Calibrate, OnADeviceTheRangesAreTheCpus) {
  testing_device::expect_device_calibration_is_the_cpus(std::make_shared<testing_fake::FakeDeviceBackend>(false), 0);
}

}  // namespace
}  // namespace qeval::eval::quant
