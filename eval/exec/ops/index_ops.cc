// Indexing ops: Slice, Gather, GatherElements.
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

// ---- Slice -----------------------------------------------------------------------------------

// Starts/ends/axes as attributes before opset 10; from 10 on as inputs, with optional steps.
class SliceOp final : public Op {
 public:
  explicit SliceOp(const Node& node) : node_(node) {
    for (const char* attr : {"starts", "ends", "axes"}) check_form(node, attr, 1, 10);
  }
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    auto v = view(in[0]->shape, [&](std::size_t i, const char* what) -> std::optional<std::vector<std::int64_t>> {
      if (i >= in.size() || !in[i]) return std::nullopt;
      return int_list(node_, plan_time_input(node_, in, i, what), what);
    });
    return {meta_like(*in[0], v.counts)};
  }
  std::optional<StridedView> strided_view(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) return std::nullopt;
    return view(in[0]->shape, [&](std::size_t i, const char* what) -> std::optional<std::vector<std::int64_t>> {
      if (i >= in.size() || !in[i]) return std::nullopt;
      return int_list(node_, plan_time_input(node_, in, i, what), what);
    });
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    auto v = view(in[0]->shape(), [&](std::size_t i, const char*) -> std::optional<std::vector<std::int64_t>> {
      if (i >= in.size() || !in[i]) return std::nullopt;
      return to_int64s(*in[i]);
    });
    copy_view(in[0]->raw(), out[0]->raw(), dtype_size(in[0]->dtype()), std::move(v));
  }

  std::vector<std::size_t> constant_inputs() const override {
    if (node_.opset < 10) return {};
    return {1, 2, 3, 4};
  }

 private:
  template <class Get>
  StridedView view(const Shape& s, Get get) const {
    const int rank = int(s.size());
    std::vector<std::int64_t> starts, ends, axes, steps;
    bool has_axes = false;
    if (node_.opset < 10) {
      if (!node_.has("starts") || !node_.has("ends")) fail(node_, "needs 'starts' and 'ends' attributes");
      starts = node_.get_ints("starts");
      ends = node_.get_ints("ends");
      has_axes = node_.has("axes");
      axes = node_.get_ints("axes");
    } else {
      auto st = get(1, "starts");
      auto en = get(2, "ends");
      if (!st || !en) fail(node_, "needs 'starts' and 'ends' inputs");
      starts = *st;
      ends = *en;
      if (auto a = get(3, "axes")) {
        has_axes = true;
        axes = *a;
      }
      if (auto p = get(4, "steps")) steps = *p;
    }
    if (ends.size() != starts.size())
      fail(node_, "starts has " + std::to_string(starts.size()) + " values, ends " + std::to_string(ends.size()));
    if (!has_axes)
      for (std::size_t i = 0; i < starts.size(); ++i) axes.push_back(std::int64_t(i));
    if (axes.size() != starts.size())
      fail(node_, "axes has " + std::to_string(axes.size()) + " values, starts " + std::to_string(starts.size()));
    if (steps.empty()) steps.assign(starts.size(), 1);
    if (steps.size() != starts.size())
      fail(node_, "steps has " + std::to_string(steps.size()) + " values, starts " + std::to_string(starts.size()));
    auto norm = unique_axes(node_, axes, rank, "axes");

    const auto st = dense_strides(s);
    StridedView v;
    v.counts = s;
    v.strides = st;
    for (std::size_t i = 0; i < norm.size(); ++i) {
      const std::size_t a = std::size_t(norm[i]);
      const std::int64_t dim = s[a], step = steps[i];
      if (step == 0) fail(node_, "step for axis " + std::to_string(a) + " is 0");
      std::int64_t b = starts[i], e = ends[i];
      if (b < 0) b += dim;
      if (e < 0) e += dim;
      std::int64_t count;
      if (dim == 0) {
        count = 0;
      } else if (step > 0) {
        b = std::clamp<std::int64_t>(b, 0, dim);
        e = std::clamp<std::int64_t>(e, 0, dim);
        count = e > b ? (e - b + step - 1) / step : 0;
      } else {
        // Counting down: start clamps to [0, dim-1], end to [-1, dim-1] (-1: through index 0).
        b = std::clamp<std::int64_t>(b, 0, dim - 1);
        e = std::clamp<std::int64_t>(e, -1, dim - 1);
        count = b > e ? (b - e + (-step) - 1) / (-step) : 0;
      }
      v.counts[a] = count;
      v.strides[a] = st[a] * step;
      if (count > 0) v.base += b * st[a];
    }
    return v;
  }
  Node node_;
};

// ---- Gather, GatherElements ------------------------------------------------------------------

std::int64_t checked_index(const Node& node, std::int64_t idx, std::int64_t dim, int axis) {
  if (idx < -dim || idx >= dim)
    fail(node, "index " + std::to_string(idx) + " is out of range [" + std::to_string(-dim) + ", " +
                   std::to_string(dim - 1) + "] for axis " + std::to_string(axis));
  return idx < 0 ? idx + dim : idx;
}

class GatherOp final : public Op {
 public:
  explicit GatherOp(const Node& node) : node_(node), axis_(node.get_int("axis", 0)) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 2 || !in[0] || !in[1]) fail(node_, "needs data and indices");
    check_index_type(node_, *in[1]);
    const Shape& s = in[0]->shape;
    if (s.empty()) fail(node_, "data must have rank >= 1");
    const std::size_t axis = std::size_t(normalize_axis(node_, axis_, int(s.size())));
    Shape out(s.begin(), s.begin() + std::ptrdiff_t(axis));
    out.insert(out.end(), in[1]->shape.begin(), in[1]->shape.end());
    out.insert(out.end(), s.begin() + std::ptrdiff_t(axis) + 1, s.end());
    return {meta_like(*in[0], out)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    const int axis = normalize_axis(node_, axis_, x.rank());
    const std::int64_t dim = x.shape()[std::size_t(axis)];
    auto idx = to_int64s(*in[1]);
    for (auto& i : idx) i = checked_index(node_, i, dim, axis);
    const std::size_t es = dtype_size(x.dtype());
    const std::int64_t outer = prod(x.shape(), 0, std::size_t(axis));
    const std::size_t inner = std::size_t(prod(x.shape(), std::size_t(axis) + 1, x.shape().size())) * es;
    const std::int64_t n = std::int64_t(idx.size());
    const std::byte* src = x.raw();
    std::byte* dst = out[0]->raw();
    parallel_items(outer * n, std::int64_t(inner / es), [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t t = b; t < e; ++t) {
        const std::int64_t o = t / n, k = t % n;
        std::memcpy(dst + std::size_t(t) * inner, src + std::size_t(o * dim + idx[std::size_t(k)]) * inner, inner);
      }
    });
  }

 private:
  Node node_;
  std::int64_t axis_;
};

class GatherElementsOp final : public Op {
 public:
  explicit GatherElementsOp(const Node& node) : node_(node), axis_(node.get_int("axis", 0)) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 2 || !in[0] || !in[1]) fail(node_, "needs data and indices");
    check_index_type(node_, *in[1]);
    const Shape& s = in[0]->shape;
    const Shape& is = in[1]->shape;
    if (s.empty()) fail(node_, "data must have rank >= 1");
    const int axis = normalize_axis(node_, axis_, int(s.size()));
    bool ok = is.size() == s.size();
    for (std::size_t d = 0; ok && d < s.size(); ++d) ok = int(d) == axis || is[d] <= s[d];
    if (!ok)
      fail(node_, "indices shape " + shape_to_string(is) + " must have the data's rank and fit in data shape " +
                      shape_to_string(s) + " outside axis " + std::to_string(axis));
    return {meta_like(*in[0], is)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    const int axis = normalize_axis(node_, axis_, x.rank());
    const Shape& is = in[1]->shape();
    const auto idx = to_int64s(*in[1]);
    const auto xs = dense_strides(x.shape());
    const std::int64_t dim = x.shape()[std::size_t(axis)];
    const int r = x.rank();
    with_element_size(dtype_size(x.dtype()), [&](auto tag) {
      using T = decltype(tag);
      const T* src = reinterpret_cast<const T*>(x.raw());
      T* dst = reinterpret_cast<T*>(out[0]->raw());
      std::vector<std::int64_t> pos(std::size_t(r), 0);
      std::int64_t base = 0;  // data offset of pos with the axis coordinate left out
      for (std::size_t i = 0; i < idx.size(); ++i) {
        dst[i] = src[base + checked_index(node_, idx[i], dim, axis) * xs[std::size_t(axis)]];
        for (int d = r - 1; d >= 0; --d) {
          const std::size_t du = std::size_t(d);
          if (d != axis) base += xs[du];
          if (++pos[du] < is[du]) break;
          if (d != axis) base -= xs[du] * is[du];
          pos[du] = 0;
        }
      }
    });
  }

 private:
  Node node_;
  std::int64_t axis_;
};

}  // namespace

void register_index_ops(std::vector<OpSchema>& out) {
  out.push_back({"Slice", "", 1, 9, factory<SliceOp>()});  // attributes, no steps
  out.push_back({"Slice", "", 10, kMaxOpset, factory<SliceOp>()});
  out.push_back({"Gather", "", 1, kMaxOpset, factory<GatherOp>()});
  out.push_back({"GatherElements", "", 11, kMaxOpset, factory<GatherElementsOp>()});
}

}  // namespace qeval::eval
