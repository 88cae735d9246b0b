// Small-float conversions (bit-exact) and int8/uint8 quantization.
#include "kernels/numeric.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace qeval {
namespace {

// Rounds `sig >> shift` to nearest, ties to even, for 1 <= shift <= 31 and sig < 2^31. Adding
// (half - 1) plus the kept lsb carries exactly when the dropped bits exceed half, or equal half
// with an odd lsb.
constexpr std::uint32_t shift_right_rne(std::uint32_t sig, std::uint32_t shift) {
  return (sig + (std::uint32_t{1} << (shift - 1)) - 1 + ((sig >> shift) & 1)) >> shift;
}

// c ? a : b as a mask. GCC 12 turns the nested ?: of the float16 conversions into branches and
// then refuses to vectorise the bulk loop; masks keep it straight-line.
constexpr std::uint32_t select_bits(bool c, std::uint32_t a, std::uint32_t b) {
  const std::uint32_t m = 0u - std::uint32_t(c);
  return (a & m) | (b & ~m);
}

// float bits -> binary16 bits. Straight-line (no early returns) so the bulk loop vectorises.
inline std::uint16_t float_bits_to_half(std::uint32_t x) {
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7fffffffu;
  // Normal half (a >= 2^-14): rebias the exponent; a carry out of the mantissa bumps the
  // exponent, and past 65504 lands on or beyond 0x7C00, which min() turns into inf.
  const std::uint32_t normal = std::min<std::uint32_t>((a + 0xfffu + ((a >> 13) & 1) - (112u << 23)) >> 13, 0x7c00u);
  // Subnormal half: the value in units of 2^-24 is sig >> (126 - e). Shifts past 25 give 0
  // anyway (sig < 2^24), so clamp to keep the shift defined; float subnormals (e == 0) land there.
  const std::uint32_t e = a >> 23;
  const std::uint32_t sig = (a & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = std::min<std::uint32_t>(126u - std::min<std::uint32_t>(e, 112u), 25u);
  const std::uint32_t subnormal = shift_right_rne(sig, shift);
  // NaN: keep the top 10 payload bits and set the quiet bit (what VCVTPS2PH does).
  const std::uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  const std::uint32_t mag = select_bits(a > 0x7f800000u, nan, select_bits(a < 0x38800000u, subnormal, normal));
  return static_cast<std::uint16_t>(sign | mag);
}

// binary16 bits -> float. Subnormals scale the integer mantissa by 2^-24 (exact).
inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t em = h & 0x7fffu;
  const std::uint32_t mant = em & 0x3ffu;
  const std::uint32_t normal = (em << 13) + (112u << 23);
  // Inf/NaN: exponent all ones; a NaN gets the quiet bit, as VCVTPH2PS does.
  const std::uint32_t special = 0x7f800000u | (mant << 13) | select_bits(mant != 0, 0x400000u, 0);
  const std::uint32_t subnormal = std::bit_cast<std::uint32_t>(float(mant) * 0x1p-24f);
  const std::uint32_t mag = select_bits(em >= 0x7c00u, special, select_bits(em < 0x400u, subnormal, normal));
  return std::bit_cast<float>(sign | mag);
}

// float bits -> bfloat16 bits. Overflow rounds to inf naturally (0x7F7FFFFF + 0x8000 = inf's top).
inline std::uint16_t float_bits_to_bfloat16(std::uint32_t x) {
  const bool nan = (x & 0x7fffffffu) > 0x7f800000u;
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1)) >> 16;
  return static_cast<std::uint16_t>(nan ? 0x7fc0u : rounded);
}

inline float round_float16_portable(float v) {
  return half_to_float(float_bits_to_half(std::bit_cast<std::uint32_t>(v)));
}

inline float round_bfloat16(float v) {
  return std::bit_cast<float>(std::uint32_t(float_bits_to_bfloat16(std::bit_cast<std::uint32_t>(v))) << 16);
}

// The float8 formats differ in exponent width, bias and which codes are special.
enum class Fp8Kind {
  kFn,    // E4M3FN: no inf; S.1111.111 is NaN; max S.1111.110
  kIeee,  // E5M2: IEEE-style inf (S.11111.00) and NaN (S.11111.xx)
  kFnuz,  // no inf, no -0; 0x80 is the only NaN; every other code is a number
};

template <int kExpBits, int kMantBits, int kBias, Fp8Kind kKind>
struct Fp8Format {
  static constexpr int exp_bits = kExpBits;
  static constexpr int mant_bits = kMantBits;
  static constexpr int bias = kBias;
  static constexpr Fp8Kind kind = kKind;
  // Largest finite magnitude code.
  static constexpr std::uint32_t max_mag = kKind == Fp8Kind::kFnuz ? 0x7fu : (kKind == Fp8Kind::kFn ? 0x7eu : 0x7bu);
};

using E4M3FN = Fp8Format<4, 3, 7, Fp8Kind::kFn>;
using E5M2 = Fp8Format<5, 2, 15, Fp8Kind::kIeee>;
using E4M3FNUZ = Fp8Format<4, 3, 8, Fp8Kind::kFnuz>;
using E5M2FNUZ = Fp8Format<5, 2, 16, Fp8Kind::kFnuz>;

template <class F>
std::uint8_t encode_fp8(float v, bool saturate) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(v);
  const std::uint32_t sign = (x >> 24) & 0x80u;
  const std::uint32_t a = x & 0x7fffffffu;
  const std::uint32_t nan = F::kind == Fp8Kind::kFnuz ? 0x80u : (sign | 0x7fu);
  const std::uint32_t overflow = saturate ? (sign | F::max_mag) : (F::kind == Fp8Kind::kIeee ? (sign | 0x7cu) : nan);
  if (a > 0x7f800000u) return static_cast<std::uint8_t>(nan);
  if (a == 0x7f800000u) return static_cast<std::uint8_t>(overflow);

  // value = sig * 2^(exp - 150) with exp >= 1 (float subnormals use exp 1 without implicit bit).
  const int e = int(a >> 23);
  const int exp = std::max(e, 1);
  const std::uint32_t sig = (a & 0x7fffffu) | (e != 0 ? 0x800000u : 0u);
  const int unbiased = exp - 127;
  constexpr int kMinNormal = 1 - F::bias;  // unbiased exponent of the smallest normal
  // Below the normal range the quantum stays 2^(kMinNormal - mant_bits): shift further right.
  // Shifts past 25 round to 0 like 25 does (sig < 2^24), so clamp to keep the shift defined.
  const int shift = std::min(23 - F::mant_bits + std::max(0, kMinNormal - unbiased), 25);
  const std::uint32_t rounded = shift_right_rne(sig, std::uint32_t(shift));
  // `rounded` still holds the implicit bit (value 2^mant_bits), which adds the 1 missing from
  // the exponent field below; a rounding carry moves up into the exponent the same way. For
  // subnormal targets the field is 0 and a carry to 2^mant_bits is exactly the smallest normal.
  const std::uint32_t exp_field = std::uint32_t(std::max(unbiased + F::bias - 1, 0));
  const std::uint32_t mag = (exp_field << F::mant_bits) + rounded;
  if (mag > F::max_mag) return static_cast<std::uint8_t>(overflow);
  if (F::kind == Fp8Kind::kFnuz && mag == 0) return 0;  // no -0
  return static_cast<std::uint8_t>(sign | mag);
}

template <class F>
float decode_fp8(std::uint8_t code) {
  const bool negative = (code & 0x80u) != 0;
  const std::uint32_t mag = code & 0x7fu;
  const std::uint32_t exp_field = mag >> F::mant_bits;
  const std::uint32_t mant = mag & ((1u << F::mant_bits) - 1);
  constexpr std::uint32_t kExpAllOnes = (1u << F::exp_bits) - 1;
  if constexpr (F::kind == Fp8Kind::kFnuz) {
    if (code == 0x80u) return std::numeric_limits<float>::quiet_NaN();
  } else if constexpr (F::kind == Fp8Kind::kFn) {
    if (mag == 0x7fu) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      return negative ? -nan : nan;
    }
  } else {
    if (exp_field == kExpAllOnes) {
      const float special =
          mant == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
      return negative ? -special : special;
    }
  }
  float value;
  if (exp_field == 0) {
    // Subnormal: mant * 2^(1 - bias - mant_bits); a power-of-two scale is exact.
    value = std::ldexp(float(mant), 1 - F::bias - F::mant_bits);
  } else {
    const std::uint32_t bits = ((exp_field - F::bias + 127) << 23) | (mant << (23 - F::mant_bits));
    value = std::bit_cast<float>(bits);
  }
  return negative ? -value : value;
}

}  // namespace

float16 to_float16(float v) { return {float_bits_to_half(std::bit_cast<std::uint32_t>(v))}; }
bfloat16 to_bfloat16(float v) { return {float_bits_to_bfloat16(std::bit_cast<std::uint32_t>(v))}; }
float8_e4m3fn to_float8_e4m3fn(float v, bool saturate) { return {encode_fp8<E4M3FN>(v, saturate)}; }
float8_e5m2 to_float8_e5m2(float v, bool saturate) { return {encode_fp8<E5M2>(v, saturate)}; }
float8_e4m3fnuz to_float8_e4m3fnuz(float v, bool saturate) { return {encode_fp8<E4M3FNUZ>(v, saturate)}; }
float8_e5m2fnuz to_float8_e5m2fnuz(float v, bool saturate) { return {encode_fp8<E5M2FNUZ>(v, saturate)}; }

float to_float(float16 v) { return half_to_float(v.bits); }
float to_float(bfloat16 v) { return std::bit_cast<float>(std::uint32_t(v.bits) << 16); }
namespace {
// Every code decoded once: DequantizeLinear of fp8 values reads a table instead of branching
// (and calling ldexp for subnormals) per element.
template <class F>
std::array<float, 256> fp8_table() {
  std::array<float, 256> t;
  for (int c = 0; c < 256; ++c) t[std::size_t(c)] = decode_fp8<F>(std::uint8_t(c));
  return t;
}
const std::array<float, 256> kE4M3FN = fp8_table<E4M3FN>(), kE5M2 = fp8_table<E5M2>(),
                             kE4M3FNUZ = fp8_table<E4M3FNUZ>(), kE5M2FNUZ = fp8_table<E5M2FNUZ>();
}  // namespace

float to_float(float8_e4m3fn v) { return kE4M3FN[v.bits]; }
const float* float8_e4m3fn_values() { return kE4M3FN.data(); }
float to_float(float8_e5m2 v) { return kE5M2[v.bits]; }
float to_float(float8_e4m3fnuz v) { return kE4M3FNUZ[v.bits]; }
float to_float(float8_e5m2fnuz v) { return kE5M2FNUZ[v.bits]; }

float round_to_float16(float v) { return round_float16_portable(v); }
float round_to_bfloat16(float v) { return round_bfloat16(v); }

void round_to_float16_portable(float* data, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) data[i] = round_float16_portable(data[i]);
}

bool float16_bulk_uses_f16c() {
#if defined(__F16C__)
  return true;
#else
  return false;
#endif
}

void round_to_float16(float* data, std::size_t n) {
  std::size_t i = 0;
#if defined(__F16C__)
  // Rounding mode in the immediate, not MXCSR, so a caller's mode cannot change the result.
  constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
#if defined(__AVX512F__)
  // Masked forms throughout: they also take the tail, and the unmasked _mm512_cvtps_ph/cvtph_ps
  // trip GCC 12's -Wmaybe-uninitialized inside its own headers.
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m256i h = _mm512_maskz_cvtps_ph(m, _mm512_maskz_loadu_ps(m, data + i), kRne);
    _mm512_mask_storeu_ps(data + i, m, _mm512_maskz_cvtph_ps(m, h));
  }
#else
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(data + i), kRne);
    _mm256_storeu_ps(data + i, _mm256_cvtph_ps(h));
  }
#endif
#endif
  if (i < n) round_to_float16_portable(data + i, n - i);
}

bool narrow_to_float16_exact(const float* x, std::uint16_t* out, std::size_t n) {
  std::size_t i = 0;
#if defined(__F16C__) && defined(__AVX2__)
  constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m128i h = _mm256_cvtps_ph(v, kRne);
    // The round trip's bits (F16C and to_float16 quiet NaNs alike: a signalling one is not exact).
    const __m256i same = _mm256_cmpeq_epi32(_mm256_castps_si256(_mm256_cvtph_ps(h)), _mm256_castps_si256(v));
    if (_mm256_movemask_epi8(same) != -1) return false;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
#endif
  for (; i < n; ++i) {
    const float16 h = to_float16(x[i]);
    if (std::bit_cast<std::uint32_t>(to_float(h)) != std::bit_cast<std::uint32_t>(x[i])) return false;
    out[i] = h.bits;
  }
  return true;
}

void widen_float16(const std::uint16_t* h, float* out, std::size_t n) {
  std::size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
#endif
  for (; i < n; ++i) out[i] = to_float(float16{h[i]});
}

void round_to_bfloat16(float* data, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) data[i] = round_bfloat16(data[i]);
}

std::int8_t quantize_int8(float x, float scale, std::int32_t zero_point) {
  return quantize_to<std::int8_t>(x, scale, zero_point);
}

std::uint8_t quantize_uint8(float x, float scale, std::int32_t zero_point) {
  return quantize_to<std::uint8_t>(x, scale, zero_point);
}

}  // namespace qeval
