// ONNX Runtime's arithmetic for its 8-bit QOperator ops (com.microsoft QLinearAdd, QLinearMul,
// QLinearGlobalAveragePool and the 256-entry lookup tables of QLinearSigmoid / QLinearLeakyRelu /
// QLinearConcat), written so qeval's values are ORT's bits: float ratios of the scales, round half
// to even, saturation. No ONNX here: plain arrays, scales and zero points.
#pragma once

#include <array>
#include <cstdint>
#include <functional>

namespace qeval::kernels {

// QLinearAdd, as MLAS's AVX2 kernel computes it: with ra = sa / sc, rb = sb / sc and
// fixed = zc - (ra * za + rb * zb) (all float), c = saturate(round(a * ra + (b * rb + fixed)))
// with each a * r + t one fused multiply-add. When one operand is a single value for the whole run
// (a broadcast span), MLAS folds it into the fixed part first (a product, then a sum, each rounded):
// the results differ in the last bit from the two-vector form, so the caller says which form runs.
struct QLinearAddParams {
  float ratio_a = 1, ratio_b = 1, fixed = 0;
};
QLinearAddParams qlinear_add_params(float sa, std::int32_t za, float sb, std::int32_t zb, float sc, std::int32_t zc);
// y[i] = a[i * a_step] + b[i * b_step], steps 0 (one value for the run) or 1.
void qlinear_add(const std::uint8_t* a, std::int64_t a_step, const std::uint8_t* b, std::int64_t b_step,
                 std::uint8_t* y, std::int64_t n, const QLinearAddParams& p);
void qlinear_add(const std::int8_t* a, std::int64_t a_step, const std::int8_t* b, std::int64_t b_step, std::int8_t* y,
                 std::int64_t n, const QLinearAddParams& p);

// QLinearMul, as MLAS computes it: the exact integer product (a - za)(b - zb) as float, times
// (sa * sb) / sc, plus zc, rounded half to even, saturated.
void qlinear_mul(const std::uint8_t* a, std::int64_t a_step, std::int32_t za, const std::uint8_t* b,
                 std::int64_t b_step, std::int32_t zb, float ratio, std::int32_t zc, std::uint8_t* y, std::int64_t n);
void qlinear_mul(const std::int8_t* a, std::int64_t a_step, std::int32_t za, const std::int8_t* b, std::int64_t b_step,
                 std::int32_t zb, float ratio, std::int32_t zc, std::int8_t* y, std::int64_t n);

// QLinearGlobalAveragePool of one plane of `size` values: the exact int32 sum less zx * size, as
// float, times sx / (sy * size), rounded half to even, plus zy, saturated (MLAS's requantization).
std::uint8_t qlinear_average(const std::uint8_t* x, std::int64_t size, std::int32_t zx, float sx, float sy,
                             std::int32_t zy);
std::int8_t qlinear_average(const std::int8_t* x, std::int64_t size, std::int32_t zx, float sx, float sy,
                            std::int32_t zy);

// A 256-entry table of an 8-bit op with one input (ORT's QlinearBuildLookupTable): entry v holds
// quantize(f(sx * (v - zx)), sy, zy), v the code's value in T (0..255 for uint8, -128..127 for
// int8, indexed by the code's byte). f works on float.
template <class T>
std::array<T, 256> qlinear_lookup_table(float sx, std::int32_t zx, float sy, std::int32_t zy,
                                        const std::function<float(float)>& f);
// y[i] = table[byte of x[i]].
template <class T>
void qlinear_lookup(const T* x, const std::array<T, 256>& table, T* y, std::int64_t n);

// QLinearSoftmax, as ONNX Runtime computes it (its zero point of x plays no part: softmax is
// shift-invariant): table[code] = float(exp((i - 255 + shift) * x_scale)) with i the code's rank
// (0..255: uint8 codes, int8 codes + 128) and shift = max(0, ln(FLT_MAX / reduce_len) - 5) / x_scale
// so that sums of `reduce_len` entries stay finite.
std::array<float, 256> qlinear_softmax_table(float x_scale, std::int64_t reduce_len, bool is_signed);
// One softmax vector of n codes (x[i * stride]): the largest is aligned with the table's top, the
// float sum of the entries taken in order, y = round_half_even(entry * floor(1 / y_scale) / sum)
// + zy, saturated above (ORT's uint8 path; its int8 path wraps values past 255, kept as it is).
void qlinear_softmax(const std::uint8_t* x, std::int64_t stride, std::int64_t n, const std::array<float, 256>& table,
                     float y_scale, std::int32_t zy, std::uint8_t* y);
void qlinear_softmax(const std::int8_t* x, std::int64_t stride, std::int64_t n, const std::array<float, 256>& table,
                     float y_scale, std::int32_t zy, std::int8_t* y);

// QLinearAveragePool of one 2-D plane x [h, w] into y [out_h, out_w], as ORT's kernel: codes
// dequantized to float (sx * (x - zx)), the window's values summed in float in row-major order
// (padding contributes nothing), divided by the window's size (the kernel's with
// count_include_pad, else the part inside the input), then round_half_even(v / sy + zy) saturated.
struct QLinearPoolWindow {
  std::int64_t h = 0, w = 0, out_h = 0, out_w = 0;
  std::int64_t kernel[2] = {1, 1}, stride[2] = {1, 1}, pad_begin[2] = {0, 0};
  bool count_include_pad = false;
};
void qlinear_average_pool_2d(const std::uint8_t* x, const QLinearPoolWindow& p, float sx, std::int32_t zx, float sy,
                             std::int32_t zy, std::uint8_t* y);
void qlinear_average_pool_2d(const std::int8_t* x, const QLinearPoolWindow& p, float sx, std::int32_t zx, float sy,
                             std::int32_t zy, std::int8_t* y);

}  // namespace qeval::kernels
