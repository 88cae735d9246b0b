#include "eval/quant/recipe.h"

#include <gtest/gtest.h>

#include "base/json_config.h"
#include "kernels/error.h"

namespace qeval::eval::quant {
namespace {

Recipe parse(const std::string& text) {
  return parse_recipe(base::JsonConfig::parse(text, "r.json", "docs/recipes.md"));
}

std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Recipe, ParsesEveryFieldWithDefaults) {
  Recipe r = parse(R"({"name": "l25", "format": "int8", "level": 2.5,
      "calibration": {"method": "percentile", "percentile": 0.8, "collect": "mean-max"},
      "smoothquant": {"alpha": 0.8}, "exclude": ["up_blocks\\.1"]})");
  EXPECT_EQ(r.name, "l25");
  EXPECT_EQ(r.format, QuantFormat::kInt8);
  EXPECT_EQ(r.weights, WeightGranularity::kPerChannel);
  EXPECT_DOUBLE_EQ(r.level, 2.5);
  EXPECT_TRUE(r.default_exclusions);
  EXPECT_EQ(r.calibration.method, CalibrationMethod::kPercentile);
  EXPECT_DOUBLE_EQ(r.calibration.percentile, 0.8);
  EXPECT_EQ(r.calibration.collect, CollectMethod::kMeanMax);
  EXPECT_TRUE(r.smoothquant.enabled);
  EXPECT_FALSE(r.smoothquant.search);
  EXPECT_DOUBLE_EQ(r.smoothquant.alpha, 0.8);
  EXPECT_EQ(r.exclude, std::vector<std::string>{"up_blocks\\.1"});

  Recipe s = parse(R"({"format": "int8", "level": 3, "calibration": {"method": "entropy"},
                       "smoothquant": {"alpha": "search"}})");
  EXPECT_EQ(s.name, "r");  // file stem
  EXPECT_EQ(s.calibration.num_bins, 2048);
  EXPECT_EQ(s.calibration.start_bin, 128);
  EXPECT_TRUE(s.smoothquant.search);
  ASSERT_EQ(s.smoothquant.alpha_grid.size(), 21u);
  EXPECT_DOUBLE_EQ(s.smoothquant.alpha_grid[20], 1.0);
  EXPECT_EQ(format_max(QuantFormat::kFp8E4M3), 448.0f);
}

TEST(Recipe, FingerprintIgnoresNameAndKeyOrderButNotContent) {
  const Recipe a = parse(R"({"name": "a", "format": "int8", "level": 2, "calibration": {"method": "max"}})");
  const Recipe b = parse(R"({"calibration": {"method": "max"}, "level": 2, "format": "int8", "name": "b",
                             "description": "same thing"})");
  const Recipe c = parse(R"({"name": "a", "format": "int8", "level": 2.5, "calibration": {"method": "max"}})");
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  EXPECT_NE(a.fingerprint(), c.fingerprint());
  EXPECT_EQ(a.fingerprint().size(), 16u);
  // FNV-1a 64 reference values (the published test vectors).
  EXPECT_EQ(fnv1a64_hex("", 0), "cbf29ce484222325");
  EXPECT_EQ(fnv1a64_hex("a", 1), "af63dc4c8601ec8c");
}

// Keys added later (other_matmuls, exclude_nodes) enter the canonical form only when set, so the
// recipes written before them keep their fingerprints (calibration cache keys).
TEST(Recipe, OtherMatMulsAndExcludeNodesRoundTripThroughTheDocument) {
  const Recipe plain = parse(R"({"format": "int8", "level": 3, "calibration": {"method": "max"}})");
  EXPECT_FALSE(plain.canonical().contains("other_matmuls"));
  EXPECT_FALSE(plain.canonical().contains("exclude_nodes"));
  const Recipe a = parse(R"({"format": "int8", "level": 3, "calibration": {"method": "max"}, "other_matmuls": true,
                             "exclude_nodes": ["/b/Conv", "/a/MatMul"]})");
  const Recipe b = parse(R"({"format": "int8", "level": 3, "calibration": {"method": "max"}, "other_matmuls": true,
                             "exclude_nodes": ["/a/MatMul", "/b/Conv"]})");
  EXPECT_TRUE(a.other_matmuls);
  EXPECT_EQ(a.exclude_nodes, (std::vector<std::string>{"/b/Conv", "/a/MatMul"}));
  EXPECT_EQ(a.fingerprint(), b.fingerprint());  // a set of names
  EXPECT_NE(a.fingerprint(), plain.fingerprint());
  const Recipe c = parse(R"({"format": "int8", "level": 3, "calibration": {"method": "max"}, "other_matmuls": true})");
  EXPECT_NE(a.fingerprint(), c.fingerprint());
  // The document reads back to the same recipe (what qeval triage writes).
  Recipe named = a;
  named.name = "x-fallback";
  named.description = "kept two nodes";
  const Recipe back = parse(named.document().dump());
  EXPECT_EQ(back.fingerprint(), a.fingerprint());
  EXPECT_EQ(back.name, "x-fallback");
  EXPECT_EQ(back.description, "kept two nodes");
  EXPECT_EQ(error_of(R"({"format": "int8", "level": 3, "calibration": {"method": "max"}, "exclude_nodes": [""]})"),
            "r.json: exclude_nodes[0]: an empty node name (see docs/recipes.md)");
}

TEST(Recipe, BadInputNamesTheKeyAndTheValidChoices) {
  EXPECT_EQ(error_of(R"({"format": "int8", "level": 2, "calibraton": {}})"),
            "r.json: unknown key 'calibraton' (valid keys: name, description, format, weights, "
            "activations, level, default_exclusions, include, exclude, other_matmuls, exclude_nodes, calibration, "
            "smoothquant) "
            "(see docs/recipes.md)");
  EXPECT_EQ(error_of(R"({"format": "int4", "level": 2, "calibration": {"method": "max"}})"),
            "r.json: format: 'int4' is not one of: int8, fp8_e4m3, fp8_e5m2 (see docs/recipes.md)");
  EXPECT_EQ(error_of(R"({"format": "int8", "level": 5, "calibration": {"method": "max"}})"),
            "r.json: level must be one of 1, 2, 2.5, 3, 4, got 5 (see docs/recipes.md)");
  EXPECT_EQ(error_of(R"({"format": "int8", "level": 2, "calibration": {"method": "max", "percentile": 1}})"),
            "r.json: calibration: unknown key 'percentile' (valid keys: method) (see docs/recipes.md)");
  EXPECT_NE(error_of(R"({"format": "int8", "level": 2, "calibration": {"method": "percentile", "percentile": 0}})")
                .find("percentile must be in (0, 1]"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"format": "int8", "level": 2, "calibration": {"method": "percentile", "collect": "mean"}})")
                .find("'mean' is not one of: min-mean, mean-max, global_min, min-max"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"format": "fp8_e4m3", "level": 3, "calibration": {"method": "max"},
                         "smoothquant": {"alpha": 0.5}})")
                .find("SmoothQuant applies to int8 recipes only"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"format": "int8", "level": 3, "calibration": {"method": "max"},
                         "smoothquant": {"alpha": 1.5}})")
                .find("alpha must be in [0, 1]"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"format": "int8", "level": 3, "calibration": {"method": "max"}, "exclude": ["(a"]})")
                .find("exclude[0]: '(a' is not a valid regular expression"),
            std::string::npos);
  EXPECT_EQ(error_of(R"({"format": "int8", "level": 3})"),
            "r.json: missing required key 'calibration' (see docs/recipes.md)");
}

}  // namespace
}  // namespace qeval::eval::quant
