// Summary statistics with double sums and sorted-copy percentiles.
#include "metrics/stats.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace qeval::metrics {

namespace {
double percentile_sorted(const std::vector<double>& s, double q) {
  double pos = q / 100.0 * double(s.size() - 1);
  std::size_t lo = static_cast<std::size_t>(std::floor(pos));
  std::size_t hi = std::min(lo + 1, s.size() - 1);
  double frac = pos - double(lo);
  if (frac == 0 || s[lo] == s[hi]) return s[lo];  // also keeps +inf samples from making inf - inf
  return s[lo] + (s[hi] - s[lo]) * frac;
}
}  // namespace

std::optional<double> percentile(std::span<const double> values, double q) {
  if (values.empty()) return std::nullopt;
  if (!(q >= 0 && q <= 100)) throw std::invalid_argument("percentile must be in [0, 100]");
  // Selection, not a full sort: the two order statistics around the rank, in O(n).
  std::vector<double> s(values.begin(), values.end());
  const double pos = q / 100.0 * double(s.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(std::floor(pos));
  std::nth_element(s.begin(), s.begin() + std::ptrdiff_t(lo), s.end());
  const double a = s[lo];
  if (lo + 1 >= s.size()) return a;
  const double b = *std::min_element(s.begin() + std::ptrdiff_t(lo) + 1, s.end());
  const double frac = pos - double(lo);
  if (frac == 0 || a == b) return a;  // also keeps +inf samples from making inf - inf
  return a + (b - a) * frac;
}

std::optional<Summary> summarize(std::span<const double> values) {
  if (values.empty()) return std::nullopt;
  std::vector<double> s(values.begin(), values.end());
  std::sort(s.begin(), s.end());
  Summary r;
  r.count = s.size();
  double sum = 0;
  for (double v : s) sum += v;
  r.mean = sum / double(s.size());
  double ss = 0;
  for (double v : s) ss += (v - r.mean) * (v - r.mean);
  r.stddev = std::sqrt(ss / double(s.size()));
  r.min = s.front();
  r.max = s.back();
  r.median = percentile_sorted(s, 50);
  r.p5 = percentile_sorted(s, 5);
  r.p95 = percentile_sorted(s, 95);
  return r;
}

StatSpec parse_stat(std::string_view name) {
  StatSpec spec;
  if (name == "mean") return spec;
  if (name == "min") return {StatSpec::Kind::kMin, 0};
  if (name == "max") return {StatSpec::Kind::kMax, 0};
  if (name == "median") return {StatSpec::Kind::kMedian, 0};
  if (name == "std") return {StatSpec::Kind::kStd, 0};
  if (name.size() > 1 && name[0] == 'p') {
    double q = 0;
    auto [ptr, ec] = std::from_chars(name.data() + 1, name.data() + name.size(), q);
    if (ec == std::errc() && ptr == name.data() + name.size() && q >= 0 && q <= 100)
      return {StatSpec::Kind::kPercentile, q};
  }
  throw std::invalid_argument("unknown statistic '" + std::string(name) +
                              "' (expected mean, min, max, median, std or pNN such as p5, p99.9)");
}

std::optional<double> compute_stat(const StatSpec& stat, std::span<const double> values) {
  auto s = summarize(values);
  if (!s) return std::nullopt;
  switch (stat.kind) {
    case StatSpec::Kind::kMean: return s->mean;
    case StatSpec::Kind::kMin: return s->min;
    case StatSpec::Kind::kMax: return s->max;
    case StatSpec::Kind::kMedian: return s->median;
    case StatSpec::Kind::kStd: return s->stddev;
    case StatSpec::Kind::kPercentile: return percentile(values, stat.q);
  }
  return std::nullopt;
}

}  // namespace qeval::metrics
