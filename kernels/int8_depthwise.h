// int8 convolutions with one input channel per group (depthwise; fewer than 16 filters per
// channel): direct loops along output rows with exact int32 sums, an AVX-512 VNNI/VBMI kernel and
// a portable one, both tested against int8_conv_reference.
#pragma once

#include <cstdint>

#include "kernels/conv.h"
#include "kernels/int8_gemm.h"

namespace qeval::kernels {

// Whether int8_conv runs p through int8_depthwise_conv: one input channel per group and fewer
// than 16 filters reading it (as the float conv decides; more filters amortise im2col + GEMM).
bool int8_conv_is_depthwise(const ConvParams& p);

// Whether this build has the vector kernel (AVX-512 VNNI + VBMI). Geometries it cannot take
// (a row of 16 outputs' taps wider than 64 bytes) run the portable kernel whatever `vector` says.
bool int8_depthwise_vector_available();

// y[b, oc, out...] = sum over the window of x * w exactly in int32; padding reads pad_value.
// w is [out_channels, kernel...] (one input channel per group), channel_sums[oc] the sum of oc's
// weights. window_sums (or null): [batch, groups, out positions], the sum of the x values each
// output position reads, padding included. Parallel over (plane, row block); integer sums make
// the result independent of the split and of `vector`.
// e, when not null: each output row is finished into floats while in L1, as int8_epilogue over
// the int32 sums of one batch item would ([out_channels, out positions]: row terms by output channel,
// column terms by output position); y then holds floats.
void int8_depthwise_conv(const ConvParams& p, const std::int8_t* x, std::int8_t pad_value, const std::int8_t* w,
                         const std::int32_t* channel_sums, std::int32_t* y, std::int32_t* window_sums, bool vector,
                         const Int8Epilogue* e = nullptr);

}  // namespace qeval::kernels
