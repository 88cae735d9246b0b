// 16-lane float vectors (GCC vector extensions: one AVX-512 register where the target has it) and
// exp / erf / sigmoid written on them: the formulas of exp_vectorisable, erf_vectorisable and
// sigmoid_vectorisable (kernels/softmax.h, kernels/elementwise.h) lane by lane, giving the same
// bits (tests/kernels/elementwise_test.cc). Loops over the scalar forms vectorise too, but GCC's
// if-conversion of their selects costs a third more instructions (masked FMAs, mask logic).
#pragma once

#include <cstdint>

namespace qeval::kernels::simd {

typedef float F32x16 __attribute__((vector_size(64)));
typedef float F32x16U __attribute__((vector_size(64), aligned(4)));  // for unaligned loads and stores
typedef std::int32_t I32x16 __attribute__((vector_size(64)));
inline constexpr int kLanes = 16;

inline F32x16 splat(float v) { return F32x16{} + v; }
inline F32x16 load(const float* p) { return *reinterpret_cast<const F32x16U*>(p); }
inline void store(float* p, F32x16 v) { *reinterpret_cast<F32x16U*>(p) = v; }

// exp of lanes clamped to [-87.33654, 88] (no NaN): exp_vectorisable's formula lane by lane.
inline F32x16 exp_clamped(F32x16 c) {
  const F32x16 k = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  F32x16 r = c - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  F32x16 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const I32x16 bits = (__builtin_convertvector(k, I32x16) + 127) << 23;
  return p * __builtin_bit_cast(F32x16, bits);
}

// exp_vectorisable lane by lane.
inline F32x16 exp(F32x16 x) {
  const F32x16 lo = splat(-87.33654f), hi = splat(88.0f);
  F32x16 c = x < lo ? lo : x;
  c = c > hi ? hi : c;
  c = c == c ? c : F32x16{};
  const F32x16 result = exp_clamped(c);
  return x < lo ? F32x16{} : (x == x ? result : x);
}

// simd::exp for lanes known to hold no NaN and no value above 0 (a max-subtracted row of finite
// maximum): the same bits without the selects that only NaN and large inputs need.
inline F32x16 exp_nonpositive(F32x16 x) {
  const F32x16 lo = splat(-87.33654f);
  const F32x16 result = exp_clamped(x < lo ? lo : x);
  return x < lo ? F32x16{} : result;
}

inline F32x16 abs(F32x16 x) { return __builtin_bit_cast(F32x16, __builtin_bit_cast(I32x16, x) & 0x7fffffff); }

// erf_vectorisable lane by lane.
inline F32x16 erf(F32x16 x) {
  const I32x16 sign = __builtin_bit_cast(I32x16, x) & std::int32_t(0x80000000u);
  const F32x16 a = abs(x);
  const F32x16 t = a * a;
  F32x16 p = splat(-6.024572649039328e-4f);
  p = p * t + 5.000889301300049e-3f;
  p = p * t + -2.677295356988907e-2f;
  p = p * t + 1.1282039433717728e-1f;
  p = p * t + -3.761252462863922e-1f;
  p = p * t + 1.2837916612625122e-1f;
  const F32x16 small = a + a * p;
  const F32x16 c = a < 4.0f ? a : splat(4.0f);
  F32x16 q = splat(3.3717236647134996e-7f);
  q = q * c + 1.6803254766273312e-5f;
  q = q * c + -4.1108153527602553e-4f;
  q = q * c + 4.09982493147254e-3f;
  q = q * c + -2.498658187687397e-2f;
  q = q * c + 1.0812472552061081e-1f;
  q = q * c + 6.334582567214966e-1f;
  q = q * c + 1.1294702291488647f;
  q = q * c + -1.6695375961717218e-4f;
  const F32x16 big = 1.0f - exp(-q);
  const F32x16 r = a < 0.921875f ? small : big;
  const F32x16 s = __builtin_bit_cast(F32x16, __builtin_bit_cast(I32x16, r) | sign);  // copysign(r, x)
  return x == x ? s : x;
}

// sigmoid_vectorisable lane by lane.
inline F32x16 sigmoid(F32x16 x) {
  const F32x16 e = exp(-abs(x));
  const F32x16 r = 1.0f / (1.0f + e);
  return x >= 0.0f ? r : (x == x ? e * r : x);
}

}  // namespace qeval::kernels::simd
