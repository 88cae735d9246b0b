// Shared rules of the quantization ops (Q/DQ, QLinear*, *Integer) and the Q/DQ fusion pass: how a
// scale maps onto a tensor (per-tensor, per-axis, blocked) and the checks on scales and zero points.
#pragma once

#include <cstdint>
#include <vector>

#include "eval/exec/ops/op.h"

namespace qeval::eval {

bool is_float8(DType t);

// axis / block_size as the node declares them (axis from opset 13, block_size from opset 21).
struct QuantAttributes {
  std::int64_t axis = 1;
  std::int64_t block_size = 0;
  bool per_tensor_only = false;  // opset 10: no axis attribute, scales must be scalars
};
// `custom`: a non-ONNX-domain op (trt), whose attributes do not depend on the ai.onnx opset.
QuantAttributes read_quant_attributes(const Node& node, bool custom = false);

// x viewed as [outer, axis_dim, inner]; scales are one (per-tensor), one per axis slice
// (per-axis), or one per `block` consecutive slices of each [outer, ., inner] line (blocked:
// scale shape = x shape with dim `axis` = scale_axis_dim = ceil(axis_dim / block)).
struct QuantLayout {
  enum class Kind { kPerTensor, kPerAxis, kBlocked } kind = Kind::kPerTensor;
  std::int64_t outer = 1, axis_dim = 1, inner = 1;
  std::int64_t block = 1, scale_axis_dim = 1;
  std::int64_t numel() const { return outer * axis_dim * inner; }
};

// The layout of a scale of shape `scale` for an input of shape `x` (inputs x_index and
// scale_index of the node, for messages). InputError naming the node and tensors on an axis out of
// range or a scale shape that fits none of the forms.
QuantLayout resolve_layout(const Node& node, const QuantAttributes& attrs, const Shape& x, std::size_t x_index,
                           const Shape& scale, std::size_t scale_index);

// The scale input is a float type (float32; float16/bfloat16 from opset 19).
void check_scale_meta(const Node& node, const ValueMeta& scale, std::size_t index);
// Every scale is finite and nonzero (zero allowed with allow_zero); InputError naming the tensor,
// the element and its value.
void check_scale_values(const Node& node, std::size_t index, const Tensor& scale, bool allow_zero);
// The type is one the node's opset quantizes to (dequantize: also int32).
void check_quant_type(const Node& node, DType t, std::size_t index, bool dequantize);
// An ONNX type code of an attribute (output_dtype) that must be a quantized type.
DType quant_type_from_onnx(const Node& node, std::int64_t code, const char* what);
// A zero point has the scale's shape (one element for per-tensor either way).
void check_zero_point_meta(const Node& node, const ValueMeta& zp, std::size_t index, const ValueMeta& scale);
// Zero points as int32 (empty for float8 zero points, which must be 0: TensorRT's convention;
// ONNX Runtime and onnx.reference ignore them). InputError for values outside what the type allows
// (a nonzero int32 zero point, a NaN float8 one).
std::vector<std::int32_t> zero_point_values(const Node& node, std::size_t index, const Tensor& zp, DType declared);

}  // namespace qeval::eval
