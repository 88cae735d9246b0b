// Per-tensor int8/uint8 quantize of a block: 16 lanes at a time (divide, clamp, convert under the
// current rounding mode, NaN -> zero point, add the zero point, saturate to bytes), the scalar
// quantize_to on builds without AVX-512.
#include "kernels/quantize_block.h"

#include <limits>
#include <type_traits>

#include "kernels/numeric.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace qeval::kernels {
namespace {

template <class T>
void quantize(const float* __restrict x, T* __restrict y, std::int64_t n, float scale, std::int32_t zero_point) {
  std::int64_t i = 0;
#if defined(__AVX512F__)
  // quantize_to's result in integers, two vector operations fewer than its float steps (0.127 ->
  // 0.115 ns an element on 64 Ki floats, 1 thread, Zen 4): the quotient clamped to +-2^30 (a NaN
  // passes both clamps: min/max return their second operand when it is NaN), converted under the
  // current rounding mode (cvtps2dq: nearbyint's rounding; exact, and whole already past 2^23),
  // NaN lanes zeroed, the zero point added in int32 (no overflow: |r| <= 2^30, |zero_point| < 2^9),
  // then saturated to T by the narrowing conversion (int8: signed saturation; uint8: negatives
  // raised to 0, then unsigned saturation). quantize_to's float steps agree: nearbyint(q) +
  // zero_point is exact below 2^24 and saturates the same way beyond; NaN gives the saturated zero
  // point; infinities saturate. The division stays (multiplying by 1/scale differs in the last bit).
  static_assert(sizeof(T) == 1);
  const __m512 s = _mm512_set1_ps(scale);
  const __m512 hi = _mm512_set1_ps(1073741824.0f), lo = _mm512_set1_ps(-1073741824.0f);
  const __m512i z = _mm512_set1_epi32(zero_point);
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m512 d = _mm512_maskz_div_ps(m, _mm512_maskz_loadu_ps(m, x + i), s);
    const __mmask16 number = _mm512_cmp_ps_mask(d, d, _CMP_ORD_Q);
    const __m512 clamped = _mm512_maskz_max_ps(m, lo, _mm512_maskz_min_ps(m, hi, d));
    __m512i r = _mm512_add_epi32(_mm512_maskz_cvtps_epi32(number, clamped), z);
    // A whole vector's bytes through a register and a plain 16-byte store: a narrowing store under
    // a mask is slow on Zen 4. The tail keeps the masked form. (maskz forms throughout: GCC 12 warns
    // on the unmasked ones' undefined sources.)
    if constexpr (std::is_same_v<T, std::int8_t>) {
      if (m == 0xffff) _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm512_maskz_cvtsepi32_epi8(m, r));
      else _mm512_mask_cvtsepi32_storeu_epi8(y + i, m, r);
    } else {
      r = _mm512_maskz_max_epi32(m, r, _mm512_setzero_si512());
      if (m == 0xffff) _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm512_maskz_cvtusepi32_epi8(m, r));
      else _mm512_mask_cvtusepi32_storeu_epi8(y + i, m, r);
    }
  }
#endif
  for (; i < n; ++i) y[i] = quantize_to<T>(x[i], scale, zero_point);
}

}  // namespace

void quantize_block(const float* x, std::int8_t* y, std::int64_t n, float scale, std::int32_t zero_point) {
  quantize(x, y, n, scale, zero_point);
}

void quantize_block(const float* x, std::uint8_t* y, std::int64_t n, float scale, std::int32_t zero_point) {
  quantize(x, y, n, scale, zero_point);
}

}  // namespace qeval::kernels
