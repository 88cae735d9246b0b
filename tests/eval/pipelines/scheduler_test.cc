// DDIM and Euler schedulers against tools/make_scheduler_goldens.py (diffusers' formulas in numpy).
#include <gtest/gtest.h>

#include <cmath>

#include "eval/pipelines/scheduler.h"
#include "kernels/error.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

using nlohmann::json;

SchedulerConfig config_of(const json& j) {
  SchedulerConfig c;
  c.type = parse_scheduler_type(j["type"]);
  c.num_train_timesteps = j["num_train_timesteps"];
  c.beta_start = j["beta_start"];
  c.beta_end = j["beta_end"];
  c.beta_schedule = j["beta_schedule"] == "linear" ? BetaSchedule::kLinear : BetaSchedule::kScaledLinear;
  c.prediction_type = j["prediction_type"] == "epsilon"        ? PredictionType::kEpsilon
                      : j["prediction_type"] == "v_prediction" ? PredictionType::kVPrediction
                                                               : PredictionType::kSample;
  c.timestep_spacing = parse_timestep_spacing(j["timestep_spacing"]);
  c.steps_offset = j["steps_offset"];
  c.set_alpha_to_one = j["set_alpha_to_one"];
  c.clip_sample = j["clip_sample"];
  c.clip_sample_range = j["clip_sample_range"];
  return c;
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

class SchedulerGoldens : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    goldens_ = new json(testing::read_json(testing::data_dir() / "tiny_sd" / "scheduler_goldens.json"));
  }
  static void TearDownTestSuite() { delete goldens_; }
  static json* goldens_;
};
json* SchedulerGoldens::goldens_ = nullptr;

TEST_F(SchedulerGoldens, TablesMatchNumpy) {
  const json& g = *goldens_;
  ASSERT_GE(g["cases"].size(), 20u);
  for (const json& c : g["cases"]) {
    SCOPED_TRACE(c["config"].dump() + " steps " + std::to_string(int(c["steps"])));
    const SchedulerConfig cfg = config_of(c["config"]);
    const Scheduler s(cfg, c["steps"]);
    for (const auto& [i, v] : c["alphas_cumprod_probe"].items())
      EXPECT_LE(rel(s.alphas_cumprod()[std::stoul(i)], v.get<double>()), 1e-14) << "alphas_cumprod[" << i << "]";
    ASSERT_EQ(s.timesteps().size(), c["timesteps"].size());
    for (std::size_t i = 0; i < s.timesteps().size(); ++i)
      EXPECT_EQ(s.timesteps()[i], c["timesteps"][i].get<double>()) << "timestep " << i;
    EXPECT_LE(rel(s.init_noise_sigma(), c["init_noise_sigma"]), 1e-12);
    if (cfg.type == SchedulerType::kDdim) {
      for (std::size_t i = 0; i < s.alpha_t().size(); ++i) {
        EXPECT_LE(rel(s.alpha_t()[i], c["alpha_t"][i]), 1e-14) << i;
        EXPECT_LE(rel(s.alpha_prev()[i], c["alpha_prev"][i]), 1e-14) << i;
      }
    } else {
      ASSERT_EQ(s.sigmas().size(), c["sigmas"].size());
      for (std::size_t i = 0; i < s.sigmas().size(); ++i)
        EXPECT_EQ(s.sigmas()[i], c["sigmas"][i].get<double>()) << "sigma " << i;  // both float32-rounded
    }
  }
}

TEST_F(SchedulerGoldens, StepsAndInputScalingMatchNumpy) {
  const json& g = *goldens_;
  const std::vector<float> x = g["sample"].get<std::vector<float>>();
  const std::vector<float> m = g["model_output"].get<std::vector<float>>();
  double worst = 0;
  for (const json& c : g["cases"]) {
    SCOPED_TRACE(c["config"].dump() + " steps " + std::to_string(int(c["steps"])));
    const Scheduler s(config_of(c["config"]), c["steps"]);
    const auto idx = c["step_indices"].get<std::vector<int>>();
    for (std::size_t k = 0; k < idx.size(); ++k) {
      std::vector<float> out(x.size());
      s.step(idx[k], m, x, out);
      const auto want = c["step_outputs"][k].get<std::vector<float>>();
      for (std::size_t e = 0; e < out.size(); ++e) {
        const double err = std::abs(double(out[e]) - want[e]) / std::max(1.0, std::abs(double(want[e])));
        worst = std::max(worst, err);
        ASSERT_LE(err, 1e-6) << "step " << idx[k] << " element " << e << ": " << out[e] << " vs " << want[e];
      }
      if (c.contains("model_input")) {
        std::vector<float> scaled(x.size());
        s.scale_model_input(idx[k], x, scaled);
        const auto want_in = c["model_input"][k].get<std::vector<float>>();
        for (std::size_t e = 0; e < scaled.size(); ++e) ASSERT_EQ(scaled[e], want_in[e]) << "model input " << e;
      }
    }
  }
  // Same float32 operations in the same order (pipelines/ compiles without FMA contraction): exact.
  EXPECT_EQ(worst, 0.0) << "worst";
}

TEST_F(SchedulerGoldens, Float64TablesStayCloseToDiffusersFloat32Ones) {
  // diffusers computes the schedule in float32; the numpy script measured the gap to float64.
  const json& gap = (*goldens_)["diffusers_float32_gap"];
  EXPECT_LT(gap["alphas_cumprod"].get<double>(), 1e-5);
  EXPECT_LT(gap["euler_sigmas"].get<double>(), 2e-4);
}

TEST(Scheduler, StableDiffusionDdimTimesteps) {
  const Scheduler s(SchedulerConfig{}, 20);  // SD 1.x: leading, steps_offset 1
  EXPECT_EQ(s.timesteps().front(), 951);
  EXPECT_EQ(s.timesteps().back(), 1);
  EXPECT_EQ(s.alpha_prev().back(), s.alphas_cumprod()[0]);  // set_alpha_to_one false
  EXPECT_EQ(s.model_input_divisor(3), 1.0);
}

TEST(Scheduler, EulerLinspaceStartsAtTheLargestSigma) {
  SchedulerConfig c;
  c.type = SchedulerType::kEulerDiscrete;
  c.timestep_spacing = TimestepSpacing::kLinspace;
  c.steps_offset = 0;
  const Scheduler s(c, 20);
  EXPECT_EQ(s.timesteps().front(), 999);
  EXPECT_EQ(s.timesteps().back(), 0);
  EXPECT_EQ(s.sigmas().back(), 0);
  EXPECT_NEAR(s.init_noise_sigma(), 14.6146, 1e-4);  // SD 1.x's sigma_max
  EXPECT_NEAR(s.model_input_divisor(0), std::sqrt(s.sigmas()[0] * s.sigmas()[0] + 1), 1e-5);
}

TEST(Scheduler, RejectsImpossibleStepCounts) {
  SchedulerConfig c;
  EXPECT_THROW(Scheduler(c, 0), InputError);
  EXPECT_THROW(Scheduler(c, 1001), InputError);
  try {
    Scheduler s(c, 1000);  // leading with steps_offset 1 reaches t = 1000
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("timestep 1000 outside [0, 1000)"), std::string::npos) << e.what();
  }
}

TEST(Scheduler, DdimStepWithEpsilonRecoversCleanSampleAtTheEnd) {
  // x_t = sqrt(a) x0 + sqrt(1 - a) eps with the true eps: one step to a_prev gives the exact
  // forward-process sample at a_prev.
  SchedulerConfig c;
  c.set_alpha_to_one = true;
  const Scheduler s(c, 10);
  const int last = s.steps() - 1;
  const double a = s.alpha_t()[std::size_t(last)];
  std::vector<float> x0 = {0.5f, -0.25f, 1.0f}, eps = {0.1f, 2.0f, -1.0f}, xt(3), out(3);
  for (int k = 0; k < 3; ++k)
    xt[std::size_t(k)] = float(std::sqrt(a) * x0[std::size_t(k)] + std::sqrt(1 - a) * eps[std::size_t(k)]);
  s.step(last, eps, xt, out);  // a_prev = 1: out = x0
  for (int k = 0; k < 3; ++k) EXPECT_NEAR(out[std::size_t(k)], x0[std::size_t(k)], 2e-6);
}

}  // namespace
}  // namespace qeval::eval
