#include "metrics/calibration.h"

#include <gtest/gtest.h>

#include "datasets/npy.h"
#include "test_util.h"

namespace qeval::metrics {
namespace {

std::filesystem::path dir() { return testing::data_dir() / "calibration"; }

// Golden values: tools/make_calibration_goldens.py (numpy/scipy reimplementation of
// pytorch-quantization's histogram calibrator and ModelOpt's percentile calibrator).
TEST(Calibration, HistogramEntropyAndMseMatchTheNumpyReference) {
  const auto golden = testing::read_json(dir() / "golden.json");
  AbsHistogram hist(2048);
  for (int i = 0; i < 3; ++i) {
    const Tensor t = datasets::read_npy(dir() / ("batch" + std::to_string(i) + ".npy"));
    hist.collect(t.span<float>());
  }
  ASSERT_EQ(hist.counts().size(), golden["histogram"]["bins"].get<std::size_t>());  // grew from 2048
  EXPECT_DOUBLE_EQ(hist.width(), golden["histogram"]["width"].get<double>());
  double total = 0, weighted = 0;
  for (std::size_t i = 0; i < hist.counts().size(); ++i) {
    total += hist.counts()[i];
    weighted += hist.counts()[i] * static_cast<double>(i);
  }
  EXPECT_EQ(total, golden["histogram"]["total"].get<double>());
  EXPECT_EQ(weighted, golden["histogram"]["weighted_index_sum"].get<double>());

  const auto edges = hist.edges();
  EXPECT_DOUBLE_EQ(entropy_amax(hist.counts(), edges), golden["entropy"]["default"].get<double>());
  EXPECT_DOUBLE_EQ(entropy_amax(hist.counts(), edges, 8, 4, 256), golden["entropy"]["stride4_start256"].get<double>());
  EXPECT_DOUBLE_EQ(mse_amax(hist.counts(), edges), golden["mse"]["default"].get<double>());
  EXPECT_DOUBLE_EQ(mse_amax(hist.counts(), edges, 3, 64), golden["mse"]["stride3_start64"].get<double>());
}

TEST(Calibration, EntropyClipsOutliersAndKeepsDenseRanges) {
  // A uniform |x| distribution: nothing to clip, the full range wins.
  std::vector<float> uniform(20000);
  for (std::size_t i = 0; i < uniform.size(); ++i) uniform[i] = static_cast<float>(i % 1000) / 999.0f;
  AbsHistogram u(2048);
  u.collect(uniform);
  EXPECT_NEAR(entropy_amax(u.counts(), u.edges()), 1.0, 1e-3);
  // An exponential tail: the KL optimum clips it well below the maximum.
  std::mt19937 rng(7);
  std::exponential_distribution<float> expo(1.0f);
  std::vector<float> tail(100000);
  for (auto& v : tail) v = expo(rng);
  AbsHistogram t(2048);
  t.collect(tail);
  const double amax = entropy_amax(t.counts(), t.edges());
  EXPECT_LT(amax, 0.8 * t.max_value());
  EXPECT_GT(amax, 4.0);  // P(|x| > 4) = 1.8%: not clipped away
  // MSE keeps even less range than KL on the same tail.
  EXPECT_LT(mse_amax(t.counts(), t.edges()), t.max_value());
}

TEST(Calibration, HistogramIgnoresNanAndWaitsForANonZeroRange) {
  AbsHistogram h(4);
  const std::vector<float> zeros{0, 0, 0};
  h.collect(zeros);
  EXPECT_TRUE(h.counts().empty());
  const std::vector<float> values{std::nanf(""), -4.0f, 1.0f, 0.5f};
  h.collect(values);
  ASSERT_EQ(h.counts().size(), 4u);
  EXPECT_EQ(h.width(), 1.0);
  EXPECT_EQ(h.counts()[0], 4.0);  // three early zeros and 0.5
  EXPECT_EQ(h.counts()[1], 1.0);
  EXPECT_EQ(h.counts()[3], 1.0);  // the maximum lands in the last bin
  const std::vector<float> wider{6.5f};
  h.collect(wider);
  EXPECT_EQ(h.counts().size(), 7u);
  EXPECT_EQ(h.counts()[6], 1.0);
}

TEST(Calibration, PercentileStepReductionMatchesTheNumpyReference) {
  const auto golden = testing::read_json(dir() / "golden.json")["steps"];
  StepAmaxCollector c;
  for (const auto& call : golden["amax"])
    for (std::size_t t = 0; t < call.size(); ++t) c.collect(static_cast<int>(t), call[t].get<double>());
  const int total = golden["total_step"].get<int>();
  int checked = 0;
  for (const auto& cs : golden["cases"]) {
    const std::string m = cs["method"];
    const CollectMethod method = m == "min-mean"     ? CollectMethod::kMinMean
                                 : m == "mean-max"   ? CollectMethod::kMeanMax
                                 : m == "global_min" ? CollectMethod::kGlobalMin
                                                     : CollectMethod::kMinMax;
    EXPECT_NEAR(c.percentile_amax(total, cs["percentile"].get<double>(), method), cs["amax"].get<double>(), 1e-12)
        << m << " " << cs["percentile"];
    ++checked;
  }
  EXPECT_EQ(checked, 16);
  EXPECT_EQ(StepAmaxCollector().percentile_amax(10, 1.0, CollectMethod::kMinMax), 0.0);
}

}  // namespace
}  // namespace qeval::metrics
