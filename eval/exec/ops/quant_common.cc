// Shared rules of the quantization ops: scale layouts and the checks on scales and zero points.
#include "eval/exec/ops/quant_common.h"

#include <cmath>

#include "eval/exec/onnx_import.h"

namespace qeval::eval {

namespace {

std::string input_name(const Node& node, std::size_t i) {
  static const char* const kQ[] = {"x", "y_scale", "y_zero_point"};
  static const char* const kDq[] = {"x", "x_scale", "x_zero_point"};
  const bool dq = node.op_type.find("Dequantize") != std::string::npos;
  std::string role = node.op_type.find("uantizeLinear") != std::string::npos && i < 3 ? (dq ? kDq : kQ)[i]
                                                                                      : "input " + std::to_string(i);
  return role + " '" + (i < node.inputs.size() ? node.inputs[i] : std::string()) + "'";
}

std::string float_text(float v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", double(v));
  return buf;
}

}  // namespace

bool is_float8(DType t) {
  return t == DType::kFloat8E4M3FN || t == DType::kFloat8E5M2 || t == DType::kFloat8E4M3FNUZ ||
         t == DType::kFloat8E5M2FNUZ;
}

QuantAttributes read_quant_attributes(const Node& node, bool custom) {
  QuantAttributes a;
  a.per_tensor_only = !custom && node.opset < 13;
  if (a.per_tensor_only && node.has("axis"))
    fail(node, "has an 'axis' attribute, which " + node.op_type + " only has from opset 13");
  a.axis = node.get_int("axis", 1);
  if (custom || node.opset >= 21) a.block_size = node.get_int("block_size", 0);
  else if (node.has("block_size"))
    fail(node, "has a 'block_size' attribute, which " + node.op_type + " only has from opset 21");
  if (a.block_size < 0) fail(node, "block_size must be >= 0, got " + std::to_string(a.block_size));
  return a;
}

QuantLayout resolve_layout(const Node& node, const QuantAttributes& attrs, const Shape& x, std::size_t x_index,
                           const Shape& scale, std::size_t scale_index) {
  QuantLayout l;
  const std::int64_t scale_numel = shape_numel(scale);
  l.inner = shape_numel(x);
  const bool one = scale_numel == 1 && scale.size() <= 1;
  if (attrs.block_size == 0 && one) return l;  // per-tensor
  if (attrs.per_tensor_only)
    fail(node, input_name(node, scale_index) + " has shape " + shape_to_string(scale) + "; " + node.op_type + "-" +
                   std::to_string(node.opset) + " takes a scalar scale (per-axis scales need opset 13)");
  const int rank = static_cast<int>(x.size());
  if (attrs.axis < -rank || attrs.axis >= rank)
    fail(node, "axis " + std::to_string(attrs.axis) + " is out of range for " + input_name(node, x_index) +
                   " of shape " + shape_to_string(x) + " (" + input_name(node, scale_index) + " has shape " +
                   shape_to_string(scale) + ")");
  const int axis = static_cast<int>(attrs.axis < 0 ? attrs.axis + rank : attrs.axis);
  l.outer = 1;
  for (int d = 0; d < axis; ++d) l.outer *= x[std::size_t(d)];
  l.axis_dim = x[std::size_t(axis)];
  l.inner = 1;
  for (int d = axis + 1; d < rank; ++d) l.inner *= x[std::size_t(d)];
  if (attrs.block_size == 0) {
    if (scale.size() != 1 || scale[0] != l.axis_dim)
      fail(node, input_name(node, scale_index) + " has shape " + shape_to_string(scale) + "; per-axis scales for " +
                     input_name(node, x_index) + " of shape " + shape_to_string(x) + " along axis " +
                     std::to_string(attrs.axis) + " must have shape [" + std::to_string(l.axis_dim) +
                     "] (or one element for per-tensor)");
    l.kind = QuantLayout::Kind::kPerAxis;
    return l;
  }
  l.kind = QuantLayout::Kind::kBlocked;
  l.block = attrs.block_size;
  l.scale_axis_dim = (l.axis_dim + l.block - 1) / l.block;
  Shape want = x;
  want[std::size_t(axis)] = l.scale_axis_dim;
  if (scale != want)
    fail(node, input_name(node, scale_index) + " has shape " + shape_to_string(scale) +
                   "; blocked scales (block_size " + std::to_string(l.block) + ", axis " + std::to_string(attrs.axis) +
                   ") for " + input_name(node, x_index) + " of shape " + shape_to_string(x) + " must have shape " +
                   shape_to_string(want));
  return l;
}

void check_scale_meta(const Node& node, const ValueMeta& scale, std::size_t index) {
  const DType t = scale.declared;
  const bool ok = t == DType::kFloat32 ||
                  ((t == DType::kFloat16 || t == DType::kBFloat16) && (node.opset >= 19 || !node.domain.empty()));
  if (!ok)
    fail(node, input_name(node, index) + " has type " + type_name(t) + "; scales are float" +
                   (node.opset >= 19 ? ", float16 or bfloat16" : ""));
}

void check_scale_values(const Node& node, std::size_t index, const Tensor& scale, bool allow_zero) {
  const float* s = scale.data<float>();
  for (std::int64_t i = 0; i < scale.numel(); ++i) {
    if (std::isfinite(s[i]) && (s[i] != 0 || allow_zero)) continue;
    fail(node, input_name(node, index) + (scale.numel() > 1 ? " element " + std::to_string(i) : std::string()) +
                   " is " + float_text(s[i]) + "; scales must be finite and nonzero");
  }
}

void check_quant_type(const Node& node, DType t, std::size_t index, bool dequantize) {
  bool ok = t == DType::kInt8 || t == DType::kUInt8 || (dequantize && t == DType::kInt32);
  if (node.opset >= 19) ok |= is_float8(t);
  if (node.opset >= 21) ok |= t == DType::kInt16 || t == DType::kUInt16;
  if (ok) return;
  std::string allowed = std::string("int8, uint8") + (dequantize ? ", int32" : "") +
                        (node.opset >= 19 ? ", float8 types" : "") + (node.opset >= 21 ? ", int16, uint16" : "");
  fail(node, input_name(node, index) + " has type " + type_name(t) + "; " + node.op_type + "-" +
                 std::to_string(node.opset) + " takes " + allowed);
}

DType quant_type_from_onnx(const Node& node, std::int64_t code, const char* what) {
  if (code == 21 || code == 22 || code == 23)
    throw UnsupportedError(node.describe() + ": " + what + " = " + std::to_string(code) +
                           " (a 4-bit type) is not supported");
  DType t;
  try {
    t = dtype_from_onnx(int(code), node.describe());
  } catch (const InputError&) {
    fail(node, std::string(what) + " = " + std::to_string(code) + " is not an ONNX element type");
  }
  check_quant_type(node, t, 0, false);
  return t;
}

void check_zero_point_meta(const Node& node, const ValueMeta& zp, std::size_t index, const ValueMeta& scale) {
  const bool both_one =
      shape_numel(zp.shape) == 1 && zp.shape.size() <= 1 && shape_numel(scale.shape) == 1 && scale.shape.size() <= 1;
  if (!both_one && zp.shape != scale.shape)
    fail(node, input_name(node, index) + " has shape " + shape_to_string(zp.shape) + ", the scale '" +
                   node.inputs[index - 1] + "' has " + shape_to_string(scale.shape) + " (they must match)");
}

std::vector<std::int32_t> zero_point_values(const Node& node, std::size_t index, const Tensor& zp, DType declared) {
  std::vector<std::int32_t> out;
  if (is_float8(declared)) {
    const float* v = zp.data<float>();
    for (std::int64_t i = 0; i < zp.numel(); ++i) {
      if (v[i] == 0) continue;
      if (!std::isfinite(v[i]))
        fail(node, input_name(node, index) + " element " + std::to_string(i) + " is " + float_text(v[i]) +
                       ", outside the range of a zero point");
      throw UnsupportedError(node.describe() + ": " + input_name(node, index) + " element " + std::to_string(i) +
                             " is " + float_text(v[i]) +
                             "; float8 zero points must be 0 (TensorRT's "
                             "convention; ONNX Runtime ignores them)");
    }
    return out;
  }
  out.resize(std::size_t(zp.numel()));
  visit_storage(zp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T> && sizeof(T) <= 4 && !std::is_same_v<T, bool> &&
                  !std::is_same_v<T, std::uint32_t>) {
      const T* v = zp.data<T>();
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = std::int32_t(v[i]);
    } else {
      fail(node, input_name(node, index) + " has type " + type_name(declared) + ", not a quantized integer type");
    }
  });
  if (declared == DType::kInt32)
    for (std::size_t i = 0; i < out.size(); ++i)
      if (out[i] != 0)
        fail(node, input_name(node, index) + " element " + std::to_string(i) + " is " + std::to_string(out[i]) +
                       ", outside the range allowed for int32 inputs (the zero point of int32 values must be 0)");
  return out;
}

}  // namespace qeval::eval
