// Shape rules shared by the float ops and their quantized forms (ConvInteger, QLinearConv,
// MatMulInteger, QLinearMatMul, the fused Q/DQ ops): conv attributes and geometry, numpy matmul.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "eval/exec/ops/op.h"
#include "kernels/conv.h"

namespace qeval::eval {

enum class AutoPad { kNotSet, kValid, kSameUpper, kSameLower };

// Attributes shared by Conv and ConvTranspose, checked against the spatial rank.
struct ConvAttributes {
  AutoPad auto_pad = AutoPad::kNotSet;
  std::int64_t group = 1;
  std::vector<std::int64_t> kernel_shape, strides, dilations, pads;
};
ConvAttributes read_conv_attributes(const Node& node);

// Forward-conv geometry from the shapes of X [N, C, spatial...] and W [M, C / group, kernel...]
// (defaults applied, auto_pad resolved); InputError naming the node on inconsistent shapes.
kernels::ConvParams conv_forward_params(const Node& node, const ConvAttributes& a, const Shape& x, const Shape& w);

// Shapes of a numpy matmul: operands promoted to rank >= 2, batch dimensions broadcast.
struct MatMulPlan {
  Shape a, b;   // promoted operand shapes
  Shape batch;  // broadcast batch shape
  std::int64_t m, n, k;
  Shape out;  // the output shape (promoted dimensions removed)
};
MatMulPlan plan_matmul(const Node& node, const Shape& a_in, const Shape& b_in);
// For each entry of the broadcast batch, which A and B matrices it multiplies (indices in units of
// one m x k / k x n matrix).
std::vector<std::pair<std::int64_t, std::int64_t>> matmul_batch_operands(const MatMulPlan& p);

}  // namespace qeval::eval
