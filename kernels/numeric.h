// Bit-exact conversions to/from float16, bfloat16 and the ONNX float8 formats; int8/uint8 quantize.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace qeval {

// Storage types: the raw code, so a caller can compare and serialise bits without going through
// float (NaN payloads and -0 survive).
struct float16 {
  std::uint16_t bits;
};  // IEEE 754 binary16
struct bfloat16 {
  std::uint16_t bits;
};
struct float8_e4m3fn {
  std::uint8_t bits;
};  // no inf, NaN = 0x7F/0xFF, max 448
struct float8_e5m2 {
  std::uint8_t bits;
};  // IEEE-like, inf and NaN, max 57344
struct float8_e4m3fnuz {
  std::uint8_t bits;
};  // no inf, no -0, NaN = 0x80, max 240
struct float8_e5m2fnuz {
  std::uint8_t bits;
};  // no inf, no -0, NaN = 0x80, max 57344

// float -> format: round to nearest, ties to even, on the exact value (no double rounding).
// Overflow is decided on the rounded value, as the ONNX Cast-19 tables say ("[x] means the value
// rounded to the target mantissa width"): e.g. 464 is the tie between E4M3FN's 448 and the
// unrepresentable 480 and goes to 448; anything above it overflows.
//
// float8 `saturate` (ONNX Cast / QuantizeLinear opset 19+):
//   saturate=true:  overflow and +-inf -> +-max, for every float8 format (as onnx.reference,
//                   ml_dtypes and ONNX Runtime do; the Cast-19 table lists inf -> NaN for the fnuz
//                   formats, but no implementation does that).
//   saturate=false: overflow and +-inf -> +-inf (E5M2) or NaN (E4M3FN: 0x7F|sign; fnuz: 0x80).
//   NaN -> NaN whatever `saturate` is: E4M3FN and E5M2 give 0x7F|sign (ONNX Runtime's code;
//   ml_dtypes gives 0x7E|sign for E5M2, also a NaN), the fnuz formats 0x80.
//   -0 -> 0x80 for E4M3FN/E5M2; the fnuz formats have no -0, so -0 and negative values that round
//   to zero give 0x00.
// to_float16: overflow -> inf (IEEE); NaN -> quiet NaN keeping sign and top payload bits (as F16C).
float16 to_float16(float v);
bfloat16 to_bfloat16(float v);  // RNE as onnx.reference and PyTorch; every NaN -> 0x7FC0 as they do
float8_e4m3fn to_float8_e4m3fn(float v, bool saturate = true);
float8_e5m2 to_float8_e5m2(float v, bool saturate = true);
float8_e4m3fnuz to_float8_e4m3fnuz(float v, bool saturate = true);
float8_e5m2fnuz to_float8_e5m2fnuz(float v, bool saturate = true);

// format -> float: exact (every code of these formats is a float). NaN codes give a quiet NaN with
// the code's sign (the fnuz NaN 0x80 gives +NaN); a float16 signalling NaN is quieted as F16C does,
// bfloat16 codes are shifted unchanged (as onnx.reference does).
float to_float(float16 v);
float to_float(bfloat16 v);
float to_float(float8_e4m3fn v);
float to_float(float8_e5m2 v);
float to_float(float8_e4m3fnuz v);
float to_float(float8_e5m2fnuz v);
// to_float of every float8_e4m3fn code (256 values, indexed by the bits): for loops decoding many.
const float* float8_e4m3fn_values();

// to_float(to_float8_e4m3fn(v, saturate)) computed in float without branches per element, so loops
// over it vectorise (QuantizeLinear to float8 stores the rounded values as floats): 3 mantissa bits
// rounded to nearest even from 2^-6 up, multiples of 2^-9 below; beyond 448 (and +-inf) +-448 when
// saturating, else NaN; NaN stays NaN. Signs as the codes' (NaN with the input's sign).
inline float round_to_float8_e4m3fn(float v, bool saturate) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(v);
  const std::uint32_t sign = x & 0x80000000u, a = x & 0x7fffffffu;
  // Normal targets: round the float's mantissa to 3 bits, ties to even (no wrap: a <= 0x7f800000).
  const std::uint32_t normal = (a + 0x7ffffu + ((a >> 20) & 1u)) & 0xfff00000u;
  // Subnormal targets (|v| < 2^-6): multiples of 2^-9, ties to even (the scaling is exact).
  const float sub = __builtin_nearbyintf(std::bit_cast<float>(a) * 512.0f) * (1.0f / 512.0f);
  std::uint32_t r = a < 0x3c800000u ? std::bit_cast<std::uint32_t>(sub) : normal;
  constexpr std::uint32_t kMax = 0x43e00000u;  // 448
  constexpr std::uint32_t kNaN = 0x7fc00000u;
  const std::uint32_t over = saturate ? kMax : kNaN;
  r = a > 0x7f800000u ? kNaN : (r > kMax ? over : r);
  return std::bit_cast<float>(r | sign);
}

// Round-trip helpers used to emulate a precision in float32 storage:
float round_to_float16(float v);   // to_float(to_float16(v))
float round_to_bfloat16(float v);  // to_float(to_bfloat16(v))
// Bulk versions, in place (the executor calls these on whole tensors). round_to_float16 uses F16C
// (AVX-512 or AVX width) when compiled with it; results are bit-identical to the portable path.
void round_to_float16(float* data, std::size_t n);
void round_to_bfloat16(float* data, std::size_t n);
// The portable (integer-only) bulk path, exposed so tests and benchmarks can compare it with the
// F16C one. `float16_bulk_uses_f16c` says which one round_to_float16(float*, n) runs.
void round_to_float16_portable(float* data, std::size_t n);
bool float16_bulk_uses_f16c();
// out[i] = the float16 code of x[i] for every i when each x[i] is exactly a float16 value (returns
// true: widening the codes gives back x's bits); false as soon as one is not (out then partly
// written).
bool narrow_to_float16_exact(const float* x, std::uint16_t* out, std::size_t n);
// out[i] = the float value of float16 code h[i] (exact; F16C where compiled with it).
void widen_float16(const std::uint16_t* h, float* out, std::size_t n);

// int8/uint8 quantize, as ONNX QuantizeLinear:
// q = saturate(round_half_even(x / scale) + zero_point).
// x / scale is a float division (not a multiplication by 1/scale: ONNX Runtime and onnx.reference
// divide, and the two differ in the last bit), rounded with std::nearbyint under the default
// rounding mode. NaN input (implementation-defined in ONNX) gives saturate(zero_point).
// quantize_to<T> is the same for any integer type T of at most 16 bits (int16/uint16 are
// QuantizeLinear-21 outputs); inline so bulk loops over tensors vectorise.
template <class T>
inline T quantize_to(float x, float scale, std::int32_t zero_point) {
  static_assert(std::is_integral_v<T> && sizeof(T) <= 2, "8- and 16-bit integer targets only");
  // In float, branch-free (the loop over a tensor vectorises): r + zero_point is exact while
  // |r| < 2^24, and beyond that both saturate the same way (|zero_point| < 2^17); infinities
  // saturate; NaN becomes the zero point (saturated like any value).
  float q = std::nearbyint(x / scale) + float(zero_point);
  q = q == q ? q : float(zero_point);
  q = q > float(std::numeric_limits<T>::max()) ? float(std::numeric_limits<T>::max()) : q;
  q = q < float(std::numeric_limits<T>::lowest()) ? float(std::numeric_limits<T>::lowest()) : q;
  return static_cast<T>(q);
}
std::int8_t quantize_int8(float x, float scale, std::int32_t zero_point = 0);
std::uint8_t quantize_uint8(float x, float scale, std::int32_t zero_point = 0);
// DequantizeLinear: (q - zero_point) * scale, in float.
inline float dequantize(std::int32_t q, float scale, std::int32_t zero_point) { return float(q - zero_point) * scale; }

}  // namespace qeval
