// Recipe JSON parsing, validation and fingerprint.
#include "eval/quant/recipe.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>

#include "base/json_config.h"
#include "base/user_regex.h"
#include "kernels/error.h"

namespace qeval::eval::quant {

namespace {
constexpr const char* kDoc = "docs/recipes.md";
}

const char* const kDefaultExclusionPattern =
    "time_emb_proj|time_embedding|conv_in|conv_out|conv_shortcut|add_embedding|pos_embed|"
    "time_text_embed|context_embedder|norm_out|proj_out";

const char* format_name(QuantFormat f) {
  switch (f) {
    case QuantFormat::kInt8: return "int8";
    case QuantFormat::kFp8E4M3: return "fp8_e4m3";
    case QuantFormat::kFp8E5M2: return "fp8_e5m2";
  }
  return "?";
}

const char* calibration_method_name(CalibrationMethod m) {
  switch (m) {
    case CalibrationMethod::kMax: return "max";
    case CalibrationMethod::kPercentile: return "percentile";
    case CalibrationMethod::kEntropy: return "entropy";
    case CalibrationMethod::kMse: return "mse";
  }
  return "?";
}

const char* collect_method_name(CollectMethod m) {
  switch (m) {
    case CollectMethod::kMinMean: return "min-mean";
    case CollectMethod::kMeanMax: return "mean-max";
    case CollectMethod::kGlobalMin: return "global_min";
    case CollectMethod::kMinMax: return "min-max";
  }
  return "?";
}

float format_max(QuantFormat f) {
  switch (f) {
    case QuantFormat::kInt8: return 127.0f;
    case QuantFormat::kFp8E4M3: return 448.0f;
    case QuantFormat::kFp8E5M2: return 57344.0f;
  }
  return 1.0f;
}

std::string level_string(double level) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", level);
  return buf;
}

std::uint64_t fnv1a64(const void* data, std::size_t size, std::uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::string hex64(std::uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 15];
  return s;
}

std::string fnv1a64_hex(const void* data, std::size_t size) { return hex64(fnv1a64(data, size)); }

nlohmann::json Recipe::canonical() const {
  // nlohmann::json objects are key-sorted, so dump() is canonical for a given content.
  nlohmann::json j;
  j["format"] = format_name(format);
  j["weights"] = weights == WeightGranularity::kPerChannel ? "per_channel" : "per_tensor";
  j["activations"] = "per_tensor_static";
  j["level"] = level;
  j["default_exclusions"] = default_exclusions;
  j["include"] = include;
  j["exclude"] = exclude;
  // Keys added after version 1 appear only when set, so older recipes keep their fingerprints.
  if (other_matmuls) j["other_matmuls"] = true;
  if (!exclude_nodes.empty()) {
    std::vector<std::string> names = exclude_nodes;  // a set: order does not change the result
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    j["exclude_nodes"] = names;
  }
  nlohmann::json cal;
  cal["method"] = calibration_method_name(calibration.method);
  if (calibration.method == CalibrationMethod::kPercentile) {
    cal["percentile"] = calibration.percentile;
    cal["collect"] = collect_method_name(calibration.collect);
  }
  if (calibration.method == CalibrationMethod::kEntropy || calibration.method == CalibrationMethod::kMse) {
    cal["num_bins"] = calibration.num_bins;
    cal["start_bin"] = calibration.start_bin;
    cal["stride"] = calibration.stride;
  }
  j["calibration"] = cal;
  if (smoothquant.enabled) {
    nlohmann::json sq;
    if (smoothquant.search) {
      sq["alpha"] = "search";
      sq["alpha_grid"] = smoothquant.alpha_grid;
      sq["search_rows"] = smoothquant.search_rows;
    } else {
      sq["alpha"] = smoothquant.alpha;
    }
    j["smoothquant"] = sq;
  }
  return j;
}

nlohmann::json Recipe::document() const {
  nlohmann::json j = canonical();
  j["name"] = name;
  if (!description.empty()) j["description"] = description;
  return j;
}

std::string Recipe::fingerprint() const {
  const std::string s = canonical().dump();
  return fnv1a64_hex(s.data(), s.size());
}

namespace {

void check_patterns(const base::JsonConfig& root, const char* key, const std::vector<std::string>& patterns) {
  for (std::size_t i = 0; i < patterns.size(); ++i) {
    try {
      base::compile_user_regex(patterns[i]);
    } catch (const std::regex_error& e) {
      const std::string shown = patterns[i].size() > 80 ? patterns[i].substr(0, 80) + "..." : patterns[i];
      root.fail(std::string(key) + "[" + std::to_string(i) + "]: '" + shown + "' is not a valid regular expression (" +
                e.what() + ")");
    }
  }
}

CalibrationSpec parse_calibration(const base::JsonConfig& c) {
  CalibrationSpec spec;
  const std::string method = c.get_choice("method", {"max", "percentile", "entropy", "mse"});
  if (method == "max") {
    c.allow_keys({"method"});
    spec.method = CalibrationMethod::kMax;
  } else if (method == "percentile") {
    c.allow_keys({"method", "percentile", "collect"});
    spec.method = CalibrationMethod::kPercentile;
    spec.percentile = c.get_number("percentile", 1.0);
    if (!(spec.percentile > 0 && spec.percentile <= 1))
      c.fail(
          "percentile must be in (0, 1] (the fraction of denoising steps, from the first, "
          "whose amax counts), got " +
          std::to_string(spec.percentile));
    const std::string collect = c.get_choice("collect", {"min-mean", "mean-max", "global_min", "min-max"}, "min-mean");
    spec.collect = collect == "min-mean"     ? CollectMethod::kMinMean
                   : collect == "mean-max"   ? CollectMethod::kMeanMax
                   : collect == "global_min" ? CollectMethod::kGlobalMin
                                             : CollectMethod::kMinMax;
  } else {
    c.allow_keys({"method", "num_bins", "start_bin", "stride"});
    spec.method = method == "entropy" ? CalibrationMethod::kEntropy : CalibrationMethod::kMse;
    spec.num_bins = static_cast<int>(c.get_int("num_bins", 2048));
    spec.start_bin = static_cast<int>(c.get_int("start_bin", 128));
    spec.stride = static_cast<int>(c.get_int("stride", 1));
    if (spec.num_bins < 2 || spec.num_bins > (1 << 20))
      c.fail("num_bins must be in [2, 1048576], got " + std::to_string(spec.num_bins));
    if (spec.start_bin < 1 || spec.start_bin > spec.num_bins)
      c.fail("start_bin must be in [1, num_bins], got " + std::to_string(spec.start_bin));
    if (spec.stride < 1) c.fail("stride must be >= 1, got " + std::to_string(spec.stride));
  }
  return spec;
}

SmoothQuantSpec parse_smoothquant(const base::JsonConfig& c) {
  c.allow_keys({"alpha", "alpha_grid", "search_rows"});
  SmoothQuantSpec spec;
  spec.enabled = true;
  if (!c.has("alpha")) c.fail("missing required key 'alpha' (a number in [0, 1] or \"search\")");
  const auto& a = c.value().at("alpha");
  if (a.is_string()) {
    if (a.get<std::string>() != "search")
      c.fail("alpha must be a number in [0, 1] or \"search\", got \"" + a.get<std::string>() + "\"");
    spec.search = true;
    spec.alpha_grid = c.get_numbers("alpha_grid");
    if (spec.alpha_grid.empty())
      for (int i = 0; i <= 20; ++i) spec.alpha_grid.push_back(i * 0.05);
    for (double g : spec.alpha_grid)
      if (!(g >= 0 && g <= 1)) c.fail("alpha_grid values must be in [0, 1], got " + std::to_string(g));
    spec.search_rows = static_cast<int>(c.get_int("search_rows", 256));
    if (spec.search_rows < 1) c.fail("search_rows must be >= 1");
  } else if (a.is_number()) {
    if (c.has("alpha_grid") || c.has("search_rows"))
      c.fail("alpha_grid and search_rows only apply with \"alpha\": \"search\"");
    spec.alpha = a.get<double>();
    if (!(spec.alpha >= 0 && spec.alpha <= 1)) c.fail("alpha must be in [0, 1], got " + std::to_string(spec.alpha));
  } else {
    c.fail("alpha must be a number in [0, 1] or \"search\"");
  }
  return spec;
}

}  // namespace

Recipe parse_recipe(const base::JsonConfig& root) {
  root.allow_keys({"name", "description", "format", "weights", "activations", "level", "default_exclusions", "include",
                   "exclude", "other_matmuls", "exclude_nodes", "calibration", "smoothquant"});
  Recipe r;
  r.source = root.source();
  r.name = root.get_string("name", std::filesystem::path(root.source()).stem().string());
  r.description = root.get_string("description", "");
  const std::string fmt = root.get_choice("format", {"int8", "fp8_e4m3", "fp8_e5m2"});
  r.format = fmt == "int8" ? QuantFormat::kInt8 : fmt == "fp8_e4m3" ? QuantFormat::kFp8E4M3 : QuantFormat::kFp8E5M2;
  r.weights = root.get_choice("weights", {"per_channel", "per_tensor"}, "per_channel") == "per_channel"
                  ? WeightGranularity::kPerChannel
                  : WeightGranularity::kPerTensor;
  root.get_choice("activations", {"per_tensor_static"}, "per_tensor_static");
  r.level = root.get_number("level");
  bool level_ok = false;
  for (double l : {1.0, 2.0, 2.5, 3.0, 4.0}) level_ok = level_ok || r.level == l;
  if (!level_ok) root.fail("level must be one of 1, 2, 2.5, 3, 4, got " + root.value().at("level").dump());
  r.default_exclusions = root.get_bool("default_exclusions", true);
  r.include = root.get_strings("include");
  r.exclude = root.get_strings("exclude");
  check_patterns(root, "include", r.include);
  check_patterns(root, "exclude", r.exclude);
  r.other_matmuls = root.get_bool("other_matmuls", false);
  r.exclude_nodes = root.get_strings("exclude_nodes");
  for (std::size_t i = 0; i < r.exclude_nodes.size(); ++i)
    if (r.exclude_nodes[i].empty()) root.fail("exclude_nodes[" + std::to_string(i) + "]: an empty node name");
  r.calibration = parse_calibration(root.object("calibration"));
  if (r.calibration.method == CalibrationMethod::kEntropy && r.format != QuantFormat::kInt8)
    root.object("calibration")
        .fail(
            "entropy calibration is defined for int8 (128 quantization bins); "
            "use max, percentile or mse for " +
            fmt);
  if (auto sq = root.optional_object("smoothquant")) {
    r.smoothquant = parse_smoothquant(*sq);
    if (r.format != QuantFormat::kInt8)
      sq->fail("SmoothQuant applies to int8 recipes only (as ModelOpt), this recipe is " + fmt);
  }
  return r;
}

Recipe load_recipe(const std::filesystem::path& path) { return parse_recipe(base::JsonConfig::load(path, kDoc)); }

}  // namespace qeval::eval::quant
