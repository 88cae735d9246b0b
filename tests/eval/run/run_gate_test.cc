// The gate over a run report: checks per compared variant, variant filters, layer and step checks
// naming the worst layer or step, the non-finite budget beyond the reference's, bad variant names.
#include <gtest/gtest.h>

#include <cmath>

#include "eval/run/run_report_build.h"
#include "kernels/error.h"
#include "reports/run_report_fixture.h"

namespace qeval::eval {
namespace {

const reports::GateCheckRow* find(const reports::RunReport& r, const std::string& variant, const std::string& name) {
  for (const auto& c : r.gate.checks)
    if (c.variant == variant && c.name == name) return &c;
  return nullptr;
}

TEST(RunGate, ChecksEveryComparedVariantWithLayerStepAndNonFiniteChecks) {
  reports::RunReport r = testing::synthetic_run_report();
  const Gate g = parse_gate(R"({
    "checks": [{"metric": "psnr_db", "stat": "mean", "min": 0},
               {"metric": "ssim", "stat": "min", "min": 2, "variant": "int8-l3"}],
    "layers": [{"column": "local_sqnr_db", "stat": "min", "min": 0}],
    "steps": [{"stat": "min", "min": 1000}],
    "max_nonfinite": 0})",
                            "g.json");
  apply_run_gate(g, r);
  EXPECT_FALSE(r.gate.passed);
  EXPECT_EQ(r.gate.source, "g.json");
  for (const char* v : {"fp16", "int8-l3", "fp8-qdq"}) {
    ASSERT_TRUE(find(r, v, "psnr_db mean >= 0")) << v;
    EXPECT_TRUE(find(r, v, "psnr_db mean >= 0")->passed);
    // Layer check: the worst layer is named.
    const auto* layer = find(r, v, "layer local_sqnr_db min >= 0");
    ASSERT_TRUE(layer) << v;
    EXPECT_NE(layer->detail.find("worst"), std::string::npos);
    // Step check on the teacher-forced noise prediction curve.
    const auto* step = find(r, v, "noise_pred teacher-forced sqnr_db min >= 1000");
    ASSERT_TRUE(step) << v;
    EXPECT_FALSE(step->passed);
    EXPECT_NE(step->detail.find("at step"), std::string::npos);
  }
  EXPECT_FALSE(find(r, "fp32", "psnr_db mean >= 0"));   // the reference is not checked
  EXPECT_TRUE(find(r, "int8-l3", "ssim min >= 2"));     // a check naming a variant applies to it alone
  EXPECT_FALSE(find(r, "fp16", "ssim min >= 2"));
  // The fp8 export's 12 infinities are beyond the reference's (none there): its check fails.
  const auto* nf = find(r, "fp8-qdq", "NaN/Inf values beyond the reference's <= 0");
  ASSERT_TRUE(nf);
  EXPECT_FALSE(nf->passed);
  EXPECT_EQ(*nf->value, 12.0);
  EXPECT_TRUE(find(r, "fp16", "NaN/Inf values beyond the reference's <= 0")->passed);
}

TEST(RunGate, LayerChecksCanBeLimitedToNodesByName) {
  reports::RunReport r = testing::synthetic_run_report();
  const Gate g = parse_gate(R"({"layers": [
    {"column": "local_sqnr_db", "stat": "min", "min": -1000, "nodes": "^up_blocks\\.1/"},
    {"column": "local_sqnr_db", "stat": "min", "min": -1000, "nodes": "conv_out"}]})",
                            "g.json");
  ASSERT_EQ(g.layer_checks.size(), 2u);
  EXPECT_EQ(g.layer_checks[0].nodes, "^up_blocks\\.1/");
  apply_run_gate(g, r);
  const auto* scoped = find(r, "int8-l3", "layer local_sqnr_db min >= -1000 (nodes ~ ^up_blocks\\.1/)");
  ASSERT_TRUE(scoped);
  EXPECT_TRUE(scoped->passed) << scoped->detail;
  // Only the 10 layers of up_blocks.1 count, and the worst of them is named.
  EXPECT_NE(scoped->detail.find("over 10 layers matching '^up_blocks\\.1/'"), std::string::npos) << scoped->detail;
  EXPECT_NE(scoped->detail.find("(up_blocks.1/"), std::string::npos) << scoped->detail;
  // A pattern that matches no layer fails and says so, rather than passing on no evidence.
  const auto* none = find(r, "int8-l3", "layer local_sqnr_db min >= -1000 (nodes ~ conv_out)");
  ASSERT_TRUE(none);
  EXPECT_FALSE(none->passed);
  EXPECT_EQ(none->detail, "no layer name matches 'conv_out'");
  try {
    parse_gate(R"({"layers": [{"column": "local_sqnr_db", "min": 1, "nodes": "conv_(in"}]})", "g.json");
    FAIL() << "a broken pattern must be an input error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("layers[0]: 'nodes' is not a valid regular expression 'conv_(in'"),
              std::string::npos)
        << e.what();
  }
}

TEST(RunGate, AVariantTheRunLacksIsAnInputError) {
  reports::RunReport r = testing::synthetic_run_report();
  EXPECT_THROW(apply_run_gate(parse_gate(R"({"checks": [{"metric": "ssim", "min": 0.9, "variant": "int4"}]})", "g.json"), r),
               InputError);
  EXPECT_THROW(parse_gate(R"({"steps": [{"mode": "sideways", "min": 1}]})", "g.json"), InputError);
  EXPECT_THROW(parse_gate(R"({"layers": [{"column": "sqnr", "min": 1}]})", "g.json"), InputError);
}

}  // namespace
}  // namespace qeval::eval
