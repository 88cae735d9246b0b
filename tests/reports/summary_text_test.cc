// The stdout summaries: nothing cut (long variant names, gate checks, a table wider than the
// output), near-1 metrics never printed as 1, MAC shares that were not measured said in words.
#include <gtest/gtest.h>

#include <sstream>

#include "reports/metric_format.h"
#include "reports/recipe_comparison.h"
#include "reports/run_report.h"
#include "reports/run_report_fixture.h"
#include "reports/text_table.h"

namespace qeval::reports {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Every occurrence of `old_name` as a variant in the report becomes `new_name`.
void rename_variant(RunReport& r, const std::string& old_name, const std::string& new_name) {
  for (auto& v : r.variants)
    if (v.name == old_name) v.name = new_name;
  for (auto& c : r.gate.checks)
    if (c.variant == old_name) c.variant = new_name;
  for (auto& t : r.layer_tables)
    if (t.variant == old_name) t.variant = new_name;
  for (auto& s : r.samples)
    for (auto& res : s.results)
      if (res.variant == old_name) res.variant = new_name;
  for (auto& e : r.nonfinite)
    if (e.variant == old_name) e.variant = new_name;
}

TEST(SummaryText, LongVariantNamesAndGateChecksAppearWhole) {
  RunReport r = testing::synthetic_run_report();
  const std::string long_name = "int8-level3-smoothquant-alpha0.8-entropy";  // 40 characters
  ASSERT_EQ(long_name.size(), 40u);
  rename_variant(r, "int8-l3", long_name);
  // Several checks on it with long names, failing: each is listed on stdout.
  for (int i = 0; i < 1; ++i) {
    GateCheckRow c = r.gate.checks[6];
    c.variant = long_name;
    c.passed = false;
    c.name = fmt::format("layer local_sqnr_db p5 >= {} dB over the attention softmax outputs of the UNet", 20 + i);
    r.gate.checks.push_back(c);
  }
  r.gate.passed = false;
  const std::string text = render_summary_text(r, "out/run", 100);
  for (const auto& v : r.variants) EXPECT_NE(text.find(v.name), std::string::npos) << v.name << "\n" << text;
  std::size_t failed = 0;
  for (const auto& c : r.gate.checks) failed += !c.passed;
  ASSERT_LE(failed, 5u);  // all listed (no "... and N more")
  for (const auto& c : r.gate.checks) {
    if (c.passed) continue;
    EXPECT_NE(text.find(c.name), std::string::npos) << c.name << "\n" << text;
  }
  EXPECT_EQ(text.find("..."), std::string::npos) << text;  // nothing cut
  // The gate column in full: "FAIL n/m" beside the long name's block or row.
  EXPECT_NE(text.find("FAIL 3/5"), std::string::npos) << text;
  for (const auto& line : lines_of(text)) EXPECT_LE(line.size(), 100u) << line;
}

TEST(SummaryText, ATableWiderThanTheOutputBecomesABlockPerVariant) {
  RunReport r = testing::synthetic_run_report();
  const std::string long_name = "int8-level3-smoothquant-alpha0.8-entropy";
  rename_variant(r, "int8-l3", long_name);
  const std::string narrow = render_summary_text(r, {}, 80);
  // Stacked: the name on a line of its own, then labelled cells.
  EXPECT_NE(narrow.find("\n" + long_name + "\n  kind: recipe, quantized: "), std::string::npos) << narrow;
  EXPECT_NE(narrow.find("ms/sample: "), std::string::npos) << narrow;
  for (const auto& line : lines_of(narrow)) EXPECT_LE(line.size(), 80u) << line;
  // A wide terminal keeps the aligned table with the whole name in its column.
  const std::string wide = render_summary_text(r, {}, 200);
  EXPECT_NE(wide.find(long_name + "  recipe"), std::string::npos) << wide;
}

TEST(SummaryText, NearOneValuesNeverPrintAsOne) {
  EXPECT_EQ(format_metric("cosine", 0.99997), "0.99997");
  EXPECT_EQ(format_metric("cosine", 0.9999993), "0.999999");  // 5 decimals would say 1.00000
  EXPECT_EQ(format_metric("cosine", 0.99999996), "0.99999996");
  EXPECT_EQ(format_metric("cosine", 1.0), "1.00000");
  EXPECT_EQ(format_metric("output_cosine", 0.999996), "0.999996");
  EXPECT_EQ(format_metric("mask_iou", 0.99997), "0.99997");  // 4 significant digits would say 1
  EXPECT_EQ(format_metric("mask_iou", 0.98765), "0.9877");
  EXPECT_EQ(format_metric("psnr_db", 41.5), "41.50");
  // In the summary table: a near-1 mean and p5 are told apart from 1.
  RunReport r = testing::synthetic_run_report();
  r.metrics = {{"mask_iou", "mask IoU", true}};
  for (auto& v : r.variants) {
    v.summary.metrics.clear();
    if (v.reference) continue;
    SummaryRow s;
    s.metric = "mask_iou";
    s.count = 8;
    s.mean = v.name == "fp16" ? 0.99997 : 0.9;
    s.p5 = v.name == "fp16" ? 0.99991 : 0.8;
    v.summary.metrics.push_back(s);
  }
  const std::string text = render_summary_text(r);
  EXPECT_NE(text.find("0.99997 (0.9999)"), std::string::npos) << text;  // 0.99991 is not 1 at 4 digits
  EXPECT_EQ(text.find("1 (1)"), std::string::npos) << text;
}

TEST(SummaryText, MacSharesWithoutRecordedShapesSayNotMeasured) {
  RunReport r = testing::synthetic_run_report();
  ModelQuantization q;
  q.model = "unet";
  q.compute_nodes = 147;
  q.quantized_nodes = 95;
  q.params = 1000;
  q.quantized_params = 864;  // no MACs: --no-layers recorded no shapes
  r.variants[2].quantization = {q};
  const std::string text = render_summary_text(r);
  EXPECT_NE(text.find("unet 86% of params (MACs not measured)"), std::string::npos) << text;
  EXPECT_EQ(text.find(" ?"), std::string::npos) << text;
  const std::string html = render_html(r);
  EXPECT_NE(html.find("MACs not measured"), std::string::npos);
  q.macs = 100;
  q.quantized_macs = 84;
  r.variants[2].quantization = {q};
  EXPECT_NE(render_summary_text(r).find("unet 84%"), std::string::npos);
}

TEST(TextTable, WrapsLongLinesAtSpacesAndNeverCutsAWord) {
  const std::string word(120, 'x');
  EXPECT_EQ(wrap_line("short line", 100), "short line\n");
  EXPECT_EQ(wrap_line("  aaa bbb ccc", 9, "    "), "  aaa bbb\n    ccc\n");
  EXPECT_EQ(wrap_line("a " + word, 100), "a\n    " + word + "\n");
}

TEST(SummaryText, CompareRecipesKeepsWholeRecipeNames) {
  RecipeComparison c;
  c.gate.source = "gate.json";
  c.quality_metric = "psnr_db";
  RecipeRow row;
  row.variant = "int8-level3-smoothquant-alpha0.8-percentile99.9";
  row.gate_passed = true;
  c.rows.push_back(row);
  const std::string text = render_summary_text(c, {}, 100);
  EXPECT_NE(text.find(row.variant), std::string::npos) << text;
  for (const auto& line : lines_of(text)) EXPECT_LE(line.size(), 100u) << line;
}

}  // namespace
}  // namespace qeval::reports
