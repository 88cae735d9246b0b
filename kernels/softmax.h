// Softmax and log-softmax along one axis of an array viewed as [outer, n, inner].
#pragma once

#include <cstdint>

namespace qeval::kernels {

// y = softmax(x) (log-softmax when `log`) along the middle axis of x viewed as [outer, n, inner].
// The row maximum is subtracted before exponentiating (no overflow on large logits); sums are
// accumulated in double (float rows: float lanes of at most 8 terms, added in double). NaN anywhere in a row makes the
// whole row NaN, as the math says. T is float or double; `y` must not alias `x`.
template <class T>
void softmax(const T* x, T* y, std::int64_t outer, std::int64_t n, std::int64_t inner, bool log);

// The contiguous-row case (inner == 1) on the calling thread: `rows` rows of n values. Gives the
// same bits as softmax() on the same rows (which runs this per row). y may equal x (in place)
// unless `log`.
void softmax_rows(const float* x, float* y, std::int64_t rows, std::int64_t n, bool log);

// exp(x) in float, written so that the compiler vectorises loops over it (std::exp does not
// vectorise without -ffast-math). Within 2 ulp of std::exp; 0 below -87.3 (where std::exp is
// denormal), NaN stays NaN. Meant for x <= 0 (max-subtracted logits); saturates above 88.
inline float exp_vectorisable(float x) {
  const float lo = -87.33654f, hi = 88.0f;
  float c = x < lo ? lo : x;
  c = c > hi ? hi : c;
  c = c == c ? c : 0.0f;  // keeps the float -> int conversion below defined for NaN
  // exp(c) = 2^k * exp(r), k = round(c / ln 2), |r| <= ln2 / 2.
  const float k = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  float r = c - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^k by building the exponent field; k is in [-126, 127] after clamping.
  const std::int32_t bits = (static_cast<std::int32_t>(k) + 127) << 23;
  const float scale = __builtin_bit_cast(float, bits);
  const float result = p * scale;
  return x < lo ? 0.0f : (x == x ? result : x);
}

}  // namespace qeval::kernels
