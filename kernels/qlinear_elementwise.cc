// ONNX Runtime's arithmetic for its 8-bit QOperator ops (see the header for each formula).
#include "kernels/qlinear_elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/numeric.h"

namespace qeval::kernels {

namespace {

template <class T>
T saturate_rounded(float v) {
  // cvtps2dq rounds half to even under the default rounding mode; the packs saturate.
  const float r = std::nearbyint(v);
  const float lo = float(std::numeric_limits<T>::lowest()), hi = float(std::numeric_limits<T>::max());
  return T(r < lo ? lo : (r > hi ? hi : r));
}

template <class T>
void add_impl(const T* a, std::int64_t a_step, const T* b, std::int64_t b_step, T* y, std::int64_t n,
              const QLinearAddParams& p) {
  if (a_step == 0 && b_step != 0) {
    const float fixed = p.fixed + float(a[0]) * p.ratio_a;  // MLAS: a broadcast A joins the fixed part
    for (std::int64_t i = 0; i < n; ++i) y[i] = saturate_rounded<T>(std::fma(float(b[i]), p.ratio_b, fixed));
  } else if (b_step == 0) {
    const float fixed = p.fixed + float(b[0]) * p.ratio_b;
    for (std::int64_t i = 0; i < n; ++i) y[i] = saturate_rounded<T>(std::fma(float(a[i * a_step]), p.ratio_a, fixed));
  } else {
    for (std::int64_t i = 0; i < n; ++i)
      y[i] = saturate_rounded<T>(std::fma(float(a[i]), p.ratio_a, std::fma(float(b[i]), p.ratio_b, p.fixed)));
  }
}

template <class T>
void mul_impl(const T* a, std::int64_t a_step, std::int32_t za, const T* b, std::int64_t b_step, std::int32_t zb,
              float ratio, std::int32_t zc, T* y, std::int64_t n) {
  const float fz = float(zc);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t prod = (std::int32_t(a[i * a_step]) - za) * (std::int32_t(b[i * b_step]) - zb);
    y[i] = saturate_rounded<T>(float(prod) * ratio + fz);  // two roundings (no FMA: -ffp-contract=off)
  }
}

template <class T>
T average_impl(const T* x, std::int64_t size, std::int32_t zx, float sx, float sy, std::int32_t zy) {
  std::int32_t sum = -zx * std::int32_t(size);
  for (std::int64_t i = 0; i < size; ++i) sum += std::int32_t(x[i]);
  const float scale = sx / (sy * float(size));
  return saturate_rounded<T>(std::nearbyint(float(sum) * scale) + float(zy));
}

template <class T>
void average_pool_impl(const T* x, const QLinearPoolWindow& p, float sx, std::int32_t zx, float sy, std::int32_t zy,
                       T* y) {
  for (std::int64_t oh = 0; oh < p.out_h; ++oh) {
    std::int64_t h0 = oh * p.stride[0] - p.pad_begin[0];
    const std::int64_t h1 = std::min(h0 + p.kernel[0], p.h);
    h0 = std::max<std::int64_t>(h0, 0);
    for (std::int64_t ow = 0; ow < p.out_w; ++ow) {
      std::int64_t w0 = ow * p.stride[1] - p.pad_begin[1];
      const std::int64_t w1 = std::min(w0 + p.kernel[1], p.w);
      w0 = std::max<std::int64_t>(w0, 0);
      float sum = 0;
      for (std::int64_t i = h0; i < h1; ++i)
        for (std::int64_t j = w0; j < w1; ++j) sum += sx * float(std::int32_t(x[i * p.w + j]) - zx);
      const std::int64_t count =
          p.count_include_pad ? p.kernel[0] * p.kernel[1] : std::max<std::int64_t>(0, (h1 - h0) * (w1 - w0));
      sum /= float(count);
      y[oh * p.out_w + ow] = saturate_rounded<T>(sum / sy + float(zy));
    }
  }
}

}  // namespace

void qlinear_average_pool_2d(const std::uint8_t* x, const QLinearPoolWindow& p, float sx, std::int32_t zx, float sy,
                             std::int32_t zy, std::uint8_t* y) {
  average_pool_impl(x, p, sx, zx, sy, zy, y);
}
void qlinear_average_pool_2d(const std::int8_t* x, const QLinearPoolWindow& p, float sx, std::int32_t zx, float sy,
                             std::int32_t zy, std::int8_t* y) {
  average_pool_impl(x, p, sx, zx, sy, zy, y);
}

QLinearAddParams qlinear_add_params(float sa, std::int32_t za, float sb, std::int32_t zb, float sc, std::int32_t zc) {
  QLinearAddParams p;
  p.ratio_a = sa / sc;
  p.ratio_b = sb / sc;
  p.fixed = float(zc) - (p.ratio_a * float(za) + p.ratio_b * float(zb));
  return p;
}

void qlinear_add(const std::uint8_t* a, std::int64_t a_step, const std::uint8_t* b, std::int64_t b_step,
                 std::uint8_t* y, std::int64_t n, const QLinearAddParams& p) {
  add_impl(a, a_step, b, b_step, y, n, p);
}
void qlinear_add(const std::int8_t* a, std::int64_t a_step, const std::int8_t* b, std::int64_t b_step, std::int8_t* y,
                 std::int64_t n, const QLinearAddParams& p) {
  add_impl(a, a_step, b, b_step, y, n, p);
}

void qlinear_mul(const std::uint8_t* a, std::int64_t a_step, std::int32_t za, const std::uint8_t* b,
                 std::int64_t b_step, std::int32_t zb, float ratio, std::int32_t zc, std::uint8_t* y, std::int64_t n) {
  mul_impl(a, a_step, za, b, b_step, zb, ratio, zc, y, n);
}
void qlinear_mul(const std::int8_t* a, std::int64_t a_step, std::int32_t za, const std::int8_t* b, std::int64_t b_step,
                 std::int32_t zb, float ratio, std::int32_t zc, std::int8_t* y, std::int64_t n) {
  mul_impl(a, a_step, za, b, b_step, zb, ratio, zc, y, n);
}

std::uint8_t qlinear_average(const std::uint8_t* x, std::int64_t size, std::int32_t zx, float sx, float sy,
                             std::int32_t zy) {
  return average_impl(x, size, zx, sx, sy, zy);
}
std::int8_t qlinear_average(const std::int8_t* x, std::int64_t size, std::int32_t zx, float sx, float sy,
                            std::int32_t zy) {
  return average_impl(x, size, zx, sx, sy, zy);
}

template <class T>
std::array<T, 256> qlinear_lookup_table(float sx, std::int32_t zx, float sy, std::int32_t zy,
                                        const std::function<float(float)>& f) {
  std::array<T, 256> table{};
  for (int code = 0; code < 256; ++code) {
    const std::uint8_t byte = std::uint8_t(code);
    T v;
    std::memcpy(&v, &byte, 1);
    const float x = sx * float(std::int32_t(v) - zx);
    table[std::size_t(code)] = quantize_to<T>(f(x), sy, zy);
  }
  return table;
}
template std::array<std::uint8_t, 256> qlinear_lookup_table<std::uint8_t>(float, std::int32_t, float, std::int32_t,
                                                                          const std::function<float(float)>&);
template std::array<std::int8_t, 256> qlinear_lookup_table<std::int8_t>(float, std::int32_t, float, std::int32_t,
                                                                        const std::function<float(float)>&);

template <class T>
void qlinear_lookup(const T* x, const std::array<T, 256>& table, T* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint8_t byte;
    std::memcpy(&byte, x + i, 1);
    y[i] = table[byte];
  }
}
template void qlinear_lookup<std::uint8_t>(const std::uint8_t*, const std::array<std::uint8_t, 256>&, std::uint8_t*,
                                           std::int64_t);
template void qlinear_lookup<std::int8_t>(const std::int8_t*, const std::array<std::int8_t, 256>&, std::int8_t*,
                                          std::int64_t);

std::array<float, 256> qlinear_softmax_table(float x_scale, std::int64_t reduce_len, bool is_signed) {
  double shift = std::log(double(std::numeric_limits<float>::max() / float(reduce_len)));
  shift = std::max(0.0, shift - 5.0) / double(x_scale);
  std::array<float, 256> table{};
  for (int i = 0; i < 256; ++i) {
    const double e = std::exp((double(i) - 255.0 + shift) * double(x_scale));
    table[std::uint8_t(is_signed ? i - 128 : i)] = float(e);
  }
  return table;
}

void qlinear_softmax(const std::uint8_t* x, std::int64_t stride, std::int64_t n, const std::array<float, 256>& table,
                     float y_scale, std::int32_t zy, std::uint8_t* y) {
  std::uint8_t top = 0;
  for (std::int64_t i = 0; i < n; ++i) top = std::max(top, x[i * stride]);
  const float* shifted = table.data() + (255 - top);
  float sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += shifted[x[i * stride]];
  if (!(sum > 0)) {  // the top code's entry is >= 1: only an overflowing sum; ORT leaves the row unwritten
    for (std::int64_t i = 0; i < n; ++i) y[i * stride] = std::uint8_t(zy);
    return;
  }
  const float scale = std::floor(1.0f / y_scale);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t q = std::uint32_t(std::nearbyint(shifted[x[i * stride]] * scale / sum)) + std::uint32_t(zy);
    y[i * stride] = q > 255 ? 255 : std::uint8_t(q);
  }
}

void qlinear_softmax(const std::int8_t* x, std::int64_t stride, std::int64_t n, const std::array<float, 256>& table,
                     float y_scale, std::int32_t zy, std::int8_t* y) {
  std::int8_t top = -128;
  for (std::int64_t i = 0; i < n; ++i) top = std::max(top, x[i * stride]);
  const std::int32_t adjustment = 127 - top;
  float sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += table[std::uint8_t(adjustment + x[i * stride])];
  if (!(sum > 0)) {
    for (std::int64_t i = 0; i < n; ++i) y[i * stride] = std::int8_t(zy);
    return;
  }
  const float scale = std::floor(1.0f / y_scale);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t q =
        std::int32_t(std::nearbyint(table[std::uint8_t(adjustment + x[i * stride])] * scale / sum)) + zy;
    y[i * stride] = q > 255 ? std::int8_t(-1) : std::int8_t(q);
  }
}

}  // namespace qeval::kernels
