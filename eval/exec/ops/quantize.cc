// Quantization ops: QuantizeLinear / DequantizeLinear (opsets 10-22: per-tensor, per-axis and
// blocked scales; int8/uint8/int16/uint16 and float8 types) and NVIDIA ModelOpt's
// trt::TRT_FP8QuantizeLinear / TRT_FP8DequantizeLinear.
#include <cmath>
#include <cstring>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "eval/exec/onnx_import.h"
#include "eval/exec/ops/families.h"
#include "eval/exec/ops/quant_common.h"
#include "kernels/numeric.h"
#include "kernels/quantize_block.h"

namespace qeval::eval {

namespace {

// Calls f(elem_offset, count, scale_offset, scale_step) over contiguous runs of x whose scales are
// scale[scale_offset + i * scale_step] (step 0: one scale for the run), in parallel when large.
template <class F>
void for_each_run(const QuantLayout& l, F&& f) {
  constexpr std::int64_t kGrain = std::int64_t(1) << 15;
  if (l.kind == QuantLayout::Kind::kPerTensor) {
    const std::int64_t n = l.numel();
    const std::int64_t chunks = (n + kGrain - 1) / kGrain;
    auto body = [&](std::int64_t c0, std::int64_t c1) {
      for (std::int64_t c = c0; c < c1; ++c) f(c * kGrain, std::min(kGrain, n - c * kGrain), 0, 0);
    };
    if (chunks <= 2) body(0, chunks);
    else
      tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, chunks),
                        [&](const tbb::blocked_range<std::int64_t>& r) { body(r.begin(), r.end()); });
    return;
  }
  const std::int64_t rows = l.outer * l.axis_dim;
  auto body = [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t o = r / l.axis_dim, a = r % l.axis_dim;
      if (l.kind == QuantLayout::Kind::kPerAxis) f(r * l.inner, l.inner, a, 0);
      else f(r * l.inner, l.inner, (o * l.scale_axis_dim + a / l.block) * l.inner, 1);
    }
  };
  if (l.numel() < 4 * kGrain) {
    body(0, rows);
    return;
  }
  const std::int64_t grain = std::max<std::int64_t>(1, kGrain / std::max<std::int64_t>(1, l.inner));
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, rows, std::size_t(grain)),
                    [&](const tbb::blocked_range<std::int64_t>& r) { body(r.begin(), r.end()); });
}

// x / scale rounded to a float8 format (ONNX QuantizeLinear-19 and Cast semantics).
float to_fp8_value(float v, DType fmt, bool saturate) {
  switch (fmt) {
    case DType::kFloat8E4M3FN: return to_float(to_float8_e4m3fn(v, saturate));
    case DType::kFloat8E5M2: return to_float(to_float8_e5m2(v, saturate));
    case DType::kFloat8E4M3FNUZ: return to_float(to_float8_e4m3fnuz(v, saturate));
    case DType::kFloat8E5M2FNUZ: return to_float(to_float8_e5m2fnuz(v, saturate));
    default: throw std::logic_error("to_fp8_value: not a float8 type");
  }
}

// Which ONNX form a node is: the standard ops, or ModelOpt's trt-domain FP8 ops (no zero point,
// the E4M3FN code carried in a uint8 tensor).
enum class Flavor { kOnnx, kTrtFp8 };

// ---- QuantizeLinear ---------------------------------------------------------------------------

class QuantizeLinearOp final : public Op {
 public:
  QuantizeLinearOp(const Node& node, Flavor flavor)
      : node_(node), flavor_(flavor), attrs_(read_quant_attributes(node, flavor == Flavor::kTrtFp8)) {
    saturate_ = flavor == Flavor::kTrtFp8 || node.opset < 19 || node.get_int("saturate", 1) != 0;
    if (node.opset >= 21 && flavor == Flavor::kOnnx && node.get_int("output_dtype", 0) != 0) {
      const std::int64_t code = node.get_int("output_dtype", 0);
      output_dtype_ = quant_type_from_onnx(node, code, "output_dtype");
    }
  }

  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 2 || !in[0] || !in[1]) fail(node_, "needs inputs x and y_scale");
    if (flavor_ == Flavor::kTrtFp8 && in.size() > 2 && in[2])
      fail(node_, "takes two inputs (x, scale); got a zero point '" + node_.inputs[2] + "'");
    const ValueMeta& x = *in[0];
    const bool x_ok = x.dtype == DType::kFloat32 || x.dtype == DType::kInt32;
    if (!x_ok ||
        (node_.opset < 19 && flavor_ == Flavor::kOnnx && x.declared != DType::kFloat32 && x.declared != DType::kInt32))
      fail(node_, "input x '" + node_.inputs[0] + "' has type " + type_name(x.declared) + "; QuantizeLinear-" +
                      std::to_string(node_.opset) + " takes " +
                      (node_.opset < 19 ? "float or int32" : "float, float16, bfloat16 or int32"));
    check_scale_meta(node_, *in[1], 1);
    const ValueMeta* zp = in.size() > 2 ? in[2] : nullptr;
    const DType out = output_type(zp);
    if (zp) check_zero_point_meta(node_, *zp, 2, *in[1]);
    resolve_layout(node_, attrs_, x.shape, 0, in[1]->shape, 1);
    if (in[1]->value) check_scale_values(node_, 1, *in[1]->value, false);
    if (zp && zp->value) zero_point_values(node_, 2, *zp->value, zp->declared);
    if (flavor_ == Flavor::kTrtFp8) return {meta_of(DType::kUInt8, x.shape)};
    return {meta_of(out, x.shape)};
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    const Tensor& scale = *in[1];
    const Tensor* zp_t = in.size() > 2 ? in[2] : nullptr;
    const QuantLayout l = resolve_layout(node_, attrs_, x.shape(), 0, scale.shape(), 1);
    check_scale_values(node_, 1, scale, false);
    const float* s = scale.data<float>();
    Tensor& y = *out[0];
    if (flavor_ == Flavor::kTrtFp8) {
      std::uint8_t* dst = y.data<std::uint8_t>();
      const float* src = x.data<float>();
      for_each_run(l, [&](std::int64_t off, std::int64_t n, std::int64_t so, std::int64_t step) {
        for (std::int64_t i = 0; i < n; ++i)
          dst[off + i] = to_float8_e4m3fn(src[off + i] / s[so + i * step], true).bits;
      });
      return;
    }
    const DType out_type = zp_t ? zero_point_declared_ : output_type(nullptr);
    std::vector<std::int32_t> zps;
    if (zp_t) zps = zero_point_values(node_, 2, *zp_t, out_type);
    const std::int32_t* zp = zps.empty() ? nullptr : zps.data();
    if (is_float8(out_type)) {
      // Zero points of float8 outputs are 0 (checked): y = fp8(x / scale).
      float* dst = y.data<float>();
      visit_x(x, [&](const auto* src) {
        for_each_run(l, [&](std::int64_t off, std::int64_t n, std::int64_t so, std::int64_t step) {
          if (out_type == DType::kFloat8E4M3FN) {  // the common FP8 format: a loop that vectorises
            for (std::int64_t i = 0; i < n; ++i)
              dst[off + i] = round_to_float8_e4m3fn(float(src[off + i]) / s[so + i * step], saturate_);
            return;
          }
          for (std::int64_t i = 0; i < n; ++i)
            dst[off + i] = to_fp8_value(float(src[off + i]) / s[so + i * step], out_type, saturate_);
        });
      });
      return;
    }
    visit_storage(y.dtype(), [&](auto otag) {
      using O = decltype(otag);
      if constexpr (std::is_integral_v<O> && sizeof(O) <= 2 && !std::is_same_v<O, bool>) {
        O* dst = y.data<O>();
        visit_x(x, [&](const auto* src) {
          using X = std::remove_cv_t<std::remove_pointer_t<decltype(src)>>;
          for_each_run(l, [&](std::int64_t off, std::int64_t n, std::int64_t so, std::int64_t step) {
            if constexpr (std::is_same_v<X, float>) {
              if (step == 0) {
                // One scale and zero point for the run: a vector loop (kernels::quantize_block for
                // 8-bit outputs, the same bytes as quantize_to), else one the compiler vectorises.
                const float sc = s[so];
                const std::int32_t z = zp ? zp[so] : 0;
                const float* __restrict xs = src + off;
                O* __restrict ys = dst + off;
                if constexpr (sizeof(O) == 1) kernels::quantize_block(xs, ys, n, sc, z);
                else
                  for (std::int64_t i = 0; i < n; ++i) ys[i] = quantize_to<O>(xs[i], sc, z);
                return;
              }
            }
            for (std::int64_t i = 0; i < n; ++i) {
              const float sc = s[so + i * step];
              const std::int32_t z = zp ? zp[so + i * step] : 0;
              if constexpr (std::is_same_v<X, std::int32_t>) {
                // onnx.reference divides int32 inputs in double (numpy's int32 / float32).
                const double r = std::nearbyint(double(src[off + i]) / double(sc)) + z;
                dst[off + i] =
                    O(std::clamp(r, double(std::numeric_limits<O>::lowest()), double(std::numeric_limits<O>::max())));
              } else {
                dst[off + i] = quantize_to<O>(src[off + i], sc, z);
              }
            }
          });
        });
      } else {
        throw std::logic_error("QuantizeLinear: unexpected output storage type");
      }
    });
  }

 private:
  template <class F>
  static void visit_x(const Tensor& x, F&& f) {
    if (x.dtype() == DType::kInt32) f(x.data<std::int32_t>());
    else f(x.data<float>());
  }

  DType output_type(const ValueMeta* zp) const {
    if (flavor_ == Flavor::kTrtFp8) return DType::kFloat8E4M3FN;
    if (zp) {
      zero_point_declared_ = zp->declared;
      if (output_dtype_ && *output_dtype_ != zp->declared)
        fail(node_, "output_dtype " + type_name(*output_dtype_) + " differs from the type of y_zero_point '" +
                        node_.inputs[2] + "' (" + type_name(zp->declared) + ")");
      check_quant_type(node_, zp->declared, 2, false);
      return zp->declared;
    }
    return output_dtype_.value_or(DType::kUInt8);
  }

  Node node_;
  Flavor flavor_;
  QuantAttributes attrs_;
  bool saturate_ = true;
  std::optional<DType> output_dtype_;
  // The zero point's declared type (float8 zero points are stored as float32): a property of the
  // graph, the same for every plan.
  mutable DType zero_point_declared_ = DType::kUInt8;
};

// ---- DequantizeLinear -------------------------------------------------------------------------

class DequantizeLinearOp final : public Op {
 public:
  DequantizeLinearOp(const Node& node, Flavor flavor)
      : node_(node), flavor_(flavor), attrs_(read_quant_attributes(node, flavor == Flavor::kTrtFp8)) {}

  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 2 || !in[0] || !in[1]) fail(node_, "needs inputs x and x_scale");
    const ValueMeta& x = *in[0];
    if (flavor_ == Flavor::kTrtFp8) {
      if (in.size() > 2 && in[2])
        fail(node_, "takes two inputs (x, scale); got a zero point '" + node_.inputs[2] + "'");
      if (x.declared != DType::kUInt8)
        fail(node_, "input x '" + node_.inputs[0] + "' must be uint8 (E4M3FN codes), got " + type_name(x.declared));
    } else {
      check_quant_type(node_, x.declared, 0, true);
    }
    check_scale_meta(node_, *in[1], 1);
    const ValueMeta* zp = in.size() > 2 ? in[2] : nullptr;
    if (zp) {
      if (zp->declared != x.declared)
        fail(node_, "x_zero_point '" + node_.inputs[2] + "' has type " + type_name(zp->declared) + ", x '" +
                        node_.inputs[0] + "' has " + type_name(x.declared) + " (they must match)");
      check_zero_point_meta(node_, *zp, 2, *in[1]);
      zero_point_declared_ = zp->declared;
    }
    resolve_layout(node_, attrs_, x.shape, 0, in[1]->shape, 1);
    // A zero scale is harmless here (it gives 0) and DynamicQuantizeLinear produces one for an
    // all-zero tensor only at run time; a constant zero scale is still a broken graph.
    if (in[1]->value) check_scale_values(node_, 1, *in[1]->value, false);
    if (zp && zp->value) zero_point_values(node_, 2, *zp->value, zp->declared);
    // Output type: the scale's (float16 scales give float16 outputs from opset 19).
    return {meta_of(in[1]->declared, x.shape)};
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    const Tensor& scale = *in[1];
    const Tensor* zp_t = in.size() > 2 ? in[2] : nullptr;
    const QuantLayout l = resolve_layout(node_, attrs_, x.shape(), 0, scale.shape(), 1);
    check_scale_values(node_, 1, scale, true);
    const float* s = scale.data<float>();
    float* dst = out[0]->data<float>();
    if (flavor_ == Flavor::kTrtFp8) {
      const std::uint8_t* src = x.data<std::uint8_t>();
      const float* values = float8_e4m3fn_values();
      for_each_run(l, [&](std::int64_t off, std::int64_t n, std::int64_t so, std::int64_t step) {
        for (std::int64_t i = 0; i < n; ++i) dst[off + i] = values[src[off + i]] * s[so + i * step];
      });
      return;
    }
    std::vector<std::int32_t> zps;
    if (zp_t) zps = zero_point_values(node_, 2, *zp_t, zero_point_declared_);
    const std::int32_t* zp = zps.empty() ? nullptr : zps.data();
    if (x.dtype() == DType::kFloat32) {
      // float8 values (stored as float32; zero point 0, checked).
      const float* src = x.data<float>();
      for_each_run(l, [&](std::int64_t off, std::int64_t n, std::int64_t so, std::int64_t step) {
        for (std::int64_t i = 0; i < n; ++i) dst[off + i] = src[off + i] * s[so + i * step];
      });
      return;
    }
    visit_storage(x.dtype(), [&](auto xtag) {
      using X = decltype(xtag);
      if constexpr (std::is_integral_v<X> && sizeof(X) <= 4 && !std::is_same_v<X, bool> &&
                    !std::is_same_v<X, std::uint32_t>) {
        const X* src = x.data<X>();
        for_each_run(l, [&](std::int64_t off, std::int64_t n, std::int64_t so, std::int64_t step) {
          for (std::int64_t i = 0; i < n; ++i) {
            const std::int32_t z = zp ? zp[so + i * step] : 0;
            dst[off + i] = dequantize(std::int32_t(src[off + i]), s[so + i * step], z);
          }
        });
      } else {
        throw std::logic_error("DequantizeLinear: unexpected input storage type");
      }
    });
  }

 private:
  Node node_;
  Flavor flavor_;
  QuantAttributes attrs_;
  mutable DType zero_point_declared_ = DType::kUInt8;  // set by infer (float8 is stored as float32)
};

}  // namespace

void register_quantize_ops(std::vector<OpSchema>& out) {
  auto q = [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<QuantizeLinearOp>(n, Flavor::kOnnx); };
  auto dq = [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<DequantizeLinearOp>(n, Flavor::kOnnx); };
  auto trt_q = [](const Node& n) -> std::unique_ptr<Op> {
    return std::make_unique<QuantizeLinearOp>(n, Flavor::kTrtFp8);
  };
  auto trt_dq = [](const Node& n) -> std::unique_ptr<Op> {
    return std::make_unique<DequantizeLinearOp>(n, Flavor::kTrtFp8);
  };
  // 10: per-tensor; 13: axis; 19: float8, saturate, float16/bfloat16 scales; 21: block_size,
  // output_dtype, 16-bit types. One class reads the attributes each opset defines.
  out.push_back({"QuantizeLinear", "", 10, kMaxOpset, q});
  out.push_back({"DequantizeLinear", "", 10, kMaxOpset, dq});
  // ModelOpt's FP8 export (modelopt/torch/quantization/export_onnx.py): scale = amax / 448,
  // y = E4M3FN(x / scale) saturating, carried as its uint8 code; DQ gives code * scale.
  out.push_back({"TRT_FP8QuantizeLinear", "trt", 1, 1000, trt_q});
  out.push_back({"TRT_FP8DequantizeLinear", "trt", 1, 1000, trt_dq});
}

}  // namespace qeval::eval
