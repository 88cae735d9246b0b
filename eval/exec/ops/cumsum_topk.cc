// CumSum and TopK.
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

// ---- CumSum, TopK ----------------------------------------------------------------------------

class CumSumOp final : public Op {
 public:
  explicit CumSumOp(const Node& node)
      : node_(node), exclusive_(node.get_int("exclusive", 0) != 0), reverse_(node.get_int("reverse", 0) != 0) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 2 || !in[0] || !in[1]) fail(node_, "needs x and axis");
    const DType t = in[0]->dtype;
    if (t == DType::kBool || t == DType::kInt8 || t == DType::kUInt8 || t == DType::kInt16 || t == DType::kUInt16)
      fail(node_, "type " + type_name(in[0]->declared) + " is not one of float, double, (u)int32, (u)int64");
    check_index_type(node_, *in[1]);
    if (shape_numel(in[1]->shape) != 1)
      fail(node_, "axis must be a scalar, got shape " + shape_to_string(in[1]->shape));
    if (in[1]->value) normalize_axis(node_, to_int64s(*in[1]->value)[0], int(in[0]->shape.size()));
    return {meta_like(*in[0], in[0]->shape)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    const std::size_t axis = std::size_t(normalize_axis(node_, to_int64s(*in[1])[0], x.rank()));
    const std::int64_t n = x.rank() ? x.shape()[axis] : 1;
    const std::int64_t inner = prod(x.shape(), axis + 1, x.shape().size());
    const std::int64_t outer = n * inner == 0 ? 0 : x.numel() / (n * inner);
    visit_storage(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, bool>) {
        using Acc = std::conditional_t<std::is_floating_point_v<T>, double, T>;
        const T* src = x.data<T>();
        T* dst = out[0]->data<T>();
        std::vector<Acc> acc(static_cast<std::size_t>(inner));
        for (std::int64_t o = 0; o < outer; ++o) {
          std::fill(acc.begin(), acc.end(), Acc(0));
          for (std::int64_t step = 0; step < n; ++step) {
            const std::int64_t k = reverse_ ? n - 1 - step : step;
            const std::int64_t base = (o * n + k) * inner;
            for (std::int64_t j = 0; j < inner; ++j) {
              if (exclusive_) {
                dst[base + j] = T(acc[std::size_t(j)]);
                acc[std::size_t(j)] += src[base + j];
              } else {
                acc[std::size_t(j)] += src[base + j];
                dst[base + j] = T(acc[std::size_t(j)]);
              }
            }
          }
        }
      }
    });
  }

 private:
  Node node_;
  bool exclusive_, reverse_;
};

// TopK: k as an attribute before opset 10, as an input from 10; 'largest'/'sorted' from 11. Ties
// keep the lower index first, as ONNX specifies; NaN counts as larger than any number.
class TopKOp final : public Op {
 public:
  explicit TopKOp(const Node& node)
      : node_(node), axis_(node.get_int("axis", -1)), largest_(node.opset < 11 || node.get_int("largest", 1) != 0) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    if (in[0]->dtype == DType::kBool) fail(node_, "bool input is not supported by TopK");
    const Shape& s = in[0]->shape;
    const int axis = normalize_axis(node_, axis_, int(s.size()));
    if (s.empty()) fail(node_, "input must have rank >= 1");
    std::int64_t k;
    if (node_.opset < 10) {
      if (!node_.has("k")) fail(node_, "missing attribute 'k'");
      k = node_.get_int("k", 0);
    } else {
      auto v = int_list(node_, plan_time_input(node_, in, 1, "K"), "K");
      if (v.size() != 1) fail(node_, "K must hold one value, got " + std::to_string(v.size()));
      k = v[0];
    }
    if (k < 0 || k > s[std::size_t(axis)])
      fail(node_, "k = " + std::to_string(k) + " is out of range [0, " + std::to_string(s[std::size_t(axis)]) +
                      "] for axis " + std::to_string(axis) + " of shape " + shape_to_string(s));
    Shape out = s;
    out[std::size_t(axis)] = k;
    return {meta_like(*in[0], out), meta_of(DType::kInt64, out)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    if (!out[0] && !out[1]) return;
    const std::size_t axis = std::size_t(normalize_axis(node_, axis_, x.rank()));
    const Shape& os = out[0] ? out[0]->shape() : out[1]->shape();
    const std::int64_t n = x.shape()[axis], k = os[axis];
    const std::int64_t inner = prod(x.shape(), axis + 1, x.shape().size());
    const std::int64_t outer = n * inner == 0 ? 0 : x.numel() / (n * inner);
    visit_storage(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, bool>) {
        const T* src = x.data<T>();
        T* values = out[0] ? out[0]->data<T>() : nullptr;
        std::int64_t* indices = out[1] ? out[1]->data<std::int64_t>() : nullptr;
        auto before = [&](std::int64_t a, std::int64_t b, const T* p) {  // a strictly precedes b
          const T va = p[a * inner], vb = p[b * inner];
          if constexpr (std::is_floating_point_v<T>) {
            const bool na = std::isnan(va), nb = std::isnan(vb);
            if (na || nb) return na && !nb ? largest_ : (!na && nb ? !largest_ : a < b);
          }
          if (va != vb) return largest_ ? va > vb : va < vb;
          return a < b;
        };
        std::vector<std::int64_t> order(static_cast<std::size_t>(n));
        for (std::int64_t o = 0; o < outer; ++o)
          for (std::int64_t j = 0; j < inner; ++j) {
            const T* p = src + o * n * inner + j;
            std::iota(order.begin(), order.end(), std::int64_t(0));
            std::partial_sort(order.begin(), order.begin() + k, order.end(),
                              [&](std::int64_t a, std::int64_t b) { return before(a, b, p); });
            for (std::int64_t r = 0; r < k; ++r) {
              const std::int64_t at = (o * k + r) * inner + j;
              if (values) values[at] = p[order[std::size_t(r)] * inner];
              if (indices) indices[at] = order[std::size_t(r)];
            }
          }
      }
    });
  }

  std::vector<std::size_t> constant_inputs() const override {
    if (node_.opset < 10) return {};
    return {1};
  }

 private:
  Node node_;
  std::int64_t axis_;
  bool largest_;
};

}  // namespace

void register_cumsum_topk_ops(std::vector<OpSchema>& out) {
  out.push_back({"CumSum", "", 11, kMaxOpset, factory<CumSumOp>()});
  // TopK: k attribute (1-9), k input (10), + largest/sorted (11+).
  out.push_back({"TopK", "", 1, 9, factory<TopKOp>()});
  out.push_back({"TopK", "", 10, 10, factory<TopKOp>()});
  out.push_back({"TopK", "", 11, kMaxOpset, factory<TopKOp>()});
}

}  // namespace qeval::eval
