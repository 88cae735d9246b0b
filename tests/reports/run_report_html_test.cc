// report.html of `qeval run`: self-contained, every section present, and it renders in headless
// Chromium with no script error. The rendered report and a screenshot stay in
// build/test-output/run_report_html/ (report.html, report.png) for a person to look at.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>

#include "datasets/image_io.h"
#include "reports/chromium.h"
#include "reports/run_report.h"
#include "reports/run_report_fixture.h"
#include "test_util.h"

namespace qeval::reports {
namespace {

using testing::read_text;

using testing::DomDump;
using testing::dump_dom;
using testing::expect_readable_at;
using testing::find_chromium;
using testing::Layout;
using testing::measure_layout;
using testing::run_chromium;

const char* const kSections[] = {"verdict",          "gate",        "variants",   "samples",   "layers",
                                 "timestep-heatmap", "step-curves", "histograms", "nonfinite", "unmatched",
                                 "unquantized",      "config"};

TEST(RunReportHtml, IsSelfContainedWithEverySection) {
  const std::string h = render_html(testing::synthetic_run_report());
  for (const char* id : kSections)
    EXPECT_NE(h.find(std::string("<section id=\"") + id + "\">"), std::string::npos) << id;
  // No network: no remote URLs, stylesheets or scripts by reference.
  for (const char* remote : {"http://", "https://", "src=\"//", "<link", "<script src", "@import"})
    EXPECT_EQ(h.find(remote), std::string::npos) << remote;
  EXPECT_NE(h.find("data:image/png;base64,"), std::string::npos);
  // The verdict comes first, then the gate.
  EXPECT_LT(h.find("id=\"verdict\""), h.find("id=\"gate\""));
  EXPECT_LT(h.find("id=\"gate\""), h.find("id=\"samples\""));
  // The culprit layer ranks first for int8 (lowest local SQNR).
  const auto layers = h.find("id=\"layers-2\"");
  ASSERT_NE(layers, std::string::npos);
  EXPECT_NE(h.find("<td class=\"num\">1</td><td class=\"name\">mid_block.1/Softmax_37</td>", layers),
            std::string::npos);
  // Names are escaped everywhere, including inside the embedded heatmap data.
  RunReport r = testing::synthetic_run_report({.prompts = 2, .layers = 12, .steps = 4, .images = false});
  r.layers[1].name = "</script><b>x";
  r.samples[0].prompt = "<img src=x onerror=alert(1)>";
  const std::string e = render_html(r);
  EXPECT_EQ(e.find("</script><b>x"), std::string::npos);
  EXPECT_EQ(e.find("<img src=x"), std::string::npos);
  EXPECT_NE(e.find("\\u003c/script>\\u003cb>x"), std::string::npos);
  // Empty sections say so instead of disappearing.
  RunReport bare;
  bare.variants.push_back({});
  bare.variants[0].name = "fp32";
  bare.variants[0].reference = true;
  const std::string b = render_html(bare);
  for (const char* id : kSections)
    EXPECT_NE(b.find(std::string("<section id=\"") + id + "\">"), std::string::npos) << id;
  EXPECT_NE(b.find("No per-layer observation in this run."), std::string::npos);
}

TEST(RunReportHtml, StaysSmallWithHundredsOfLayers) {
  RunReport r = testing::synthetic_run_report({.prompts = 8, .layers = 400, .steps = 20, .images = false});
  const auto start = std::chrono::steady_clock::now();
  const std::string h = render_html(r);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  // 400 layers x 20 steps x 4 variants: the heatmap data is the bulk; keep the page light to open.
  EXPECT_LT(h.size(), 4u << 20) << h.size();
  EXPECT_LT(ms, 2000.0);
  // Only the 30 worst layers of each variant are shown until "show all" is pressed.
  EXPECT_NE(h.find("show all 400 layers"), std::string::npos);
}

TEST(RunReportHtml, RendersInHeadlessChromiumWithoutErrors) {
  const std::string chromium = find_chromium();
  ASSERT_FALSE(chromium.empty())
      << "headless Chromium is needed for this test: install Debian's chromium (scripts/setup.sh)";
  const std::filesystem::path out = testing::test_output_dir("run_report_html");
  write_run_report(testing::synthetic_run_report(), out);
  testing::ScratchDir profile("chromium-profile");
  const std::string url = "file://" + std::filesystem::absolute(out / "report.html").string();

  // 1. The DOM after scripts ran, plus every console message on stderr.
  const DomDump page = dump_dom(chromium, profile.path(), url, out);
  ASSERT_EQ(page.rc, 0) << page.log;
  const std::string& dom = page.dom;
  expect_rendered_cleanly(page);
  for (const char* id : kSections)
    EXPECT_NE(dom.find(std::string("<section id=\"") + id + "\">"), std::string::npos) << id;
  // The heatmap script filled its selectors from the embedded data.
  EXPECT_NE(dom.find("<option value=\"local_rel_l2\">local error (rel L2)</option>"), std::string::npos);
  EXPECT_NE(dom.find("<option value=\"drift_calib\">"), std::string::npos);
  EXPECT_NE(dom.find("(log)"), std::string::npos);  // the legend was drawn
  // Rows are grouped into blocks by name (drawn in the margin when rows are too thin to name).
  EXPECT_TRUE(std::regex_search(
      dom, std::regex("aria-label=\"[0-9]+ layer rows in [0-9]+ blocks: [^\"]*up_blocks\\.1 \\([0-9]+\\)")))
      << "no block labels on the timestep heatmap";
  // The difference heatmaps have one labelled scale for the whole report.
  EXPECT_NE(dom.find("id=\"diff-legend\""), std::string::npos);

  // 2. A screenshot of the top of the page: it shows the red FAIL banner.
  const int rc =
      run_chromium(chromium, profile.path(),
                   "--hide-scrollbars --window-size=1280,2400 --screenshot='" + (out / "report.png").string() + "'",
                   url, out / "screenshot.out", out / "screenshot.log");
  ASSERT_EQ(rc, 0) << read_text(out / "screenshot.log");
  const datasets::Image shot = datasets::load_image(out / "report.png");
  EXPECT_EQ(shot.width(), 1280);
  EXPECT_GE(shot.height(), 2000);
  std::size_t banner = 0;
  const float* px = shot.planes.data<float>();
  const std::size_t plane = std::size_t(shot.width()) * std::size_t(shot.height());
  for (std::size_t i = 0; i < std::size_t(shot.width()) * 400; ++i)
    banner += std::abs(px[i] - 179) < 6 && std::abs(px[plane + i] - 38) < 6 && std::abs(px[2 * plane + i] - 30) < 6;
  EXPECT_GT(banner, 20000u) << "the FAIL banner (#b3261e) is not in the top 400 rows of " << (out / "report.png");

  // 3. At 1400 px: no horizontal scrolling (page or tables), every section, the red banner.
  const Layout layout = measure_layout(chromium, profile.path(), out / "report.html", out, 1400);
  expect_readable_at(layout, 1400, std::vector<std::string>(std::begin(kSections), std::end(kSections)), false);
}

// The amplified view: one button swaps every difference image to its x8 form, the captions and
// the legend say so; pressed again, the fixed scale returns.
TEST(RunReportHtml, AmplifiedViewToggleSwapsEveryDifferenceImage) {
  const std::string chromium = find_chromium();
  ASSERT_FALSE(chromium.empty()) << "headless Chromium is needed for this test (scripts/setup.sh)";
  const std::filesystem::path out = testing::test_output_dir("run_report_html_x8");
  RunReport r = testing::synthetic_run_report();
  std::size_t amplified = 0;
  for (auto& s : r.samples)
    for (auto& res : s.results)
      if (!res.heatmap.empty()) {
        res.heatmap_amplified = res.image;  // any other picture: the test checks which one shows
        ++amplified;
      }
  ASSERT_GT(amplified, 0u);
  write_run_report(r, out);
  ASSERT_NE(read_text(out / "report.html").find("amplified view: x8"), std::string::npos);
  testing::ScratchDir profile("chromium-profile-x8");
  EXPECT_EQ(testing::check_gain_toggle(chromium, profile.path(), out / "report.html", out),
            "true,true,true," + std::to_string(amplified));
}

// A single-model run judged per output (many metric columns) and a run whose gate passed: readable
// at 1400 px too, with a green banner.
TEST(RunReportHtml, SingleModelWithManyMetricsIsReadableAt1400Px) {
  const std::string chromium = find_chromium();
  ASSERT_FALSE(chromium.empty()) << "headless Chromium is needed for this test";
  RunReport r = testing::synthetic_run_report({.prompts = 4, .layers = 40, .steps = 2, .images = false});
  r.config.pipeline = "single-model";
  r.config.scheduler.clear();
  r.config.seeds.clear();
  r.timesteps = {};
  r.step_curves.clear();
  r.config.steps = 0;
  for (auto& e : r.nonfinite) e.step = -1;
  for (auto& hist : r.histograms) hist.step = -1;
  // Three judged outputs with four metrics each, as issue 20's per-output keys.
  r.metrics.clear();
  for (const char* out : {"sigmoid_0.tmp_0", "logits/long_output_name:0", "boxes"})
    for (const auto& [m, label] : {std::pair{"sqnr_db", "SQNR dB"}, std::pair{"cosine", "cosine"},
                                   std::pair{"rel_l2", "rel L2"}, std::pair{"max_abs", "max |err|"}})
      r.metrics.push_back({std::string(out) + "." + m, std::string(out) + " " + label, m != std::string("rel_l2")});
  for (auto& s : r.samples)
    for (auto& res : s.results) {
      res.metrics.clear();
      if (res.variant == "fp32") continue;
      for (const auto& m : r.metrics) res.metrics.push_back({m.key, 31.25, {}, ""});
    }
  summarize_samples(r);
  r.gate = {};
  r.gate.source = "gate.json";
  r.gate.checks.push_back({"sigmoid_0.tmp_0.sqnr_db mean >= 30", "sigmoid_0.tmp_0.sqnr_db", "mean", ">=", 30, 31.25,
                           true, "mean = 31.25 over 4 pairs", "fp16"});
  r.gate.passed = true;
  const std::filesystem::path out = testing::test_output_dir("run_report_single_model_html");
  write_run_report(r, out);
  testing::ScratchDir profile("chromium-profile-single");
  const Layout layout = measure_layout(chromium, profile.path(), out / "report.html", out, 1400);
  expect_readable_at(layout, 1400, {"verdict", "gate", "variants", "samples", "layers", "config"}, true);
}

}  // namespace
}  // namespace qeval::reports
