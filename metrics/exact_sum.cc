// Exact summation (Shewchuk 1997; the algorithm of CPython's math.fsum).
#include "metrics/exact_sum.h"

#include <cmath>
#include <utility>

namespace qeval::metrics {

void ExactSum::add(double x) {
  if (!std::isfinite(x)) {
    special_ += x;
    return;
  }
  std::size_t i = 0;
  for (double y : partials_) {
    if (std::abs(x) < std::abs(y)) std::swap(x, y);
    const double hi = x + y;
    const double lo = y - (hi - x);
    if (lo != 0.0) partials_[i++] = lo;
    x = hi;
  }
  partials_.resize(i);
  if (x != 0.0 || partials_.empty()) partials_.push_back(x);
}

void ExactSum::merge(const ExactSum& other) {
  for (double p : other.partials_) add(p);
  special_ += other.special_;
}

double ExactSum::value() const {
  if (special_ != 0.0 || std::isnan(special_)) return special_;
  std::size_t n = partials_.size();
  if (n == 0) return 0.0;
  double hi = partials_[--n], lo = 0.0;
  while (n > 0) {
    const double x = hi, y = partials_[--n];
    hi = x + y;
    const double yr = hi - x;
    lo = y - yr;
    if (lo != 0.0) break;
  }
  // Round half to even: when the rest of the partials push the tie one way, take it.
  if (n > 0 && ((lo < 0.0 && partials_[n - 1] < 0.0) || (lo > 0.0 && partials_[n - 1] > 0.0))) {
    const double y = lo * 2.0, x = hi + y, yr = x - hi;
    if (y == yr) hi = x;
  }
  return hi;
}

ExactSum ExactSum::from_parts(std::vector<double> partials, double special) {
  ExactSum s;
  for (double p : partials) s.add(p);
  s.special_ = special;
  return s;
}

}  // namespace qeval::metrics
