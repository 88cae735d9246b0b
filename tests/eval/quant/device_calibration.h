// Calibration on a device backend against the CPU's (tests/eval/quant/calibrate_test.cc with the
// fake device, tests/gpu with CUDA): the same recipes over the same samples give the same ranges
// and SmoothQuant scales, within `rel` (0: the same bits).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "base/json_config.h"
#include "eval/exec/backend.h"
#include "eval/quant/calibrate.h"
#include "eval/quant/mini_block.h"
#include "test_util.h"

namespace qeval::eval::quant::testing_device {

inline void expect_near(double got, double want, double rel, const std::string& what) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what;
  } else if (rel == 0) {
    EXPECT_EQ(got, want) << what;
  } else {
    EXPECT_NEAR(got, want, rel * std::max(1e-30, std::fabs(want))) << what;
  }
}

inline void expect_device_calibration_is_the_cpus(const std::shared_ptr<Backend>& device, double rel) {
  const Graph g = testing::mini_unet_block().graph();
  std::vector<std::map<std::string, Tensor>> samples;
  for (unsigned seed = 1; seed <= 3; ++seed)
    samples.push_back({{"sample", testing::floats({1, 2, 4, 4}, testing::seeded_values(32, seed, 2.0f))},
                       {"temb", testing::floats({1, 3}, testing::seeded_values(3, seed + 1000, 1.0f))}});
  for (const char* body :
       {R"("format": "int8", "level": 3, "calibration": {"method": "percentile", "percentile": 1.0, "collect": "min-mean"}, "smoothquant": {"alpha": 0.8})",
        R"("format": "int8", "level": 4, "calibration": {"method": "entropy"})",
        R"("format": "int8", "level": 3, "calibration": {"method": "max"}, "smoothquant": {"alpha": "search", "alpha_grid": [0, 0.5, 1], "search_rows": 16})",
        R"("format": "fp8_e4m3", "level": 4, "calibration": {"method": "max"})"}) {
    SCOPED_TRACE(body);
    const Recipe recipe = parse_recipe(base::JsonConfig::parse(std::string("{") + body + "}", "r.json"));
    const Selection selection = select_nodes(g, recipe);
    TensorCalibrationSet cpu_set(samples), device_set(samples);
    const CalibrationResult want = calibrate(g, selection, recipe, cpu_set);
    set_default_backend(device);
    CalibrationResult got;
    try {
      got = calibrate(g, selection, recipe, device_set);
    } catch (...) {
      set_default_backend(nullptr);
      throw;
    }
    set_default_backend(nullptr);
    ASSERT_EQ(got.activations.size(), want.activations.size());
    for (std::size_t a = 0; a < want.activations.size(); ++a) {
      const ActivationRange &x = got.activations[a], &y = want.activations[a];
      const std::string what = y.node + ":" + std::to_string(y.input);
      expect_near(x.amax, y.amax, rel, what + " amax");
      ASSERT_EQ(x.step_max.size(), y.step_max.size()) << what;
      for (std::size_t s = 0; s < y.step_max.size(); ++s) {
        expect_near(x.step_max[s], y.step_max[s], rel, what + " step max");
        expect_near(x.step_mean[s], y.step_mean[s], rel, what + " step mean");
      }
    }
    ASSERT_EQ(got.smoothing.size(), want.smoothing.size());
    for (const auto& [node, sm] : want.smoothing) {
      const Smoothing* other = got.smoothing_for(node);
      ASSERT_NE(other, nullptr) << node;
      EXPECT_EQ(other->alpha, sm.alpha) << node;
      ASSERT_EQ(other->scale.size(), sm.scale.size()) << node;
      for (std::size_t j = 0; j < sm.scale.size(); ++j) expect_near(other->scale[j], sm.scale[j], rel, node + " scale");
    }
  }
}

}  // namespace qeval::eval::quant::testing_device
