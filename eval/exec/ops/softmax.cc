// Softmax and LogSoftmax (opset < 13: 2-D coercion; 13+: one axis).
#include "kernels/softmax.h"
#include "eval/exec/ops/families.h"

namespace qeval::eval {

namespace {

class SoftmaxOp final : public Op {
 public:
  SoftmaxOp(const Node& node, bool log)
      : node_(node), log_(log), axis_(node.get_int("axis", node.opset < 13 ? 1 : -1)) {}

  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    const DType t = in[0]->dtype;
    if (t != DType::kFloat32 && t != DType::kFloat64)
      fail(node_, "input '" + node_.inputs[0] + "' has unsupported type " + std::string(dtype_name(in[0]->declared)));
    const int rank = static_cast<int>(in[0]->shape.size());
    if (rank == 0) fail(node_, "input '" + node_.inputs[0] + "' is a scalar; " + node_.op_type + " needs rank >= 1");
    // Before opset 13 the axis may equal the rank (everything in one row); normalize_axis checks.
    if (node_.opset < 13 && axis_ == rank) return {meta_like(*in[0], in[0]->shape)};
    normalize_axis(node_, axis_, rank);
    return {meta_like(*in[0], in[0]->shape)};
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    const Shape& s = x.shape();
    const int rank = x.rank();
    const int axis = (node_.opset < 13 && axis_ == rank) ? rank : normalize_axis(node_, axis_, rank);
    std::int64_t outer = 1, n = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= s[std::size_t(d)];
    if (node_.opset < 13) {
      // Opsets 1 and 11 flatten to [outer, rest] and normalise each row of the 2-D view.
      for (int d = axis; d < rank; ++d) n *= s[std::size_t(d)];
    } else {
      n = s[std::size_t(axis)];
      for (int d = axis + 1; d < rank; ++d) inner *= s[std::size_t(d)];
    }
    if (x.dtype() == DType::kFloat32) kernels::softmax(x.data<float>(), out[0]->data<float>(), outer, n, inner, log_);
    else kernels::softmax(x.data<double>(), out[0]->data<double>(), outer, n, inner, log_);
  }

 private:
  Node node_;
  bool log_;
  std::int64_t axis_;
};

}  // namespace

void register_softmax_ops(std::vector<OpSchema>& out) {
  auto softmax = [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<SoftmaxOp>(n, false); };
  auto log_softmax = [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<SoftmaxOp>(n, true); };
  // Opsets 1 and 11 share the 2-D coercion (11 only allowed negative axes); 13 made it one axis.
  out.push_back({"Softmax", "", 1, 12, softmax});
  out.push_back({"Softmax", "", 13, kMaxOpset, softmax});
  out.push_back({"LogSoftmax", "", 1, 12, log_softmax});
  out.push_back({"LogSoftmax", "", 13, kMaxOpset, log_softmax});
}

}  // namespace qeval::eval
