// compare-images' report.html in headless Chromium on the shipped sample pairs: readable at 1400 px
// (no horizontal scrolling), every section, no console message, the banner in the gate's colour,
// heatmaps on the fixed scale with a working x8 toggle.
// The page, its DOM and screenshots stay in build/test-output/compare_images_html/.
#include <gtest/gtest.h>

#include "reports/chromium.h"
#include "test_util.h"

namespace qeval {
namespace {

TEST(CompareImagesHtml, SamplePairsAreReadableAt1400PxInHeadlessChromium) {
  const std::string chromium = testing::find_chromium();
  ASSERT_FALSE(chromium.empty()) << "headless Chromium is needed for this test (scripts/setup.sh)";
  const std::filesystem::path src = testing::source_dir();
  const std::filesystem::path out = testing::test_output_dir("compare_images_html");
  const auto r = testing::run_qeval("compare-images --ref " + (src / "samples/ref").string() + " --test " +
                                    (src / "samples/test").string() + " --gate " +
                                    (src / "samples/gate.json").string() + " --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  testing::ScratchDir profile("chromium-profile-compare-images");
  const testing::Layout layout = testing::measure_layout(chromium, profile.path(), out / "report.html", out, 1400);
  testing::expect_readable_at(layout, 1400, {"gate", "summary", "worst", "pairs", "config"}, true);
  // The worst pairs' heatmaps: one labelled fixed scale, and the x8 view behind the toggle (4 pairs).
  EXPECT_NE(testing::read_text(out / "report.html").find("aria-label=\"colour scale 0 to 32 of 255\""),
            std::string::npos);
  EXPECT_EQ(testing::check_gain_toggle(chromium, profile.path(), out / "report.html", out / "toggle"),
            "true,true,true,4");
}

}  // namespace
}  // namespace qeval
