// Report rendering: JSON fields the schema promises, self-contained HTML, atomic writes, base64.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "base/files.h"
#include "kernels/error.h"
#include "reports/compare_report.h"
#include "reports/heatmap.h"
#include "reports/html.h"
#include "test_util.h"

namespace qeval::reports {
namespace {

CompareImagesReport sample_report() {
  CompareImagesReport r;
  r.tool_version = "0.1.0";
  r.created_utc = "2026-11-21T00:00:00Z";
  r.command_line = "qeval compare-images --ref a --test b --out c";
  PairRow ok;
  ok.name = "a<b>.png";
  ok.width = ok.height = 64;
  ok.channels = 3;
  ok.bit_depth = 8;
  ok.color_type = "rgb";
  ok.metrics = {
      {"psnr_db", 31.5, {31.0, 32.0, 31.6}, ""}, {"ssim", 0.95, {}, ""}, {"ms_ssim", std::nullopt, {}, "too small"}};
  ok.failed_checks = {"ssim 0.95 < 0.96"};
  PairRow same;
  same.name = "same.png";
  same.identical = true;
  same.metrics = {{"psnr_db", std::nullopt, {}, "identical"}, {"ssim", 1.0, {}, ""}};
  PairRow bad;
  bad.name = "bad.png";
  bad.error = "reference is 3x3, test is 4x4";
  bad.error_kind = "size_mismatch";
  r.pairs = {ok, same, bad};
  r.gate.passed = false;
  r.gate.source = "gate.json";
  r.gate.checks = {{"ssim mean >= 0.96", "ssim", "mean", ">=", 0.96, 0.975, true, "why", ""},
                   {"psnr_db min >= 30", "psnr_db", "min", ">=", 30, std::numeric_limits<double>::infinity(), true,
                    "all identical", ""},
                   {"pairs that could not be compared <= 0", "errors", "count", "<=", 0, 1, false, "1 pair", ""}};
  r.worst = {{"a<b>.png", "SSIM 0.95", {1, 2, 3}, {4, 5}, {6}, "legend", {7}, "legend x8"}};
  return r;
}

TEST(CompareReport, JsonCarriesTheSchemaFields) {
  auto j = to_json(sample_report());
  EXPECT_EQ(j["schema_version"], kCompareImagesSchemaVersion);
  EXPECT_EQ(j["kind"], "compare-images");
  ASSERT_EQ(j["pairs"].size(), 3u);
  EXPECT_EQ(j["pairs"][0]["name"], "a<b>.png");
  EXPECT_DOUBLE_EQ(j["pairs"][0]["psnr_db"].get<double>(), 31.5);
  EXPECT_DOUBLE_EQ(j["pairs"][0]["ssim"].get<double>(), 0.95);
  EXPECT_TRUE(j["pairs"][0]["ms_ssim"].is_null());
  EXPECT_EQ(j["pairs"][0]["metric_notes"]["ms_ssim"], "too small");
  EXPECT_EQ(j["pairs"][0]["per_channel"]["psnr_db"].size(), 3u);
  EXPECT_FALSE(j["pairs"][0]["passed"].get<bool>());
  EXPECT_TRUE(j["pairs"][1]["psnr_db"].is_null());
  EXPECT_TRUE(j["pairs"][1]["identical"].get<bool>());
  EXPECT_EQ(j["pairs"][2]["status"], "error");
  EXPECT_EQ(j["pairs"][2]["error_kind"], "size_mismatch");
  EXPECT_FALSE(j["gate"]["passed"].get<bool>());
  ASSERT_EQ(j["gate"]["checks"].size(), 3u);
  for (const auto& c : j["gate"]["checks"])
    for (const char* key : {"name", "threshold", "value", "passed", "detail"}) EXPECT_TRUE(c.contains(key)) << key;
  EXPECT_TRUE(j["gate"]["checks"][1]["value"].is_null());
  EXPECT_TRUE(j["gate"]["checks"][1]["value_unbounded"].get<bool>());
  EXPECT_EQ(j["summary"]["errors"], 1);
  // JSON has no inf/NaN: the document must round-trip through a strict parser.
  EXPECT_NO_THROW(nlohmann::json::parse(j.dump()));
}

TEST(CompareReport, HtmlIsSelfContainedAndEscaped) {
  std::string h = render_html(sample_report());
  EXPECT_NE(h.find("<div class=\"verdict fail\">FAIL"), std::string::npos);
  EXPECT_NE(h.find("a&lt;b&gt;.png"), std::string::npos);
  EXPECT_EQ(h.find("a<b>.png"), std::string::npos);
  EXPECT_NE(h.find("data:image/png;base64,"), std::string::npos);
  EXPECT_EQ(h.find("http://"), std::string::npos);
  EXPECT_EQ(h.find("https://"), std::string::npos);
  EXPECT_EQ(h.find("src=\"//"), std::string::npos);
  // Gate table before the per-pair table: the verdict and its reasons come first.
  EXPECT_LT(h.find("<h2 id=\"gate\">Gate</h2>"), h.find("<h2 id=\"pairs\">Pairs</h2>"));
  EXPECT_NE(h.find("reference is 3x3, test is 4x4"), std::string::npos);
}

TEST(CompareReport, JunitHasOneCasePerCheck) {
  std::string x = render_junit(sample_report());
  EXPECT_NE(x.find("tests=\"3\" failures=\"1\""), std::string::npos);
  EXPECT_NE(x.find("<failure message=\"1 pair\"/>"), std::string::npos);
}

TEST(Files, AtomicWriteReplacesAndLeavesNoTemporary) {
  testing::ScratchDir dir("atomic");
  base::write_file_atomic(dir / "r.json", "first");
  base::write_file_atomic(dir / "r.json", "second");
  auto bytes = testing::read_bytes(dir / "r.json");
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "second");
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  EXPECT_THROW(base::write_file_atomic(dir / "no/such/dir/r.json", "x"), InputError);
}

TEST(Files, AtomicWriterInPiecesCommitsOrLeavesTheTargetAlone) {
  testing::ScratchDir dir("atomic_pieces");
  auto target = dir / "state.bin";
  base::write_file_atomic(target, "old");
  auto files = [&] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.path())) n += e.is_regular_file();
    return n;
  };
  {
    base::AtomicFileWriter out(target);
    out.write("new ");
    EXPECT_EQ(files(), 2);  // the temporary beside the target
  }                         // not committed (an error on the way): the target keeps its bytes, the temporary is gone
  auto bytes = testing::read_bytes(target);
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "old");
  EXPECT_EQ(files(), 1);
  {
    base::AtomicFileWriter out(target);
    out.write("new ");
    out.write(std::string(100000, 'x'));
    out.commit();
    EXPECT_THROW(out.write("late"), std::logic_error);
  }
  bytes = testing::read_bytes(target);
  EXPECT_EQ(bytes.size(), 100004u);
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 4), "new ");
  EXPECT_EQ(files(), 1);
  EXPECT_THROW(base::AtomicFileWriter(dir / "no/such/dir/r.json"), InputError);
}

TEST(Files, WriteReportCreatesTheThreeFiles) {
  testing::ScratchDir dir("report");
  write_compare_images_report(sample_report(), dir / "out");
  for (const char* f : {"report.json", "report.html", "junit.xml"})
    EXPECT_TRUE(std::filesystem::exists(dir / "out" / f)) << f;
  auto j = testing::read_json(dir / "out" / "report.json");
  EXPECT_EQ(j["schema_version"], kCompareImagesSchemaVersion);
}

TEST(Files, Base64MatchesRfc4648Vectors) {
  EXPECT_EQ(html::base64(""), "");
  EXPECT_EQ(html::base64("f"), "Zg==");
  EXPECT_EQ(html::base64("fo"), "Zm8=");
  EXPECT_EQ(html::base64("foo"), "Zm9v");
  EXPECT_EQ(html::base64("foob"), "Zm9vYg==");
  EXPECT_EQ(html::base64("fooba"), "Zm9vYmE=");
  EXPECT_EQ(html::base64("foobar"), "Zm9vYmFy");
}

TEST(Heatmap, RampEndsAndNaN) {
  std::vector<float> v = {0.0f, 10.0f, 20.0f, NAN};
  auto rgb = heatmap_rgb(v, 10.0f);
  EXPECT_EQ(rgb[0] + rgb[1] + rgb[2], 0 + 0 + 4);  // darkest
  EXPECT_EQ(rgb[3], 252);                          // brightest at the scale
  EXPECT_EQ(rgb[6], rgb[3]);                       // clamped above the scale
  EXPECT_EQ(rgb[9], 255);                          // NaN: magenta
  EXPECT_EQ(rgb[10], 0);
}

}  // namespace
}  // namespace qeval::reports
