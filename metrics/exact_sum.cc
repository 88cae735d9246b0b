// Exact summation (Shewchuk 1997; the algorithm of CPython's math.fsum).
#include "metrics/exact_sum.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace qeval::metrics {

ExactSum& ExactSum::operator=(const ExactSum& other) {
  if (this == &other) return *this;
  reserve(other.n_);
  std::copy(other.data(), other.data() + other.n_, data());
  n_ = other.n_;
  special_ = other.special_;
  return *this;
}

ExactSum& ExactSum::operator=(ExactSum&& other) noexcept {
  if (this == &other) return *this;
  if (other.heap_) {
    heap_ = std::move(other.heap_);
    capacity_ = other.capacity_;
  } else {
    std::copy(other.inline_, other.inline_ + other.n_, data());  // fits: capacity_ >= kInline
  }
  n_ = other.n_;
  special_ = other.special_;
  other.n_ = 0;
  other.capacity_ = kInline;
  other.special_ = 0;
  return *this;
}

void ExactSum::reserve(std::uint32_t n) {
  if (n <= capacity_) return;
  const std::uint32_t capacity = std::max(n, 2 * capacity_);
  auto grown = std::make_unique<double[]>(capacity);
  std::copy(data(), data() + n_, grown.get());
  heap_ = std::move(grown);
  capacity_ = capacity;
}

void ExactSum::add(double x) {
  if (!std::isfinite(x)) {
    special_ += x;
    return;
  }
  double* p = data();
  std::uint32_t i = 0;
  for (std::uint32_t k = 0; k < n_; ++k) {
    double y = p[k];
    if (std::abs(x) < std::abs(y)) std::swap(x, y);
    const double hi = x + y;
    const double lo = y - (hi - x);
    if (lo != 0.0) p[i++] = lo;
    x = hi;
  }
  n_ = i;
  if (x != 0.0 || n_ == 0) {
    reserve(n_ + 1);
    data()[n_++] = x;
  }
}

void ExactSum::merge(const ExactSum& other) {
  if (this == &other) {
    const ExactSum copy(other);
    merge(copy);
    return;
  }
  for (double p : other.partials()) add(p);
  special_ += other.special_;
}

double ExactSum::value() const {
  if (special_ != 0.0 || std::isnan(special_)) return special_;
  const double* partials = data();
  std::size_t n = n_;
  if (n == 0) return 0.0;
  double hi = partials[--n], lo = 0.0;
  while (n > 0) {
    const double x = hi, y = partials[--n];
    hi = x + y;
    const double yr = hi - x;
    lo = y - yr;
    if (lo != 0.0) break;
  }
  // Round half to even: when the rest of the partials push the tie one way, take it.
  if (n > 0 && ((lo < 0.0 && partials[n - 1] < 0.0) || (lo > 0.0 && partials[n - 1] > 0.0))) {
    const double y = lo * 2.0, x = hi + y, yr = x - hi;
    if (y == yr) hi = x;
  }
  return hi;
}

ExactSum ExactSum::from_parts(std::span<const double> partials, double special) {
  ExactSum s;
  for (double p : partials) s.add(p);
  s.special_ = special;
  return s;
}

}  // namespace qeval::metrics
