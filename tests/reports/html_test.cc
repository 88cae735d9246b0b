// Shared HTML pieces: scatter labels that never overlap, the fixed-scale legend, the banner title.
#include <gtest/gtest.h>

#include <regex>

#include "reports/html.h"

namespace qeval::reports::html {
namespace {

struct Label {
  double x, y;
  std::string text;
};

std::vector<Label> labels(const std::string& svg) {
  std::vector<Label> out;
  const std::regex re("<text x=\"([-0-9.]+)\" y=\"([-0-9.]+)\" class=\"pl\">([^<]*)</text>");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back({std::stod((*it)[1]), std::stod((*it)[2]), (*it)[3]});
  return out;
}

TEST(ScatterChart, LabelsOfPointsAtTheSameSpotDoNotOverlap) {
  // Three recipes at the same MAC share and quality (compare-recipes' "worst layer" chart had two
  // names drawn over each other), one elsewhere.
  const std::vector<ScatterPoint> points = {{"int8-level3", 0.84, 23.6, "#1f7a3f", ""},
                                            {"int8-naive", 0.84, 23.6, "#b3261e", ""},
                                            {"int8-level3-sq", 0.84, 23.6, "#1f7a3f", ""},
                                            {"fp8-level4", 0.30, 30.0, "#1f7a3f", ""}};
  const std::string svg = scatter_chart("worst layer vs MACs quantized", "share", "worst local_sqnr_db", points, true);
  const auto l = labels(svg);
  ASSERT_EQ(l.size(), 4u) << svg;
  for (std::size_t a = 0; a < l.size(); ++a)
    for (std::size_t b = a + 1; b < l.size(); ++b) {
      const double wa = 6.2 * double(l[a].text.size()), wb = 6.2 * double(l[b].text.size());
      const bool overlap = l[a].x < l[b].x + wb && l[b].x < l[a].x + wa && std::abs(l[a].y - l[b].y) < 11;
      EXPECT_FALSE(overlap) << l[a].text << " and " << l[b].text << " overlap";
    }
  // The y-axis title stays clear of the tick labels: it sits left of where they end (x = left - 4).
  EXPECT_NE(svg.find("rotate(-90 14 "), std::string::npos);
}

TEST(ScaleLegend, LabelsTheFixedScaleInItsUnits) {
  const std::string svg = scale_legend(32, 4, "of 255");
  for (const char* tick : {">0<", ">8<", ">16<", ">24<", ">&ge;32<", ">of 255<"})
    EXPECT_NE(svg.find(tick), std::string::npos) << tick;
}

TEST(VerdictBanner, ColourIsTheVerdictAndTheTitleMaySayMore) {
  EXPECT_EQ(verdict_banner(false, "x", "FAIL &middot; fallback found"),
            "<div class=\"verdict fail\">FAIL &middot; fallback found<small>x</small></div>");
  EXPECT_EQ(verdict_banner(true, "y"), "<div class=\"verdict pass\">PASS<small>y</small></div>");
}

}  // namespace
}  // namespace qeval::reports::html
