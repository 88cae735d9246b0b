// The gate over a run report: checks per compared variant, variant filters, layer and step checks
// naming the worst layer or step, the non-finite budget beyond the reference's, bad variant names.
#include <gtest/gtest.h>

#include <cmath>

#include "eval/run/run_report_build.h"
#include "kernels/error.h"
#include "reports/run_report.h"
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
  EXPECT_FALSE(find(r, "fp32", "psnr_db mean >= 0"));  // the reference is not checked
  EXPECT_TRUE(find(r, "int8-l3", "ssim min >= 2"));    // a check naming a variant applies to it alone
  EXPECT_FALSE(find(r, "fp16", "ssim min >= 2"));
  // The fp8 export's 12 infinities are beyond the reference's (none there): its check fails.
  const auto* nf = find(r, "fp8-qdq", "NaN/Inf values beyond the reference's <= 0");
  ASSERT_TRUE(nf);
  EXPECT_FALSE(nf->passed);
  EXPECT_EQ(*nf->value, 12.0);
  EXPECT_TRUE(find(r, "fp16", "NaN/Inf values beyond the reference's <= 0")->passed);
}

// The one missing-value rule (docs/gate.md "Rules"), as compare-images has it: a missing value of
// an identical sample is +inf only for a metric unbounded on identical inputs (PSNR here); MS-SSIM
// of images too small for it stays not applicable (the run used to count it +inf, passing any min).
TEST(RunGate, AnIdenticalSampleIsUnboundedOnlyInMetricsThatAreUnboundedOnIdenticalInputs) {
  reports::RunReport r = testing::synthetic_run_report();
  std::size_t identical = 0;
  for (auto& row : r.samples)
    for (auto& res : row.results)
      if (res.variant == "fp16") {
        res.identical = true;
        res.metrics[0].value.reset();  // psnr_db: none for identical images
        res.metrics[0].note = "identical: PSNR is unbounded";
        ++identical;
      }
  ASSERT_GT(identical, 0u);
  reports::summarize_samples(r);
  const Gate g = parse_gate(R"({"checks": [{"metric": "psnr_db", "stat": "min", "min": 40},
                                           {"metric": "ms_ssim", "stat": "min", "min": 0.5}]})",
                            "g.json", GateMetrics::kRun);
  apply_run_gate(g, r);
  const auto* psnr = find(r, "fp16", "psnr_db min >= 40");
  ASSERT_TRUE(psnr);
  EXPECT_TRUE(psnr->passed) << psnr->detail;
  EXPECT_NE(psnr->detail.find("identical (unbounded)"), std::string::npos) << psnr->detail;
  const auto* ms = find(r, "fp16", "ms_ssim min >= 0.5");
  ASSERT_TRUE(ms);
  EXPECT_FALSE(ms->passed) << ms->detail;
  EXPECT_NE(ms->detail.find("not applicable"), std::string::npos) << ms->detail;
  for (const auto& v : r.variants)
    if (v.name == "fp16")
      for (const auto& s : v.summary.metrics) {
        if (s.metric == "psnr_db") {
          EXPECT_EQ(s.unbounded, identical);
        }
        if (s.metric == "ms_ssim") {
          EXPECT_EQ(s.unbounded, 0u);
          EXPECT_EQ(s.not_applicable, identical);
        }
      }
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

// The shipped tiny-sd gate over a run told not to observe layers (`qeval run --no-layers`): its
// layer and NaN/Inf checks are "not measured", neither pass nor fail, and every summary says so.
// A run that did observe layers and has no data for a check still fails.
TEST(RunGate, ChecksARunWasToldNotToMeasureAreNotMeasuredRatherThanFailed) {
  const Gate shipped = load_gate(testing::source_dir() / "models/tiny-sd/gate.json", GateMetrics::kRun);
  ASSERT_FALSE(shipped.layer_checks.empty());
  ASSERT_TRUE(shipped.max_nonfinite);
  auto no_layers = [](const char* observe_layers) {
    reports::RunReport r = testing::synthetic_run_report();
    r.layers.clear();
    r.layer_tables.clear();
    r.timesteps.layers.clear();
    r.timesteps.tables.clear();
    r.histograms.clear();
    r.nonfinite.clear();
    r.config.settings.emplace_back("observe.layers", observe_layers);
    return r;
  };
  reports::RunReport r = no_layers("false");
  apply_run_gate(shipped, r);
  const auto* fp16_layers = find(r, "fp16", "layer local_sqnr_db min >= 20");
  const auto* fp16_nonfinite = find(r, "fp16", "NaN/Inf values beyond the reference's <= 0");
  ASSERT_TRUE(fp16_layers && fp16_nonfinite);
  for (const auto* c : {fp16_layers, fp16_nonfinite}) {
    EXPECT_FALSE(c->measured) << c->name;
    EXPECT_TRUE(c->passed) << c->name;  // fails nothing
    EXPECT_FALSE(c->value) << c->name;
    EXPECT_NE(c->detail.find("not measured: this run did not observe layers"), std::string::npos) << c->detail;
  }
  // The sample and step checks were measured as before.
  EXPECT_TRUE(find(r, "fp16", "psnr_db mean >= 30")->measured);
  EXPECT_TRUE(find(r, "fp16", "noise_pred teacher-forced sqnr_db mean >= 12")->measured);
  // 3 compared variants x (2 layer checks + the NaN/Inf budget) not measured.
  EXPECT_EQ(r.gate.not_measured(), 9u);
  bool fp16_fails = false;
  for (const auto& c : r.gate.checks) fp16_fails |= c.variant == "fp16" && !c.passed;
  EXPECT_FALSE(fp16_fails);

  // stdout: the count and the list, apart from passes and failures.
  const std::string text = reports::render_summary_text(r);
  EXPECT_NE(text.find(fmt::format("gate checks passed, 9 not measured")), std::string::npos) << text;
  EXPECT_NE(text.find("not measured (neither pass nor fail):"), std::string::npos) << text;
  EXPECT_EQ(text.find("NaN/Inf ... <= 0: value 0"), std::string::npos) << text;
  // junit.xml: skipped, not failed.
  const std::string junit = reports::render_junit(r);
  EXPECT_NE(junit.find("skipped=\"9\""), std::string::npos) << junit;
  EXPECT_NE(junit.find("<skipped message=\"not measured"), std::string::npos) << junit;
  // report.json keeps it (and the schema allows it); report.html shows it.
  testing::ScratchDir dir("run-gate-not-measured");
  reports::write_run_report(r, dir.path());
  const auto j = testing::read_json(dir / "report.json");
  std::size_t unmeasured = 0;
  for (const auto& c : j["gate"]["checks"]) unmeasured += c.at("measured") == false;
  EXPECT_EQ(unmeasured, 9u);
  const reports::RunReport back = reports::read_run_report(dir / "report.json");
  EXPECT_EQ(back.gate.not_measured(), 9u);
  const std::string page = reports::render_html(r);
  EXPECT_NE(page.find("class=\"nmv\">not measured</td>"), std::string::npos);

  // observe.layers true, yet no layer data: the run measured and found nothing, which fails.
  reports::RunReport observed = no_layers("true");
  apply_run_gate(shipped, observed);
  EXPECT_EQ(observed.gate.not_measured(), 0u);
  EXPECT_FALSE(find(observed, "fp16", "layer local_sqnr_db min >= 20")->passed);
  EXPECT_FALSE(observed.gate.passed);
}

TEST(RunGate, AVariantTheRunLacksIsAnInputError) {
  reports::RunReport r = testing::synthetic_run_report();
  EXPECT_THROW(
      apply_run_gate(parse_gate(R"({"checks": [{"metric": "ssim", "min": 0.9, "variant": "int4"}]})", "g.json"), r),
      InputError);
  EXPECT_THROW(parse_gate(R"({"steps": [{"mode": "sideways", "min": 1}]})", "g.json"), InputError);
  EXPECT_THROW(parse_gate(R"({"layers": [{"column": "sqnr", "min": 1}]})", "g.json"), InputError);
}

}  // namespace
}  // namespace qeval::eval
