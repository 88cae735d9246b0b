// Small-float conversions and int8/uint8 quantization: exhaustive and randomised bit-exact checks.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/numeric.h"

namespace qeval {
namespace {

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }
float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---- An independent description of each format, from the published bit layouts. ----

enum class Specials {
  kIeee,  // exponent all ones: inf (mantissa 0) or NaN
  kFn,    // only exponent and mantissa all ones is NaN; no inf
  kFnuz,  // only the code 1000...0 is NaN; no inf, no -0
};

struct Format {
  const char* name;
  int total_bits, exp_bits, mant_bits, bias;
  Specials specials;
  std::uint32_t max_code;  // largest finite positive code
  // Conversions under test; float16/bfloat16 ignore `saturate` (they always overflow to inf).
  std::function<std::uint32_t(float, bool)> encode;
  std::function<float(std::uint32_t)> decode;

  std::uint32_t sign_bit() const { return 1u << (total_bits - 1); }
  std::uint32_t code_count() const { return 1u << total_bits; }
  bool is_fp8() const { return total_bits == 8; }
};

std::vector<Format> all_formats() {
  return {
      {"float16", 16, 5, 10, 15, Specials::kIeee, 0x7bff,
       [](float v, bool) { return std::uint32_t(to_float16(v).bits); },
       [](std::uint32_t c) { return to_float(float16{std::uint16_t(c)}); }},
      {"bfloat16", 16, 8, 7, 127, Specials::kIeee, 0x7f7f,
       [](float v, bool) { return std::uint32_t(to_bfloat16(v).bits); },
       [](std::uint32_t c) { return to_float(bfloat16{std::uint16_t(c)}); }},
      {"float8_e4m3fn", 8, 4, 3, 7, Specials::kFn, 0x7e,
       [](float v, bool s) { return std::uint32_t(to_float8_e4m3fn(v, s).bits); },
       [](std::uint32_t c) { return to_float(float8_e4m3fn{std::uint8_t(c)}); }},
      {"float8_e5m2", 8, 5, 2, 15, Specials::kIeee, 0x7b,
       [](float v, bool s) { return std::uint32_t(to_float8_e5m2(v, s).bits); },
       [](std::uint32_t c) { return to_float(float8_e5m2{std::uint8_t(c)}); }},
      {"float8_e4m3fnuz", 8, 4, 3, 8, Specials::kFnuz, 0x7f,
       [](float v, bool s) { return std::uint32_t(to_float8_e4m3fnuz(v, s).bits); },
       [](std::uint32_t c) { return to_float(float8_e4m3fnuz{std::uint8_t(c)}); }},
      {"float8_e5m2fnuz", 8, 5, 2, 16, Specials::kFnuz, 0x7f,
       [](float v, bool s) { return std::uint32_t(to_float8_e5m2fnuz(v, s).bits); },
       [](std::uint32_t c) { return to_float(float8_e5m2fnuz{std::uint8_t(c)}); }},
  };
}

// Magnitude of a positive code read as a plain number, ignoring the special codes. Used for the
// virtual code max_code + 1 too (the value the format would have if it had one more code).
double ref_magnitude(const Format& f, std::uint32_t code) {
  const std::uint32_t exp = code >> f.mant_bits;  // callers pass codes without the sign bit
  const std::uint32_t mant = code & ((1u << f.mant_bits) - 1);
  if (exp == 0) return std::ldexp(double(mant), 1 - f.bias - f.mant_bits);
  return std::ldexp(double((1u << f.mant_bits) + mant), int(exp) - f.bias - f.mant_bits);
}

struct RefValue {
  enum Class { kNumber, kInf, kNaN } cls;
  double value;  // signed; -0.0 for negative zero
  bool negative;
};

RefValue ref_decode(const Format& f, std::uint32_t code) {
  const bool negative = (code & f.sign_bit()) != 0;
  const std::uint32_t mag = code & (f.sign_bit() - 1);
  const std::uint32_t exp = mag >> f.mant_bits;
  const std::uint32_t mant = mag & ((1u << f.mant_bits) - 1);
  const std::uint32_t exp_ones = (1u << f.exp_bits) - 1, mant_ones = (1u << f.mant_bits) - 1;
  switch (f.specials) {
    case Specials::kIeee:
      if (exp == exp_ones) return {mant == 0 ? RefValue::kInf : RefValue::kNaN, 0, negative};
      break;
    case Specials::kFn:
      if (exp == exp_ones && mant == mant_ones) return {RefValue::kNaN, 0, negative};
      break;
    case Specials::kFnuz:
      if (code == f.sign_bit()) return {RefValue::kNaN, 0, negative};
      break;
  }
  const double m = ref_magnitude(f, mag);
  return {RefValue::kNumber, negative ? -m : m, negative};
}

// The code of +-(positive code c); the fnuz formats have no -0.
std::uint32_t with_sign(const Format& f, std::uint32_t c, bool negative) {
  if (!negative) return c;
  if (f.specials == Specials::kFnuz && c == 0) return 0;
  return c | f.sign_bit();
}

// What an overflowing (or infinite) input must give.
std::uint32_t overflow_code(const Format& f, bool negative, bool saturate) {
  if (!f.is_fp8()) return with_sign(f, f.max_code + 1, negative);  // inf: exponent all ones
  if (saturate) return with_sign(f, f.max_code, negative);
  switch (f.specials) {
    case Specials::kIeee: return with_sign(f, 0x7c, negative);  // E5M2 inf
    case Specials::kFn: return with_sign(f, 0x7f, negative);    // E4M3FN NaN
    case Specials::kFnuz: return 0x80;                          // the one NaN
  }
  return 0;
}

// The code a NaN input must give: ONNX Runtime's choice for E4M3FN/E5M2 (0x7F with the sign),
// 0x80 for fnuz, F16C's for float16 (quiet, top payload bits kept), onnx.reference's for bfloat16.
std::uint32_t nan_code(const Format& f, std::uint32_t float_bits) {
  const bool negative = (float_bits >> 31) != 0;
  if (std::string(f.name) == "float16") return (negative ? 0x8000u : 0u) | 0x7e00u | ((float_bits >> 13) & 0x3ffu);
  if (std::string(f.name) == "bfloat16") return 0x7fc0;
  if (f.specials == Specials::kFnuz) return 0x80;
  return with_sign(f, 0x7f, negative);
}

// ---- Exhaustive decoding ----

TEST(NumericDecode, EveryCodeMatchesBitFieldFormula) {
  for (const Format& f : all_formats()) {
    SCOPED_TRACE(f.name);
    int numbers = 0, infs = 0, nans = 0;
    for (std::uint32_t c = 0; c < f.code_count(); ++c) {
      const RefValue ref = ref_decode(f, c);
      const float got = f.decode(c);
      switch (ref.cls) {
        case RefValue::kNaN:
          ++nans;
          ASSERT_TRUE(std::isnan(got)) << "code " << c;
          // NaN keeps the code's sign, except the sign-less fnuz NaN which decodes to +NaN.
          if (f.specials != Specials::kFnuz) {
            ASSERT_EQ(std::signbit(got), ref.negative) << "code " << c;
          }
          break;
        case RefValue::kInf:
          ++infs;
          ASSERT_TRUE(std::isinf(got)) << "code " << c;
          ASSERT_EQ(std::signbit(got), ref.negative) << "code " << c;
          break;
        case RefValue::kNumber:
          ++numbers;
          ASSERT_EQ(double(got), ref.value) << "code " << c;
          ASSERT_EQ(std::signbit(got), ref.negative) << "code " << c;  // -0 stays -0
          break;
      }
    }
    // Class sizes straight from the format definitions.
    const int mant_codes = 1 << f.mant_bits;
    if (f.specials == Specials::kIeee) {
      EXPECT_EQ(infs, 2);
      EXPECT_EQ(nans, 2 * (mant_codes - 1));
    } else {
      EXPECT_EQ(infs, 0);
      EXPECT_EQ(nans, f.specials == Specials::kFn ? 2 : 1);
    }
    EXPECT_EQ(numbers + infs + nans, int(f.code_count()));
  }
}

// Anchors from the format documents, so a bias or width transcribed wrongly in both the code and
// the reference above cannot pass.
TEST(NumericDecode, DocumentedAnchors) {
  EXPECT_EQ(to_float(float16{0x7bff}), 65504.0f);
  EXPECT_EQ(to_float(float16{0x0001}), std::ldexp(1.0f, -24));
  EXPECT_EQ(to_float(float16{0x0400}), std::ldexp(1.0f, -14));
  EXPECT_EQ(to_float(float16{0x3c00}), 1.0f);
  EXPECT_EQ(to_float(float16{0xc000}), -2.0f);
  EXPECT_EQ(to_float(bfloat16{0x3f80}), 1.0f);
  EXPECT_EQ(to_float(bfloat16{0x7f7f}), from_bits(0x7f7f0000));
  EXPECT_EQ(to_float(bfloat16{0x0001}), from_bits(0x00010000));
  EXPECT_EQ(to_float(float8_e4m3fn{0x7e}), 448.0f);
  EXPECT_EQ(to_float(float8_e4m3fn{0xfe}), -448.0f);
  EXPECT_EQ(to_float(float8_e4m3fn{0x38}), 1.0f);
  EXPECT_EQ(to_float(float8_e4m3fn{0x01}), std::ldexp(1.0f, -9));
  EXPECT_EQ(to_float(float8_e4m3fn{0x08}), std::ldexp(1.0f, -6));
  EXPECT_EQ(to_float(float8_e5m2{0x7b}), 57344.0f);
  EXPECT_EQ(to_float(float8_e5m2{0x3c}), 1.0f);
  EXPECT_EQ(to_float(float8_e5m2{0x01}), std::ldexp(1.0f, -16));
  EXPECT_EQ(to_float(float8_e5m2{0x7c}), kInf);
  EXPECT_EQ(to_float(float8_e5m2{0xfc}), -kInf);
  EXPECT_EQ(to_float(float8_e4m3fnuz{0x7f}), 240.0f);
  EXPECT_EQ(to_float(float8_e4m3fnuz{0x40}), 1.0f);
  EXPECT_EQ(to_float(float8_e4m3fnuz{0x01}), std::ldexp(1.0f, -10));
  EXPECT_EQ(to_float(float8_e5m2fnuz{0x7f}), 57344.0f);
  EXPECT_EQ(to_float(float8_e5m2fnuz{0x40}), 1.0f);
  EXPECT_EQ(to_float(float8_e5m2fnuz{0x01}), std::ldexp(1.0f, -17));
  EXPECT_TRUE(std::isnan(to_float(float8_e4m3fnuz{0x80})));
  EXPECT_TRUE(std::isnan(to_float(float8_e5m2fnuz{0x80})));
  EXPECT_EQ(bits_of(to_float(float8_e4m3fn{0x80})), 0x80000000u);  // -0
  EXPECT_EQ(bits_of(to_float(float8_e5m2{0x80})), 0x80000000u);
  // A float16 signalling NaN comes back quiet with its payload (as VCVTPH2PS does).
  EXPECT_EQ(bits_of(to_float(float16{0x7c01})), 0x7fc02000u);
  EXPECT_EQ(bits_of(to_float(float16{0xfe00})), 0xffc00000u);
}

// ---- Round trip ----

TEST(NumericRoundTrip, EveryCodeSurvivesDecodeThenEncode) {
  for (const Format& f : all_formats()) {
    SCOPED_TRACE(f.name);
    for (std::uint32_t c = 0; c < f.code_count(); ++c) {
      const float v = f.decode(c);
      const RefValue ref = ref_decode(f, c);
      for (bool saturate : {true, false}) {
        const std::uint32_t back = f.encode(v, saturate);
        if (ref.cls == RefValue::kNaN) {
          // NaN canonicalisation: fp8 gives the format's NaN code, float16 quiets, bfloat16 0x7FC0.
          ASSERT_EQ(back, nan_code(f, bits_of(v))) << "code " << c;
          ASSERT_EQ(ref_decode(f, back).cls, RefValue::kNaN) << "code " << c;
        } else if (ref.cls == RefValue::kInf) {
          // E5M2 inf saturates to max under saturate=true (ONNX Cast-19); 16-bit formats keep it.
          ASSERT_EQ(back, f.is_fp8() ? overflow_code(f, ref.negative, saturate) : c) << c;
        } else {
          ASSERT_EQ(back, c) << "code " << c << " saturate " << saturate;
        }
      }
    }
  }
}

// ---- Encoding: ties, near-ties, overflow, underflow, specials ----

TEST(NumericEncode, MidpointsTieToEvenAndNeighboursRoundToNearest) {
  for (const Format& f : all_formats()) {
    SCOPED_TRACE(f.name);
    int checked = 0;
    // Pairs (lo, lo + 1) of adjacent positive codes, including (0, smallest subnormal), the
    // subnormal/normal boundary and (max, the virtual next code) where rounding up overflows.
    for (std::uint32_t lo = 0; lo <= f.max_code; ++lo) {
      const std::uint32_t hi = lo + 1;
      const double mid = (ref_magnitude(f, lo) + ref_magnitude(f, hi)) / 2;
      const float mid_f = float(mid);
      ASSERT_EQ(double(mid_f), mid) << "midpoint not a float, code " << lo;
      const std::uint32_t even = (lo & 1) == 0 ? lo : hi;
      const float above = std::nextafter(mid_f, kInf);
      const float below = std::nextafter(mid_f, 0.0f);
      for (bool negative : {false, true}) {
        const float s = negative ? -1.0f : 1.0f;
        for (bool saturate : {true, false}) {
          auto expect_code = [&](std::uint32_t c) {
            return c > f.max_code ? overflow_code(f, negative, saturate) : with_sign(f, c, negative);
          };
          ASSERT_EQ(f.encode(s * mid_f, saturate), expect_code(even)) << "tie after code " << lo;
          ASSERT_EQ(f.encode(s * above, saturate), expect_code(hi)) << "above tie, code " << lo;
          ASSERT_EQ(f.encode(s * below, saturate), expect_code(lo)) << "below tie, code " << lo;
          checked += 3;
        }
      }
    }
    EXPECT_EQ(checked, int(f.max_code + 1) * 12);
  }
}

TEST(NumericEncode, OverflowWithAndWithoutSaturation) {
  // E4M3FN: 464 is the tie between 448 and the missing 480 -> 448 (even). Past it: overflow.
  EXPECT_EQ(to_float8_e4m3fn(448.0f, false).bits, 0x7e);
  EXPECT_EQ(to_float8_e4m3fn(464.0f, false).bits, 0x7e);
  EXPECT_EQ(to_float8_e4m3fn(std::nextafter(464.0f, kInf), false).bits, 0x7f);
  EXPECT_EQ(to_float8_e4m3fn(std::nextafter(464.0f, kInf), true).bits, 0x7e);
  // 480 rounds to 480, which E4M3FN cannot hold: NaN (ONNX Runtime's Float8E4M3FN gives 448 for
  // [480, 496) even with saturate=false; onnx.reference/ml_dtypes and the Cast table give NaN).
  EXPECT_EQ(to_float8_e4m3fn(480.0f, false).bits, 0x7f);
  EXPECT_EQ(to_float8_e4m3fn(-480.0f, false).bits, 0xff);
  EXPECT_EQ(to_float8_e4m3fn(480.0f, true).bits, 0x7e);
  EXPECT_EQ(to_float8_e4m3fn(-1e30f, true).bits, 0xfe);
  EXPECT_EQ(to_float8_e4m3fn(std::numeric_limits<float>::max(), false).bits, 0x7f);
  EXPECT_EQ(to_float8_e4m3fn(kInf, true).bits, 0x7e);
  EXPECT_EQ(to_float8_e4m3fn(-kInf, true).bits, 0xfe);
  EXPECT_EQ(to_float8_e4m3fn(kInf, false).bits, 0x7f);
  EXPECT_EQ(to_float8_e4m3fn(-kInf, false).bits, 0xff);
  // E5M2: like float16, 61440 ties to the "even" 65536 = inf.
  EXPECT_EQ(to_float8_e5m2(57344.0f, false).bits, 0x7b);
  EXPECT_EQ(to_float8_e5m2(std::nextafter(61440.0f, 0.0f), false).bits, 0x7b);
  EXPECT_EQ(to_float8_e5m2(61440.0f, false).bits, 0x7c);
  EXPECT_EQ(to_float8_e5m2(-61440.0f, false).bits, 0xfc);
  EXPECT_EQ(to_float8_e5m2(61440.0f, true).bits, 0x7b);
  EXPECT_EQ(to_float8_e5m2(-1e30f, true).bits, 0xfb);
  EXPECT_EQ(to_float8_e5m2(kInf, true).bits, 0x7b);
  EXPECT_EQ(to_float8_e5m2(-kInf, true).bits, 0xfb);
  EXPECT_EQ(to_float8_e5m2(kInf, false).bits, 0x7c);
  EXPECT_EQ(to_float8_e5m2(-kInf, false).bits, 0xfc);
  // E4M3FNUZ: max 240, next would be 256, tie 248 -> 256 -> overflow.
  EXPECT_EQ(to_float8_e4m3fnuz(240.0f, false).bits, 0x7f);
  EXPECT_EQ(to_float8_e4m3fnuz(std::nextafter(248.0f, 0.0f), false).bits, 0x7f);
  EXPECT_EQ(to_float8_e4m3fnuz(248.0f, false).bits, 0x80);
  EXPECT_EQ(to_float8_e4m3fnuz(-248.0f, false).bits, 0x80);
  EXPECT_EQ(to_float8_e4m3fnuz(248.0f, true).bits, 0x7f);
  EXPECT_EQ(to_float8_e4m3fnuz(-248.0f, true).bits, 0xff);
  EXPECT_EQ(to_float8_e4m3fnuz(kInf, true).bits, 0x7f);
  EXPECT_EQ(to_float8_e4m3fnuz(-kInf, true).bits, 0xff);
  EXPECT_EQ(to_float8_e4m3fnuz(kInf, false).bits, 0x80);
  EXPECT_EQ(to_float8_e4m3fnuz(-kInf, false).bits, 0x80);
  // E5M2FNUZ: max 57344, tie 61440 -> overflow.
  EXPECT_EQ(to_float8_e5m2fnuz(57344.0f, false).bits, 0x7f);
  EXPECT_EQ(to_float8_e5m2fnuz(61440.0f, false).bits, 0x80);
  EXPECT_EQ(to_float8_e5m2fnuz(61440.0f, true).bits, 0x7f);
  EXPECT_EQ(to_float8_e5m2fnuz(-1e30f, true).bits, 0xff);
  EXPECT_EQ(to_float8_e5m2fnuz(-kInf, true).bits, 0xff);
  EXPECT_EQ(to_float8_e5m2fnuz(-kInf, false).bits, 0x80);
  // float16 and bfloat16 always overflow to inf (IEEE).
  EXPECT_EQ(to_float16(std::nextafter(65520.0f, 0.0f)).bits, 0x7bff);
  EXPECT_EQ(to_float16(65520.0f).bits, 0x7c00);
  EXPECT_EQ(to_float16(-65520.0f).bits, 0xfc00);
  EXPECT_EQ(to_float16(1e30f).bits, 0x7c00);
  EXPECT_EQ(to_float16(kInf).bits, 0x7c00);
  EXPECT_EQ(to_float16(-kInf).bits, 0xfc00);
  EXPECT_EQ(to_bfloat16(std::numeric_limits<float>::max()).bits, 0x7f80);
  EXPECT_EQ(to_bfloat16(-std::numeric_limits<float>::max()).bits, 0xff80);
  EXPECT_EQ(to_bfloat16(from_bits(0x7f7f7fff)).bits, 0x7f7f);
  EXPECT_EQ(to_bfloat16(kInf).bits, 0x7f80);
  EXPECT_EQ(to_bfloat16(-kInf).bits, 0xff80);
  EXPECT_TRUE(std::isinf(round_to_float16(70000.0f)));
  EXPECT_TRUE(std::isinf(round_to_bfloat16(std::numeric_limits<float>::max())));
}

TEST(NumericEncode, NaNInputsGiveNaNWhateverSaturate) {
  const std::uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u,
                                0x7fc02000u, 0x7fffffffu, 0xffbfffffu};
  for (const Format& f : all_formats()) {
    SCOPED_TRACE(f.name);
    for (std::uint32_t n : nans) {
      for (bool saturate : {true, false}) {
        const std::uint32_t got = f.encode(from_bits(n), saturate);
        EXPECT_EQ(got, nan_code(f, n)) << std::hex << n;
        EXPECT_EQ(ref_decode(f, got).cls, RefValue::kNaN) << std::hex << n;
      }
    }
  }
  // Spot values of the rule nan_code states.
  EXPECT_EQ(to_float16(from_bits(0x7f800001u)).bits, 0x7e00);  // signalling -> quiet
  EXPECT_EQ(to_float16(from_bits(0xffc00000u)).bits, 0xfe00);
  EXPECT_EQ(to_float16(from_bits(0x7fc02000u)).bits, 0x7e01);
  EXPECT_EQ(to_bfloat16(from_bits(0xffc00000u)).bits, 0x7fc0);
  EXPECT_EQ(to_float8_e4m3fn(-kNaN).bits, 0xff);
  EXPECT_EQ(to_float8_e5m2(kNaN).bits, 0x7f);
  EXPECT_EQ(to_float8_e4m3fnuz(-kNaN, false).bits, 0x80);
  EXPECT_EQ(to_float8_e5m2fnuz(kNaN).bits, 0x80);
  EXPECT_TRUE(std::isnan(round_to_float16(kNaN)));
  EXPECT_TRUE(std::isnan(round_to_bfloat16(kNaN)));
}

TEST(NumericEncode, TinyValuesUnderflowToSubnormalsAndSignedZero) {
  const float tiny_values[] = {1e-30f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                               0.0f};
  for (const Format& f : all_formats()) {
    SCOPED_TRACE(f.name);
    const double min_sub = ref_magnitude(f, 1);
    for (bool saturate : {true, false}) {
      for (bool negative : {false, true}) {
        const float s = negative ? -1.0f : 1.0f;
        auto enc = [&](double v) { return f.encode(s * float(v), saturate); };
        auto code = [&](std::uint32_t c) { return with_sign(f, c, negative); };
        EXPECT_EQ(enc(min_sub), code(1));
        EXPECT_EQ(enc(0.75 * min_sub), code(1));
        EXPECT_EQ(enc(0.5 * min_sub), code(0));  // tie -> 0 (even); sign kept where -0 exists
        EXPECT_EQ(enc(0.25 * min_sub), code(0));
        EXPECT_EQ(enc(1.5 * min_sub), code(2));  // tie between 1 and 2 -> 2
        EXPECT_EQ(enc(2.5 * min_sub), code(2));  // tie between 2 and 3 -> 2
        EXPECT_EQ(enc(3.5 * min_sub), code(4));
        for (float t : tiny_values) {
          if (std::string(f.name) == "bfloat16" && t != 0.0f && t >= min_sub / 2) continue;
          EXPECT_EQ(enc(t), code(0)) << t;
        }
      }
    }
  }
  // -0 explicitly: kept where the format has it, 0x00 for fnuz.
  EXPECT_EQ(to_float16(-0.0f).bits, 0x8000);
  EXPECT_EQ(to_bfloat16(-0.0f).bits, 0x8000);
  EXPECT_EQ(to_float8_e4m3fn(-0.0f).bits, 0x80);
  EXPECT_EQ(to_float8_e5m2(-0.0f).bits, 0x80);
  EXPECT_EQ(to_float8_e4m3fnuz(-0.0f).bits, 0x00);
  EXPECT_EQ(to_float8_e5m2fnuz(-1e-30f).bits, 0x00);
  EXPECT_EQ(bits_of(round_to_float16(-1e-30f)), 0x80000000u);
}

// ---- bfloat16 against add-and-truncate ----

std::uint16_t bfloat16_reference(std::uint32_t x) {
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // onnx.reference / PyTorch NaN
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

TEST(NumericBFloat16, MatchesAddAndTruncateOnRandomAndEdgeValues) {
  std::mt19937 rng(20240519);
  std::vector<float> values;
  std::uniform_int_distribution<std::uint32_t> any_bits;
  std::uniform_real_distribution<float> ordinary(-1000.0f, 1000.0f);
  for (int i = 0; i < (1 << 20); ++i) values.push_back(from_bits(any_bits(rng)));
  for (int i = 0; i < (1 << 20); ++i) values.push_back(ordinary(rng));
  // Edges: exact ties (low half 0x8000) with even and odd kept lsb, their neighbours, carries
  // into the exponent, the largest finite values, subnormals, zeros, infinities.
  const std::uint32_t edges[] = {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x3f7fffffu,
                                 0x3fff8000u, 0x7f7f7fffu, 0x7f7f8000u, 0x7f7fffffu, 0x00008000u,
                                 0x00018000u, 0x00000001u, 0x807fffffu, 0x00000000u, 0x80000000u,
                                 0x7f800000u, 0xff800000u, 0xbf808000u, 0xbf818000u};
  for (std::uint32_t e : edges) values.push_back(from_bits(e));
  std::vector<float> bulk = values;
  round_to_bfloat16(bulk.data(), bulk.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::uint32_t x = bits_of(values[i]);
    const std::uint16_t want = bfloat16_reference(x);
    ASSERT_EQ(to_bfloat16(values[i]).bits, want) << std::hex << x;
    ASSERT_EQ(bits_of(round_to_bfloat16(values[i])), std::uint32_t(want) << 16) << std::hex << x;
    ASSERT_EQ(bits_of(bulk[i]), std::uint32_t(want) << 16) << std::hex << x;
  }
  EXPECT_EQ(to_bfloat16(from_bits(0x3f808000u)).bits, 0x3f80);  // tie, even kept
  EXPECT_EQ(to_bfloat16(from_bits(0x3f818000u)).bits, 0x3f82);  // tie, odd -> up
  EXPECT_EQ(to_bfloat16(from_bits(0x3fff8000u)).bits, 0x4000);  // carry into the exponent
}

// ---- float16 encode is the nearest representable value ----

TEST(NumericFloat16, EncodeIsNearestRepresentableOnRandomFloats) {
  const Format f16 = all_formats()[0];
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  // Exponents that matter for float16 (below its subnormals to past its max), any mantissa.
  std::uniform_int_distribution<std::uint32_t> exponent(127 - 27, 127 + 17);
  std::vector<float> values;
  for (int i = 0; i < (1 << 20); ++i) {
    const std::uint32_t r = any_bits(rng);
    values.push_back(from_bits((r & 0x807fffffu) | (exponent(rng) << 23)));
  }
  for (int i = 0; i < (1 << 20); ++i) {
    const float v = from_bits(any_bits(rng));
    if (!std::isnan(v)) values.push_back(v);
  }
  ASSERT_GE(values.size(), std::size_t(2'000'000));
  for (float v : values) {
    const std::uint32_t h = to_float16(v).bits;
    const bool negative = std::signbit(v);
    ASSERT_EQ((h & 0x8000u) != 0, negative) << v;
    const std::uint32_t mag = h & 0x7fffu;
    const double a = std::fabs(double(v));
    if (a >= 65520.0) {  // the tie with 65536 and beyond: IEEE overflow
      ASSERT_EQ(mag, 0x7c00u) << v;
      continue;
    }
    ASSERT_LE(mag, f16.max_code) << v;
    const double d = std::fabs(a - ref_magnitude(f16, mag));
    auto check_neighbour = [&](std::uint32_t other) {
      const double d_other = std::fabs(a - ref_magnitude(f16, other));
      ASSERT_LE(d, d_other) << v << " coded " << mag << " but " << other << " is nearer";
      if (d == d_other) {
        ASSERT_EQ(mag & 1, 0u) << v << " tie went to an odd mantissa";
      }
    };
    if (mag > 0) check_neighbour(mag - 1);
    check_neighbour(mag + 1);  // max_code + 1 reads as the virtual 65536
  }
}

TEST(NumericFloat16, BulkF16cPathMatchesPortablePath) {
  std::vector<float> values;
  for (std::uint32_t c = 0; c < 0x10000u; ++c) values.push_back(to_float(float16{std::uint16_t(c)}));
  const Format f16 = all_formats()[0];
  for (std::uint32_t lo = 0; lo <= f16.max_code; ++lo) {
    const float mid = float((ref_magnitude(f16, lo) + ref_magnitude(f16, lo + 1)) / 2);
    for (float m : {mid, -mid}) {
      values.push_back(m);
      values.push_back(std::nextafter(m, kInf));
      values.push_back(std::nextafter(m, -kInf));
    }
  }
  std::mt19937 rng(99);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  for (int i = 0; i < (1 << 20); ++i) values.push_back(from_bits(any_bits(rng)));  // NaNs included
  for (std::uint32_t b : {0x7f800001u, 0xff800001u, 0x7fc02000u, 0x00000001u, 0x807fffffu})
    values.push_back(from_bits(b));

  std::vector<float> fast = values, portable = values;
  round_to_float16(fast.data(), fast.size());
  round_to_float16_portable(portable.data(), portable.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(bits_of(fast[i]), bits_of(portable[i])) << std::hex << bits_of(values[i]);
    ASSERT_EQ(bits_of(portable[i]), bits_of(round_to_float16(values[i]))) << std::hex << bits_of(values[i]);
  }
  // Lengths and misalignments that exercise the SIMD tails (masked or scalar).
  for (std::size_t offset = 0; offset < 3; ++offset) {
    for (std::size_t n = 0; n <= 70; ++n) {
      std::vector<float> a(values.begin() + 70000, values.begin() + 70000 + 80);
      std::vector<float> b = a;
      round_to_float16(a.data() + offset, n);
      for (std::size_t i = offset; i < offset + n; ++i) b[i] = round_to_float16(b[i]);
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "n " << n << " offset " << offset;
    }
  }
  RecordProperty("f16c", float16_bulk_uses_f16c() ? "yes" : "no");
}

// ---- ONNX conformance data (Debian's libonnx-testdata, when installed) ----

// The few TensorProto fields these tests need, read from the protobuf wire format directly so the
// test needs no ONNX or protobuf library: dims (1), data_type (2), float_data (4), int32_data (5),
// raw_data (9).
struct TensorData {
  int data_type = 0;
  std::vector<std::int64_t> dims;
  std::vector<float> float_data;
  std::vector<std::int32_t> int32_data;
  std::string raw;
};

bool read_varint(const std::uint8_t*& p, const std::uint8_t* end, std::uint64_t& v) {
  v = 0;
  for (int shift = 0; p < end && shift < 64; shift += 7) {
    const std::uint8_t byte = *p++;
    v |= std::uint64_t(byte & 0x7f) << shift;
    if (!(byte & 0x80)) return true;
  }
  return false;
}

TensorData read_tensor_proto(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto* p = reinterpret_cast<const std::uint8_t*>(bytes.data());
  const auto* end = p + bytes.size();
  TensorData t;
  auto fail = [&] { return std::runtime_error("malformed TensorProto " + path.string()); };
  while (p < end) {
    std::uint64_t key = 0, v = 0;
    if (!read_varint(p, end, key)) throw fail();
    const std::uint64_t field = key >> 3, wire = key & 7;
    if (wire == 0) {
      if (!read_varint(p, end, v)) throw fail();
      if (field == 1) t.dims.push_back(std::int64_t(v));
      if (field == 2) t.data_type = int(v);
      if (field == 5) t.int32_data.push_back(std::int32_t(v));
    } else if (wire == 2) {
      if (!read_varint(p, end, v) || v > std::uint64_t(end - p)) throw fail();
      const std::uint8_t* q = p;
      const std::uint8_t* q_end = p + v;
      p = q_end;
      if (field == 9) t.raw.assign(reinterpret_cast<const char*>(q), std::size_t(v));
      if (field == 4) {
        for (; q + 4 <= q_end; q += 4)
          t.float_data.push_back(from_bits(std::uint32_t(q[0]) | std::uint32_t(q[1]) << 8 | std::uint32_t(q[2]) << 16 |
                                           std::uint32_t(q[3]) << 24));
      }
      while ((field == 1 || field == 5) && q < q_end) {
        if (!read_varint(q, q_end, v)) throw fail();
        if (field == 1) t.dims.push_back(std::int64_t(v));
        else t.int32_data.push_back(std::int32_t(v));
      }
    } else if (wire == 5) {
      if (end - p < 4) throw fail();
      if (field == 4) {
        t.float_data.push_back(from_bits(std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 |
                                         std::uint32_t(p[3]) << 24));
      }
      p += 4;
    } else if (wire == 1) {
      if (end - p < 8) throw fail();
      p += 8;
    } else {
      throw fail();
    }
  }
  return t;
}

// Elements as raw bit patterns (float bits for FLOAT, 16-bit codes otherwise).
std::vector<std::uint32_t> tensor_bits(const TensorData& t) {
  // ONNX 1.12's bfloat16 cases store their codes as UINT16 (4), not BFLOAT16 (16).
  constexpr int kFloat = 1, kUInt16 = 4, kFloat16 = 10, kBFloat16 = 16;
  std::vector<std::uint32_t> out;
  const auto* r = reinterpret_cast<const std::uint8_t*>(t.raw.data());
  if (t.data_type == kFloat) {
    if (!t.raw.empty()) {
      for (std::size_t i = 0; i + 4 <= t.raw.size(); i += 4)
        out.push_back(std::uint32_t(r[i]) | std::uint32_t(r[i + 1]) << 8 | std::uint32_t(r[i + 2]) << 16 |
                      std::uint32_t(r[i + 3]) << 24);
    } else {
      for (float v : t.float_data) out.push_back(bits_of(v));
    }
  } else if (t.data_type == kFloat16 || t.data_type == kBFloat16 || t.data_type == kUInt16) {
    if (!t.raw.empty()) {
      for (std::size_t i = 0; i + 2 <= t.raw.size(); i += 2)
        out.push_back(std::uint32_t(r[i]) | std::uint32_t(r[i + 1]) << 8);
    } else {
      for (std::int32_t v : t.int32_data) out.push_back(std::uint32_t(v) & 0xffffu);
    }
  } else {
    throw std::runtime_error("unexpected data_type " + std::to_string(t.data_type));
  }
  std::int64_t numel = 1;
  for (std::int64_t d : t.dims) numel *= d;
  if (std::int64_t(out.size()) != numel) throw std::runtime_error("element count != dims");
  return out;
}

const std::filesystem::path kOnnxNodeTests = "/usr/share/libonnx-testdata/data/node";

// Input and expected output bits of an ONNX node test, or empty when it is not installed.
bool load_onnx_case(const std::string& name, std::vector<std::uint32_t>* in, std::vector<std::uint32_t>* out) {
  const auto dir = kOnnxNodeTests / name / "test_data_set_0";
  if (!std::filesystem::exists(dir / "input_0.pb")) return false;
  *in = tensor_bits(read_tensor_proto(dir / "input_0.pb"));
  *out = tensor_bits(read_tensor_proto(dir / "output_0.pb"));
  return !in->empty() && in->size() == out->size();
}

TEST(NumericOnnxConformance, CastFloatToFloat16) {
  std::vector<std::uint32_t> in, want;
  if (!load_onnx_case("test_cast_FLOAT_to_FLOAT16", &in, &want)) GTEST_SKIP() << "libonnx-testdata not installed";
  for (std::size_t i = 0; i < in.size(); ++i) EXPECT_EQ(to_float16(from_bits(in[i])).bits, want[i]) << "element " << i;
}

TEST(NumericOnnxConformance, CastFloat16ToFloat) {
  std::vector<std::uint32_t> in, want;
  if (!load_onnx_case("test_cast_FLOAT16_to_FLOAT", &in, &want)) GTEST_SKIP() << "libonnx-testdata not installed";
  for (std::size_t i = 0; i < in.size(); ++i) {
    const float got = to_float(float16{std::uint16_t(in[i])});
    if (std::isnan(from_bits(want[i]))) EXPECT_TRUE(std::isnan(got)) << "element " << i;
    else EXPECT_EQ(bits_of(got), want[i]) << "element " << i;
  }
}

TEST(NumericOnnxConformance, CastBFloat16ToFloat) {
  std::vector<std::uint32_t> in, want;
  if (!load_onnx_case("test_cast_BFLOAT16_to_FLOAT", &in, &want)) GTEST_SKIP() << "libonnx-testdata not installed";
  for (std::size_t i = 0; i < in.size(); ++i)
    EXPECT_EQ(bits_of(to_float(bfloat16{std::uint16_t(in[i])})), want[i]) << "element " << i;
}

TEST(NumericOnnxConformance, CastFloatToBFloat16) {
  std::vector<std::uint32_t> in, want;
  if (!load_onnx_case("test_cast_FLOAT_to_BFLOAT16", &in, &want)) GTEST_SKIP() << "libonnx-testdata not installed";
  // ONNX <= 1.13 generated this case by truncation (x >> 16); from 1.14 onnx.reference rounds to
  // nearest even, as we do. Each element must match one of the two rules, and ours must be RNE.
  int truncated = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::uint16_t got = to_bfloat16(from_bits(in[i])).bits;
    ASSERT_EQ(got, bfloat16_reference(in[i]));
    if (got != want[i]) {
      EXPECT_EQ(want[i], in[i] >> 16) << "element " << i << " is neither RNE nor truncation";
      ++truncated;
    }
  }
  RecordProperty("elements_expected_by_truncation", truncated);
}

// ---- int8 / uint8 QuantizeLinear ----

TEST(NumericQuantize, RoundsHalfToEven) {
  EXPECT_EQ(quantize_int8(2.5f, 1.0f), 2);
  EXPECT_EQ(quantize_int8(3.5f, 1.0f), 4);
  EXPECT_EQ(quantize_int8(-2.5f, 1.0f), -2);
  EXPECT_EQ(quantize_int8(-3.5f, 1.0f), -4);
  EXPECT_EQ(quantize_int8(0.5f, 1.0f), 0);
  EXPECT_EQ(quantize_int8(-0.5f, 1.0f), 0);
  EXPECT_EQ(quantize_int8(std::nextafter(2.5f, kInf), 1.0f), 3);
  EXPECT_EQ(quantize_int8(5.0f, 2.0f), 2);  // 5 / 2 = 2.5
  EXPECT_EQ(quantize_int8(7.0f, 2.0f), 4);  // 3.5
  EXPECT_EQ(quantize_uint8(2.5f, 1.0f), 2);
  EXPECT_EQ(quantize_uint8(3.5f, 1.0f), 4);
  EXPECT_EQ(quantize_uint8(-0.5f, 1.0f, 10), 10);
  // x / scale, not x * (1 / scale): here the quotient is exactly -115.5 (-> -116) while the
  // product with the reciprocal is -115.49999 (-> -115).
  EXPECT_EQ(quantize_int8(-0x1.d91688p-4f, 0x1.0624dep-10f), -116);
  EXPECT_EQ(quantize_int8(0x1.d91688p-4f, 0x1.0624dep-10f), 116);
  // And the other way: quotient -38.5 (-> -38), product -38.500004 (-> -39).
  EXPECT_EQ(quantize_int8(-0x1.d90258p-5f, 0x1.892684p-10f), -38);
}

TEST(NumericQuantize, SaturatesAndAppliesZeroPoint) {
  EXPECT_EQ(quantize_int8(1000.0f, 1.0f), 127);
  EXPECT_EQ(quantize_int8(-1000.0f, 1.0f), -128);
  EXPECT_EQ(quantize_int8(127.5f, 1.0f), 127);    // rounds to 128, saturates
  EXPECT_EQ(quantize_int8(-128.5f, 1.0f), -128);  // rounds to -128 (even)
  EXPECT_EQ(quantize_int8(-129.0f, 1.0f), -128);
  EXPECT_EQ(quantize_int8(kInf, 1.0f), 127);
  EXPECT_EQ(quantize_int8(-kInf, 1.0f), -128);
  EXPECT_EQ(quantize_int8(1e30f, 1e-30f), 127);  // quotient overflows float to inf
  EXPECT_EQ(quantize_int8(1.0f, 0.0f), 127);     // x / 0 = inf
  EXPECT_EQ(quantize_uint8(300.0f, 1.0f), 255);
  EXPECT_EQ(quantize_uint8(-3.0f, 1.0f), 0);
  EXPECT_EQ(quantize_uint8(kInf, 1.0f), 255);
  EXPECT_EQ(quantize_uint8(-kInf, 1.0f, 128), 0);
  // Zero points shift after rounding.
  EXPECT_EQ(quantize_int8(2.5f, 1.0f, 10), 12);
  EXPECT_EQ(quantize_int8(-2.5f, 1.0f, -10), -12);
  EXPECT_EQ(quantize_int8(100.0f, 1.0f, 50), 127);
  EXPECT_EQ(quantize_int8(-100.0f, 1.0f, -50), -128);
  EXPECT_EQ(quantize_uint8(-1.0f, 0.5f, 128), 126);
  EXPECT_EQ(quantize_uint8(250.0f, 1.0f, 10), 255);
  EXPECT_EQ(quantize_uint8(-20.0f, 1.0f, 10), 0);
  EXPECT_EQ(quantize_uint8(0.0f, 1.0f, 300), 255);  // zero point outside the range saturates
  // NaN: implementation-defined in ONNX; we give saturate(zero_point).
  EXPECT_EQ(quantize_int8(kNaN, 1.0f), 0);
  EXPECT_EQ(quantize_int8(kNaN, 1.0f, -7), -7);
  EXPECT_EQ(quantize_uint8(kNaN, 1.0f, 128), 128);
  EXPECT_EQ(quantize_uint8(kNaN, 1.0f, -5), 0);
  EXPECT_EQ(quantize_int8(0.0f, 0.0f, 3), 3);  // 0 / 0 = NaN
}

TEST(NumericQuantize, DequantizeInvertsQuantizeOnEveryCode) {
  for (float scale : {0.1f, 0.0173f, 1.0f / 127.0f, 3.0f}) {
    for (int q = -128; q <= 127; ++q) ASSERT_EQ(quantize_int8(dequantize(q, scale, 0), scale), q) << "scale " << scale;
    for (int zp : {0, 128, 255}) {
      for (int q = 0; q <= 255; ++q)
        ASSERT_EQ(quantize_uint8(dequantize(q, scale, zp), scale, zp), q) << "scale " << scale;
    }
  }
  EXPECT_EQ(dequantize(-128, 0.5f, 0), -64.0f);
  EXPECT_EQ(dequantize(255, 0.25f, 128), 31.75f);
  EXPECT_EQ(dequantize(0, 0.1f, 128), float(-128) * 0.1f);
}

TEST(NumericDecode, Float8E4M3FNValuesTableIsToFloatOfEveryCode) {
  const float* values = float8_e4m3fn_values();
  for (std::uint32_t c = 0; c < 256; ++c) {
    const float want = to_float(float8_e4m3fn{std::uint8_t(c)});
    EXPECT_EQ(std::bit_cast<std::uint32_t>(values[c]), std::bit_cast<std::uint32_t>(want)) << c;
  }
  EXPECT_EQ(values[0x7e], 448.0f);
  EXPECT_TRUE(std::isnan(values[0xff]));
}

TEST(NumericEncode, Float8E4M3FNRoundingInFloatEqualsEncodeThenDecode) {
  // Every 97th bit pattern, and every pattern around the subnormal/normal boundary (2^-6) and the
  // top of the range (448, its tie at 464, 480), both signs, saturating or not.
  auto check = [](std::uint32_t bits) {
    const float v = std::bit_cast<float>(bits);
    for (bool saturate : {true, false}) {
      const float want = to_float(to_float8_e4m3fn(v, saturate));
      const float got = round_to_float8_e4m3fn(v, saturate);
      if (std::bit_cast<std::uint32_t>(got) != std::bit_cast<std::uint32_t>(want)) {
        ADD_FAILURE() << std::hex << "bits 0x" << bits << " saturate " << saturate << ": got " << got << ", want "
                      << want;
        return false;
      }
    }
    return true;
  };
  for (std::uint64_t b = 0; b <= 0xffffffffu; b += 97)
    if (!check(std::uint32_t(b))) return;
  for (std::uint32_t sign : {0u, 0x80000000u}) {
    for (std::uint32_t b = 0x3c000000u; b <= 0x3d000000u; ++b)
      if (!check(sign | b)) return;
    for (std::uint32_t b = 0x43c00000u; b <= 0x44000000u; ++b)
      if (!check(sign | b)) return;
    for (std::uint32_t b : {0u, 1u, 0x7f7fffffu, 0x7f800000u, 0x7fc00000u, 0x7f800001u})
      if (!check(sign | b)) return;
  }
}

TEST(Numeric, NarrowToFloat16ExactRoundTripsOrRefuses) {
  std::vector<float> x = {0.0f, -0.0f, 1.0f, 65504.0f, 0x1p-24f, -3.5f, std::numeric_limits<float>::infinity()};
  for (int i = 0; i < 40; ++i) x.push_back(float(i) * 0.125f - 2.0f);  // past one 8-wide F16C step
  std::vector<std::uint16_t> h(x.size());
  ASSERT_TRUE(narrow_to_float16_exact(x.data(), h.data(), x.size()));
  std::vector<float> back(x.size());
  widen_float16(h.data(), back.data(), x.size());
  EXPECT_EQ(0, std::memcmp(x.data(), back.data(), x.size() * sizeof(float)));
  for (std::size_t at : {std::size_t(3), std::size_t(20), x.size() - 1}) {  // in a vector step and in the tail
    std::vector<float> y = x;
    y[at] = 1.0f + 0x1p-11f;  // between two float16 values
    EXPECT_FALSE(narrow_to_float16_exact(y.data(), h.data(), y.size())) << at;
    y[at] = 1e-8f;  // below float16's smallest subnormal
    EXPECT_FALSE(narrow_to_float16_exact(y.data(), h.data(), y.size())) << at;
  }
}

}  // namespace
}  // namespace qeval
