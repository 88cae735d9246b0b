// The op families (one file each in eval/exec/ops/); each appends its schemas to the registry.
#pragma once

#include <vector>

#include "eval/exec/ops/op.h"

namespace qeval::eval {

using RegisterOps = void (*)(std::vector<OpSchema>&);

void register_elementwise_ops(std::vector<OpSchema>& out);    // elementwise.cc
void register_shape_ops(std::vector<OpSchema>& out);          // shape_ops.cc: Reshape family, Shape, Range
void register_layout_ops(std::vector<OpSchema>& out);         // layout_ops.cc: Transpose, Concat, Split, Pad
void register_index_ops(std::vector<OpSchema>& out);          // index_ops.cc: Slice, Gather
void register_cast_ops(std::vector<OpSchema>& out);           // cast_ops.cc: Cast, CastLike
void register_cumsum_topk_ops(std::vector<OpSchema>& out);    // cumsum_topk.cc
void register_reduce_ops(std::vector<OpSchema>& out);         // reduce.cc: Reduce*, ArgMax/ArgMin
void register_matmul_ops(std::vector<OpSchema>& out);         // matmul.cc: MatMul, Gemm, Einsum
void register_conv_ops(std::vector<OpSchema>& out);           // conv.cc: Conv, ConvTranspose
void register_normalization_ops(std::vector<OpSchema>& out);  // normalization.cc
void register_softmax_ops(std::vector<OpSchema>& out);        // softmax.cc: Softmax, LogSoftmax
void register_pool_ops(std::vector<OpSchema>& out);           // pool.cc
void register_resize_ops(std::vector<OpSchema>& out);         // resize.cc
void register_quantize_ops(std::vector<OpSchema>& out);       // quantize.cc: QuantizeLinear, DequantizeLinear
void register_qlinear_ops(std::vector<OpSchema>& out);        // qlinear.cc: QLinear*, *Integer, fused Q/DQ ops

void register_qlinear_contrib_ops(std::vector<OpSchema>& out);  // qlinear_contrib.cc: com.microsoft QLinear*

inline constexpr RegisterOps kOpFamilies[] = {
    register_elementwise_ops, register_shape_ops,         register_layout_ops,  register_index_ops,
    register_cast_ops,        register_cumsum_topk_ops,   register_reduce_ops,  register_matmul_ops,
    register_conv_ops,        register_normalization_ops, register_softmax_ops, register_pool_ops,
    register_resize_ops,      register_quantize_ops,      register_qlinear_ops, register_qlinear_contrib_ops,
};

}  // namespace qeval::eval
