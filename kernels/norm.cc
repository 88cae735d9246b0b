// Normalisation kernels: two-pass moments in double, affine applied in double per element.
#include "kernels/norm.h"

#include <algorithm>
#include <cmath>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

namespace qeval::kernels {

namespace {

// Eight independent accumulators: a fixed summation order that still pipelines and vectorises.
template <class T>
double sum_of(const T* x, std::int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
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
    for (std::int64_t r = range.begin(); r < range.end(); ++r) {
      const T* xr = x + r * n;
      T* yr = y + r * n;
      double mean = 0, var = 0;
      moments(xr, n, &mean, &var);
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
