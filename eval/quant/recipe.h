// Quantization recipes: the JSON format users write (docs/recipes.md), parsed and validated, with
// a fingerprint of its canonical form (calibration caches are keyed by it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "metrics/calibration.h"

namespace qeval::base {
class JsonConfig;
}

namespace qeval::eval::quant {

enum class QuantFormat { kInt8, kFp8E4M3, kFp8E5M2 };
enum class WeightGranularity { kPerChannel, kPerTensor };
enum class CalibrationMethod { kMax, kPercentile, kEntropy, kMse };
// ModelOpt's diffusion PercentileCalibrator collect methods (docs/recipes.md).
using metrics::CollectMethod;

const char* format_name(QuantFormat f);
const char* calibration_method_name(CalibrationMethod m);
const char* collect_method_name(CollectMethod m);
// Largest representable magnitude: 127 (int8), 448 (E4M3FN), 57344 (E5M2). scale = amax / this.
float format_max(QuantFormat f);
// "1", "2.5": a level as users write it.
std::string level_string(double level);

struct CalibrationSpec {
  CalibrationMethod method = CalibrationMethod::kMax;
  // percentile: fraction of the denoising steps, from the first, whose per-step amax counts
  // (ModelOpt's `percentile`, in (0, 1]); `collect` reduces over samples and steps.
  double percentile = 1.0;
  CollectMethod collect = CollectMethod::kMinMean;
  // entropy / mse: |x| histogram and the amax search over its bins (TensorRT / pytorch-quantization).
  int num_bins = 2048;
  int start_bin = 128;
  int stride = 1;
};

struct SmoothQuantSpec {
  bool enabled = false;
  // One alpha for every smoothed layer, or (search) the alpha of `alpha_grid` that minimises each
  // layer's output MSE on the calibration rows it saw.
  bool search = false;
  double alpha = 0.5;
  std::vector<double> alpha_grid;  // default 0, 0.05, ..., 1 when searching
  int search_rows = 256;           // calibration rows kept per layer for the search
};

struct Recipe {
  std::string name;
  std::string description;
  std::string source;  // file it came from, for messages
  QuantFormat format = QuantFormat::kInt8;
  WeightGranularity weights = WeightGranularity::kPerChannel;
  double level = 3;  // 1, 2, 2.5, 3 or 4
  bool default_exclusions = true;
  std::vector<std::string> include;  // ECMAScript regexes, searched in node and weight names
  std::vector<std::string> exclude;
  // MatMuls of two activations that reach no Softmax (NodeCategory::kOtherMatMul: EfficientViT's
  // ReLU linear attention, ...): no level includes them; this quantizes them at any level.
  bool other_matmuls = false;
  // Exact node names kept in high precision whatever the level and patterns say (what
  // `qeval triage` writes as its fallback). Matched against node names only.
  std::vector<std::string> exclude_nodes;
  CalibrationSpec calibration;
  SmoothQuantSpec smoothquant;

  // Everything that changes the result, in a fixed key order (name and description excluded).
  nlohmann::json canonical() const;
  // 16 hex digits: FNV-1a 64 of canonical().dump().
  std::string fingerprint() const;
  // The recipe as a file: canonical() plus name and description; parse_recipe reads it back to an
  // equal recipe (same fingerprint).
  nlohmann::json document() const;
};

// TensorRT's diffusion demo (filter_func in demo/Diffusion/utils_modelopt.py): layers it never
// quantizes; matched as a regex search in node and weight names.
extern const char* const kDefaultExclusionPattern;

Recipe parse_recipe(const base::JsonConfig& root);
Recipe load_recipe(const std::filesystem::path& path);

// FNV-1a 64 over bytes, as 16 hex digits (fingerprints of recipes, models, calibration sets).
std::string fnv1a64_hex(const void* data, std::size_t size);
std::uint64_t fnv1a64(const void* data, std::size_t size, std::uint64_t seed = 0xcbf29ce484222325ULL);
std::string hex64(std::uint64_t v);

}  // namespace qeval::eval::quant
