// MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool, MaxUnpool.
#include <algorithm>

#include "eval/exec/ops/families.h"
#include "kernels/window_pool.h"

namespace qeval::eval {

namespace {

std::string ints_to_string(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Attributes shared by MaxPool and AveragePool, and the output geometry they give for an input.
class WindowPoolOp : public Op {
 public:
  explicit WindowPoolOp(const Node& node) : node_(node) {
    if (!node.has("kernel_shape")) fail(node, "missing required attribute kernel_shape");
    kernel_ = node.get_ints("kernel_shape");
    const std::size_t k = kernel_.size();
    if (k < 1 || k > 3)
      throw UnsupportedError(node.describe() + ": " + std::to_string(k) +
                             "-D pooling is not supported (1-D, 2-D and 3-D are)");
    strides_ = node.get_ints("strides", std::vector<std::int64_t>(k, 1));
    dilations_ = node.get_ints("dilations", std::vector<std::int64_t>(k, 1));
    pads_ = node.get_ints("pads", std::vector<std::int64_t>(2 * k, 0));
    auto_pad_ = node.get_string("auto_pad", "NOTSET");
    ceil_mode_ = node.get_int("ceil_mode", 0) != 0;
    if (strides_.size() != k || dilations_.size() != k || pads_.size() != 2 * k)
      fail(node, "kernel_shape " + ints_to_string(kernel_) + ", strides " + ints_to_string(strides_) + ", dilations " +
                     ints_to_string(dilations_) + " and pads " + ints_to_string(pads_) +
                     " disagree on the number of spatial dimensions");
    for (std::size_t i = 0; i < k; ++i)
      if (kernel_[i] < 1 || strides_[i] < 1 || dilations_[i] < 1)
        fail(node, "kernel_shape " + ints_to_string(kernel_) + ", strides " + ints_to_string(strides_) +
                       " and dilations " + ints_to_string(dilations_) + " must be >= 1");
    for (auto p : pads_)
      if (p < 0) fail(node, "pads " + ints_to_string(pads_) + " must be >= 0");
    if (auto_pad_ != "NOTSET" && auto_pad_ != "SAME_UPPER" && auto_pad_ != "SAME_LOWER" && auto_pad_ != "VALID")
      fail(node, "auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got '" + auto_pad_ + "'");
  }

 protected:
  kernels::PoolWindow window(const Shape& xs) const {
    const std::size_t k = kernel_.size();
    if (xs.size() != k + 2)
      fail(node_, "input '" + node_.inputs[0] + "' has shape " + shape_to_string(xs) + ", expected [N, C] and " +
                      std::to_string(k) + " spatial dimensions (kernel_shape " + ints_to_string(kernel_) + ")");
    kernels::PoolWindow w;
    w.rank = static_cast<int>(k);
    for (std::size_t i = 0; i < k; ++i) {
      const std::int64_t in = xs[i + 2], s = strides_[i];
      const std::int64_t span = (kernel_[i] - 1) * dilations_[i] + 1;
      std::int64_t pb = 0, pe = 0, out = 0;
      if (auto_pad_ == "SAME_UPPER" || auto_pad_ == "SAME_LOWER") {
        out = (in + s - 1) / s;
        const std::int64_t total = std::max<std::int64_t>(0, (out - 1) * s + span - in);
        pb = auto_pad_ == "SAME_UPPER" ? total / 2 : total - total / 2;
        pe = total - pb;
      } else {
        if (auto_pad_ == "NOTSET") {
          pb = pads_[i];
          pe = pads_[i + k];
        }
        const std::int64_t room = in + pb + pe - span;
        if (room < 0)
          fail(node_, "the window (kernel_shape " + ints_to_string(kernel_) + ", dilations " +
                          ints_to_string(dilations_) + ") is larger than the padded input " + shape_to_string(xs));
        out = (ceil_mode_ ? (room + s - 1) / s : room / s) + 1;
        // A ceil-mode window must start inside the input or its leading padding (PyTorch's rule,
        // which ONNX adopted); otherwise it is dropped.
        if (ceil_mode_ && (out - 1) * s >= in + pb) --out;
      }
      w.in[i] = in;
      w.out[i] = out;
      w.kernel[i] = kernel_[i];
      w.stride[i] = s;
      w.dilation[i] = dilations_[i];
      w.pad_begin[i] = pb;
      w.pad_end[i] = pe;
    }
    return w;
  }

  static Shape output_shape(const Shape& xs, const kernels::PoolWindow& w) {
    Shape out{xs[0], xs[1]};
    for (int i = 0; i < w.rank; ++i) out.push_back(w.out[std::size_t(i)]);
    return out;
  }

  Node node_;
  std::vector<std::int64_t> kernel_, strides_, dilations_, pads_;
  std::string auto_pad_;
  bool ceil_mode_ = false;
};

class MaxPoolOp final : public WindowPoolOp {
 public:
  explicit MaxPoolOp(const Node& node) : WindowPoolOp(node) {
    const std::int64_t order = node.get_int("storage_order", 0);
    if (order != 0 && order != 1) fail(node, "storage_order must be 0 or 1, got " + std::to_string(order));
    column_major_ = order == 1;
  }

  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    const DType t = in[0]->dtype;
    if (t != DType::kFloat32 && t != DType::kFloat64 && t != DType::kInt8 && t != DType::kUInt8)
      fail(node_, "input '" + node_.inputs[0] + "' has unsupported type " + std::string(dtype_name(in[0]->declared)));
    const Shape out = output_shape(in[0]->shape, window(in[0]->shape));
    return {meta_like(*in[0], out), meta_of(DType::kInt64, out)};
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    const kernels::PoolWindow w = window(x.shape());
    const std::int64_t planes = x.dim(0) * x.dim(1);
    std::int64_t* indices = out.size() > 1 && out[1] ? out[1]->data<std::int64_t>() : nullptr;
    switch (x.dtype()) {
      case DType::kFloat32:
        return kernels::max_pool(x.data<float>(), out[0]->data<float>(), indices, planes, w, column_major_);
      case DType::kFloat64:
        return kernels::max_pool(x.data<double>(), out[0]->data<double>(), indices, planes, w, column_major_);
      case DType::kInt8:
        return kernels::max_pool(x.data<std::int8_t>(), out[0]->data<std::int8_t>(), indices, planes, w, column_major_);
      case DType::kUInt8:
        return kernels::max_pool(x.data<std::uint8_t>(), out[0]->data<std::uint8_t>(), indices, planes, w,
                                 column_major_);
      default: fail(node_, "unsupported type " + std::string(dtype_name(x.dtype())));
    }
  }

 private:
  bool column_major_ = false;
};

class AveragePoolOp final : public WindowPoolOp {
 public:
  explicit AveragePoolOp(const Node& node)
      : WindowPoolOp(node), count_include_pad_(node.get_int("count_include_pad", 0) != 0) {}

  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    const DType t = in[0]->dtype;
    if (t != DType::kFloat32 && t != DType::kFloat64)
      fail(node_, "input '" + node_.inputs[0] + "' has unsupported type " + std::string(dtype_name(in[0]->declared)));
    return {meta_like(*in[0], output_shape(in[0]->shape, window(in[0]->shape)))};
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    const kernels::PoolWindow w = window(x.shape());
    const std::int64_t planes = x.dim(0) * x.dim(1);
    if (x.dtype() == DType::kFloat32)
      kernels::average_pool(x.data<float>(), out[0]->data<float>(), planes, w, count_include_pad_);
    else kernels::average_pool(x.data<double>(), out[0]->data<double>(), planes, w, count_include_pad_);
  }

 private:
  bool count_include_pad_;
};

class GlobalPoolOp final : public Op {
 public:
  GlobalPoolOp(const Node& node, bool max) : node_(node), max_(max) {}

  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    const DType t = in[0]->dtype;
    if (t != DType::kFloat32 && t != DType::kFloat64)
      fail(node_, "input '" + node_.inputs[0] + "' has unsupported type " + std::string(dtype_name(in[0]->declared)));
    const Shape& xs = in[0]->shape;
    if (xs.size() < 2)
      fail(node_, "input '" + node_.inputs[0] + "' has shape " + shape_to_string(xs) + "; expected [N, C, ...]");
    Shape out(xs.size(), 1);
    out[0] = xs[0];
    out[1] = xs[1];
    return {meta_like(*in[0], out)};
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    const std::int64_t planes = x.dim(0) * x.dim(1);
    const std::int64_t size = planes == 0 ? 0 : x.numel() / planes;
    if (x.dtype() == DType::kFloat32) kernels::global_pool(x.data<float>(), out[0]->data<float>(), planes, size, max_);
    else kernels::global_pool(x.data<double>(), out[0]->data<double>(), planes, size, max_);
  }

 private:
  Node node_;
  bool max_;
};

// Scatters pooled values back to where MaxPool's Indices say they came from.
class MaxUnpoolOp final : public Op {
 public:
  explicit MaxUnpoolOp(const Node& node) : node_(node) {
    if (!node.has("kernel_shape")) fail(node, "missing required attribute kernel_shape");
    kernel_ = node.get_ints("kernel_shape");
    const std::size_t k = kernel_.size();
    strides_ = node.get_ints("strides", std::vector<std::int64_t>(k, 1));
    pads_ = node.get_ints("pads", std::vector<std::int64_t>(2 * k, 0));
    if (k < 1 || strides_.size() != k || pads_.size() != 2 * k)
      fail(node, "kernel_shape " + ints_to_string(kernel_) + ", strides " + ints_to_string(strides_) + " and pads " +
                     ints_to_string(pads_) + " disagree on the number of spatial dimensions");
  }

  std::vector<std::size_t> constant_inputs() const override { return {2}; }

  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 2 || !in[0] || !in[1]) fail(node_, "needs inputs X and I");
    if (in[0]->dtype != DType::kFloat32 && in[0]->dtype != DType::kFloat64)
      fail(node_, "input '" + node_.inputs[0] + "' has unsupported type " + std::string(dtype_name(in[0]->declared)));
    if (in[1]->dtype != DType::kInt64) fail(node_, "indices '" + node_.inputs[1] + "' must be int64");
    if (in[1]->shape != in[0]->shape)
      fail(node_, "indices '" + node_.inputs[1] + "' have shape " + shape_to_string(in[1]->shape) + ", X has " +
                      shape_to_string(in[0]->shape));
    const Shape inferred = inferred_shape(in[0]->shape);
    if (in.size() < 3 || !in[2]) return {meta_like(*in[0], inferred)};
    const Shape out = to_int64s(constant_input(node_, in, 2, "output_shape"));
    bool ok = out.size() == inferred.size();
    for (std::size_t d = 0; ok && d < out.size(); ++d) ok = out[d] >= inferred[d] && (d >= 2 || out[d] == inferred[d]);
    if (!ok)
      fail(node_, "output_shape " + shape_to_string(out) + " must keep N and C and be at least the unpooled shape " +
                      shape_to_string(inferred));
    return {meta_like(*in[0], out)};
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    const Shape inferred = inferred_shape(x.shape());
    const std::int64_t* idx = in[1]->data<std::int64_t>();
    std::int64_t bad;
    if (x.dtype() == DType::kFloat32)
      bad = kernels::max_unpool(x.data<float>(), idx, x.numel(), out[0]->data<float>(), inferred, out[0]->shape());
    else bad = kernels::max_unpool(x.data<double>(), idx, x.numel(), out[0]->data<double>(), inferred, out[0]->shape());
    if (bad >= 0)
      fail(node_, "index " + std::to_string(idx[bad]) + " at position " + std::to_string(bad) + " of '" +
                      node_.inputs[1] + "' is outside the unpooled shape " + shape_to_string(inferred));
  }

 private:
  Shape inferred_shape(const Shape& xs) const {
    const std::size_t k = kernel_.size();
    if (xs.size() != k + 2)
      fail(node_, "input '" + node_.inputs[0] + "' has shape " + shape_to_string(xs) + ", expected [N, C] and " +
                      std::to_string(k) + " spatial dimensions");
    Shape s{xs[0], xs[1]};
    for (std::size_t i = 0; i < k; ++i) {
      const std::int64_t d = (xs[i + 2] - 1) * strides_[i] - (pads_[i] + pads_[i + k]) + kernel_[i];
      if (d < 0) fail(node_, "pads " + ints_to_string(pads_) + " leave a negative output size");
      s.push_back(d);
    }
    return s;
  }

  Node node_;
  std::vector<std::int64_t> kernel_, strides_, pads_;
};

}  // namespace

void register_pool_ops(std::vector<OpSchema>& out) {
  // Later opsets only added attributes whose defaults keep the earlier behaviour (MaxPool: 8
  // storage_order and Indices, 10 ceil_mode and dilations, 12 int8/uint8; AveragePool: 10
  // ceil_mode, 19 dilations), so one implementation covers every opset. AveragePool starts at 7:
  // before count_include_pad existed the spec did not say whether padding counts.
  out.push_back({"MaxPool", "", 1, kMaxOpset,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<MaxPoolOp>(n); }});
  out.push_back({"AveragePool", "", 7, kMaxOpset,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<AveragePoolOp>(n); }});
  out.push_back({"GlobalAveragePool", "", 1, kMaxOpset,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<GlobalPoolOp>(n, false); }});
  out.push_back({"GlobalMaxPool", "", 1, kMaxOpset,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<GlobalPoolOp>(n, true); }});
  // Opsets 11 (wording) and 22 (types) left the definition of 9 unchanged.
  out.push_back({"MaxUnpool", "", 9, kMaxOpset,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<MaxUnpoolOp>(n); }});
}

}  // namespace qeval::eval
