// qeval run reports: report.json against docs/report.schema.json, the reader's round trip and its
// errors, junit.xml, the stdout summary.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

#include "kernels/error.h"
#include "reports/json_schema.h"
#include "reports/json_text.h"
#include "reports/run_report.h"
#include "reports/run_report_fixture.h"
#include "test_util.h"

namespace qeval::reports {
namespace {

using nlohmann::json;

testing::JsonSchema report_schema() {
  return testing::JsonSchema(testing::read_json(testing::source_dir() / "docs" / "report.schema.json"));
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST(JsonSchemaValidator, ChecksTheKeywordsItSupports) {
  testing::JsonSchema s(json::parse(R"({
    "type": "object", "additionalProperties": false, "required": ["n", "k"],
    "properties": {
      "n": {"$ref": "#/$defs/count"},
      "k": {"enum": ["a", "b"]},
      "x": {"anyOf": [{"type": "number"}, {"const": "inf"}]},
      "s": {"type": "string", "pattern": "^[0-9]+/[0-9]+$", "minLength": 3},
      "a": {"type": "array", "minItems": 1, "items": {"type": ["integer", "null"]}}
    },
    "$defs": {"count": {"type": "integer", "minimum": 0}}})"));
  EXPECT_TRUE(s.validate(json::parse(R"({"n": 3, "k": "a", "x": "inf", "s": "1/4", "a": [1, null, 2.0]})")).empty());
  auto errors = s.validate(json::parse(R"({"n": -1, "k": "c", "x": "nan", "s": "14", "a": [], "z": 1})"));
  const std::string all = joined(errors);
  EXPECT_NE(all.find("$.n: below the minimum 0"), std::string::npos) << all;
  EXPECT_NE(all.find("$.k: expected one of"), std::string::npos) << all;
  EXPECT_NE(all.find("$.x: matches no anyOf branch"), std::string::npos) << all;
  EXPECT_NE(all.find("$.s: shorter than 3"), std::string::npos) << all;
  EXPECT_NE(all.find("$.s: does not match"), std::string::npos) << all;
  EXPECT_NE(all.find("$.a: fewer than 1 items"), std::string::npos) << all;
  EXPECT_NE(all.find("$.z: key not allowed"), std::string::npos) << all;
  EXPECT_EQ(joined(s.validate(json::parse(R"({"n": 1.5, "k": "a"})"))), "$.n: expected type \"integer\", found 1.5\n");
  EXPECT_NE(joined(s.validate(json::parse(R"({"k": "a"})"))).find("missing required key \"n\""), std::string::npos);
  // A keyword the validator does not implement must not be skipped silently.
  EXPECT_THROW(testing::JsonSchema(json::parse(R"({"oneOf": [true]})")), std::invalid_argument);
  EXPECT_THROW(testing::JsonSchema(json::parse(R"({"properties": {"a": {"$ref": "#/$defs/nope"}}})")),
               std::invalid_argument);
}

TEST(RunReport, WrittenReportsMatchThePublishedSchema) {
  const auto schema = report_schema();
  RunReport r = testing::synthetic_run_report();
  testing::ScratchDir dir("runreport-schema");
  write_run_report(r, dir.path());
  for (const char* f : {"report.json", "report.html", "junit.xml"}) EXPECT_TRUE(std::filesystem::exists(dir / f)) << f;
  json j = testing::read_json(dir / "report.json");
  auto errors = schema.validate(j);
  EXPECT_TRUE(errors.empty()) << joined(errors);
  EXPECT_EQ(j["schema_version"], kRunReportSchemaVersion);
  EXPECT_EQ(j["kind"], "run");

  // A minimal report (no layers, no steps, no samples) is valid too.
  RunReport empty;
  empty.variants.push_back({});
  empty.variants[0].name = "fp32";
  empty.variants[0].reference = true;
  errors = schema.validate(to_json(empty));
  EXPECT_TRUE(errors.empty()) << joined(errors);

  // The schema catches what a reader would trip on.
  json bad = j;
  bad["variants"][2]["kind"] = "int4";
  bad["layers"]["tables"][1]["stats"]["local_sqnr_db"][3] = "nan";
  bad["samples"][0]["results"][1]["metrics"]["ssim"] = "0.9";
  bad["gate"].erase("checks");
  bad["layers"]["tables"][0]["stats"]["sqnr"] = json::array();
  const std::string all = joined(schema.validate(bad));
  for (const char* path :
       {"$.variants[2].kind", "$.layers.tables[1].stats.local_sqnr_db[3]", "$.samples[0].results[1].metrics.ssim",
        "$.gate: missing required key", "$.layers.tables[0].stats.sqnr"})
    EXPECT_NE(all.find(path), std::string::npos) << path << "\n" << all;
}

TEST(RunReport, ReaderRoundTripsEverythingButThumbnails) {
  RunReport r = testing::synthetic_run_report();
  testing::ScratchDir dir("runreport-roundtrip");
  write_run_report(r, dir.path());
  RunReport back = read_run_report(dir / "report.json");

  // Same document, byte for byte, when written again.
  EXPECT_EQ(dump_json_readable(to_json(back)), dump_json_readable(to_json(r)));
  // Float cells come back bit-exact (shortest round-trip digits), NaN and infinities included.
  ASSERT_EQ(back.layer_tables.size(), r.layer_tables.size());
  for (std::size_t v = 0; v < r.layer_tables.size(); ++v)
    for (const auto& col : kLayerColumns) {
      EXPECT_TRUE(same_bits(back.layer_tables[v].stats.*col.column, r.layer_tables[v].stats.*col.column))
          << r.layer_tables[v].variant << " " << col.key;
      EXPECT_TRUE(same_bits(back.timesteps.tables[v].stats.*col.column, r.timesteps.tables[v].stats.*col.column))
          << r.layer_tables[v].variant << " steps " << col.key;
    }
  EXPECT_TRUE(same_bits(back.layer_tables[2].calib_amax, r.layer_tables[2].calib_amax));
  EXPECT_TRUE(std::isnan(back.layer_tables[0].calib_amax[0]));
  EXPECT_TRUE(back.layer_tables[0].format.empty());
  EXPECT_EQ(back.layer_tables[2].format, r.layer_tables[2].format);
  EXPECT_EQ(back.layers, r.layers);
  EXPECT_EQ(back.histograms, r.histograms);
  EXPECT_EQ(back.nonfinite, r.nonfinite);
  EXPECT_EQ(back.metrics, r.metrics);
  EXPECT_EQ(back.config.calibration, r.config.calibration);
  EXPECT_EQ(back.config.settings, r.config.settings);
  EXPECT_EQ(back.config.seeds, r.config.seeds);
  ASSERT_EQ(back.variants.size(), 4u);
  EXPECT_EQ(back.variants[3].kind, VariantKind::kOnnx);
  EXPECT_EQ(back.variants[3].unmatched, r.variants[3].unmatched);
  EXPECT_EQ(back.variants[3].onnx, r.variants[3].onnx);
  EXPECT_EQ(back.variants[2].recipe, r.variants[2].recipe);
  EXPECT_TRUE(back.variants[0].reference);
  // Sample metrics keep the report's metric order; notes and unbounded values survive.
  const SampleResult& res = back.samples[1].results[2];
  ASSERT_EQ(res.metrics.size(), 3u);
  EXPECT_EQ(res.metrics[0].key, "psnr_db");
  EXPECT_EQ(res.metrics[2].key, "ms_ssim");
  EXPECT_FALSE(res.metrics[2].value);
  EXPECT_EQ(res.metrics[2].note, "image smaller than 161 px");
  EXPECT_EQ(res.image.path, r.samples[1].results[2].image.path);
  EXPECT_TRUE(res.image.png.empty());  // thumbnails live in report.html only
  EXPECT_EQ(back.samples[6].results[3].error, r.samples[6].results[3].error);
  // Gate values: +inf survives as "inf".
  r.gate.checks[0].value = std::numeric_limits<double>::infinity();
  RunReport again = run_report_from_json(to_json(r), "mem");
  EXPECT_TRUE(again.gate.checks[0].value && std::isinf(*again.gate.checks[0].value));
  EXPECT_EQ(again.gate.checks[0].variant, "fp16");
}

TEST(RunReport, SummariesAreRecomputedFromSamples) {
  RunReport r = testing::synthetic_run_report();
  const SummaryRow psnr = r.variants[2].summary.metrics[0];
  for (auto& v : r.variants) v.summary.metrics.clear();
  summarize_samples(r);
  EXPECT_TRUE(r.variants[0].summary.metrics.empty());  // the reference has nothing to compare
  ASSERT_EQ(r.variants[2].summary.metrics.size(), 3u);
  EXPECT_EQ(r.variants[2].summary.metrics[0].count, psnr.count);
  EXPECT_DOUBLE_EQ(r.variants[2].summary.metrics[0].mean, psnr.mean);
  EXPECT_EQ(r.variants[2].summary.metrics[2].not_applicable, 8u);  // MS-SSIM: images too small
  EXPECT_EQ(r.variants[3].summary.errors, 1u);
  EXPECT_EQ(r.variants[3].summary.metrics[0].count, 7u);
  // An identical output has no PSNR value: it counts as unbounded, not as not-applicable.
  r.samples[0].results[1].identical = true;
  r.samples[0].results[1].metrics[0].value.reset();
  summarize_samples(r);
  EXPECT_EQ(r.variants[1].summary.metrics[0].unbounded, 1u);
  EXPECT_EQ(r.variants[1].summary.metrics[0].count, 7u);
}

TEST(RunReport, ReaderErrorsNameTheFileAndKeyPath) {
  const json good = to_json(testing::synthetic_run_report({.prompts = 2, .layers = 4, .steps = 3, .images = false}));
  auto error_of = [&](const std::function<void(json&)>& mutate) {
    json j = good;
    mutate(j);
    try {
      run_report_from_json(j, "out/report.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of([](json& j) { j["schema_version"] = "2.0"; }),
            "out/report.json: schema_version: this qeval reads report schema 1.x, found \"2.0\" "
            "(see docs/report.md)");
  EXPECT_NE(error_of([](json& j) {
              j["variants"][1].erase("kind");
            }).find("out/report.json: variants[1]: missing key 'kind'"),
            std::string::npos);
  EXPECT_NE(error_of([](json& j) { j["variants"][2]["kind"] = "int4"; }).find("variants[2].kind: expected one of"),
            std::string::npos);
  EXPECT_NE(error_of([](json& j) {
              j["layers"]["tables"][1]["stats"]["acc_sqnr_db"].erase(0);
            }).find("layers.tables[1].stats.acc_sqnr_db: expected 4 values (or none), found 3"),
            std::string::npos);
  EXPECT_NE(error_of([](json& j) {
              j["timesteps"]["tables"][0]["stats"]["absmax"][0] = "big";
            }).find("timesteps.tables[0].stats.absmax[0]: expected a number, null, \"inf\""),
            std::string::npos);
  EXPECT_NE(error_of([](json& j) {
              j["histograms"][0]["variant"] = "int4";
            }).find("histograms[0].variant: unknown variant \"int4\""),
            std::string::npos);
  EXPECT_NE(error_of([](json& j) {
              j["timesteps"]["layers"][0] = 99;
            }).find("timesteps.layers[0]: layer index 99 >= 4 layers"),
            std::string::npos);
  EXPECT_NE(error_of([](json& j) {
              j["samples"][0]["results"][1]["status"] = "error";
            }).find("samples[0].results[1].status: \"error\" contradicts"),
            std::string::npos);
  EXPECT_NE(error_of([](json& j) { j["kind"] = "compare-images"; }).find("kind: expected \"run\""), std::string::npos);
  // A newer minor version with keys this reader does not know is still read.
  EXPECT_EQ(error_of([](json& j) {
              j["schema_version"] = "1.7";
              j["future_section"] = json::object();
            }),
            "no error");
  testing::ScratchDir dir("runreport-badfile");
  std::ofstream(dir / "report.json") << "{\"schema_version\": ";
  EXPECT_THROW(read_run_report(dir / "report.json"), InputError);
  EXPECT_THROW(read_run_report(dir / "missing.json"), InputError);
}

TEST(RunReport, InconsistentReportsAreRefusedBeforeWriting) {
  EXPECT_TRUE(check_run_report(testing::synthetic_run_report({.prompts = 2, .layers = 6, .steps = 3})).empty());
  RunReport r = testing::synthetic_run_report({.prompts = 2, .layers = 6, .steps = 3, .images = false});
  r.variants[1].reference = true;
  r.layer_tables[2].stats.local_sqnr_db.pop_back();
  r.timesteps.tables[1].stats.absmax.push_back(1);
  r.histograms[0].step = 3;
  r.step_curves[0].values.pop_back();
  r.samples[1].results[0].variant = "fp64";
  r.gate.checks[0].variant = "int4";
  const auto problems = check_run_report(r);
  std::string all;
  for (const auto& p : problems) all += p + "\n";
  for (const char* expected :
       {"2 variants are marked reference; expected exactly 1",
        "layer table int8-l3.local_sqnr_db: 5 values, expected 6 (or none)",
        "step table fp16.absmax: 19 values, expected 18 (or none)", "histogram of fp32: step 3 outside [-1, 3)",
        "step curve fp16 noise_pred sqnr_db: 2 values, expected 3 (or none)",
        "sample p001-s42: unknown variant \"fp64\"", "gate check \"psnr_db mean >= 30\": unknown variant \"int4\""})
    EXPECT_NE(all.find(expected), std::string::npos) << expected << "\n" << all;
  EXPECT_EQ(problems.size(), 7u) << all;
  testing::ScratchDir dir("runreport-inconsistent");
  EXPECT_THROW(write_run_report(r, dir / "out"), std::logic_error);
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

TEST(RunReport, JsonStaysCompactForHundredsOfLayers) {
  // 400 layers x 20 steps x 4 variants: columns are one line each, so the file stays small.
  RunReport r = testing::synthetic_run_report({.prompts = 2, .layers = 400, .steps = 20, .images = false});
  const std::string text = dump_json_readable(to_json(r));
  EXPECT_LT(text.size(), 6u << 20) << text.size();
  std::size_t lines = std::count(text.begin(), text.end(), '\n');
  EXPECT_LT(lines, 4000u);
}

TEST(RunReport, JunitListsEveryCheckByVariant) {
  RunReport r = testing::synthetic_run_report();
  const std::string x = render_junit(r);
  std::size_t failed = 0;
  for (const auto& c : r.gate.checks) failed += !c.passed;
  ASSERT_GT(failed, 0u);
  EXPECT_NE(x.find(fmt::format("tests=\"{}\" failures=\"{}\"", r.gate.checks.size(), failed)), std::string::npos);
  EXPECT_NE(x.find("classname=\"gate.int8-l3\" name=\"worst-layer local SQNR &gt;= 10 dB\"><failure"),
            std::string::npos);
  EXPECT_NE(x.find("classname=\"gate.fp16\" name=\"no NaN/Inf\"></testcase>"), std::string::npos);
}

}  // namespace
}  // namespace qeval::reports

namespace qeval::reports {
namespace {

TEST(RunReport, SummaryTextFitsOneScreen) {
  RunReport r = testing::synthetic_run_report();
  const std::string text = render_summary_text(r, "out/run");
  std::istringstream in(text);
  std::size_t lines = 0;
  for (std::string line; std::getline(in, line); ++lines) EXPECT_LE(line.size(), 100u) << line;
  EXPECT_LE(lines, 26u);  // was 24 when names and lines were cut at 100 columns; now they wrap
  EXPECT_EQ(text.rfind("qeval run: FAIL - 8 of 12 gate checks passed (gate.json)", 0), 0u) << text;
  EXPECT_NE(text.find("int8-l3   recipe           63%  36.67 (36.61)"), std::string::npos) << text;
  EXPECT_NE(text.find("FAIL 2/4, 1 failed"), std::string::npos) << text;
  EXPECT_NE(text.find("worst-layer local SQNR >= 10 dB: value 4.46"), std::string::npos) << text;
  EXPECT_NE(text.find("int8-l3   mid_block.1/Softmax_37 4.46"), std::string::npos) << text;
  EXPECT_NE(text.find("fp8-qdq   up_blocks.1/Softmax_57 (Softmax) step 18, sample p005-s42: 0 NaN, 12 Inf"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("report: out/run/report.html"), std::string::npos);
  EXPECT_NE(text.find("worst layers (local SQNR dB):"), std::string::npos) << text;
  {  // Without local error the layers are ranked by accumulated SQNR, and the heading says so.
    RunReport acc = r;
    for (auto& t : acc.layer_tables) t.stats.local_sqnr_db.clear();
    const std::string a = render_summary_text(acc);
    EXPECT_NE(a.find("worst layers (accumulated SQNR dB: no local error):"), std::string::npos) << a;
    EXPECT_EQ(a.find("worst layers (local SQNR dB)"), std::string::npos) << a;
  }
  // Many variants and failed checks are listed up to a count ("... and N more"), not scrolled.
  for (int i = 0; i < 12; ++i) {
    Variant v = r.variants[2];
    v.name = "int8-extra-" + std::to_string(i);
    r.variants.push_back(v);
    GateCheckRow c = r.gate.checks[6];
    c.variant = v.name;
    r.gate.checks.push_back(c);
  }
  const std::string many = render_summary_text(r);
  EXPECT_LE(std::count(many.begin(), many.end(), '\n'), 32) << many;  // 30 when cut
  EXPECT_NE(many.find("... and 8 more variants"), std::string::npos) << many;
  EXPECT_NE(many.find("  ... and "), std::string::npos) << many;
}

}  // namespace
}  // namespace qeval::reports
