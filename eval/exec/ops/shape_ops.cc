// Shape ops: Identity/Dropout, Shape, Reshape, Squeeze/Unsqueeze/Flatten, Size, ConstantOfShape, Range.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <type_traits>

#include "eval/exec/ops/families.h"
#include "eval/exec/ops/tensor_common.h"
#include "kernels/numeric.h"

namespace qeval::eval {

namespace {

using namespace tensor_ops;

// ---- Identity, Shape, Reshape ----------------------------------------------------------------

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
    bool overflow = false, zero = false;
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
        zero = zero || target[i] == 0;
        overflow = overflow || __builtin_mul_overflow(known, target[i], &known);
      }
    }
    if (zero) known = 0;
    else if (overflow) fail(node_, "shape " + shape_to_string(target) + " has more elements than fit in 64 bits");
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

// ---- Squeeze, Unsqueeze, Flatten: new shapes over the same data ------------------------------

enum class Regroup { kSqueeze, kUnsqueeze, kFlatten };

// axes as an attribute before opset 13, as an input from 13 on (Squeeze's is optional).
class RegroupOp final : public Op {
 public:
  RegroupOp(const Node& node, Regroup kind) : node_(node), kind_(kind) {
    if (kind != Regroup::kFlatten) check_form(node, "axes", 1, 13);
  }
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    const Shape& s = in[0]->shape;
    const int rank = int(s.size());
    Shape out;
    if (kind_ == Regroup::kFlatten) {
      const std::int64_t axis = node_.get_int("axis", 1);
      if (axis < -rank || axis > rank)
        fail(node_, "axis " + std::to_string(axis) + " is out of range [-" + std::to_string(rank) + ", " +
                        std::to_string(rank) + "] for input shape " + shape_to_string(s));
      const std::size_t a = std::size_t(axis < 0 ? axis + rank : axis);
      out = {prod(s, 0, a), prod(s, a, s.size())};
    } else {
      std::vector<std::int64_t> axes;
      bool given = true;
      if (node_.opset < 13) {
        given = node_.has("axes");
        axes = node_.get_ints("axes");
      } else if (in.size() > 1 && in[1]) {
        axes = int_list(node_, plan_time_input(node_, in, 1, "axes"), "axes");
      } else {
        given = false;
      }
      if (kind_ == Regroup::kUnsqueeze) {
        if (!given) fail(node_, "Unsqueeze needs axes");
        const int out_rank = rank + int(axes.size());
        auto norm = unique_axes(node_, axes, out_rank, "axes");
        std::vector<bool> inserted(std::size_t(out_rank), false);
        for (int a : norm) inserted[std::size_t(a)] = true;
        for (int d = 0, k = 0; d < out_rank; ++d) out.push_back(inserted[std::size_t(d)] ? 1 : s[std::size_t(k++)]);
      } else {
        std::vector<bool> drop(s.size(), false);
        if (!given) {
          for (std::size_t d = 0; d < s.size(); ++d) drop[d] = s[d] == 1;
        } else {
          for (int a : unique_axes(node_, axes, rank, "axes")) {
            if (s[std::size_t(a)] != 1)
              fail(node_, "cannot squeeze axis " + std::to_string(a) + " of shape " + shape_to_string(s) +
                              ": its size is " + std::to_string(s[std::size_t(a)]) + ", not 1");
            drop[std::size_t(a)] = true;
          }
        }
        for (std::size_t d = 0; d < s.size(); ++d)
          if (!drop[d]) out.push_back(s[d]);
      }
    }
    ValueMeta m = meta_like(*in[0], out);
    if (in[0]->value) m.value = std::make_shared<Tensor>(in[0]->value->reshaped(out));
    return {m};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    copy_data(*in[0], *out[0]);
  }

  std::vector<std::size_t> constant_inputs() const override {
    if (kind_ == Regroup::kFlatten || node_.opset < 13) return {};
    return {1};
  }

 private:
  Node node_;
  Regroup kind_;
};

// ---- Size, ConstantOfShape, Range ------------------------------------------------------------

class SizeOp final : public Op {
 public:
  explicit SizeOp(const Node& node) : node_(node) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    auto t = std::make_shared<Tensor>(DType::kInt64, Shape{});
    t->data<std::int64_t>()[0] = shape_numel(in[0]->shape);
    ValueMeta m = meta_of(DType::kInt64, {});
    m.value = std::move(t);
    return {m};
  }
  void run(std::span<const Tensor* const>, std::span<Tensor* const>) const override {
    throw std::logic_error("Size is always folded");
  }

 private:
  Node node_;
};

// A one-element tensor in its declared type -> its value in storage type.
Tensor scalar_to_storage(const Tensor& t) {
  const DType storage = storage_type(t.dtype());
  Tensor out(storage, {});
  if (storage == t.dtype()) {
    std::memcpy(out.raw(), t.raw(), dtype_size(storage));
    return out;
  }
  const auto* b = reinterpret_cast<const std::uint8_t*>(t.raw());
  std::uint16_t u16 = 0;
  if (t.dtype() == DType::kFloat16 || t.dtype() == DType::kBFloat16) std::memcpy(&u16, b, 2);
  float v = 0;
  switch (t.dtype()) {
    case DType::kFloat16: v = to_float(float16{u16}); break;
    case DType::kBFloat16: v = to_float(bfloat16{u16}); break;
    case DType::kFloat8E4M3FN: v = to_float(float8_e4m3fn{b[0]}); break;
    case DType::kFloat8E5M2: v = to_float(float8_e5m2{b[0]}); break;
    case DType::kFloat8E4M3FNUZ: v = to_float(float8_e4m3fnuz{b[0]}); break;
    case DType::kFloat8E5M2FNUZ: v = to_float(float8_e5m2fnuz{b[0]}); break;
    default: break;
  }
  out.data<float>()[0] = v;
  return out;
}

class ConstantOfShapeOp final : public Op {
 public:
  explicit ConstantOfShapeOp(const Node& node) : node_(node) {
    if (const Tensor* t = node.get_tensor("value")) {
      if (t->numel() != 1) fail(node, "'value' must hold one element, got shape " + shape_to_string(t->shape()));
      declared_ = t->dtype();
      value_ = scalar_to_storage(*t);
    } else {
      value_ = Tensor(DType::kFloat32, {});  // default: float32 zero
    }
  }
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs the shape input");
    auto shape = int_list(node_, plan_time_input(node_, in, 0, "shape"), "shape");
    for (auto d : shape)
      if (d < 0) fail(node_, "shape has a negative dimension: " + shape_to_string(shape));
    return {meta_of(declared_, shape)};
  }
  void run(std::span<const Tensor* const>, std::span<Tensor* const> out) const override {
    const std::size_t es = dtype_size(value_.dtype());
    with_element_size(es, [&](auto tag) {
      using T = decltype(tag);
      T v;
      std::memcpy(&v, value_.raw(), es);
      std::fill_n(reinterpret_cast<T*>(out[0]->raw()), out[0]->numel(), v);
    });
  }

  std::vector<std::size_t> constant_inputs() const override { return {0}; }

 private:
  Node node_;
  DType declared_ = DType::kFloat32;
  Tensor value_;
};

// Range: the output length depends on the input values, so they must be known at plan time.
class RangeOp final : public Op {
 public:
  explicit RangeOp(const Node& node) : node_(node) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 3 || !in[0] || !in[1] || !in[2]) fail(node_, "needs start, limit and delta");
    for (std::size_t i = 0; i < 3; ++i) {
      if (in[i]->declared != in[0]->declared)
        fail(node_, "start, limit and delta must have one type; got " + type_name(in[0]->declared) + " and " +
                        type_name(in[i]->declared));
      if (shape_numel(in[i]->shape) != 1)
        fail(node_, "input " + std::to_string(i) + " must be a scalar, got shape " + shape_to_string(in[i]->shape));
    }
    const DType t = in[0]->declared;
    if (t != DType::kFloat32 && t != DType::kFloat64 && t != DType::kInt16 && t != DType::kInt32 && t != DType::kInt64)
      fail(node_, "type " + type_name(t) + " is not one of float, double, int16, int32, int64");
    const char* names[] = {"start", "limit", "delta"};
    for (std::size_t i = 0; i < 3; ++i) plan_time_input(node_, in, i, names[i]);
    std::int64_t n = 0;
    visit_storage(in[0]->dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, bool>) n = count<T>(*in[0]->value, *in[1]->value, *in[2]->value);
    });
    return {meta_like(*in[0], Shape{n})};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    visit_storage(in[0]->dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, bool>) {
        const T start = in[0]->data<T>()[0], delta = in[2]->data<T>()[0];
        T* dst = out[0]->data<T>();
        for (std::int64_t i = 0; i < out[0]->numel(); ++i) {
          if constexpr (std::is_floating_point_v<T>) dst[i] = static_cast<T>(double(start) + double(i) * double(delta));
          else dst[i] = static_cast<T>(std::int64_t(start) + i * std::int64_t(delta));
        }
      }
    });
  }

  std::vector<std::size_t> constant_inputs() const override { return {0, 1, 2}; }

 private:
  template <class T>
  std::int64_t count(const Tensor& s, const Tensor& l, const Tensor& d) const {
    const T start = s.data<T>()[0], limit = l.data<T>()[0], delta = d.data<T>()[0];
    if (delta == T(0)) fail(node_, "delta is 0");
    if constexpr (std::is_floating_point_v<T>) {
      const T q = std::ceil((limit - start) / delta);  // in T, as the ONNX definition computes it
      if (std::isnan(q)) fail(node_, "start, limit and delta give no finite length");
      if (q > T(std::int64_t(1) << 40))
        fail(node_, "the range is too long (" + std::to_string(double(q)) + " elements)");
      return q > 0 ? std::int64_t(q) : 0;
    } else {
      const std::int64_t diff = std::int64_t(limit) - std::int64_t(start), dl = std::int64_t(delta);
      std::int64_t q = diff / dl;
      if (diff % dl != 0 && ((diff > 0) == (dl > 0))) ++q;
      return std::max<std::int64_t>(q, 0);
    }
  }
  Node node_;
};

}  // namespace

void register_shape_ops(std::vector<OpSchema>& out) {
  auto identity = [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<IdentityOp>(n); };
  auto squeeze = [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<RegroupOp>(n, Regroup::kSqueeze); };
  auto unsqueeze = [](const Node& n) -> std::unique_ptr<Op> {
    return std::make_unique<RegroupOp>(n, Regroup::kUnsqueeze);
  };
  out.push_back({"Identity", "", 1, kMaxOpset, identity});
  out.push_back({"Dropout", "", 7, kMaxOpset, identity});
  out.push_back({"Shape", "", 1, kMaxOpset, factory<ShapeOp>()});
  out.push_back({"Reshape", "", 5, kMaxOpset, factory<ReshapeOp>()});
  out.push_back({"Size", "", 1, kMaxOpset, factory<SizeOp>()});
  // Squeeze/Unsqueeze: axes attribute 1-12, input 13+ (one class reads node.opset).
  out.push_back({"Squeeze", "", 1, 12, squeeze});
  out.push_back({"Squeeze", "", 13, kMaxOpset, squeeze});
  out.push_back({"Unsqueeze", "", 1, 12, unsqueeze});
  out.push_back({"Unsqueeze", "", 13, kMaxOpset, unsqueeze});
  out.push_back({"ConstantOfShape", "", 9, kMaxOpset, factory<ConstantOfShapeOp>()});
  out.push_back({"Range", "", 11, kMaxOpset, factory<RangeOp>()});
  out.push_back({"Flatten", "", 1, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> {
                   return std::make_unique<RegroupOp>(n, Regroup::kFlatten);
                 }});
}

}  // namespace qeval::eval
