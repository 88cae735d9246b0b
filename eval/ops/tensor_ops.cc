// Shape and data-movement ops: Identity, Shape, Reshape, Cast, and the rest of the family.
#include <algorithm>
#include <cstring>

#include "eval/ops/families.h"

namespace qeval::eval {

namespace {

constexpr int kLatest = 22;

void copy_data(const Tensor& in, Tensor& out) {
  if (in.nbytes()) std::memcpy(out.raw(), in.raw(), in.nbytes());
}

// Identity, Dropout (inference: identity; the optional mask output is all true).
class IdentityOp final : public Op {
 public:
  explicit IdentityOp(const Node& node) : node_(node) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    if (node_.op_type == "Dropout" && in.size() > 2 && in[2]) {
      const Tensor& training = constant_input(node_, in, 2, "training_mode");
      if (training.data<bool>()[0])
        throw UnsupportedError(node_.describe() + ": training_mode=true is not supported (inference only)");
    }
    std::vector<ValueMeta> out{meta_like(*in[0], in[0]->shape)};
    out.back().value = in[0]->value;  // a constant passes through as a constant
    if (node_.outputs.size() > 1) out.push_back(meta_of(DType::kBool, in[0]->shape));
    return out;
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    copy_data(*in[0], *out[0]);
    if (out.size() > 1 && out[1]) std::memset(out[1]->raw(), 1, out[1]->nbytes());
  }

 private:
  Node node_;
};

// Shape (with opset 15's start/end): known from static shapes, so always a constant.
class ShapeOp final : public Op {
 public:
  explicit ShapeOp(const Node& node) : node_(node) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    const auto& s = in[0]->shape;
    const std::int64_t rank = std::int64_t(s.size());
    auto clamp = [&](std::int64_t v) { return std::clamp(v < 0 ? v + rank : v, std::int64_t(0), rank); };
    const std::int64_t start = clamp(node_.get_int("start", 0));
    const std::int64_t end = clamp(node_.get_int("end", rank));
    auto t = std::make_shared<Tensor>(DType::kInt64, Shape{std::max<std::int64_t>(0, end - start)});
    for (std::int64_t i = start; i < end; ++i) t->data<std::int64_t>()[i - start] = s[std::size_t(i)];
    ValueMeta m = meta_of(DType::kInt64, t->shape());
    m.value = std::move(t);
    return {m};
  }
  void run(std::span<const Tensor* const>, std::span<Tensor* const>) const override {
    throw std::logic_error("Shape is always folded");
  }

 private:
  Node node_;
};

class ReshapeOp final : public Op {
 public:
  explicit ReshapeOp(const Node& node) : node_(node), allowzero_(node.get_int("allowzero", 0) != 0) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 2 || !in[0]) fail(node_, "needs data and shape inputs");
    auto target = to_int64s(constant_input(node_, in, 1, "shape"));
    const Shape& src = in[0]->shape;
    const std::int64_t n = shape_numel(src);
    int infer_at = -1;
    std::int64_t known = 1;
    for (std::size_t i = 0; i < target.size(); ++i) {
      if (target[i] == 0 && !allowzero_) {
        if (i >= src.size()) fail(node_, "shape has 0 at position " + std::to_string(i) + " beyond the input's rank");
        target[i] = src[i];
      }
      if (target[i] == -1) {
        if (infer_at >= 0) fail(node_, "shape has more than one -1");
        infer_at = int(i);
      } else if (target[i] < 0) {
        fail(node_, "invalid dimension " + std::to_string(target[i]) + " in shape");
      } else {
        known *= target[i];
      }
    }
    if (infer_at >= 0) {
      if (known == 0 || n % known != 0)
        fail(node_, "cannot reshape " + shape_to_string(src) + " to " + shape_to_string(target));
      target[std::size_t(infer_at)] = n / known;
    }
    if (shape_numel(target) != n)
      fail(node_, "cannot reshape " + shape_to_string(src) + " (" + std::to_string(n) + " elements) to " +
                      shape_to_string(target));
    ValueMeta m = meta_like(*in[0], target);
    if (in[0]->value) m.value = std::make_shared<Tensor>(in[0]->value->reshaped(target));
    return {m};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    copy_data(*in[0], *out[0]);
  }

 private:
  Node node_;
  bool allowzero_;
};

}  // namespace

void register_tensor_ops(std::vector<OpSchema>& out) {
  auto identity = [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<IdentityOp>(n); };
  out.push_back({"Identity", "", 1, kLatest, identity});
  out.push_back({"Dropout", "", 7, kLatest, identity});
  out.push_back({"Shape", "", 1, kLatest, [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<ShapeOp>(n); }});
  out.push_back({"Reshape", "", 5, kLatest, [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<ReshapeOp>(n); }});
}

}  // namespace qeval::eval
