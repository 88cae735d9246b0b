// An exact sum of doubles (Shewchuk's non-overlapping partials, as Python's math.fsum): the
// result is the correctly rounded exact sum, the same whatever the order or grouping of the
// additions. Pooled statistics use it so that a run merged from shards, or resumed from a
// checkpoint, gives the same bits as one run.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>

namespace qeval::metrics {

class ExactSum {
 public:
  ExactSum() = default;
  explicit ExactSum(double x) { add(x); }
  ExactSum(const ExactSum& other) { *this = other; }
  ExactSum& operator=(const ExactSum& other);
  ExactSum(ExactSum&& other) noexcept { *this = std::move(other); }
  ExactSum& operator=(ExactSum&& other) noexcept;

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
    n_ = 0;
    special_ = 0;
  }

  // For serialisation: the partials (finite terms) and the sum of the non-finite ones.
  std::span<const double> partials() const { return {data(), n_}; }
  double special() const { return special_; }
  static ExactSum from_parts(std::span<const double> partials, double special);

 private:
  // Partials live inline up to kInline (sums of a few terms, the common case: no allocation, no
  // pointer to follow), on the heap beyond.
  static constexpr std::uint32_t kInline = 3;
  double* data() { return heap_ ? heap_.get() : inline_; }
  const double* data() const { return heap_ ? heap_.get() : inline_; }
  void reserve(std::uint32_t n);

  double inline_[kInline] = {};
  std::unique_ptr<double[]> heap_;
  std::uint32_t n_ = 0, capacity_ = kInline;  // partials: non-overlapping, increasing magnitude
  double special_ = 0;                        // +-inf / NaN terms
};

}  // namespace qeval::metrics
