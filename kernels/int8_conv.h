// int8 convolution (NCHW, 1 to 3 spatial dimensions) with exact int32 accumulation: im2col into
// the int8 GEMM (weights packed once), a direct path for depthwise convolutions, and the naive
// definition for tests.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/conv.h"
#include "kernels/int8_gemm.h"

namespace qeval::kernels {

// Conv weights [out_channels, in_channels / groups, kernel...] packed once per group as the A
// operand of the int8 GEMM; keeps each output channel's weight sum.
class PackedInt8ConvWeights {
 public:
  PackedInt8ConvWeights(const ConvParams& p, const std::int8_t* w);
  std::int64_t groups() const { return std::int64_t(groups_.size()); }
  const PackedInt8A& group(std::int64_t g) const { return groups_[std::size_t(g)]; }
  // Sum of output channel oc's weights.
  std::int32_t channel_sum(std::int64_t oc) const { return sums_[std::size_t(oc)]; }
  const std::int32_t* channel_sums() const { return sums_.data(); }
  // One input channel per group and fewer than 16 filters on it: int8_depthwise_conv.
  bool depthwise() const { return depthwise_; }
  const std::int8_t* raw() const { return raw_.data(); }  // kept for the depthwise path

 private:
  std::vector<PackedInt8A> groups_;
  std::vector<std::int32_t> sums_;
  std::vector<std::int8_t> raw_;
  bool depthwise_ = false;
};

// im2col (and the packed x of a 1x1 conv) is built a block of output positions at a time, each
// block's GEMM run before the next is packed: the lent B matrix holds at most about this many
// bytes (plus its column sums) whatever the image size. A 1024x1024 model's largest im2col was
// 302 MB whole.
inline constexpr std::int64_t kInt8ConvBlockBytes = std::int64_t(4) << 20;
// The columns (output positions) of one block for a K of k, out of `columns`: whole multiples of 256
// (the GEMM's column block), at least 256.
std::int64_t int8_conv_block_columns(std::int64_t k, std::int64_t columns);
// Where there are enough blocks for every thread (or one thread), a block is instead small enough
// to stay in L2 from its packing to its GEMM, both done by one task: at most about this many bytes
// (at least one 32-column panel), whole panels of kInt8NR columns.
inline constexpr std::int64_t kInt8ConvCacheBlockBytes = std::int64_t(448) << 10;
std::int64_t int8_conv_cache_block_columns(std::int64_t k, std::int64_t columns);

// y[b, oc, out...] = sum over the receptive field of x * w, exactly in int32. Positions in the
// padding read `pad_value` (a quantized tensor's zero point, so that padding means real 0).
// window_sums, when not null, receives [batch, groups, out positions]: the sum of the x values
// (padding included) each output position reads, for weight zero-point corrections.
// scratch, when not null, holds a block of the im2col matrix or packed x (reused across calls; one caller at a
// time); null: one lent by this thread (kernels/scratch.h).
void int8_conv(const ConvParams& p, const std::int8_t* x, std::int8_t pad_value, const PackedInt8ConvWeights& w,
               std::int32_t* y, std::int32_t* window_sums = nullptr, Int8GemmPath path = int8_gemm_best_path(),
               PackedInt8B* scratch = nullptr);
// The same convolution with the int8 GEMM's dequantizing epilogue (kernels/int8_gemm.h) applied to
// every sum; its row terms are indexed by output channel. y holds int32 sums until they are final.
void int8_conv(const ConvParams& p, const std::int8_t* x, std::int8_t pad_value, const PackedInt8ConvWeights& w,
               float* y, const Int8Epilogue& e, Int8GemmPath path = int8_gemm_best_path(),
               PackedInt8B* scratch = nullptr);
// The definition, single-threaded (w unpacked).
void int8_conv_reference(const ConvParams& p, const std::int8_t* x, std::int8_t pad_value, const std::int8_t* w,
                         std::int32_t* y);

}  // namespace qeval::kernels
