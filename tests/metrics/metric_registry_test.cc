// The metric registry as the one source of metric identity: lookups, the missing-value rule, no metric
// name spelled in eval/ or reports/ sources, and docs/gate.md's metric table generated from it.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "metrics/image_metric.h"
#include "metrics/metric_registry.h"
#include "reports/run_report_model.h"
#include "test_util.h"

namespace qeval::metrics {
namespace {

namespace fs = std::filesystem;

TEST(MetricRegistry, EveryImageMetricKeyIsRegisteredOnceWithItsIdentity) {
  std::set<std::string_view> keys;
  for (const MetricDef& d : metric_defs()) {
    EXPECT_TRUE(keys.insert(d.key).second) << d.key << " registered twice";
    EXPECT_FALSE(d.label.empty()) << d.key;
  }
  for (const auto& m : image_metrics()) {
    std::vector<MetricValue> values;
    const Tensor a = testing::random_planes(3, 40, 48, 1), b = testing::random_planes(3, 40, 48, 2);
    m->compute(a, b, {}, values);
    const auto defs = m->defs();
    ASSERT_EQ(values.size(), defs.size()) << m->name() << ": defs() must list what compute() appends";
    for (std::size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(values[i].key, defs[i].key) << m->name();
      const MetricDef* d = find_metric(values[i].key);
      ASSERT_NE(d, nullptr) << values[i].key;
      EXPECT_EQ(d->scope, MetricScope::kImagePair) << values[i].key;
    }
  }
}

TEST(MetricRegistry, QualifiedKeysResolveToTheirMetric) {
  ASSERT_NE(find_metric(keys::kSqnrDb), nullptr);
  EXPECT_EQ(find_metric("output_sqnr_db"), find_metric(keys::kSqnrDb));
  EXPECT_EQ(find_metric("logit_sqnr_db"), find_metric(keys::kSqnrDb));
  EXPECT_EQ(find_metric("sigmoid_0.tmp_0.max_abs"), find_metric(keys::kMaxAbs));
  EXPECT_EQ(find_metric("x.psnr_y_db"), find_metric(keys::kPsnrYDb));  // the longest key it ends with
  EXPECT_EQ(find_metric("max_abs_diff"), find_metric(keys::kMaxAbsDiff));
  EXPECT_EQ(find_metric("psnr"), nullptr);      // a metric's name, not a key
  EXPECT_EQ(find_metric("xsqnr_db"), nullptr);  // no separator
  EXPECT_EQ(find_metric("absmax"), nullptr);
  EXPECT_THROW(metric_def("no_such_metric"), std::logic_error);
  EXPECT_TRUE(metric_def("output_sqnr_db").higher_is_better);
  EXPECT_FALSE(metric_def("output_rel_l2").higher_is_better);
}

TEST(MetricRegistry, AMissingValueIsUnboundedOnlyForAnIdenticalSampleOfAnUnboundedMetric) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(counted_value(find_metric(keys::kPsnrDb), std::nullopt, true), inf);
  EXPECT_EQ(counted_value(find_metric("logit_sqnr_db"), std::nullopt, true), inf);
  EXPECT_EQ(counted_value(find_metric(keys::kPsnrDb), std::nullopt, false), std::nullopt);
  // MS-SSIM of an identical pair too small for it, cosine of two zero tensors: not applicable
  // (`qeval run` used to read these as +inf, compare-images as not applicable).
  EXPECT_EQ(counted_value(find_metric(keys::kMsSsim), std::nullopt, true), std::nullopt);
  EXPECT_EQ(counted_value(find_metric("output_cosine"), std::nullopt, true), std::nullopt);
  EXPECT_EQ(counted_value(find_metric(keys::kBoundaryF), std::nullopt, true), std::nullopt);
  EXPECT_EQ(counted_value(nullptr, std::nullopt, true), std::nullopt);
  EXPECT_EQ(counted_value(find_metric(keys::kSsim), 0.5, true), 0.5);
}

// report.json's per-layer error columns are registry metrics qualified by how they were measured
// ("acc_sqnr_db", "local_max_abs"): their labels and directions must be the registry's.
TEST(MetricRegistry, LayerErrorColumnsAgreeWithTheRegistry) {
  std::size_t error_columns = 0;
  for (const auto& c : reports::kLayerColumns) {
    const std::string key = c.key;
    const MetricDef* d = find_metric(key);
    if (!d) continue;  // absmax, p99_9, mean, std, clip_rate: activation statistics, not comparisons
    EXPECT_EQ(c.higher_is_better, d->higher_is_better) << key;
    if (d->scope != MetricScope::kTensorPair) continue;
    ++error_columns;
    const std::string qualifier = key.substr(0, key.size() - d->key.size() - 1);
    EXPECT_EQ(std::string(c.label), qualifier + " " + std::string(d->label)) << key;
  }
  EXPECT_EQ(error_columns, 8u);  // acc_ and local_ of sqnr_db, cosine, rel_l2, max_abs
}

// The string literals of a C++ source (comments skipped; raw strings read whole).
std::vector<std::string> string_literals(const std::string& src) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < src.size();) {
    const char c = src[i];
    if (src.compare(i, 2, "//") == 0) {
      i = src.find('\n', i);
      if (i == std::string::npos) break;
    } else if (src.compare(i, 2, "/*") == 0) {
      i = src.find("*/", i + 2);
      if (i == std::string::npos) break;
      i += 2;
    } else if (c == 'R' && i + 1 < src.size() && src[i + 1] == '"' &&
               (i == 0 || !std::isalnum(uint8_t(src[i - 1])) || src[i - 1] == '8' || src[i - 1] == 'u')) {
      const std::size_t open = src.find('(', i + 2);
      const std::string end = ")" + src.substr(i + 2, open - i - 2) + "\"";
      const std::size_t close = src.find(end, open);
      out.push_back(src.substr(open + 1, close - open - 1));
      i = close + end.size();
    } else if (c == '"') {
      std::string s;
      for (++i; i < src.size() && src[i] != '"'; ++i) {
        if (src[i] == '\\') s += src[i++];
        s += src[i];
      }
      out.push_back(s);
      ++i;
    } else if (c == '\'' && (i == 0 || !std::isalnum(uint8_t(src[i - 1])))) {  // not a digit separator
      for (++i; i < src.size() && src[i] != '\''; ++i)
        if (src[i] == '\\') ++i;
      ++i;
    } else {
      ++i;
    }
  }
  return out;
}

TEST(MetricNames, TheLexerFindsLiteralsAndSkipsComments) {
  const auto lits =
      string_literals("a = \"x\\\"y\"; // \"no\"\n/* \"no\" */ b = R\"d(r\"aw)d\"; c = '\"'; 1'000; \"z\"");
  EXPECT_EQ(lits, (std::vector<std::string>{"x\\\"y", "r\"aw", "z"}));
}

// A literal that names a metric: an image metric's name, a registered key, or a key qualified with
// a prefix ("output_sqnr_db", "logits.sqnr_db").
std::string names_metric(const std::string& literal) {
  for (const auto& m : image_metrics())
    if (literal == m->name()) return std::string(m->name());
  for (const MetricDef& d : metric_defs()) {
    const std::string key(d.key);
    if (literal == key) return key;
    if (literal.size() > key.size() && literal.ends_with(key)) {
      const char sep = literal[literal.size() - key.size() - 1];
      if (sep == '_' || sep == '.') return key;
    }
  }
  return {};
}

TEST(MetricNames, NoMetricNameIsSpelledInEvalOrReports) {
  // Names of another identity that happen to spell a metric key.
  std::set<std::string> layer_columns;  // report.json's per-layer columns (reports::kLayerColumns)
  for (const auto& c : reports::kLayerColumns) layer_columns.insert(c.key);
  const std::set<std::pair<std::string, std::string>> other_identity = {
      {"eval/quant/recipe.cc", "mse"},        // the MSE calibration method of a recipe
      {"eval/quant/calibrate.cc", "mse"},     // its cache field
      {"eval/run/gate.cc", "max_nonfinite"},  // gate file keys (docs/gate.md)
      {"eval/run/gate.cc", "allow_nonfinite"},
  };
  const fs::path src = testing::source_dir();
  std::size_t files = 0;
  std::vector<std::string> found;
  for (const char* dir : {"base", "eval", "reports"})
    for (const auto& e : fs::recursive_directory_iterator(src / dir)) {
      const auto ext = e.path().extension();
      if (!e.is_regular_file() || (ext != ".cc" && ext != ".h")) continue;
      ++files;
      const std::string rel = fs::relative(e.path(), src).generic_string();
      for (const auto& lit : string_literals(testing::read_text(e.path()))) {
        const std::string key = names_metric(lit);
        if (key.empty() || layer_columns.count(lit) || other_identity.count({rel, lit})) continue;
        found.push_back(rel + ": \"" + lit + "\"");
      }
    }
  EXPECT_GT(files, 100u);
  EXPECT_TRUE(found.empty()) << "metric names spelled outside metrics/ (use metrics::keys or a registry lookup):\n"
                             << ::testing::PrintToString(found);
}

TEST(MetricNames, TheScanWouldSeeASpelledName) {
  // What the scan above reads, on lines like the ones it replaced.
  EXPECT_EQ(names_metric(string_literals(R"(out.push_back({"psnr_db", v});)")[0]), "psnr_db");
  EXPECT_EQ(names_metric(string_literals(R"(if (m.key == "output_sqnr_db"))")[0]), "sqnr_db");
  EXPECT_EQ(names_metric(string_literals(R"(find_image_metric("ms_ssim"))")[0]), "ms_ssim");
  EXPECT_EQ(names_metric("psnr"), "psnr");
  EXPECT_EQ(names_metric("noise_pred"), "");
}

// docs/gate.md's table of every registered metric, between the "metric registry" markers.
TEST(MetricNames, GateDocsListEveryRegisteredMetric) {
  auto scope = [](MetricScope s) {
    switch (s) {
      case MetricScope::kImagePair: return "image pair";
      case MetricScope::kTensorPair: return "tensor pair";
      case MetricScope::kMask: return "mask";
      case MetricScope::kCount: return "count";
    }
    return "?";
  };
  std::string table =
      "| key | compares | label | unit | better | no value on an identical sample |\n|---|---|---|---|---|---|\n";
  auto cell = [](std::string_view text) {  // a '|' would end the cell
    std::string out;
    for (char c : text) out += c == '|' ? std::string("\\|") : std::string(1, c);
    return out;
  };
  for (const MetricDef& d : metric_defs())
    table += "| `" + std::string(d.key) + "` | " + scope(d.scope) + " | " + cell(d.label) + " | " +
             std::string(d.unit) + " | " + (d.higher_is_better ? "higher" : "lower") + " | " +
             (d.unbounded_when_identical ? "+inf (unbounded)" : "not applicable") + " |\n";
  const std::string doc = testing::read_text(testing::source_dir() / "docs/gate.md");
  const std::string begin = "<!-- metric registry: begin (generated: tests/metrics/metric_registry_test.cc) -->\n";
  const std::string end = "<!-- metric registry: end -->";
  const std::size_t a = doc.find(begin), b = doc.find(end);
  ASSERT_NE(a, std::string::npos) << "docs/gate.md has no '" << begin << "' marker";
  ASSERT_NE(b, std::string::npos);
  EXPECT_EQ(doc.substr(a + begin.size(), b - a - begin.size()), table)
      << "docs/gate.md's metric registry table is out of date; between the markers it should read:\n"
      << table;
}

}  // namespace
}  // namespace qeval::metrics
