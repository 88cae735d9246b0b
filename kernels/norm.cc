// Normalisation kernels: two-pass moments in double, affine applied in double per element.
#include "kernels/norm.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace qeval::kernels {

namespace {

// The eight accumulators of sum_of / centred_sums over a float row (whole groups of 8 as the
// lanes of one vector, then the tail into accumulator 0): lane j takes the very operations
// accumulator j took in the scalar loop (GCC left that loop scalar: a float -> double conversion
// and an add per element were most of a LayerNorm's or GroupNorm's time), in the same order, so
// the sums are the same bits. The square's add is fused (vfmadd), as GCC contracts the scalar
// q[j] += d * d. (maskz conversions: GCC 12 warns on the unmasked form's undefined source.)
#if defined(__AVX512F__)
inline std::int64_t sum_lanes(const float* x, std::int64_t n, double acc[8]) {
  __m512d a = _mm512_setzero_pd();
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) a = _mm512_add_pd(a, _mm512_maskz_cvtps_pd(__mmask8(0xff), _mm256_loadu_ps(x + i)));
  _mm512_storeu_pd(acc, a);
  for (; i < n; ++i) acc[0] += static_cast<double>(x[i]);
  return i;
}
inline std::int64_t centred_lanes(const float* x, std::int64_t n, double c, double a[8], double q[8]) {
  const __m512d vc = _mm512_set1_pd(c);
  __m512d va = _mm512_setzero_pd(), vq = _mm512_setzero_pd();
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512d d = _mm512_sub_pd(_mm512_maskz_cvtps_pd(__mmask8(0xff), _mm256_loadu_ps(x + i)), vc);
    va = _mm512_add_pd(va, d);
    vq = _mm512_fmadd_pd(d, d, vq);
  }
  _mm512_storeu_pd(a, va);
  _mm512_storeu_pd(q, vq);
  // The tail too, with the fused add spelt out: left to the compiler, this loop was contracted in
  // one build and not in another.
  for (; i < n; ++i) {
    const double d = static_cast<double>(x[i]) - c;
    a[0] += d;
    q[0] = std::fma(d, d, q[0]);
  }
  return i;
}

inline double combine8(const double v[8]) { return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])); }

// moments() of R consecutive rows of length n at once: each row takes exactly moments()'s
// operations (sum_lanes, centred_lanes, the same combinations), the R rows' accumulator chains
// interleaved so that the adds' latency overlaps (a LayerNorm's 64-element rows were bound by it).
template <int R>
void moments_rows(const float* x, std::int64_t n, double* mean, double* variance) {
  const std::int64_t body = n / 8 * 8;
  __m512d acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_pd();
  for (std::int64_t i = 0; i < body; i += 8)
    for (int r = 0; r < R; ++r)
      acc[r] = _mm512_add_pd(acc[r], _mm512_maskz_cvtps_pd(__mmask8(0xff), _mm256_loadu_ps(x + r * n + i)));
  double m[R];
  for (int r = 0; r < R; ++r) {
    alignas(64) double a8[8];
    _mm512_store_pd(a8, acc[r]);
    for (std::int64_t i = body; i < n; ++i) a8[0] += static_cast<double>(x[r * n + i]);
    m[r] = combine8(a8) / static_cast<double>(n);
  }
  __m512d va[R], vq[R], vc[R];
  for (int r = 0; r < R; ++r) va[r] = vq[r] = _mm512_setzero_pd(), vc[r] = _mm512_set1_pd(m[r]);
  for (std::int64_t i = 0; i < body; i += 8)
    for (int r = 0; r < R; ++r) {
      const __m512d d = _mm512_sub_pd(_mm512_maskz_cvtps_pd(__mmask8(0xff), _mm256_loadu_ps(x + r * n + i)), vc[r]);
      va[r] = _mm512_add_pd(va[r], d);
      vq[r] = _mm512_fmadd_pd(d, d, vq[r]);
    }
  for (int r = 0; r < R; ++r) {
    alignas(64) double a8[8], q8[8];
    _mm512_store_pd(a8, va[r]);
    _mm512_store_pd(q8, vq[r]);
    for (std::int64_t i = body; i < n; ++i) {
      const double d = static_cast<double>(x[r * n + i]) - m[r];
      a8[0] += d;
      q8[0] = std::fma(d, d, q8[0]);
    }
    const double sum = combine8(a8), sum_sq = combine8(q8);
    mean[r] = m[r] + sum / static_cast<double>(n);
    variance[r] = std::max(0.0, (sum_sq - sum * sum / static_cast<double>(n)) / static_cast<double>(n));
  }
}
#endif

// Eight independent accumulators: a fixed summation order that still pipelines and vectorises.
template <class T>
double sum_of(const T* x, std::int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) i = sum_lanes(x, n, acc);
#endif
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += static_cast<double>(x[i + j]);
  for (; i < n; ++i) acc[0] += static_cast<double>(x[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Sums of (x - c) and (x - c)^2.
template <class T>
void centred_sums(const T* x, std::int64_t n, double c, double* sum, double* sum_sq) {
  double a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) i = centred_lanes(x, n, c, a, q);
#endif
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      const double d = static_cast<double>(x[i + j]) - c;
      a[j] += d;
      q[j] += d * d;
    }
  for (; i < n; ++i) {
    const double d = static_cast<double>(x[i]) - c;
    a[0] += d;
    q[0] += d * d;
  }
  *sum = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
  *sum_sq = ((q[0] + q[1]) + (q[2] + q[3])) + ((q[4] + q[5]) + (q[6] + q[7]));
}

// y = (x - mean) * a + b over a run sharing one scale/bias.
template <class T>
void apply_run(const T* x, T* y, std::int64_t n, double mean, double a, double b) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<T>((static_cast<double>(x[i]) - mean) * a + b);
}

// y = (x - mean) * inv_std * scale[i] + bias[i] over a run with per-element parameters.
template <class T>
void apply_vector(const T* x, T* y, std::int64_t n, double mean, double inv_std, const T* scale, const T* bias) {
  for (std::int64_t i = 0; i < n; ++i) {
    const double s = scale ? static_cast<double>(scale[i]) : 1.0;
    const double b = bias ? static_cast<double>(bias[i]) : 0.0;
    y[i] = static_cast<T>((static_cast<double>(x[i]) - mean) * inv_std * s + b);
  }
}

}  // namespace

template <class T>
void moments(const T* x, std::int64_t n, double* mean, double* variance) {
  if (n <= 0) {
    *mean = 0;
    *variance = 0;
    return;
  }
  const double m = sum_of(x, n) / static_cast<double>(n);
  double s = 0, q = 0;
  centred_sums(x, n, m, &s, &q);
  // s is the rounding error of m times n: the centred mean is m + s / n.
  *mean = m + s / static_cast<double>(n);
  *variance = std::max(0.0, (q - s * s / static_cast<double>(n)) / static_cast<double>(n));
}

template <class T>
void normalize_rows(const T* x, T* y, std::int64_t rows, std::int64_t n, double epsilon, const ChannelAffine<T>& affine,
                    double* mean_out, double* inv_std_out) {
  if (rows <= 0 || n <= 0) return;
  const std::int64_t channels = std::max<std::int64_t>(1, affine.channels);
  const std::int64_t inner = std::max<std::int64_t>(1, affine.channel_inner);
  const std::int64_t grain = std::max<std::int64_t>(1, 32768 / n);
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, rows, grain), [&](const auto& range) {
#if defined(__AVX512F__)
    // Moments four rows at a time where the vector path has them (the same bits as row by row).
    constexpr std::int64_t kRows = 4;
    double means[kRows], vars[kRows];
    std::int64_t have = range.begin();  // rows [have - kRows, have) are in means/vars
#endif
    for (std::int64_t r = range.begin(); r < range.end(); ++r) {
      const T* xr = x + r * n;
      T* yr = y + r * n;
      double mean = 0, var = 0;
#if defined(__AVX512F__)
      if constexpr (std::is_same_v<T, float>) {
        if (r == have && range.end() - r >= kRows) {
          moments_rows<kRows>(xr, n, means, vars);
          have = r + kRows;
        }
      }
      if (r < have) {
        mean = means[r - (have - kRows)];
        var = vars[r - (have - kRows)];
      } else {
        moments(xr, n, &mean, &var);
      }
#else
      moments(xr, n, &mean, &var);
#endif
      const double inv_std = 1.0 / std::sqrt(var + epsilon);
      if (mean_out) mean_out[r] = mean;
      if (inv_std_out) inv_std_out[r] = inv_std;
      // Walk the row in runs that share a channel (inner > 1) or a contiguous stretch of the
      // parameter vectors (inner == 1).
      std::int64_t i = 0;
      while (i < n) {
        const std::int64_t f = r * n + i;
        if (inner == 1) {
          const std::int64_t c = f % channels;
          const std::int64_t len = std::min(n - i, channels - c);
          apply_vector(xr + i, yr + i, len, mean, inv_std, affine.scale ? affine.scale + c : nullptr,
                       affine.bias ? affine.bias + c : nullptr);
          i += len;
        } else {
          const std::int64_t c = (f / inner) % channels;
          const std::int64_t len = std::min(n - i, inner - f % inner);
          const double s = affine.scale ? static_cast<double>(affine.scale[c]) : 1.0;
          const double b = affine.bias ? static_cast<double>(affine.bias[c]) : 0.0;
          apply_run(xr + i, yr + i, len, mean, inv_std * s, b);
          i += len;
        }
      }
    }
  });
}

template <class T>
void batch_norm(const T* x, T* y, std::int64_t outer, std::int64_t channels, std::int64_t inner, const double* scale,
                const double* bias, const double* mean, const double* var, double epsilon) {
  if (outer <= 0 || channels <= 0 || inner <= 0) return;
  const std::int64_t grain = std::max<std::int64_t>(1, 32768 / inner);
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, outer * channels, grain), [&](const auto& range) {
    for (std::int64_t p = range.begin(); p < range.end(); ++p) {
      const std::int64_t c = p % channels;
      const double a = scale[c] / std::sqrt(var[c] + epsilon);
      apply_run(x + p * inner, y + p * inner, inner, mean[c], a, bias[c]);
    }
  });
}

template void moments<float>(const float*, std::int64_t, double*, double*);
template void moments<double>(const double*, std::int64_t, double*, double*);
template void normalize_rows<float>(const float*, float*, std::int64_t, std::int64_t, double,
                                    const ChannelAffine<float>&, double*, double*);
template void normalize_rows<double>(const double*, double*, std::int64_t, std::int64_t, double,
                                     const ChannelAffine<double>&, double*, double*);
template void batch_norm<float>(const float*, float*, std::int64_t, std::int64_t, std::int64_t, const double*,
                                const double*, const double*, const double*, double);
template void batch_norm<double>(const double*, double*, std::int64_t, std::int64_t, std::int64_t, const double*,
                                 const double*, const double*, const double*, double);

}  // namespace qeval::kernels
