// An exact sum of doubles (Shewchuk's non-overlapping partials, as Python's math.fsum): the
// result is the correctly rounded exact sum, the same whatever the order or grouping of the
// additions. Pooled statistics use it so that a run merged from shards, or resumed from a
// checkpoint, gives the same bits as one run.
#pragma once

#include <vector>

namespace qeval::metrics {

class ExactSum {
 public:
  ExactSum() = default;
  explicit ExactSum(double x) { add(x); }

  void add(double x);
  void merge(const ExactSum& other);
  ExactSum& operator+=(double x) {
    add(x);
    return *this;
  }
  // The exact sum rounded to nearest (ties to even). Non-finite terms are summed apart (plain
  // addition) and dominate the result.
  double value() const;
  operator double() const { return value(); }  // NOLINT: reads like the double it stands for
  bool operator==(const ExactSum& other) const { return value() == other.value(); }

  // Back to zero, keeping the storage (statistics reset for reuse allocate nothing).
  void clear() {
    partials_.clear();
    special_ = 0;
  }

  // For serialisation: the partials (finite terms) and the sum of the non-finite ones.
  const std::vector<double>& partials() const { return partials_; }
  double special() const { return special_; }
  static ExactSum from_parts(std::vector<double> partials, double special);

 private:
  std::vector<double> partials_;  // non-overlapping, increasing magnitude
  double special_ = 0;            // +-inf / NaN terms
};

}  // namespace qeval::metrics
