// Shared helpers for op implementations.
#include "eval/exec/ops/op.h"

#include <algorithm>

namespace qeval::eval {

// By the address of the bytes, whoever owns them (with the type and shape: the same bytes seen
// as another tensor are another): a borrowed view of a tensor (a local-error graph's weight) is
// that tensor.
SharedConstants::Key SharedConstants::key_of(const Tensor& t, std::type_index type, const std::string& key) {
  std::string form(dtype_name(t.dtype()));
  for (std::int64_t d : t.shape()) form += " " + std::to_string(d);
  return {t.on_device() ? t.device_data() : static_cast<const void*>(t.raw()), std::move(form), type, key};
}

DType storage_type(DType declared) {
  switch (declared) {
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2FNUZ: return DType::kFloat32;
    default: return declared;
  }
}

void fail(const Node& node, const std::string& message) { throw InputError(node.describe() + ": " + message); }

const Tensor& constant_input(const Node& node, std::span<const ValueMeta* const> inputs, std::size_t i,
                             const char* what) {
  if (i >= inputs.size() || !inputs[i]) fail(node, std::string("missing input ") + what);
  if (!inputs[i]->value)
    throw UnsupportedError(node.describe() + ": input " + std::to_string(i) + " ('" + node.inputs[i] + "', " + what +
                           ") must be known at plan time (a constant, or computable "
                           "from static shapes); it depends on runtime data");
  return *inputs[i]->value;
}

std::vector<std::int64_t> to_int64s(const Tensor& t) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(t.numel()));
  if (t.dtype() == DType::kInt64) {
    std::copy_n(t.data<std::int64_t>(), t.numel(), out.begin());
  } else if (t.dtype() == DType::kInt32) {
    std::copy_n(t.data<std::int32_t>(), t.numel(), out.begin());
  } else {
    throw InputError("expected an int32/int64 tensor, got " + std::string(dtype_name(t.dtype())));
  }
  return out;
}

int normalize_axis(const Node& node, std::int64_t axis, int rank) {
  if (axis < -rank || axis >= std::max(rank, 1))
    fail(node, "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

Shape broadcast_shapes(const Node& node, const Shape& a, const Shape& b) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      fail(node, "shapes " + shape_to_string(a) + " and " + shape_to_string(b) + " cannot be broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

ValueMeta meta_like(const ValueMeta& like, Shape shape) {
  return ValueMeta{like.dtype, like.declared, std::move(shape), nullptr};
}

ValueMeta meta_of(DType declared, Shape shape) {
  return ValueMeta{storage_type(declared), declared, std::move(shape), nullptr};
}

}  // namespace qeval::eval
