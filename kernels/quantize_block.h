// QuantizeLinear over a block of floats with one scale and zero point (per-tensor int8/uint8): the
// bytes of quantize_to<T> (kernels/numeric.h) element by element, in AVX-512 where the build has it.
#pragma once

#include <cstdint>

namespace qeval::kernels {

// y[i] = quantize_to<T>(x[i], scale, zero_point) for i < n: saturate(round_half_even(x / scale) +
// zero_point), NaN -> saturate(zero_point); a float division, as ONNX QuantizeLinear.
void quantize_block(const float* x, std::int8_t* y, std::int64_t n, float scale, std::int32_t zero_point);
void quantize_block(const float* x, std::uint8_t* y, std::int64_t n, float scale, std::int32_t zero_point);

}  // namespace qeval::kernels
