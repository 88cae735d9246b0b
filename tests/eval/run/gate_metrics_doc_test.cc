// docs/gate.md lists every metric name a `qeval run` gate may use, per pipeline: its table between
// the "metric names" markers is this test's output (on a mismatch the test prints the table to
// paste), so a metric added to a driver cannot go undocumented.
#include <gtest/gtest.h>

#include <fstream>

#include "eval/run/evaluator.h"
#include "eval/run/gate.h"
#include "eval/run/metric_names.h"
#include "eval/run/run_config.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

namespace fs = std::filesystem;

std::string names(const std::vector<reports::MetricInfo>& metrics, const std::string& strip = {}) {
  std::string out;
  for (const auto& m : metrics) {
    std::string key = m.key;
    if (!strip.empty() && key.rfind(strip, 0) == 0) key = "<output>." + key.substr(strip.size());
    out += (out.empty() ? "`" : ", `") + key + "`";
  }
  return out;
}

std::vector<reports::MetricInfo> driver_metrics(const std::string& config_json) {
  return make_run_driver(parse_run_config(config_json, "test.json"))->description().metrics;
}

TEST(GateDocs, ListsEveryMetricARunReports) {
  const fs::path src = testing::source_dir();
  const fs::path vit = src / "tests/data/onnx/vit_block";
  std::string table =
      "| `qeval run` on | metric names a gate may use (`checks[].metric`, `per_pair` keys) |\n|---|---|\n";
  table += "| a txt2img pipeline (tiny-sd) | " + names(make_run_driver(default_run_config())->description().metrics) +
           " |\n";
  table += "| a segmentation pipeline (tiny-sam) | " +
           names(driver_metrics(R"({"pipeline": ")" + (src / "models/tiny-sam").string() +
                                R"(", "variants": [{"name": "fp32"}, {"name": "fp16", "precision": "fp16"}]})")) +
           " |\n";
  table += "| a single model (outputs pooled) | " +
           names(driver_metrics(R"({"pipeline": ")" + (vit / "model.onnx").string() + R"(", "inputs": ")" +
                                (vit / "inputs").string() +
                                R"(", "variants": [{"name": "fp32"}, {"name": "fp16", "precision": "fp16"}]})")) +
           " |\n";
  for (OutputKind kind : {OutputKind::kTensor, OutputKind::kMask, OutputKind::kMatte, OutputKind::kImage})
    table += "| a single model, an output of kind `" + std::string(output_kind_name(kind)) + "` | " +
             names(output_metric_infos("o", kind), "o.") + " |\n";

  const std::string doc = testing::read_text(src / "docs/gate.md");
  const std::string begin = "<!-- metric names: begin (generated: tests/eval/run/gate_metrics_doc_test.cc) -->\n";
  const std::string end = "<!-- metric names: end -->";
  const std::size_t a = doc.find(begin), b = doc.find(end);
  ASSERT_NE(a, std::string::npos) << "docs/gate.md has no '" << begin << "' marker";
  ASSERT_NE(b, std::string::npos);
  EXPECT_EQ(doc.substr(a + begin.size(), b - a - begin.size()), table)
      << "docs/gate.md's metric table is out of date; between the markers it should read:\n"
      << table;
  // And every layer column a layer check may name.
  for (const auto& column : gate_layer_columns())
    EXPECT_NE(doc.find("`" + column + "`"), std::string::npos) << column << " is not in docs/gate.md";
}

}  // namespace
}  // namespace qeval::eval
