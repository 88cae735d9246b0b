// Numpy-style broadcasting iteration: visits every output element with the matching input offsets.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/tensor.h"

namespace qeval::kernels {

// Strides (in elements) of `in` broadcast to `out` (0 along broadcast dimensions). `in` is
// right-aligned against `out`, as numpy does.
std::vector<std::int64_t> broadcast_strides(const Shape& in, const Shape& out);

// Calls f(out_index, offset_a, offset_b) for every output element in row-major order, with the
// inner dimension as a tight loop. Fast paths: equal shapes and scalar operands.
template <class F>
void for_each_broadcast(const Shape& out, const Shape& a, const Shape& b, F&& f) {
  const std::int64_t n = shape_numel(out);
  if (n == 0) return;
  if (a == out && b == out) {
    for (std::int64_t i = 0; i < n; ++i) f(i, i, i);
    return;
  }
  const bool a_scalar = shape_numel(a) == 1, b_scalar = shape_numel(b) == 1;
  if (a == out && b_scalar) {
    for (std::int64_t i = 0; i < n; ++i) f(i, i, std::int64_t(0));
    return;
  }
  if (b == out && a_scalar) {
    for (std::int64_t i = 0; i < n; ++i) f(i, std::int64_t(0), i);
    return;
  }
  const auto sa = broadcast_strides(a, out), sb = broadcast_strides(b, out);
  const int rank = static_cast<int>(out.size());
  const std::int64_t inner = out[std::size_t(rank - 1)];
  const std::int64_t ia = sa[std::size_t(rank - 1)], ib = sb[std::size_t(rank - 1)];
  std::vector<std::int64_t> idx(std::size_t(rank), 0);
  std::int64_t oa = 0, ob = 0;
  for (std::int64_t base = 0; base < n; base += inner) {
    for (std::int64_t j = 0; j < inner; ++j) f(base + j, oa + j * ia, ob + j * ib);
    // Advance the outer index (odometer), updating the offsets incrementally.
    for (int d = rank - 2; d >= 0; --d) {
      const std::size_t du = std::size_t(d);
      if (++idx[du] < out[du]) {
        oa += sa[du];
        ob += sb[du];
        break;
      }
      oa -= sa[du] * (out[du] - 1);
      ob -= sb[du] * (out[du] - 1);
      idx[du] = 0;
    }
  }
}

}  // namespace qeval::kernels
