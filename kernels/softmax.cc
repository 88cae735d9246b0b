// Softmax and log-softmax kernels: contiguous rows, and strided columns vectorised across `inner`.
#include "kernels/softmax.h"

#include "kernels/vector_math.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace qeval::kernels {

namespace {

template <class T>
inline T exp_of(T v) {
  if constexpr (std::is_same_v<T, float>) return exp_vectorisable(v);
  else return std::exp(v);
}

// Sum in double with eight independent accumulators: breaks the add latency chain and lets the
// compiler use vector adds, while the order stays fixed (results do not depend on threads).
template <class T>
double sum_double(const T* v, std::int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += static_cast<double>(v[i + j]);
  for (; i < n; ++i) acc[0] += static_cast<double>(v[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Row maximum with sixteen independent lanes, so the compiler can use vector max instructions
// (a single running max is a reduction it may not reorder). A NaN is skipped here and reaches
// the output through the sum of exponentials instead.
template <class T>
T row_max(const T* x, std::int64_t n) {
  T lane[16];
  for (int j = 0; j < 16; ++j) lane[j] = x[0];
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  T m = x[0];
  for (int j = 0; j < 16; ++j) m = lane[j] > m ? lane[j] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

template <class T>
void softmax_row(const T* x, T* y, std::int64_t n, bool log) {
  const T m = row_max(x, n);
  for (std::int64_t i = 0; i < n; ++i) y[i] = exp_of<T>(x[i] - m);
  const double sum = sum_double(y, n);
  if (log) {
    const T lse = static_cast<T>(std::log(sum));
    for (std::int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - lse;
  } else {
    const T inv = static_cast<T>(1.0 / sum);
    for (std::int64_t i = 0; i < n; ++i) y[i] *= inv;
  }
}

// One [n, width] block of columns (stride `inner`): every loop runs across the columns.
template <class T>
void softmax_columns(const T* x, T* y, std::int64_t n, std::int64_t inner, std::int64_t width, bool log, T* m,
                     double* s) {
  std::copy_n(x, width, m);
  for (std::int64_t k = 1; k < n; ++k) {
    const T* xk = x + k * inner;
    for (std::int64_t j = 0; j < width; ++j) m[j] = xk[j] > m[j] ? xk[j] : m[j];
  }
  std::fill_n(s, width, 0.0);
  for (std::int64_t k = 0; k < n; ++k) {
    const T* xk = x + k * inner;
    T* yk = y + k * inner;
    // Two loops: with the double accumulation in the same loop the compiler gives up on
    // vectorising the exponential.
    for (std::int64_t j = 0; j < width; ++j) yk[j] = exp_of<T>(xk[j] - m[j]);
    for (std::int64_t j = 0; j < width; ++j) s[j] += static_cast<double>(yk[j]);
  }
  if (log) {
    for (std::int64_t j = 0; j < width; ++j) s[j] = std::log(s[j]);
    for (std::int64_t k = 0; k < n; ++k) {
      const T* xk = x + k * inner;
      T* yk = y + k * inner;
      for (std::int64_t j = 0; j < width; ++j) yk[j] = (xk[j] - m[j]) - static_cast<T>(s[j]);
    }
  } else {
    for (std::int64_t j = 0; j < width; ++j) s[j] = 1.0 / s[j];
    for (std::int64_t k = 0; k < n; ++k) {
      T* yk = y + k * inner;
      for (std::int64_t j = 0; j < width; ++j) yk[j] *= static_cast<T>(s[j]);
    }
  }
}

// ---- float rows in explicit 16-lane vectors (GCC vector extensions: AVX-512 where available) ----

using V16 = simd::F32x16;
using V16U = simd::F32x16U;
using simd::I32x16;
using simd::kLanes;
using simd::splat;
typedef float V8U __attribute__((vector_size(32), aligned(4)));
typedef double F64x8 __attribute__((vector_size(64)));

// The first `len` (< 16) floats at p, the other lanes `fill`; and the first `len` lanes of v
// stored at p. AVX-512 masks where the target has them (a row's tail is then one vector
// operation, not a copy through a buffer: short rows such as 65 or 77 keys spend much time there).
inline V16 load_partial(const float* p, std::int64_t len, float fill) {
#if defined(__AVX512F__)
  return V16(_mm512_mask_loadu_ps(_mm512_set1_ps(fill), __mmask16((1u << len) - 1), p));
#else
  alignas(64) float t[kLanes];
  for (int l = 0; l < kLanes; ++l) t[l] = l < len ? p[l] : fill;
  return *reinterpret_cast<const V16*>(t);
#endif
}
inline void store_partial(float* p, std::int64_t len, V16 v) {
#if defined(__AVX512F__)
  _mm512_mask_storeu_ps(p, __mmask16((1u << len) - 1), __m512(v));
#else
  for (std::int64_t l = 0; l < len; ++l) p[l] = v[l];
#endif
}

// Lane-wise reductions of one vector by halving shuffles (log2 steps instead of a chain of 16).
inline float max_lanes(V16 v) {
  // __builtin_shufflevector: GCC 12's and clang's spelling (the fuzz build uses clang).
  V16 w = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v = w > v ? w : v;
  w = __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  v = w > v ? w : v;
  w = __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  v = w > v ? w : v;
  w = __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  v = w > v ? w : v;
  return v[0];
}

// Max of a row; NaNs are skipped (they reach the output through the sum of exponentials).
// *has_nan tells whether the row holds one. (Which of two equal-valued zeros is "the" maximum
// does not matter: x - (+0) and x - (-0) have the same exponential.)
float row_max_f32(const float* x, std::int64_t n, bool* has_nan) {
  V16 m[4] = {splat(x[0]), splat(x[0]), splat(x[0]), splat(x[0])};
  I32x16 nan = I32x16{};
  std::int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes)
    for (int u = 0; u < 4; ++u) {
      const V16 v = *reinterpret_cast<const V16U*>(x + i + u * kLanes);
      m[u] = v > m[u] ? v : m[u];
      nan |= v != v;
    }
  for (; i + kLanes <= n; i += kLanes) {
    const V16 v = *reinterpret_cast<const V16U*>(x + i);
    m[0] = v > m[0] ? v : m[0];
    nan |= v != v;
  }
  if (i < n) {
    // The tail, padded with x[0] (already in every lane).
    const V16 v = load_partial(x + i, n - i, x[0]);
    m[1] = v > m[1] ? v : m[1];
    nan |= v != v;
  }
  m[0] = m[1] > m[0] ? m[1] : m[0];
  m[2] = m[3] > m[2] ? m[3] : m[2];
  bool any = x[0] != x[0];
  for (int l = 0; l < kLanes; ++l) any |= nan[l] != 0;
  *has_nan = any;
  return max_lanes(m[2] > m[0] ? m[2] : m[0]);
}

// y = exp(x - m) for the row, returning the sum of y. Every element goes through the same vector
// code (the tail is padded with -inf, whose exponential is 0), so an element's value does not
// depend on its position. The sum: float lanes over blocks of 256 elements (8 values a lane, the
// tail in the last block), each block's lanes added in double: the order is fixed by n alone, and
// the error stays near double's (a float lane adds at most 8 terms) at the cost of float adds.
// `finite`: the row has no NaN and m is finite, so x - m <= 0 or -inf (the cheaper exponential).
template <bool finite>
double exp_and_sum(const float* x, float* y, std::int64_t n, float m) {
  const V16 vm = splat(m);
  auto ex = [](V16 v) { return finite ? simd::exp_nonpositive(v) : simd::exp(v); };
  F64x8 total[2] = {F64x8{}, F64x8{}};
  auto flush = [&](V16(&acc)[2]) {
    const V16 s = acc[0] + acc[1];
    const V8U* h = reinterpret_cast<const V8U*>(&s);
    total[0] += __builtin_convertvector(h[0], F64x8);
    total[1] += __builtin_convertvector(h[1], F64x8);
    acc[0] = acc[1] = V16{};
  };
  constexpr std::int64_t kBlock = 256;
  V16 acc[2] = {V16{}, V16{}};
  std::int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    const V16 a = ex(*reinterpret_cast<const V16U*>(x + i) - vm);
    const V16 b = ex(*reinterpret_cast<const V16U*>(x + i + kLanes) - vm);
    *reinterpret_cast<V16U*>(y + i) = a;
    *reinterpret_cast<V16U*>(y + i + kLanes) = b;
    acc[0] += a;
    acc[1] += b;
    if ((i + 2 * kLanes) % kBlock == 0) flush(acc);
  }
  for (; i < n; i += kLanes) {
    const std::int64_t len = std::min<std::int64_t>(kLanes, n - i);
    const V16 e =
        ex((len == kLanes ? V16(*reinterpret_cast<const V16U*>(x + i)) : load_partial(x + i, len, -INFINITY)) - vm);
    acc[0] += e;
    if (len == kLanes) *reinterpret_cast<V16U*>(y + i) = e;
    else store_partial(y + i, len, e);
  }
  flush(acc);
  const F64x8 t = total[0] + total[1];
  double sum = 0;
  for (int l = 0; l < 8; ++l) sum += t[l];
  return sum;
}

void softmax_row_f32(const float* x, float* y, std::int64_t n, bool log) {
  bool has_nan = false;
  const float m = row_max_f32(x, n, &has_nan);
  const bool finite = !has_nan && m > -INFINITY && m < INFINITY;
  const double sum = finite ? exp_and_sum<true>(x, y, n, m) : exp_and_sum<false>(x, y, n, m);
  if (log) {
    const float lse = static_cast<float>(std::log(sum));
    for (std::int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - lse;
  } else {
    const float inv = static_cast<float>(1.0 / sum);
    const V16 vinv = splat(inv);
    std::int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) *reinterpret_cast<V16U*>(y + i) = *reinterpret_cast<const V16U*>(y + i) * vinv;
    if (i < n) store_partial(y + i, n - i, load_partial(y + i, n - i, 0.0f) * vinv);
  }
}

}  // namespace

__attribute__((noinline)) void softmax_rows(const float* x, float* y, std::int64_t rows, std::int64_t n, bool log) {
  if (n <= 0) return;
  for (std::int64_t r = 0; r < rows; ++r) softmax_row_f32(x + r * n, y + r * n, n, log);
}

template <class T>
void softmax(const T* x, T* y, std::int64_t outer, std::int64_t n, std::int64_t inner, bool log) {
  if (outer <= 0 || n <= 0 || inner <= 0) return;
  // About 32k elements a task: big enough to amortise scheduling, small enough to balance.
  const std::int64_t row = n * inner;
  if (inner == 1) {
    const std::int64_t grain = std::max<std::int64_t>(1, 32768 / row);
    tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, outer, grain), [&](const auto& r) {
      // float rows go through softmax_rows, the very code the fused attention kernel runs.
      if constexpr (std::is_same_v<T, float>) {
        softmax_rows(x + r.begin() * n, y + r.begin() * n, r.end() - r.begin(), n, log);
      } else {
        for (std::int64_t o = r.begin(); o < r.end(); ++o) softmax_row(x + o * n, y + o * n, n, log);
      }
    });
    return;
  }
  // Columns in tiles: the per-column max and sum, and the tile's n rows (re-read by the exp and
  // scaling passes), should stay in L2 (about 256 KiB), with at least 64 columns (measured: narrower
  // tiles lose more to strided access than they gain in locality).
  const std::int64_t kTile = std::clamp<std::int64_t>((65536 / n) / 16 * 16, 64, 256);
  const std::int64_t tiles = (inner + kTile - 1) / kTile;
  const std::int64_t grain = std::max<std::int64_t>(1, 32768 / (n * std::min(inner, kTile)));
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, outer * tiles, grain), [&](const auto& r) {
    std::vector<T> m(static_cast<std::size_t>(kTile));
    std::vector<double> s(static_cast<std::size_t>(kTile));
    for (std::int64_t t = r.begin(); t < r.end(); ++t) {
      const std::int64_t o = t / tiles, j0 = (t % tiles) * kTile;
      const std::int64_t width = std::min(kTile, inner - j0);
      softmax_columns(x + o * row + j0, y + o * row + j0, n, inner, width, log, m.data(), s.data());
    }
  });
}

template void softmax<float>(const float*, float*, std::int64_t, std::int64_t, std::int64_t, bool);
template void softmax<double>(const double*, double*, std::int64_t, std::int64_t, std::int64_t, bool);

}  // namespace qeval::kernels
