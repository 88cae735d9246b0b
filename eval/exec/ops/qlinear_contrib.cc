// ONNX Runtime's 8-bit QOperator ops of domain com.microsoft (what its graph optimizer makes of a
// Q/DQ graph at level 'extended'): QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu,
// QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat, QLinearSoftmax (QGemm is in
// qlinear.cc, beside the int8 GEMM). Inputs and outputs are uint8 or int8 with per-tensor scales and
// zero points; the arithmetic is ORT's CPU kernels' (kernels/qlinear_elementwise.h).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "eval/exec/ops/families.h"
#include "eval/exec/ops/quant_common.h"
#include "eval/exec/ops/tensor_common.h"
#include "kernels/broadcast.h"
#include "kernels/elementwise.h"
#include "kernels/qlinear_elementwise.h"

namespace qeval::eval {

namespace {

constexpr std::string_view kMsDomain = "com.microsoft";

bool is_8bit(DType t) { return t == DType::kInt8 || t == DType::kUInt8; }

// A quantized operand x (input `data`) with its scale (input `scale`) and optional zero point
// (input `zero_point`, may be past the inputs): x is 8-bit, the scale one float, the zero point one
// value of x's type. InputError naming the node and the tensor otherwise.
void check_quantized(const Node& node, std::span<const ValueMeta* const> in, std::size_t data, std::size_t scale,
                     std::size_t zero_point, DType type) {
  if (in.size() <= scale || !in[scale]) fail(node, "input " + std::to_string(scale) + " (a scale) is missing");
  check_scale_meta(node, *in[scale], scale);
  auto one_value = [&](std::size_t i, const char* what) {
    if (shape_numel(in[i]->shape) != 1 || in[i]->shape.size() > 1)
      fail(node, std::string(what) + " '" + node.inputs[i] + "' has shape " + shape_to_string(in[i]->shape) +
                     "; one value expected (per-tensor quantization)");
  };
  one_value(scale, "scale");
  if (in[scale]->value) check_scale_values(node, scale, *in[scale]->value, false);
  if (zero_point < in.size() && in[zero_point]) {
    one_value(zero_point, "zero point");
    if (in[zero_point]->declared != type)
      fail(node, "zero point '" + node.inputs[zero_point] + "' has type " + type_name(in[zero_point]->declared) + "; " +
                     type_name(type) + " expected" +
                     (data < in.size() ? " (the type of '" + node.inputs[data] + "')" : std::string()));
  }
}

void require_8bit(const Node& node, const ValueMeta* m, std::size_t i) {
  if (!m) fail(node, "input " + std::to_string(i) + " is missing");
  if (!is_8bit(m->declared))
    fail(node, "input '" + node.inputs[i] + "' has type " + type_name(m->declared) + "; uint8 or int8 expected");
}

struct QParams {
  float scale = 1;
  std::int32_t zero_point = 0;
};
QParams read_params(const Node& node, std::span<const Tensor* const> in, std::size_t scale, std::size_t zero_point) {
  check_scale_values(node, scale, *in[scale], false);
  QParams p;
  p.scale = in[scale]->data<float>()[0];
  if (zero_point < in.size() && in[zero_point])
    p.zero_point = zero_point_values(node, zero_point, *in[zero_point], in[zero_point]->dtype())[0];
  return p;
}

template <class F>
void visit_8bit(DType t, F&& f) {
  if (t == DType::kUInt8) f(std::uint8_t{});
  else f(std::int8_t{});
}

// ---- QLinearAdd / QLinearMul ---------------------------------------------------------------------

// Inputs A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point (zero points
// optional), numpy broadcasting of A and B.
class QLinearBinaryOp final : public Op {
 public:
  QLinearBinaryOp(const Node& node, bool add) : node_(node), add_(add) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    require_8bit(node_, in.size() > 0 ? in[0] : nullptr, 0);
    require_8bit(node_, in.size() > 3 ? in[3] : nullptr, 3);
    const DType t = in[0]->declared;
    if (in[3]->declared != t)
      fail(node_, "B '" + node_.inputs[3] + "' is " + type_name(in[3]->declared) + ", A '" + node_.inputs[0] + "' is " +
                      type_name(t));
    check_quantized(node_, in, 0, 1, 2, t);
    check_quantized(node_, in, 3, 4, 5, t);
    check_quantized(node_, in, 0, 6, 7, t);
    return {meta_of(t, broadcast_shapes(node_, in[0]->shape, in[3]->shape))};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const QParams a = read_params(node_, in, 1, 2), b = read_params(node_, in, 4, 5), c = read_params(node_, in, 6, 7);
    const Tensor& ta = *in[0];
    const Tensor& tb = *in[3];
    Tensor& y = *out[0];
    // Runs along the last dimension: ORT's broadcaster hands its kernels spans in which an operand
    // is either a vector or one value, and QLinearAdd's rounding depends on which (see the kernel).
    Shape shape = y.shape();
    const Shape sa = ta.shape(), sb = tb.shape();
    const auto stride_a = kernels::broadcast_strides(sa, shape), stride_b = kernels::broadcast_strides(sb, shape);
    const std::int64_t n = y.numel();
    if (n == 0) return;
    // The innermost dimension longer than 1 sets the run (trailing ones are no dimension at all).
    std::size_t inner_dim = shape.size();
    while (inner_dim > 0 && shape[inner_dim - 1] == 1) --inner_dim;
    const std::int64_t run = inner_dim == 0 ? 1 : shape[inner_dim - 1];
    const std::int64_t step_a = inner_dim == 0 ? 0 : stride_a[inner_dim - 1];
    const std::int64_t step_b = inner_dim == 0 ? 0 : stride_b[inner_dim - 1];
    const kernels::QLinearAddParams add =
        kernels::qlinear_add_params(a.scale, a.zero_point, b.scale, b.zero_point, c.scale, c.zero_point);
    const float ratio = a.scale * b.scale / c.scale;
    visit_8bit(y.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* pa = ta.data<T>();
      const T* pb = tb.data<T>();
      T* py = y.data<T>();
      std::vector<std::int64_t> idx(inner_dim, 0);
      for (std::int64_t base = 0; base < n; base += run) {
        std::int64_t oa = 0, ob = 0, rest = base / run;
        for (std::size_t d = inner_dim == 0 ? 0 : inner_dim - 1; d-- > 0;) {
          const std::int64_t i = rest % shape[d];
          rest /= shape[d];
          oa += i * stride_a[d];
          ob += i * stride_b[d];
        }
        // A single-element operand is one value for every run (step 0), as ORT treats it.
        const std::int64_t sa_run = ta.numel() == 1 ? 0 : step_a, sb_run = tb.numel() == 1 ? 0 : step_b;
        if (add_) kernels::qlinear_add(pa + oa, sa_run, pb + ob, sb_run, py + base, run, add);
        else
          kernels::qlinear_mul(pa + oa, sa_run, a.zero_point, pb + ob, sb_run, b.zero_point, ratio, c.zero_point,
                               py + base, run);
      }
    });
  }

 private:
  Node node_;
  bool add_;
};

// ---- QLinearSigmoid / QLinearLeakyRelu: a 256-entry table ------------------------------------------

// Inputs X, X_scale, X_zero_point, Y_scale, Y_zero_point (zero points optional).
class QLinearTableOp final : public Op {
 public:
  QLinearTableOp(const Node& node, bool leaky) : node_(node), leaky_(leaky), alpha_(node.get_float("alpha", 0.01f)) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    require_8bit(node_, in.size() > 0 ? in[0] : nullptr, 0);
    const DType t = in[0]->declared;
    check_quantized(node_, in, 0, 1, 2, t);
    check_quantized(node_, in, 0, 3, 4, t);
    return {meta_of(t, in[0]->shape)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const QParams x = read_params(node_, in, 1, 2), y = read_params(node_, in, 3, 4);
    const float alpha = alpha_;
    std::function<float(float)> f;
    if (leaky_) f = [alpha](float v) { return v >= 0.0f ? v : v * alpha; };
    else f = [](float v) { return kernels::sigmoid_vectorisable(v); };
    visit_8bit(out[0]->dtype(), [&](auto tag) {
      using T = decltype(tag);
      const auto table = kernels::qlinear_lookup_table<T>(x.scale, x.zero_point, y.scale, y.zero_point, f);
      kernels::qlinear_lookup(in[0]->data<T>(), table, out[0]->data<T>(), in[0]->numel());
    });
  }

 private:
  Node node_;
  bool leaky_;
  float alpha_;
};

// ---- QLinearGlobalAveragePool ---------------------------------------------------------------------

// Inputs X, x_scale, x_zero_point, y_scale, y_zero_point; attribute channels_last (NHWC when 1).
class QLinearGlobalAveragePoolOp final : public Op {
 public:
  explicit QLinearGlobalAveragePoolOp(const Node& node)
      : node_(node), channels_last_(node.get_int("channels_last", 0) != 0) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    require_8bit(node_, in.size() > 0 ? in[0] : nullptr, 0);
    const DType t = in[0]->declared;
    check_quantized(node_, in, 0, 1, 2, t);
    check_quantized(node_, in, 0, 3, 4, t);
    Shape s = in[0]->shape;
    if (s.size() < 3)
      fail(node_, "X '" + node_.inputs[0] + "' has shape " + shape_to_string(s) + "; at least 3 dimensions expected");
    const std::size_t first = channels_last_ ? 1 : 2;
    for (std::size_t d = first; d < first + s.size() - 2; ++d) s[d] = 1;
    return {meta_of(t, s)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const QParams x = read_params(node_, in, 1, 2), y = read_params(node_, in, 3, 4);
    const Shape& s = in[0]->shape();
    const std::int64_t n = s[0], c = channels_last_ ? s.back() : s[1];
    const std::int64_t size = c == 0 || n == 0 ? 0 : in[0]->numel() / (n * c);
    if (size == 0) return;
    visit_8bit(out[0]->dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* px = in[0]->data<T>();
      T* py = out[0]->data<T>();
      std::vector<T> plane(channels_last_ ? std::size_t(size) : 0);
      for (std::int64_t b = 0; b < n; ++b)
        for (std::int64_t ch = 0; ch < c; ++ch) {
          const T* src = px + (b * c + ch) * size;
          if (channels_last_) {
            for (std::int64_t i = 0; i < size; ++i) plane[std::size_t(i)] = px[(b * size + i) * c + ch];
            src = plane.data();
          }
          py[b * c + ch] = kernels::qlinear_average(src, size, x.zero_point, x.scale, y.scale, y.zero_point);
        }
    });
  }

 private:
  Node node_;
  bool channels_last_;
};

// ---- QLinearAveragePool ---------------------------------------------------------------------------

// Inputs X, x_scale, x_zero_point, y_scale, y_zero_point; AveragePool's attributes (kernel_shape,
// strides, pads, auto_pad NOTSET or VALID, ceil_mode, count_include_pad). 2-D NCHW only: 1-D, 3-D,
// channels_last, SAME padding and dilations are refused as unsupported.
class QLinearAveragePoolOp final : public Op {
 public:
  explicit QLinearAveragePoolOp(const Node& node) : node_(node) {
    if (!node.has("kernel_shape")) fail(node, "missing required attribute kernel_shape");
    kernel_ = node.get_ints("kernel_shape");
    strides_ = node.get_ints("strides", std::vector<std::int64_t>(kernel_.size(), 1));
    pads_ = node.get_ints("pads", std::vector<std::int64_t>(2 * kernel_.size(), 0));
    const std::string auto_pad = node.get_string("auto_pad", "NOTSET");
    const auto dilations = node.get_ints("dilations", std::vector<std::int64_t>(kernel_.size(), 1));
    if (kernel_.size() != 2 || node.get_int("channels_last", 0) != 0 || (auto_pad != "NOTSET" && auto_pad != "VALID") ||
        std::any_of(dilations.begin(), dilations.end(), [](std::int64_t d) { return d != 1; }))
      throw UnsupportedError(node.describe() +
                             ": QLinearAveragePool is supported in 2-D NCHW with explicit or VALID padding and no "
                             "dilation");
    if (auto_pad == "VALID") pads_.assign(4, 0);
    if (strides_.size() != 2 || pads_.size() != 4)
      fail(node, "strides and pads must have 2 and 4 values for a 2-D kernel_shape");
    for (std::size_t i = 0; i < 2; ++i)
      if (kernel_[i] < 1 || strides_[i] < 1) fail(node, "kernel_shape and strides must be >= 1");
    for (auto p : pads_)
      if (p < 0) fail(node, "pads must be >= 0");
    ceil_mode_ = node.get_int("ceil_mode", 0) != 0;
    count_include_pad_ = node.get_int("count_include_pad", 0) != 0;
  }
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    require_8bit(node_, in.size() > 0 ? in[0] : nullptr, 0);
    const DType t = in[0]->declared;
    check_quantized(node_, in, 0, 1, 2, t);
    check_quantized(node_, in, 0, 3, 4, t);
    const auto p = window(in[0]->shape);
    return {meta_of(t, {in[0]->shape[0], in[0]->shape[1], p.out_h, p.out_w})};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const QParams x = read_params(node_, in, 1, 2), y = read_params(node_, in, 3, 4);
    const auto p = window(in[0]->shape());
    const std::int64_t planes = in[0]->shape()[0] * in[0]->shape()[1];
    visit_8bit(out[0]->dtype(), [&](auto tag) {
      using T = decltype(tag);
      for (std::int64_t c = 0; c < planes; ++c)
        kernels::qlinear_average_pool_2d(in[0]->data<T>() + c * p.h * p.w, p, x.scale, x.zero_point, y.scale,
                                         y.zero_point, out[0]->data<T>() + c * p.out_h * p.out_w);
    });
  }

 private:
  kernels::QLinearPoolWindow window(const Shape& xs) const {
    if (xs.size() != 4)
      fail(node_, "X '" + node_.inputs[0] + "' has shape " + shape_to_string(xs) + "; [N, C, H, W] expected");
    kernels::QLinearPoolWindow p;
    p.h = xs[2], p.w = xs[3];
    std::int64_t* outs[2] = {&p.out_h, &p.out_w};
    for (std::size_t i = 0; i < 2; ++i) {
      const std::int64_t room = xs[i + 2] + pads_[i] + pads_[i + 2] - kernel_[i];
      if (room < 0) fail(node_, "the window is larger than the padded input " + shape_to_string(xs));
      std::int64_t o = (ceil_mode_ ? (room + strides_[i] - 1) / strides_[i] : room / strides_[i]) + 1;
      if (ceil_mode_ && (o - 1) * strides_[i] >= xs[i + 2] + pads_[i]) --o;  // as AveragePool (pool.cc)
      *outs[i] = o;
      p.kernel[i] = kernel_[i];
      p.stride[i] = strides_[i];
      p.pad_begin[i] = pads_[i];
    }
    p.count_include_pad = count_include_pad_;
    return p;
  }

  Node node_;
  std::vector<std::int64_t> kernel_, strides_, pads_;
  bool ceil_mode_ = false, count_include_pad_ = false;
};

// ---- QLinearConcat --------------------------------------------------------------------------------

// Inputs Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) per input; attribute axis. An input
// with the output's scale and zero point is copied, any other goes through a table that
// dequantizes and requantizes each code (ORT's QLinearConcat).
class QLinearConcatOp final : public Op {
 public:
  explicit QLinearConcatOp(const Node& node) : node_(node) {
    if (!node.has("axis")) fail(node, "missing required attribute 'axis'");
    axis_ = node.get_int("axis", 0);
    if (node.inputs.size() < 5 || (node.inputs.size() - 2) % 3 != 0)
      fail(node, "has " + std::to_string(node.inputs.size()) +
                     " inputs; expected Y_scale, Y_zero_point and a (tensor, scale, zero point) triple per input");
  }
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    for (std::size_t i = 0; i < in.size(); ++i)
      if (!in[i]) fail(node_, "input " + std::to_string(i) + " is missing");
    require_8bit(node_, in[2], 2);
    const DType t = in[2]->declared;
    check_quantized(node_, in, 2, 0, 1, t);
    const Shape& s0 = in[2]->shape;
    const int rank = int(s0.size());
    if (rank == 0) fail(node_, "cannot concatenate scalars (input '" + node_.inputs[2] + "' has rank 0)");
    const int axis = normalize_axis(node_, axis_, rank);
    Shape shape = s0;
    shape[std::size_t(axis)] = 0;
    for (std::size_t k = 2; k < in.size(); k += 3) {
      require_8bit(node_, in[k], k);
      if (in[k]->declared != t)
        fail(node_, "input '" + node_.inputs[k] + "' is " + type_name(in[k]->declared) + ", input '" + node_.inputs[2] +
                        "' is " + type_name(t));
      check_quantized(node_, in, k, k + 1, k + 2, t);
      const Shape& s = in[k]->shape;
      bool ok = int(s.size()) == rank;
      for (int d = 0; ok && d < rank; ++d) ok = d == axis || s[std::size_t(d)] == s0[std::size_t(d)];
      if (!ok)
        fail(node_, "input '" + node_.inputs[k] + "' has shape " + shape_to_string(s) + ", which does not match " +
                        shape_to_string(s0) + " outside axis " + std::to_string(axis));
      shape[std::size_t(axis)] += s[std::size_t(axis)];
    }
    return {meta_of(t, shape)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const QParams y = read_params(node_, in, 0, 1);
    Tensor& o = *out[0];
    const std::size_t axis = std::size_t(normalize_axis(node_, axis_, o.rank()));
    std::int64_t outer = 1, inner = 1;
    for (std::size_t d = 0; d < axis; ++d) outer *= o.shape()[d];
    for (std::size_t d = axis + 1; d < o.shape().size(); ++d) inner *= o.shape()[d];
    const std::int64_t out_row = o.shape()[axis] * inner;
    visit_8bit(o.dtype(), [&](auto tag) {
      using T = decltype(tag);
      std::int64_t offset = 0;
      for (std::size_t k = 2; k < in.size(); k += 3) {
        const QParams x = read_params(node_, in, k + 1, k + 2);
        const std::int64_t row = in[k]->shape()[axis] * inner;
        const T* src = in[k]->data<T>();
        T* dst = o.data<T>() + offset;
        if (x.scale == y.scale && x.zero_point == y.zero_point) {
          for (std::int64_t r = 0; r < outer; ++r)
            std::memcpy(dst + r * out_row, src + r * row, std::size_t(row) * sizeof(T));
        } else {
          const auto table =
              kernels::qlinear_lookup_table<T>(x.scale, x.zero_point, y.scale, y.zero_point, [](float v) { return v; });
          for (std::int64_t r = 0; r < outer; ++r)
            kernels::qlinear_lookup(src + r * row, table, dst + r * out_row, row);
        }
        offset += row;
      }
    });
  }

 private:
  Node node_;
  std::int64_t axis_ = 0;
};

// ---- QLinearSoftmax -------------------------------------------------------------------------------

// Inputs X, X_scale, x_zero_point, y_scale, y_zero_point; attributes opset (the Softmax's opset ORT
// converted: below 13 the input is coerced to 2-D at axis) and axis (default 1 below 13, else -1).
class QLinearSoftmaxOp final : public Op {
 public:
  explicit QLinearSoftmaxOp(const Node& node) : node_(node) {
    if (!node.has("opset")) fail(node, "missing required attribute 'opset'");
    opset_ = node.get_int("opset", 13);
    axis_ = node.get_int("axis", opset_ < 13 ? 1 : -1);
  }
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    require_8bit(node_, in.size() > 0 ? in[0] : nullptr, 0);
    const DType t = in[0]->declared;
    check_quantized(node_, in, 0, 1, 2, t);
    check_quantized(node_, in, 0, 3, 4, t);
    if (in[0]->shape.empty()) fail(node_, "X '" + node_.inputs[0] + "' is a scalar; softmax needs an axis");
    normalize_axis(node_, axis_, int(in[0]->shape.size()));
    return {meta_of(t, in[0]->shape)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const QParams x = read_params(node_, in, 1, 2), y = read_params(node_, in, 3, 4);
    const Shape& s = in[0]->shape();
    if (in[0]->numel() == 0) return;
    const std::size_t axis = std::size_t(normalize_axis(node_, axis_, int(s.size())));
    std::int64_t outer = 1, d = 1, inner = 1;
    for (std::size_t k = 0; k < s.size(); ++k) {
      if (k < axis) outer *= s[k];
      else if (k == axis || opset_ < 13) d *= s[k];
      else inner *= s[k];
    }
    visit_8bit(out[0]->dtype(), [&](auto tag) {
      using T = decltype(tag);
      const auto table = kernels::qlinear_softmax_table(x.scale, d, std::is_signed_v<T>);
      const T* px = in[0]->data<T>();
      T* py = out[0]->data<T>();
      for (std::int64_t o = 0; o < outer; ++o)
        for (std::int64_t i = 0; i < inner; ++i)
          kernels::qlinear_softmax(px + o * d * inner + i, inner, d, table, y.scale, y.zero_point,
                                   py + o * d * inner + i);
    });
  }

 private:
  Node node_;
  std::int64_t opset_ = 13, axis_ = -1;
};

}  // namespace

void register_qlinear_contrib_ops(std::vector<OpSchema>& out) {
  out.push_back({"QLinearAdd", kMsDomain, 1, 1,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<QLinearBinaryOp>(n, true); }});
  out.push_back({"QLinearMul", kMsDomain, 1, 1,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<QLinearBinaryOp>(n, false); }});
  out.push_back({"QLinearSigmoid", kMsDomain, 1, 1,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<QLinearTableOp>(n, false); }});
  out.push_back({"QLinearLeakyRelu", kMsDomain, 1, 1,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<QLinearTableOp>(n, true); }});
  out.push_back({"QLinearGlobalAveragePool", kMsDomain, 1, 1,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<QLinearGlobalAveragePoolOp>(n); }});
  out.push_back({"QLinearAveragePool", kMsDomain, 1, 1,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<QLinearAveragePoolOp>(n); }});
  out.push_back({"QLinearSoftmax", kMsDomain, 1, 1,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<QLinearSoftmaxOp>(n); }});
  out.push_back({"QLinearConcat", kMsDomain, 1, 1,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<QLinearConcatOp>(n); }});
}

}  // namespace qeval::eval
