// Conv and ConvTranspose (1 to 3 spatial dimensions; group, strides, dilations, pads, auto_pad,
// output_padding/output_shape): ONNX attribute and shape rules over kernels/conv.
#include <algorithm>

#include "eval/exec/ops/families.h"
#include "eval/exec/ops/geometry.h"
#include "eval/exec/ops/weight_panels.h"
#include "kernels/conv.h"

namespace qeval::eval {

namespace {

std::string list_to_string(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

AutoPad parse_auto_pad(const Node& node) {
  const std::string s = node.get_string("auto_pad", "NOTSET");
  if (s == "NOTSET") return AutoPad::kNotSet;
  if (s == "VALID") return AutoPad::kValid;
  if (s == "SAME_UPPER") return AutoPad::kSameUpper;
  if (s == "SAME_LOWER") return AutoPad::kSameLower;
  fail(node, "auto_pad must be NOTSET, VALID, SAME_UPPER or SAME_LOWER, got '" + s + "'");
}

// Checks X and W and fills the geometry common to both ops: spatial rank, kernel, strides,
// dilations (defaults applied). Pads and output sizes are each op's own business.
kernels::ConvParams base_geometry(const Node& node, const ConvAttributes& a, const Shape& x_shape, const Shape& w_shape,
                                  bool transpose) {
  if (x_shape.size() < 3) fail(node, "X must be [N, C, spatial...], got shape " + shape_to_string(x_shape));
  const std::size_t r = x_shape.size() - 2;
  if (r > 3)
    throw UnsupportedError(node.describe() + ": " + std::to_string(r) + " spatial dimensions (X " +
                           shape_to_string(x_shape) + "); 1 to 3 are supported");
  if (w_shape.size() != x_shape.size())
    fail(node, "W shape " + shape_to_string(w_shape) + " does not match the rank of X " + shape_to_string(x_shape));
  kernels::ConvParams p;
  p.batch = x_shape[0];
  p.in_channels = x_shape[1];
  p.groups = a.group;
  if (!transpose) {
    p.out_channels = w_shape[0];
    if (w_shape[1] * a.group != p.in_channels)
      fail(node, "W shape " + shape_to_string(w_shape) + " with group " + std::to_string(a.group) + " expects " +
                     std::to_string(w_shape[1] * a.group) + " input channels, X " + shape_to_string(x_shape) + " has " +
                     std::to_string(p.in_channels));
  } else {
    p.out_channels = w_shape[1] * a.group;
    if (w_shape[0] != p.in_channels)
      fail(node, "W shape " + shape_to_string(w_shape) + " expects " + std::to_string(w_shape[0]) +
                     " input channels, X " + shape_to_string(x_shape) + " has " + std::to_string(p.in_channels));
  }
  if (p.in_channels % a.group || p.out_channels % a.group)
    fail(node, "channels " + std::to_string(p.in_channels) + " -> " + std::to_string(p.out_channels) +
                   " are not divisible by group " + std::to_string(a.group));
  p.in_spatial.assign(x_shape.begin() + 2, x_shape.end());
  p.kernel.assign(w_shape.begin() + 2, w_shape.end());
  if (!a.kernel_shape.empty() && a.kernel_shape != p.kernel)
    fail(node, "kernel_shape " + list_to_string(a.kernel_shape) + " differs from W's spatial dimensions " +
                   list_to_string(p.kernel));
  p.strides = a.strides.empty() ? std::vector<std::int64_t>(r, 1) : a.strides;
  p.dilations = a.dilations.empty() ? std::vector<std::int64_t>(r, 1) : a.dilations;
  if (p.strides.size() != r || p.dilations.size() != r)
    fail(node, "strides " + list_to_string(p.strides) + " / dilations " + list_to_string(p.dilations) + " need " +
                   std::to_string(r) + " values");
  for (std::size_t i = 0; i < r; ++i)
    if (p.strides[i] < 1 || p.dilations[i] < 1 || p.kernel[i] < 1)
      fail(node, "strides " + list_to_string(p.strides) + ", dilations " + list_to_string(p.dilations) +
                     " and kernel " + list_to_string(p.kernel) + " must be positive");
  if (!a.pads.empty() && a.pads.size() != 2 * r)
    fail(node, "pads " + list_to_string(a.pads) + " need " + std::to_string(2 * r) + " values");
  for (auto v : a.pads)
    if (v < 0) fail(node, "pads " + list_to_string(a.pads) + " must be non-negative");
  return p;
}

// The float ops' type rule, then the geometry.
kernels::ConvParams base_params(const Node& node, const ConvAttributes& a, const ValueMeta& x, const ValueMeta& w,
                                bool transpose) {
  if (x.dtype != DType::kFloat32)
    throw UnsupportedError(node.describe() + ": element type " + type_name(x.declared) +
                           " is not supported (float32, float16 and bfloat16 are)");
  if (w.dtype != x.dtype)
    fail(node, "W type " + type_name(w.declared) + " differs from X type " + type_name(x.declared));
  return base_geometry(node, a, x.shape, w.shape, transpose);
}

// The output of a Conv or ConvTranspose of geometry `p`, after checking the optional bias B.
ValueMeta output_meta(const Node& node, std::span<const ValueMeta* const> in, const kernels::ConvParams& p) {
  if (in.size() > 2 && in[2] && in[2]->shape != Shape{p.out_channels})
    fail(node, "B has shape " + shape_to_string(in[2]->shape) + ", expected [" + std::to_string(p.out_channels) + "]");
  Shape y{p.batch, p.out_channels};
  y.insert(y.end(), p.out_spatial.begin(), p.out_spatial.end());
  return meta_like(*in[0], y);
}

// ---- Conv -----------------------------------------------------------------------------------

// A Conv or ConvTranspose with nothing to compute: an empty output (no output channels, batch 0 or
// an empty spatial axis), or no input channels to sum over (every output is its channel's bias, or
// 0). The kernels take neither (fuzz_onnx_loader: a Conv whose weight is [0, 1, 3, 3]).
bool ran_empty_conv(const kernels::ConvParams& p, const Tensor* bias, Tensor& out) {
  if (out.numel() == 0) return true;
  if (p.in_channels > 0) return false;
  const std::int64_t per_channel = out.numel() / (p.batch * p.out_channels);
  float* y = out.data<float>();
  for (std::int64_t n = 0; n < p.batch; ++n)
    for (std::int64_t c = 0; c < p.out_channels; ++c)
      std::fill_n(y + (n * p.out_channels + c) * per_channel, per_channel, bias ? bias->data<float>()[c] : 0.0f);
  return true;
}

class ConvOp final : public Op {
 public:
  explicit ConvOp(const Node& node) : node_(node), attrs_(read_conv_attributes(node)) {}

  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 2 || !in[0] || !in[1]) fail(node_, "needs inputs X and W");
    base_params(node_, attrs_, *in[0], *in[1], false);  // the type rule
    const kernels::ConvParams p = conv_forward_params(node_, attrs_, in[0]->shape, in[1]->shape);
    return {output_meta(node_, in, p)};
  }

  void prepare(std::span<const ValueMeta* const> in) override {
    if (in[1]->dtype != DType::kFloat32) return;
    const kernels::ConvParams p = conv_forward_params(node_, attrs_, in[0]->shape, in[1]->shape);
    if (p.in_channels < 1 || p.out_channels < 1) return;  // an empty weight: nothing to pack
    packed_.prepare(
        in[1], [&](const Tensor& w) { return kernels::pack_conv_weights(p, w.data<float>(), panel_storage(*in[1])); },
        shared_constants(),
        "conv groups " + std::to_string(p.groups));
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const kernels::ConvParams p = conv_forward_params(node_, attrs_, in[0]->shape(), in[1]->shape());
    const Tensor* b = in.size() > 2 ? in[2] : nullptr;
    if (ran_empty_conv(p, b, *out[0])) return;
    kernels::conv(p, in[0]->data<float>(), in[1]->data<float>(), b ? b->data<float>() : nullptr, out[0]->data<float>(),
                  packed_.find(in[1]));  // temporaries: lent by this thread
  }

 private:
  Node node_;
  ConvAttributes attrs_;
  ConstantCache<kernels::PackedConvWeights> packed_;
};

// ---- ConvTranspose --------------------------------------------------------------------------

kernels::ConvParams conv_transpose_params(const Node& node, const ConvAttributes& a,
                                          const std::vector<std::int64_t>& output_padding_attr,
                                          const std::vector<std::int64_t>& output_shape_attr, const ValueMeta& x,
                                          const ValueMeta& w) {
  kernels::ConvParams p = base_params(node, a, x, w, true);
  const std::size_t r = p.in_spatial.size();
  std::vector<std::int64_t> output_padding =
      output_padding_attr.empty() ? std::vector<std::int64_t>(r, 0) : output_padding_attr;
  if (output_padding.size() != r)
    fail(node, "output_padding " + list_to_string(output_padding) + " needs " + std::to_string(r) + " values");
  // output_shape may list the spatial dimensions or the whole output shape.
  std::vector<std::int64_t> output_shape = output_shape_attr;
  if (output_shape.size() == r + 2) output_shape.erase(output_shape.begin(), output_shape.begin() + 2);
  if (!output_shape.empty() && output_shape.size() != r)
    fail(node, "output_shape " + list_to_string(output_shape_attr) + " needs " + std::to_string(r) + " values");
  p.pads_begin.assign(r, 0);
  p.pads_end.assign(r, 0);
  p.out_spatial.assign(r, 0);
  for (std::size_t i = 0; i < r; ++i) {
    if (output_padding[i] < 0 || (output_padding[i] >= p.strides[i] && output_padding[i] >= p.dilations[i]))
      fail(node, "output_padding " + list_to_string(output_padding) + " must be below the stride or the dilation");
    // The full extent the kernel reaches from the input, before any padding is removed.
    const std::int64_t natural =
        p.strides[i] * (p.in_spatial[i] - 1) + output_padding[i] + p.dilations[i] * (p.kernel[i] - 1) + 1;
    const bool same = a.auto_pad == AutoPad::kSameUpper || a.auto_pad == AutoPad::kSameLower;
    std::int64_t out = -1;
    if (!output_shape.empty()) out = output_shape[i];
    else if (same) out = p.in_spatial[i] * p.strides[i];
    if (out >= 0) {
      // Pads follow from the requested size. The odd unit goes at the end for SAME_UPPER and at the
      // beginning otherwise (the ONNX spec's rule). A size beyond the natural extent leaves the
      // extra trailing positions to the bias, as output_padding does.
      const std::int64_t total = std::max<std::int64_t>(0, natural - out);
      p.pads_begin[i] = a.auto_pad == AutoPad::kSameUpper ? total / 2 : total - total / 2;
      p.pads_end[i] = total - p.pads_begin[i];
      p.out_spatial[i] = out;
    } else {
      if (a.auto_pad == AutoPad::kNotSet && !a.pads.empty()) {
        p.pads_begin[i] = a.pads[i];
        p.pads_end[i] = a.pads[i + r];
      }
      p.out_spatial[i] = natural - p.pads_begin[i] - p.pads_end[i];
    }
    if (p.out_spatial[i] < 0)
      fail(node, "pads " + list_to_string(a.pads) + " leave a negative output size for X " + shape_to_string(x.shape));
  }
  return p;
}

class ConvTransposeOp final : public Op {
 public:
  explicit ConvTransposeOp(const Node& node)
      : node_(node),
        attrs_(read_conv_attributes(node)),
        output_padding_(node.get_ints("output_padding")),
        output_shape_(node.get_ints("output_shape")) {}

  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 2 || !in[0] || !in[1]) fail(node_, "needs inputs X and W");
    const kernels::ConvParams p = params(*in[0], *in[1]);
    return {output_meta(node_, in, p)};
  }

  void prepare(std::span<const ValueMeta* const> in) override {
    if (in[1]->dtype != DType::kFloat32) return;
    const kernels::ConvParams p = params(*in[0], *in[1]);
    // Packing pays where the per-group GEMM (out channels x kernel) x (input positions) is packed.
    const std::int64_t in_size = kernels::conv_input_size(p) / std::max<std::int64_t>(1, p.batch * p.in_channels);
    const std::int64_t per_position = p.in_channels * (p.out_channels / p.groups);
    if (per_position == 0) return;  // an empty weight: nothing to pack (and no division by zero)
    const std::int64_t rows = p.out_channels / p.groups * (kernels::conv_transpose_weight_size(p) / per_position);
    if (!kernels::sgemm_uses_packing({true, false, rows, in_size, p.in_channels / p.groups, rows, in_size, in_size}))
      return;
    packed_.prepare(
        in[1],
        [&](const Tensor& w) { return kernels::pack_conv_transpose_weights(p, w.data<float>(), panel_storage(*in[1])); },
        shared_constants(), "conv-transpose groups " + std::to_string(p.groups));
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const kernels::ConvParams p =
        params(meta_of(in[0]->dtype(), in[0]->shape()), meta_of(in[1]->dtype(), in[1]->shape()));
    const Tensor* b = in.size() > 2 ? in[2] : nullptr;
    if (ran_empty_conv(p, b, *out[0])) return;
    kernels::conv_transpose(p, in[0]->data<float>(), in[1]->data<float>(), b ? b->data<float>() : nullptr,
                            out[0]->data<float>(), packed_.find(in[1]));  // temporaries: lent by this thread
  }

 private:
  kernels::ConvParams params(const ValueMeta& x, const ValueMeta& w) const {
    return conv_transpose_params(node_, attrs_, output_padding_, output_shape_, x, w);
  }

  Node node_;
  ConvAttributes attrs_;
  std::vector<std::int64_t> output_padding_, output_shape_;
  ConstantCache<kernels::PackedConvWeights> packed_;
};

}  // namespace

ConvAttributes read_conv_attributes(const Node& node) {
  ConvAttributes a;
  a.auto_pad = parse_auto_pad(node);
  a.group = node.get_int("group", 1);
  a.kernel_shape = node.get_ints("kernel_shape");
  a.strides = node.get_ints("strides");
  a.dilations = node.get_ints("dilations");
  a.pads = node.get_ints("pads");
  if (a.group < 1) fail(node, "group must be >= 1, got " + std::to_string(a.group));
  return a;
}

kernels::ConvParams conv_forward_params(const Node& node, const ConvAttributes& a, const Shape& x_shape,
                                        const Shape& w_shape) {
  kernels::ConvParams p = base_geometry(node, a, x_shape, w_shape, false);
  const std::size_t r = p.in_spatial.size();
  p.pads_begin.assign(r, 0);
  p.pads_end.assign(r, 0);
  for (std::size_t i = 0; i < r; ++i) {
    const std::int64_t span = p.dilations[i] * (p.kernel[i] - 1) + 1;
    if (a.auto_pad == AutoPad::kSameUpper || a.auto_pad == AutoPad::kSameLower) {
      // Output = ceil(in / stride); the odd pad goes at the end (UPPER) or the beginning (LOWER).
      const std::int64_t out = (p.in_spatial[i] + p.strides[i] - 1) / p.strides[i];
      const std::int64_t total = std::max<std::int64_t>(0, (out - 1) * p.strides[i] + span - p.in_spatial[i]);
      p.pads_begin[i] = a.auto_pad == AutoPad::kSameUpper ? total / 2 : total - total / 2;
      p.pads_end[i] = total - p.pads_begin[i];
    } else if (a.auto_pad == AutoPad::kNotSet && !a.pads.empty()) {
      p.pads_begin[i] = a.pads[i];
      p.pads_end[i] = a.pads[i + r];
    }
    if (p.in_spatial[i] + p.pads_begin[i] + p.pads_end[i] < span)
      fail(node, "the kernel " + list_to_string(p.kernel) + " (dilations " + list_to_string(p.dilations) +
                     ") does not fit the padded input: X " + shape_to_string(x_shape) + ", pads " +
                     list_to_string(p.pads_begin) + " / " + list_to_string(p.pads_end));
  }
  p.out_spatial = kernels::conv_output_spatial(p);
  return p;
}

void register_conv_ops(std::vector<OpSchema>& out) {
  // Conv 1 and 11 compute the same thing (11 reworded auto_pad and pads defaults); 22 added bfloat16.
  out.push_back(
      {"Conv", "", 1, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<ConvOp>(n); }});
  // ConvTranspose 1 and 11 likewise (11 clarified output_shape / auto_pad padding); 22 added types.
  out.push_back({"ConvTranspose", "", 1, kMaxOpset,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<ConvTransposeOp>(n); }});
}

}  // namespace qeval::eval
