// GMSD, the metric added as one file plus one registration line: its values against the authors'
// GMSD.m ported to numpy (tools/make_gmsd_goldens.py), and its path through compare-images' reports
// and gates, which name it nowhere but in the registry.
#include <gtest/gtest.h>

#include <cmath>

#include "datasets/image_io.h"
#include "metrics/image_metric.h"
#include "metrics/metric_registry.h"
#include "test_util.h"

namespace qeval::metrics {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kGmsdTol = 1e-9;  // double arithmetic on both sides; sums in another order

const ImageMetric& gmsd() {
  const ImageMetric* m = find_image_metric("gmsd");
  if (!m) throw std::runtime_error("gmsd is not registered");
  return *m;
}

std::optional<double> gmsd_of(const Tensor& ref, const Tensor& test, double peak, std::string* note = nullptr) {
  std::vector<MetricValue> values;
  ImageMetricOptions options;
  options.peak = peak;
  gmsd().compute(ref, test, options, values);
  EXPECT_EQ(values.size(), 1u);
  EXPECT_EQ(values[0].key, "gmsd");
  if (note) *note = values[0].note;
  return values[0].value;
}

TEST(Gmsd, IsRegisteredAsALowerIsBetterImagePairMetric) {
  const MetricDef* d = find_metric("gmsd");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->scope, MetricScope::kImagePair);
  EXPECT_FALSE(d->higher_is_better);
  EXPECT_FALSE(d->unbounded_when_identical);  // identical images score 0
  EXPECT_FALSE(d->headline);                  // `qeval run` reports stay as they were
  EXPECT_TRUE(d->summarized);
}

TEST(Gmsd, MatchesTheReferenceImplementationOnTheGoldenPairs) {
  const json golden = testing::read_json(testing::data_dir() / "metrics" / "gmsd_golden.json");
  ASSERT_GE(golden["cases"].size(), 25u);
  bool gray = false, sixteen = false, identical = false, odd = false;
  for (const auto& c : golden["cases"]) {
    const auto dir = testing::data_dir() / "metrics";
    const datasets::Image ref = datasets::load_image(dir / c["ref"].get<std::string>());
    const datasets::Image test = datasets::load_image(dir / c["test"].get<std::string>());
    const auto v = gmsd_of(ref.planes, test.planes, c["data_range"].get<double>());
    ASSERT_TRUE(v.has_value()) << c["name"];
    EXPECT_NEAR(*v, c["gmsd"].get<double>(), kGmsdTol) << c["name"];
    gray |= ref.channels() == 1;
    sixteen |= ref.bit_depth == 16;
    identical |= c["gmsd"].get<double>() == 0.0;
    odd |= ref.width() % 2 == 1 || ref.height() % 2 == 1;
  }
  EXPECT_TRUE(gray && sixteen && identical && odd);
}

TEST(Gmsd, GrowsWithDistortionAndNeedsMoreThanOneBlock) {
  const Tensor a = testing::random_planes(3, 64, 80, 7);
  Tensor slight = a, strong = a;
  for (std::int64_t i = 0; i < a.numel(); i += 7) slight.data<float>()[i] = std::min(255.0f, a.data<float>()[i] + 8);
  for (std::int64_t i = 0; i < a.numel(); i += 2) strong.data<float>()[i] = std::min(255.0f, a.data<float>()[i] + 60);
  EXPECT_EQ(gmsd_of(a, a, 255.0), 0.0);
  EXPECT_LT(*gmsd_of(a, slight, 255.0), *gmsd_of(a, strong, 255.0));
  std::string note;
  const Tensor tiny = testing::random_planes(1, 2, 2, 1), tiny2 = testing::random_planes(1, 2, 2, 2);
  EXPECT_FALSE(gmsd_of(tiny, tiny2, 255.0, &note).has_value());
  EXPECT_NE(note.find("2x2"), std::string::npos) << note;
}

// compare-images on one golden pair: GMSD in report.json (pair, summary, conventions), in report.html's
// tables, and gateable as a summary check and a per-pair bound.
TEST(Gmsd, IsReportedAndGatedByCompareImages) {
  const json golden = testing::read_json(testing::data_dir() / "metrics" / "gmsd_golden.json");
  const json* pick = nullptr;
  for (const auto& c : golden["cases"])
    if (c["name"] == "astronaut_jpeg_q30") pick = &c;
  ASSERT_NE(pick, nullptr);
  const double expected = (*pick)["gmsd"].get<double>();
  testing::ScratchDir dir("gmsd-cli");
  fs::create_directories(dir / "ref");
  fs::create_directories(dir / "test");
  fs::copy_file(testing::data_dir() / "metrics" / (*pick)["ref"].get<std::string>(), dir / "ref/a.png");
  fs::copy_file(testing::data_dir() / "metrics" / (*pick)["test"].get<std::string>(), dir / "test/a.png");
  auto run = [&](const std::string& gate_json, const std::string& out) {
    const fs::path gate = testing::write_text(dir, out + ".json", gate_json);
    return testing::run_qeval("compare-images --ref " + (dir / "ref").string() + " --test " + (dir / "test").string() +
                              " --gate " + gate.string() + " --out " + (dir / out).string());
  };
  const auto pass = run(
      R"({"checks": [{"metric": "gmsd", "stat": "max", "max": 0.05}], "per_pair": {"gmsd": {"max": 0.05}}})", "pass");
  ASSERT_EQ(pass.code, 0) << pass.out;
  const json report = testing::read_json(dir / "pass/report.json");
  EXPECT_NEAR(report["pairs"][0]["metrics"]["gmsd"].get<double>(), expected, kGmsdTol);
  EXPECT_NEAR(report["summary"]["metrics"]["gmsd"]["mean"].get<double>(), expected, kGmsdTol);
  EXPECT_NE(report["conventions"]["gmsd"].get<std::string>().find("Xue"), std::string::npos);
  EXPECT_EQ(report["gate"]["checks"][0]["metric"], "gmsd");
  EXPECT_TRUE(report["gate"]["checks"][0]["passed"].get<bool>());
  const std::string html = testing::read_text(dir / "pass/report.html");
  EXPECT_NE(html.find("<th>GMSD</th>"), std::string::npos);  // the pairs table's column
  EXPECT_NE(html.find("<td>gmsd</td>"), std::string::npos);  // the summary table's row

  const auto fail = run(R"({"checks": [{"metric": "gmsd", "stat": "max", "max": 0.001}]})", "fail");
  EXPECT_EQ(fail.code, 1) << fail.out;
  const json failed = testing::read_json(dir / "fail/report.json");
  EXPECT_EQ(failed["gate"]["checks"][0]["name"], "gmsd max <= 0.001");
  EXPECT_FALSE(failed["gate"]["checks"][0]["passed"].get<bool>());
  const auto per_pair = run(R"({"per_pair": {"gmsd": {"max": 0.001}}})", "per-pair");
  EXPECT_EQ(per_pair.code, 1) << per_pair.out;
  EXPECT_NE(testing::read_text(dir / "per-pair/report.json").find("gmsd"), std::string::npos);
}

}  // namespace
}  // namespace qeval::metrics
