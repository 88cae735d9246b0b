// Elementwise kernels: numpy-broadcast binary maps and unary maps with vectorisable inner loops,
// threaded over chunks (each element is computed on its own, so any split gives the same values),
// and vectorisable float erf / sigmoid.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/softmax.h"
#include "kernels/tensor.h"

namespace qeval::kernels {

// Below this many elements a map runs on the calling thread; above it, in chunks of this size.
inline constexpr std::int64_t kElementwiseGrain = 16384;

// The broadcast of operands a and b to `out` as a loop nest: size-1 dimensions dropped, adjacent
// dimensions merged where both operands walk them as one, and an innermost run along which each
// operand is contiguous (stride 1) or repeated (stride 0).
struct BroadcastLoop {
  std::vector<std::int64_t> dims;                  // outer dimensions, outermost first
  std::vector<std::int64_t> a_strides, b_strides;  // per outer dimension, in elements
  std::int64_t rows = 1;                           // product of dims
  std::int64_t inner = 1;                          // length of the innermost run
  std::int64_t a_inner = 0, b_inner = 0;           // 0 or 1
};
BroadcastLoop plan_broadcast(const Shape& out, const Shape& a, const Shape& b);

// y[i] = f(a[ia], b[ib]) for every element of the broadcast output, threaded.
template <class T, class U, class R, class F>
void broadcast_map(const Shape& out, const Shape& a_shape, const Shape& b_shape, const T* a, const U* b, R* y, F f) {
  const BroadcastLoop L = plan_broadcast(out, a_shape, b_shape);
  const std::int64_t total = L.rows * L.inner;
  if (total == 0) return;
  // A row segment [j0, j1) of outer row `row`; the loops are specialised by inner strides so the
  // compiler vectorises them.
  auto segment = [&](std::int64_t row, std::int64_t j0, std::int64_t j1) {
    std::int64_t oa = 0, ob = 0, rem = row;
    for (int d = int(L.dims.size()) - 1; d >= 0; --d) {
      const std::int64_t i = rem % L.dims[std::size_t(d)];
      rem /= L.dims[std::size_t(d)];
      oa += i * L.a_strides[std::size_t(d)];
      ob += i * L.b_strides[std::size_t(d)];
    }
    R* __restrict yr = y + row * L.inner;
    const T* __restrict ar = a + oa;
    const U* __restrict br = b + ob;
    if (L.a_inner && L.b_inner) {
      for (std::int64_t j = j0; j < j1; ++j) yr[j] = f(ar[j], br[j]);
    } else if (L.a_inner) {
      const U bv = br[0];
      for (std::int64_t j = j0; j < j1; ++j) yr[j] = f(ar[j], bv);
    } else if (L.b_inner) {
      const T av = ar[0];
      for (std::int64_t j = j0; j < j1; ++j) yr[j] = f(av, br[j]);
    } else {
      const R v = f(ar[0], br[0]);
      for (std::int64_t j = j0; j < j1; ++j) yr[j] = v;
    }
  };
  if (total <= kElementwiseGrain) {
    for (std::int64_t r = 0; r < L.rows; ++r) segment(r, 0, L.inner);
    return;
  }
  if (L.inner >= kElementwiseGrain) {
    // Long rows: tasks are segments of one row.
    const std::int64_t per_row = (L.inner + kElementwiseGrain - 1) / kElementwiseGrain;
    tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, L.rows * per_row), [&](const auto& r) {
      for (std::int64_t t = r.begin(); t < r.end(); ++t) {
        const std::int64_t row = t / per_row, j0 = (t % per_row) * kElementwiseGrain;
        segment(row, j0, std::min(L.inner, j0 + kElementwiseGrain));
      }
    });
    return;
  }
  // Short rows: tasks are groups of whole rows.
  const std::int64_t rows_per_task = std::max<std::int64_t>(1, kElementwiseGrain / L.inner);
  tbb::parallel_for(
      tbb::blocked_range<std::int64_t>(0, (L.rows + rows_per_task - 1) / rows_per_task), [&](const auto& r) {
        for (std::int64_t t = r.begin(); t < r.end(); ++t)
          for (std::int64_t row = t * rows_per_task; row < std::min(L.rows, (t + 1) * rows_per_task); ++row)
            segment(row, 0, L.inner);
      });
}

// f(i0, i1) over [0, n) in chunks of kElementwiseGrain, threaded when there is more than one.
template <class F>
void for_each_chunk(std::int64_t n, F f) {
  if (n <= kElementwiseGrain) return f(std::int64_t(0), n);
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, (n + kElementwiseGrain - 1) / kElementwiseGrain),
                    [&](const auto& r) {
                      for (std::int64_t t = r.begin(); t < r.end(); ++t)
                        f(t * kElementwiseGrain, std::min(n, (t + 1) * kElementwiseGrain));
                    });
}

// y[i] = f(x[i]) for i < n, threaded.
template <class T, class R, class F>
void unary_map(const T* x, R* y, std::int64_t n, F f) {
  for_each_chunk(n, [&](std::int64_t i0, std::int64_t i1) {
    const T* __restrict xs = x;
    R* __restrict ys = y;
    for (std::int64_t i = i0; i < i1; ++i) ys[i] = f(xs[i]);
  });
}

// y[i] = f(a[i * a_step], b[i * b_step]) for i < n, steps 0 or 1: the loop specialised per case so
// the compiler vectorises it.
template <class F>
inline void binary_run(const float* a, std::int64_t a_step, const float* b, std::int64_t b_step, float* y,
                       std::int64_t n, F f) {
  if (a_step && b_step) {
    for (std::int64_t i = 0; i < n; ++i) y[i] = f(a[i], b[i]);
  } else if (a_step) {
    const float bv = b[0];
    for (std::int64_t i = 0; i < n; ++i) y[i] = f(a[i], bv);
  } else if (b_step) {
    const float av = a[0];
    for (std::int64_t i = 0; i < n; ++i) y[i] = f(av, b[i]);
  } else {
    const float v = f(a[0], b[0]);
    for (std::int64_t i = 0; i < n; ++i) y[i] = v;
  }
}

// erf(x) in float without branches the vectoriser cannot convert: x + x * P(x^2) below 0.921875,
// 1 - exp(-Q(|x|)) above (coefficients fitted by tools/fit_erf.py). At most 1.25 ulp from the
// exact value over all floats (tested exhaustively on [0, 8]); NaN stays NaN.
inline float erf_vectorisable(float x) {
  const float a = std::fabs(x);
  const float t = a * a;
  float p = -6.024572649039328e-4f;
  p = p * t + 5.000889301300049e-3f;
  p = p * t + -2.677295356988907e-2f;
  p = p * t + 1.1282039433717728e-1f;
  p = p * t + -3.761252462863922e-1f;
  p = p * t + 1.2837916612625122e-1f;
  const float small = a + a * p;
  const float c = a < 4.0f ? a : 4.0f;
  float q = 3.3717236647134996e-7f;
  q = q * c + 1.6803254766273312e-5f;
  q = q * c + -4.1108153527602553e-4f;
  q = q * c + 4.09982493147254e-3f;
  q = q * c + -2.498658187687397e-2f;
  q = q * c + 1.0812472552061081e-1f;
  q = q * c + 6.334582567214966e-1f;
  q = q * c + 1.1294702291488647f;
  q = q * c + -1.6695375961717218e-4f;
  const float big = 1.0f - exp_vectorisable(-q);
  const float r = a < 0.921875f ? small : big;
  return x == x ? std::copysign(r, x) : x;
}

// 1 / (1 + exp(-x)) without overflow for either sign: exp(-|x|) is at most 1. Below -87.3 the
// result is 0 (the exact value would be denormal).
inline float sigmoid_vectorisable(float x) {
  const float e = exp_vectorisable(-std::fabs(x));
  const float r = 1.0f / (1.0f + e);
  return x >= 0.0f ? r : (x == x ? e * r : x);
}

}  // namespace qeval::kernels
