// Gate files: strict parsing, statistics, per-pair share, error budget, explained verdicts.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "eval/run/gate.h"
#include "kernels/error.h"

namespace qeval::eval {
namespace {

std::string parse_error(const std::string& text) {
  try {
    parse_gate(text, "g.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Gate, ParsesTheDocumentedFormat) {
  Gate g = parse_gate(R"({"description": "release",
    "checks": [{"metric": "ssim", "stat": "mean", "min": 0.95},
               {"metric": "psnr_db", "stat": "p5", "min": 30, "max": 80}],
    "per_pair": {"ssim": {"min": 0.9}},
    "max_failed_pair_share": 0.1, "max_errors": 2})",
                      "g.json");
  ASSERT_EQ(g.checks.size(), 2u);
  EXPECT_EQ(g.checks[1].spec.kind, metrics::StatSpec::Kind::kPercentile);
  EXPECT_EQ(*g.checks[1].bound.max, 80);
  EXPECT_EQ(*g.per_pair.at("ssim").min, 0.9);
  EXPECT_EQ(g.max_failed_pair_share, 0.1);
  EXPECT_EQ(g.max_errors, 2u);
  EXPECT_EQ(g.source, "g.json");
}

// compare-images gates name the registry's image-pair metrics, step checks its tensor-pair metrics:
// a metric only `qeval run` reports is an error when the compare-images gate is read, not a check
// that fails later for want of values.
TEST(Gate, CompareImagesGatesNameTheRegistrysImagePairMetrics) {
  EXPECT_EQ(gate_metric_keys(), metrics::metric_keys(metrics::MetricScope::kImagePair));
  for (const auto& key : gate_metric_keys())
    EXPECT_NO_THROW(parse_gate(R"({"checks": [{"metric": ")" + key + R"(", "min": 0}]})", "g.json")) << key;
  for (const char* run_only : {"output_sqnr_db", "mask_iou", "logit_sqnr_db", "output_nonfinite"}) {
    const std::string what = parse_error(R"({"per_pair": {")" + std::string(run_only) + R"(": {"min": 0}}})");
    EXPECT_NE(what.find("unknown metric '" + std::string(run_only) + "'"), std::string::npos) << what;
    EXPECT_NE(what.find("psnr_db"), std::string::npos) << what;  // lists what it may name
    EXPECT_NO_THROW(parse_gate(R"({"checks": [{"metric": ")" + std::string(run_only) + R"(", "min": 0}]})", "g.json",
                               GateMetrics::kRun));
  }
  EXPECT_EQ(gate_step_metrics(), metrics::metric_keys(metrics::MetricScope::kTensorPair));
  EXPECT_NO_THROW(parse_gate(R"({"steps": [{"metric": "cosine", "min": 0.9}]})", "g.json"));
  EXPECT_NE(parse_error(R"({"steps": [{"metric": "ssim", "min": 0.9}]})").find("unknown metric 'ssim'"),
            std::string::npos);
}

TEST(Gate, TyposAreErrorsNotSilentPasses) {
  EXPECT_NE(parse_error(R"({"chekcs": []})").find("unknown key 'chekcs'"), std::string::npos);
  EXPECT_NE(parse_error(R"({"checks": [{"metric": "ssmi", "min": 1}]})").find("unknown metric 'ssmi'"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"checks": [{"metric": "ssim", "stat": "avg", "min": 1}]})").find("unknown statistic"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"checks": [{"metric": "ssim"}]})").find("checks[0]: needs 'min'"), std::string::npos);
  EXPECT_NE(parse_error(R"({"checks": [{"metric": "ssim", "minimum": 1}]})").find("unknown key 'minimum'"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({"max_failed_pair_share": 2})").find("[0, 1]"), std::string::npos);
  EXPECT_NE(parse_error(R"({"max_errors": -1})").find("non-negative"), std::string::npos);
  EXPECT_NE(parse_error("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(parse_error("{}").size(), 1u);  // an empty gate is valid
  EXPECT_THROW(load_gate("/nonexistent/gate.json"), InputError);
}

TEST(Gate, RunGatesTakeAnyMetricNameAndCheckItAgainstTheRunsMetrics) {
  const std::string text = R"({"checks": [{"metric": "sigmoid_0.tmp_0.mask_iou", "min": 0.99}],
                               "per_pair": {"head/logits:0.sqnr_db": {"min": 30}}})";
  // compare-images knows its metrics when it reads the gate.
  EXPECT_NE(parse_error(text).find("unknown metric 'sigmoid_0.tmp_0.mask_iou'"), std::string::npos);
  const Gate g = parse_gate(text, "g.json", GateMetrics::kRun);
  ASSERT_EQ(g.checks.size(), 1u);
  EXPECT_EQ(g.checks[0].metric, "sigmoid_0.tmp_0.mask_iou");
  EXPECT_NO_THROW(check_gate_metrics(g, {"sigmoid_0.tmp_0.mask_iou", "head/logits:0.sqnr_db"}));
  try {
    check_gate_metrics(g, {"sigmoid_0.tmp_0.mask_iou", "output_nonfinite"});
    ADD_FAILURE() << "a per-pair bound on a metric the run does not have passed";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("g.json: per_pair.head/logits:0.sqnr_db: unknown metric"), std::string::npos) << what;
    EXPECT_NE(what.find("output_nonfinite"), std::string::npos) << what;  // lists the run's metrics
  }
  EXPECT_THROW(parse_gate(R"({"checks": [{"metric": "", "min": 0}]})", "g.json", GateMetrics::kRun), InputError);
}

std::vector<GateSample> samples() {
  const double inf = std::numeric_limits<double>::infinity();
  return {
      {"a.png", false, "", {{"ssim", 0.99}, {"psnr_db", 40.0}, {"ms_ssim", std::nullopt}}},
      {"b.png", false, "", {{"ssim", 0.80}, {"psnr_db", 25.0}, {"ms_ssim", std::nullopt}}},
      {"c.png", false, "", {{"ssim", 1.0}, {"psnr_db", inf}, {"ms_ssim", std::nullopt}}},
      {"d.png", true, "missing in test set", {}},
  };
}

TEST(Gate, StatisticsAndVerdicts) {
  Gate g = parse_gate(R"({"checks": [{"metric": "ssim", "stat": "mean", "min": 0.95},
                                     {"metric": "ssim", "stat": "min", "min": 0.75},
                                     {"metric": "psnr_db", "stat": "min", "min": 20}],
                         "max_errors": 1})",
                      "g");
  GateOutcome o = evaluate_gate(g, samples());
  ASSERT_EQ(o.section.checks.size(), 4u);  // 3 checks + the error budget
  const auto& mean = o.section.checks[0];
  EXPECT_NEAR(*mean.value, (0.99 + 0.80 + 1.0) / 3, 1e-12);
  EXPECT_FALSE(mean.passed);
  EXPECT_NE(mean.detail.find("min 0.8 (b.png)"), std::string::npos) << mean.detail;
  EXPECT_TRUE(o.section.checks[1].passed);
  EXPECT_TRUE(o.section.checks[2].passed);  // identical (inf) does not lower the min
  EXPECT_NE(o.section.checks[2].detail.find("1 identical"), std::string::npos);
  EXPECT_TRUE(o.section.checks[3].passed);  // one error allowed
  EXPECT_FALSE(o.section.passed);
}

TEST(Gate, NotApplicableMetricCannotPass) {
  Gate g = parse_gate(R"({"checks": [{"metric": "ms_ssim", "stat": "mean", "min": 0.9}]})", "g");
  GateOutcome o = evaluate_gate(g, samples());
  EXPECT_FALSE(o.section.checks[0].passed);
  EXPECT_FALSE(o.section.checks[0].value.has_value());
  EXPECT_NE(o.section.checks[0].detail.find("no compared pair"), std::string::npos);
}

TEST(Gate, PerPairShareAndErrorsAreCounted) {
  Gate g = parse_gate(R"({"per_pair": {"ssim": {"min": 0.9}, "psnr_db": {"min": 30}},
                         "max_failed_pair_share": 0.34})",
                      "g");
  GateOutcome o = evaluate_gate(g, samples());
  ASSERT_EQ(o.failed_checks.size(), 4u);
  EXPECT_TRUE(o.failed_checks[0].empty());
  ASSERT_EQ(o.failed_checks[1].size(), 2u);
  EXPECT_EQ(o.failed_checks[1][0], "psnr_db 25 < 30");
  EXPECT_TRUE(o.failed_checks[2].empty());
  const auto& share = o.section.checks[0];
  EXPECT_NEAR(*share.value, 1.0 / 3.0, 1e-12);
  EXPECT_TRUE(share.passed);
  EXPECT_NE(share.detail.find("b.png (psnr_db 25 < 30, ssim 0.8 < 0.9)"), std::string::npos) << share.detail;
  const auto& errors = o.section.checks[1];
  EXPECT_FALSE(errors.passed);  // default: no error allowed
  EXPECT_NE(errors.detail.find("d.png (missing in test set)"), std::string::npos);
  EXPECT_FALSE(o.section.passed);
}

TEST(Gate, DefaultGateOnlyCountsErrors) {
  GateOutcome o = evaluate_gate(Gate{}, {samples()[0], samples()[1]});
  ASSERT_EQ(o.section.checks.size(), 1u);
  EXPECT_TRUE(o.section.passed);
}

}  // namespace
}  // namespace qeval::eval
