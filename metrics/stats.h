// Summary statistics over samples: mean, extremes, percentiles (numpy's linear interpolation).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace qeval::metrics {

// q in [0, 100]; linear interpolation between closest ranks (numpy.percentile's default).
// nullopt for an empty sample. NaNs must be filtered by the caller.
std::optional<double> percentile(std::span<const double> values, double q);

struct Summary {
  std::size_t count = 0;
  double mean = 0, min = 0, max = 0, median = 0, p5 = 0, p95 = 0, stddev = 0;
};
// nullopt for an empty sample.
std::optional<Summary> summarize(std::span<const double> values);

// A named statistic: "mean", "min", "max", "median", "std", or "pNN" / "pNN.N" (percentile NN).
// Throws std::invalid_argument with the accepted forms on anything else.
struct StatSpec {
  enum class Kind { kMean, kMin, kMax, kMedian, kStd, kPercentile } kind = Kind::kMean;
  double q = 0;  // for kPercentile
};
StatSpec parse_stat(std::string_view name);
std::optional<double> compute_stat(const StatSpec& stat, std::span<const double> values);

}  // namespace qeval::metrics
