// Convolution kernels (NCHW, 1 to 3 spatial dimensions): im2col packed straight into GEMM panels,
// a depthwise direct path, ConvTranspose via GEMM + col2im, and naive references for tests.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/gemm.h"

namespace qeval::kernels {

// Geometry of a convolution over `in_spatial.size()` (1 to 3) spatial dimensions. Every spatial
// vector has that many entries; pads are split into begin/end. For conv, out_spatial must equal
// conv_output_spatial(); for conv_transpose it is the caller's (output_shape / output_padding), and
// output positions no input reaches get only the bias.
struct ConvParams {
  std::int64_t batch = 1;
  std::int64_t in_channels = 0;
  std::int64_t out_channels = 0;
  std::int64_t groups = 1;
  std::vector<std::int64_t> in_spatial, kernel, strides, dilations, pads_begin, pads_end, out_spatial;
};

// The geometry with leading spatial dimensions padded to three (size 1, kernel 1, stride 1, no
// pad), so one set of loops serves 1-D, 2-D and 3-D (the float and int8 convolutions use it).
struct ConvGeometry3 {
  std::int64_t in[3], k[3], s[3], d[3], pb[3], out[3];
  std::int64_t in_size() const { return in[0] * in[1] * in[2]; }
  std::int64_t out_size() const { return out[0] * out[1] * out[2]; }
  std::int64_t k_size() const { return k[0] * k[1] * k[2]; }
};
ConvGeometry3 conv_geometry3(const ConvParams& p);

// floor((in + pad_begin + pad_end - dilation * (kernel - 1) - 1) / stride) + 1 per dimension.
std::vector<std::int64_t> conv_output_spatial(const ConvParams& p);
// stride * (in - 1) + dilation * (kernel - 1) + 1 - pad_begin - pad_end (before output_padding).
std::vector<std::int64_t> conv_transpose_output_spatial(const ConvParams& p);

// Element counts. Conv weights are [out_channels, in_channels / groups, kernel...]; ConvTranspose
// weights are [in_channels, out_channels / groups, kernel...] (the ONNX layouts).
std::int64_t conv_input_size(const ConvParams& p);
std::int64_t conv_output_size(const ConvParams& p);
std::int64_t conv_weight_size(const ConvParams& p);
std::int64_t conv_transpose_weight_size(const ConvParams& p);
// Multiply-adds times two, for GFLOP/s figures.
double conv_flops(const ConvParams& p);

// Conv or ConvTranspose weights packed for the GEMM path once (constant weights): one PackedA per
// group. Empty where the geometry takes a path without packing (depthwise).
struct PackedConvWeights {
  std::vector<PackedA> groups;
};
// Packs what conv(p, ...) would pack on each call. Only the channel counts, groups and kernel size
// of p matter: the result serves any batch and spatial size.
// `storage`: PackedA's (float16 panels where the weights are all exact in float16).
PackedConvWeights pack_conv_weights(const ConvParams& p, const float* w, PanelStorage storage = PanelStorage::kFloat);
PackedConvWeights pack_conv_transpose_weights(const ConvParams& p, const float* w,
                                              PanelStorage storage = PanelStorage::kFloat);

// A conv's padded input larger than this (2-D and 1-D convs) is padded and multiplied a band of
// output rows at a time: the lent padded buffer stays about this size whatever the image.
inline constexpr std::int64_t kConvPaddedBandBytes = std::int64_t(8) << 20;

// Temporaries of conv / conv_transpose calls (the padded input, ConvTranspose's columns), reused
// between calls so that they fault in no fresh pages. One call at a time.
struct ConvScratch {
  AlignedFloats data;
  std::size_t size = 0;
  float* get(std::size_t n);
  std::size_t capacity_bytes() const { return size * sizeof(float); }
};

// y = conv(x, w) + bias (bias may be null). x, w, y dense NC... row-major; y is fully written.
// `packed` (from pack_conv_weights for these weights, or null) saves the packing; same results.
// `scratch` (or null: one lent by this thread, kernels/scratch.h) holds temporaries.
// Throws std::invalid_argument on inconsistent parameters. Results do not depend on the thread count.
void conv(const ConvParams& p, const float* x, const float* w, const float* bias, float* y,
          const PackedConvWeights* packed = nullptr, ConvScratch* scratch = nullptr);
// Direct definition, single-threaded; accumulates each output over (input channel, kernel offsets)
// in order, padded positions contributing zero products.
void conv_reference(const ConvParams& p, const float* x, const float* w, const float* bias, float* y);

// y = conv_transpose(x, w) + bias; x is [batch, in_channels, in_spatial...], y [batch, out_channels,
// out_spatial...].
void conv_transpose(const ConvParams& p, const float* x, const float* w, const float* bias, float* y,
                    const PackedConvWeights* packed = nullptr, ConvScratch* scratch = nullptr);
void conv_transpose_reference(const ConvParams& p, const float* x, const float* w, const float* bias, float* y);

}  // namespace qeval::kernels
