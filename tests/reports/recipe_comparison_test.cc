// The compare-recipes report from plain data: report.json against its published schema, the HTML
// self-contained and escaped with every section, rows without shares left off the charts (not
// plotted at 0), and a render in headless Chromium with no console message. The rendered report
// and a screenshot stay in build/test-output/recipe_comparison/.
#include "reports/recipe_comparison.h"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "reports/chromium.h"
#include "reports/json_schema.h"
#include "test_util.h"

namespace qeval::reports {
namespace {

using testing::read_text;

RecipeRow row(const std::string& name, bool passed, double psnr, std::optional<double> macs_quantized) {
  RecipeRow r;
  r.variant = name;
  r.recipe = {name, "recipes/" + name + ".json", "fnv1a64:0123456789abcdef"};
  r.format = "int8";
  r.level = "3";
  r.precision = "fp16";
  r.quantized_models = {"unet"};
  r.gate_passed = passed;
  if (!passed) r.failed_checks = {"layer local_sqnr_db min >= 50 (nodes ~ conv_out): 35.9"};
  r.samples = 8;
  SummaryRow s;
  s.metric = "psnr_db";
  s.count = 8;
  s.mean = psnr, s.min = psnr - 4, s.p5 = psnr - 3, s.median = psnr, s.p95 = psnr + 2, s.max = psnr + 3;
  r.metrics = {s};
  r.worst_layers = {{"/up_blocks.0/ff/net.2/MatMul", "MatMul", "unet", 23.6}, {"/conv_out/Conv", "Conv", "unet", 35.9}};
  r.compute_nodes = 147;
  r.quantized_nodes = 95;
  r.params_total = 1000000;
  r.params_quantized = 860000;
  if (macs_quantized) {
    r.macs_total = 4.0e8;
    r.macs_quantized = *macs_quantized;
  }
  r.weight_bytes = 5830000;
  r.reference_weight_bytes = 7200000;
  r.speed_class = passed ? "faster" : "slower-risk";
  r.speed_reasons = {"unet: 84% of the multiply-accumulates in 95 quantized Conv/MatMul/Gemm of 147"};
  r.calibration_s = 12.5;
  return r;
}

RecipeComparison comparison() {
  RecipeComparison c;
  c.tool_version = "0.1.0";
  c.created_utc = "2026-11-21T11:00:00Z";
  c.command_line = "qeval compare-recipes --recipes a.json b.json c.json";
  c.elapsed_s = 61.5;
  c.config.pipeline = "txt2img";
  c.config.model = {"tiny-sd", "models/tiny-sd", "fnv1a64:484ce3b81a705b77"};
  c.config.inputs = {"prompts", "prompts/tiny_eval.txt", "fnv1a64:05a04b7afccf9864"};
  c.config.reference_variant = "fp32";
  c.config.scheduler = "ddim";
  c.config.steps = 20;
  c.config.seeds = {0};
  c.reference_precision = "fp32";
  c.target = "sm89";
  c.metrics = {{"psnr_db", "PSNR dB", true}, {"ssim", "SSIM", true}};
  c.quality_metric = "psnr_db";
  c.layer_column = "local_sqnr_db";
  c.gate.source = "models/tiny-sd/gate.json";
  c.gate.checks.push_back(
      {"psnr_db mean >= 30", "psnr_db", "mean", ">=", 30, 38.3, true, "mean over 8", "int8-level3"});
  c.rows = {row("int8-level3", true, 38.26, 3.36e8), row("<b>naive</b>", false, 42.9, 4.0e8),
            row("no-shapes", true, 40.0, std::nullopt)};
  c.run_report = "run/report.html";
  return c;
}

TEST(RecipeComparison, JsonFollowsItsSchema) {
  const nlohmann::json j = to_json(comparison());
  const testing::JsonSchema schema(testing::read_json(testing::source_dir() / "docs/recipe-comparison.schema.json"));
  std::string errors;
  for (const auto& e : schema.validate(j)) errors += e + "\n";
  EXPECT_EQ(errors, "");
  EXPECT_EQ(j["gate"]["passed_recipes"], nlohmann::json::array({"int8-level3", "no-shapes"}));
  const auto& l3 = j["recipes"][0];
  EXPECT_DOUBLE_EQ(l3["quantized"]["mac_share"].get<double>(), 0.84);
  EXPECT_DOUBLE_EQ(l3["quantized"]["param_share"].get<double>(), 0.86);
  EXPECT_DOUBLE_EQ(l3["size"]["ratio"].get<double>(), 5830000.0 / 7200000.0);
  EXPECT_TRUE(j["recipes"][2]["quantized"]["mac_share"].is_null());  // unknown, never 0
  // A row the schema does not allow is caught (the schema is not vacuous).
  nlohmann::json bad = j;
  bad["recipes"][0]["speed"]["class"] = "fast";
  EXPECT_FALSE(schema.validate(bad).empty());
}

TEST(RecipeComparison, HtmlIsSelfContainedEscapedAndChartsOnlyKnownShares) {
  const std::string h = render_html(comparison());
  for (const char* id : {"verdict", "recipes-section", "charts", "gate", "run", "config"})
    EXPECT_NE(h.find(std::string("<section id=\"") + id + "\">"), std::string::npos) << id;
  for (const char* remote : {"http://", "https://", "src=\"//", "<link", "<script src", "@import"})
    EXPECT_EQ(h.find(remote), std::string::npos) << remote;
  EXPECT_EQ(h.find("<b>naive</b>"), std::string::npos);
  EXPECT_NE(h.find("&lt;b&gt;naive&lt;/b&gt;"), std::string::npos);
  EXPECT_NE(h.find("2 of 3 recipe(s) pass the gate"), std::string::npos);
  // The row without MAC counts is listed under the MAC charts, not drawn at 0%.
  EXPECT_NE(h.find("not plotted (no value): no-shapes"), std::string::npos);
  EXPECT_NE(h.find("<a href=\"run/report.html\">"), std::string::npos);
  const std::string text = render_summary_text(comparison(), "cmp");
  EXPECT_EQ(text.rfind("qeval compare-recipes: 2 of 3 recipe(s) pass the gate (models/tiny-sd/gate.json)", 0), 0u)
      << text;
  EXPECT_NE(text.find("<b>naive</b> failed: layer local_sqnr_db min >= 50"), std::string::npos) << text;
}

TEST(RecipeComparison, RendersInHeadlessChromiumWithoutErrors) {
  const std::string chromium = testing::find_chromium();
  ASSERT_FALSE(chromium.empty())
      << "headless Chromium is needed for this test: install Debian's chromium (scripts/setup.sh)";
  const std::filesystem::path out = testing::test_output_dir("recipe_comparison");
  write_recipe_comparison(comparison(), out);
  EXPECT_TRUE(std::filesystem::exists(out / "report.json"));
  testing::ScratchDir profile("chromium-profile-cmp");
  const std::string url = "file://" + std::filesystem::absolute(out / "report.html").string();
  const testing::DomDump page = testing::dump_dom(chromium, profile.path(), url, out);
  ASSERT_EQ(page.rc, 0) << page.log;
  const std::string& dom = page.dom;
  testing::expect_rendered_cleanly(page);
  EXPECT_NE(dom.find("<circle"), std::string::npos);
  const int rc = testing::run_chromium(
      chromium, profile.path(),
      "--hide-scrollbars --window-size=1280,1600 --screenshot='" + (out / "report.png").string() + "'", url,
      out / "screenshot.out", out / "screenshot.log");
  EXPECT_EQ(rc, 0) << read_text(out / "screenshot.log");
  EXPECT_TRUE(std::filesystem::exists(out / "report.png"));
  // Every decision column visible at 1400 px (they were behind a horizontal scroll even at 2400).
  const testing::Layout layout = testing::measure_layout(chromium, profile.path(), out / "report.html", out, 1400);
  testing::expect_readable_at(layout, 1400, {"verdict", "recipes-section", "charts", "gate", "run", "config"}, true);
}

}  // namespace
}  // namespace qeval::reports
