// Softmax and log-softmax kernels: contiguous rows, and strided columns vectorised across `inner`.
#include "kernels/softmax.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

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
void softmax_columns(const T* x, T* y, std::int64_t n, std::int64_t inner, std::int64_t width,
                     bool log, T* m, double* s) {
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

typedef float V16 __attribute__((vector_size(64)));
typedef float V16U __attribute__((vector_size(64), aligned(4)));
typedef std::int32_t I16 __attribute__((vector_size(64)));
typedef float V8U __attribute__((vector_size(32), aligned(4)));
typedef double D8 __attribute__((vector_size(64)));
constexpr int kLanes = 16;

inline V16 splat(float v) { return V16{} + v; }

// exp_vectorisable lane by lane (the same formula and constants).
inline V16 exp_v16(V16 x) {
  const V16 lo = splat(-87.33654f), hi = splat(88.0f);
  V16 c = x < lo ? lo : x;
  c = c > hi ? hi : c;
  c = c == c ? c : V16{};
  const V16 k = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  V16 r = c - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  V16 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const I16 bits = (__builtin_convertvector(k, I16) + 127) << 23;
  const V16 result = p * __builtin_bit_cast(V16, bits);
  return x < lo ? V16{} : (x == x ? result : x);
}

// Max of a row; NaNs are skipped (they reach the output through the sum of exponentials).
float row_max_f32(const float* x, std::int64_t n) {
  V16 m[4] = {splat(x[0]), splat(x[0]), splat(x[0]), splat(x[0])};
  std::int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes)
    for (int u = 0; u < 4; ++u) {
      const V16 v = *reinterpret_cast<const V16U*>(x + i + u * kLanes);
      m[u] = v > m[u] ? v : m[u];
    }
  for (; i + kLanes <= n; i += kLanes) {
    const V16 v = *reinterpret_cast<const V16U*>(x + i);
    m[0] = v > m[0] ? v : m[0];
  }
  float best = x[0];
  for (int u = 0; u < 4; ++u)
    for (int l = 0; l < kLanes; ++l) best = m[u][l] > best ? m[u][l] : best;
  for (; i < n; ++i) best = x[i] > best ? x[i] : best;
  return best;
}

// y = exp(x - m) for the row, returning the sum of y in double. Every element goes through the same
// vector code (the tail is padded with -inf, whose exponential is 0), so an element's value does not
// depend on its position; the sum's order is fixed by n alone.
double exp_and_sum(const float* x, float* y, std::int64_t n, float m) {
  const V16 vm = splat(m);
  D8 acc[4] = {D8{}, D8{}, D8{}, D8{}};
  auto add = [&](const float* e, int slot) {
    acc[slot] += __builtin_convertvector(*reinterpret_cast<const V8U*>(e), D8);
    acc[slot + 1] += __builtin_convertvector(*reinterpret_cast<const V8U*>(e + 8), D8);
  };
  std::int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    *reinterpret_cast<V16U*>(y + i) = exp_v16(*reinterpret_cast<const V16U*>(x + i) - vm);
    *reinterpret_cast<V16U*>(y + i + kLanes) = exp_v16(*reinterpret_cast<const V16U*>(x + i + kLanes) - vm);
    add(y + i, 0);
    add(y + i + kLanes, 2);
  }
  for (; i < n; i += kLanes) {
    const std::int64_t len = std::min<std::int64_t>(kLanes, n - i);
    alignas(64) float t[kLanes];
    for (int l = 0; l < kLanes; ++l) t[l] = l < len ? x[i + l] : -INFINITY;
    *reinterpret_cast<V16*>(t) = exp_v16(*reinterpret_cast<const V16*>(t) - vm);
    add(t, 0);
    for (std::int64_t l = 0; l < len; ++l) y[i + l] = t[l];
  }
  const D8 total = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  double sum = 0;
  for (int l = 0; l < 8; ++l) sum += total[l];
  return sum;
}

void softmax_row_f32(const float* x, float* y, std::int64_t n, bool log) {
  const float m = row_max_f32(x, n);
  const double sum = exp_and_sum(x, y, n, m);
  if (log) {
    const float lse = static_cast<float>(std::log(sum));
    for (std::int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - lse;
  } else {
    const float inv = static_cast<float>(1.0 / sum);
    for (std::int64_t i = 0; i < n; ++i) y[i] *= inv;
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
