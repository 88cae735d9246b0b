// Reduce ops (axes as attribute or input), ArgMax, ArgMin.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "eval/exec/ops/families.h"

namespace qeval::eval {

namespace {

template <class T>
bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return std::isnan(v);
  else return false;
}

// A real result (double) -> T: floats round, integers truncate toward zero (NaN gives 0,
// out of range saturates; ONNX leaves both undefined).
template <class T, class A>
T to_output(A v) {
  if constexpr (std::is_floating_point_v<T> || std::is_integral_v<A>) {
    return static_cast<T>(v);
  } else {
    if (std::isnan(v)) return T(0);
    const double t = std::trunc(double(v));
    if (t <= double(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
    if (t >= double(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
    return static_cast<T>(t);
  }
}

// ---- the reduction walk ----------------------------------------------------------------------

// The input as alternating groups of kept and reduced dimensions (unit dimensions dropped,
// neighbours of one kind merged), row-major; the walk visits every input element once in memory
// order and adds it into its output's accumulator.
struct Layout {
  std::vector<std::int64_t> counts;
  std::vector<bool> reduced;
  std::vector<std::int64_t> x_strides;    // dense input strides of the groups
  std::vector<std::int64_t> acc_strides;  // output strides of the groups (0 where reduced)
  std::int64_t outputs = 1, reduce_count = 1;
};

Layout make_layout(const Shape& s, const std::vector<bool>& mask) {
  Layout l;
  for (std::size_t d = 0; d < s.size(); ++d) {
    (mask[d] ? l.reduce_count : l.outputs) *= s[d];
    if (s[d] == 1) continue;
    if (!l.counts.empty() && l.reduced.back() == mask[d]) {
      l.counts.back() *= s[d];
    } else {
      l.counts.push_back(s[d]);
      l.reduced.push_back(mask[d]);
    }
  }
  const std::size_t r = l.counts.size();
  l.x_strides.assign(r, 1);
  l.acc_strides.assign(r, 0);
  std::int64_t xs = 1, as = 1;
  for (std::size_t d = r; d-- > 0;) {
    l.x_strides[d] = xs;
    xs *= l.counts[d];
    if (!l.reduced[d]) {
      l.acc_strides[d] = as;
      as *= l.counts[d];
    }
  }
  return l;
}

// Reduces a contiguous run into `a`. Long runs go through 8 independent partial accumulators
// (started from ident(a), combined in a fixed order), so additions do not wait on each other and
// the compiler can vectorise; the order is fixed by n alone, so results stay deterministic.
template <class T, class A, class F, class I, class C>
void reduce_run(const T* px, std::int64_t n, A& a, const F& f, const I& ident, const C& combine) {
  constexpr std::int64_t kLanes = 8;
  std::int64_t j = 0;
  if (n >= 4 * kLanes) {
    A lane[kLanes];
    for (auto& p : lane) p = ident(a);
    for (; j + kLanes <= n; j += kLanes)
      for (std::int64_t k = 0; k < kLanes; ++k) f(lane[k], px[j + k]);
    for (const auto& p : lane) combine(a, p);
  }
  for (; j < n; ++j) f(a, px[j]);
}

// Walks rows [b, e) of the first group: f(acc[output of x], x).
template <class T, class A, class F, class I, class C>
void walk(const T* x, A* acc, const Layout& l, std::int64_t b, std::int64_t e, const F& f, const I& ident,
          const C& combine) {
  const int r = int(l.counts.size());
  if (r == 0) {
    f(acc[0], x[0]);
    return;
  }
  x += b * l.x_strides[0];
  acc += b * l.acc_strides[0];
  std::vector<std::int64_t> counts = l.counts;
  counts[0] = e - b;
  const std::int64_t n = counts.back();
  std::int64_t rows = 1;
  for (int d = 0; d < r - 1; ++d) rows *= counts[std::size_t(d)];
  std::vector<std::int64_t> idx(std::size_t(r), 0);
  std::int64_t xo = 0, ao = 0;
  const bool inner_reduced = l.reduced.back();
  for (std::int64_t row = 0; row < rows; ++row) {
    const T* px = x + xo;
    if (inner_reduced) {
      A a = acc[ao];
      reduce_run(px, n, a, f, ident, combine);
      acc[ao] = a;
    } else {
      A* pa = acc + ao;
      for (std::int64_t j = 0; j < n; ++j) f(pa[j], px[j]);
    }
    for (int d = r - 2; d >= 0; --d) {
      const std::size_t du = std::size_t(d);
      xo += l.x_strides[du];
      ao += l.acc_strides[du];
      if (++idx[du] < counts[du]) break;
      xo -= l.x_strides[du] * counts[du];
      ao -= l.acc_strides[du] * counts[du];
      idx[du] = 0;
    }
  }
}

// The whole walk, in parallel where that cannot change results: split over the outermost group
// when it is kept (each output is still accumulated in one order), or, for a reduction of
// everything, in fixed-size chunks (independent of the thread count) whose partial results are
// combined in order, which also bounds rounding drift as a pairwise sum would. `acc` holds each
// output's starting value; ident(a) is the neutral start of a partial result for it.
template <class T, class A, class F, class I, class C>
void walk_all(const T* x, A* acc, const Layout& l, const F& f, const I& ident, const C& combine) {
  constexpr std::int64_t kChunk = std::int64_t(1) << 15;
  const std::int64_t total = l.outputs * l.reduce_count;
  if (l.counts.empty()) return walk(x, acc, l, 0, 1, f, ident, combine);
  if (l.counts.size() == 1 && l.reduced[0] && total > 2 * kChunk) {
    const std::int64_t chunks = (total + kChunk - 1) / kChunk;
    std::vector<A> partial(std::size_t(chunks), ident(acc[0]));
    tbb::parallel_for(std::int64_t(0), chunks, [&](std::int64_t c) {
      const std::int64_t b = c * kChunk, e = std::min(total, b + kChunk);
      reduce_run(x + b, e - b, partial[std::size_t(c)], f, ident, combine);
    });
    for (const A& p : partial) combine(acc[0], p);
    return;
  }
  if (!l.reduced[0] && l.counts[0] > 1 && total >= 4 * kChunk) {
    const std::int64_t per = total / l.counts[0];
    const std::int64_t grain = std::max<std::int64_t>(1, kChunk / std::max<std::int64_t>(per, 1));
    tbb::parallel_for(
        tbb::blocked_range<std::int64_t>(0, l.counts[0], std::size_t(grain)),
        [&](const tbb::blocked_range<std::int64_t>& r) { walk(x, acc, l, r.begin(), r.end(), f, ident, combine); });
    return;
  }
  walk(x, acc, l, 0, l.counts[0], f, ident, combine);
}

// ---- Reduce* ---------------------------------------------------------------------------------

enum class Reduce { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kSumSquare, kLogSum, kLogSumExp };

// Axes: the 'axes' attribute up to opset 12 (ReduceSum) or 17 (the others), then the optional
// 'axes' input with 'noop_with_empty_axes'. No axes: reduce everything (or, with
// noop_with_empty_axes, pass the input through).
class ReduceOp final : public Op {
 public:
  ReduceOp(const Node& node, Reduce kind, bool axes_input)
      : node_(node),
        kind_(kind),
        axes_input_(axes_input),
        keepdims_(node.get_int("keepdims", 1) != 0),
        noop_(axes_input && node.get_int("noop_with_empty_axes", 0) != 0) {
    if (!axes_input && node.input_count() > 1)
      fail(node, "takes axes as an attribute at opset " + std::to_string(node.opset) + ", not as an input");
    if (axes_input && node.has("axes"))
      fail(node, "takes axes as an input at opset " + std::to_string(node.opset) + ", not as an attribute");
  }
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    const DType t = in[0]->dtype;
    if (t == DType::kBool && kind_ != Reduce::kMax && kind_ != Reduce::kMin)
      fail(node_, "bool input is only supported by ReduceMax/ReduceMin");
    visit_storage(t, [](auto) {});  // unsupported storage types fail here, at plan time
    std::vector<std::int64_t> axes;
    if (axes_input_ && in.size() > 1 && in[1]) {
      if (!in[1]->value)
        throw UnsupportedError(node_.describe() + ": input 1 ('" + node_.inputs[1] +
                               "', axes) depends on runtime data; qeval needs it at plan time");
      if (in[1]->dtype != DType::kInt64) fail(node_, "axes must be int64, got " + type_name(in[1]->declared));
      axes = to_int64s(*in[1]->value);
    }
    const Shape& s = in[0]->shape;
    auto mask = reduce_mask(s, axes);
    if (!mask) return {meta_like(*in[0], s)};
    Shape out;
    for (std::size_t d = 0; d < s.size(); ++d) {
      if (!(*mask)[d]) out.push_back(s[d]);
      else if (keepdims_) out.push_back(1);
    }
    return {meta_like(*in[0], out)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    std::vector<std::int64_t> axes;
    if (axes_input_ && in.size() > 1 && in[1]) axes = to_int64s(*in[1]);
    auto mask = reduce_mask(x.shape(), axes);
    if (!mask) {
      if (x.nbytes()) std::memcpy(out[0]->raw(), x.raw(), x.nbytes());
      return;
    }
    const Layout l = make_layout(x.shape(), *mask);
    visit_storage(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_floating_point_v<T>) {
        compute<T, double>(x.data<T>(), out[0]->data<T>(), l);
      } else if (kind_ == Reduce::kL2 || kind_ == Reduce::kLogSum || kind_ == Reduce::kLogSumExp) {
        compute<T, double>(x.data<T>(), out[0]->data<T>(), l);
      } else {
        // Exact integer accumulation (wrapping in the output type, as ONNX Runtime does).
        using I = std::conditional_t<std::is_signed_v<T>, std::int64_t, std::uint64_t>;
        compute<T, I>(x.data<T>(), out[0]->data<T>(), l);
      }
    });
  }

  std::vector<std::size_t> constant_inputs() const override {
    if (!axes_input_) return {};
    return {1};
  }

 private:
  // Which axes reduce; nullopt for the no-op (empty axes with noop_with_empty_axes).
  std::optional<std::vector<bool>> reduce_mask(const Shape& s, std::vector<std::int64_t> axes) const {
    const int rank = int(s.size());
    if (!axes_input_) axes = node_.get_ints("axes");
    if (axes.empty() && noop_) return std::nullopt;
    std::vector<bool> mask(s.size(), axes.empty());
    for (auto a : axes) {
      if (a < -rank || a >= rank)
        fail(node_, "axis " + std::to_string(a) + " is out of range for input shape " + shape_to_string(s));
      const std::size_t d = std::size_t(a < 0 ? a + rank : a);
      if (mask[d]) fail(node_, "axes has axis " + std::to_string(a) + " more than once");
      mask[d] = true;
    }
    return mask;
  }

  // The value of a reduction over no elements (ONNX 18: the identity of the operation; Mean is
  // 0/0).
  template <class T>
  T empty_value() const {
    constexpr bool fp = std::is_floating_point_v<T>;
    constexpr T inf = fp ? std::numeric_limits<T>::infinity() : T(0);
    switch (kind_) {
      case Reduce::kProd: return T(1);
      case Reduce::kMax: return fp ? -inf : std::numeric_limits<T>::lowest();
      case Reduce::kMin: return fp ? inf : std::numeric_limits<T>::max();
      case Reduce::kLogSum:
      case Reduce::kLogSumExp: return fp ? -inf : T(0);
      case Reduce::kMean: return fp ? std::numeric_limits<T>::quiet_NaN() : T(0);
      default: return T(0);
    }
  }

  template <class T, class A>
  void compute(const T* x, T* y, const Layout& l) const {
    const std::int64_t m = l.outputs, n = l.reduce_count;
    if (m == 0) return;
    if (n == 0) {
      std::fill_n(y, m, empty_value<T>());
      return;
    }
    auto sum = [](A& a, const A& b) { a += b; };
    auto zero = [](const A&) { return A(0); };
    auto max = [](auto& a, auto v) {
      if (v > a || is_nan(v)) a = A(v);
    };
    auto min = [](auto& a, auto v) {
      if (v < a || is_nan(v)) a = A(v);
    };
    std::vector<A> acc(std::size_t(m), A(0));
    auto finish = [&](auto fn) {
      for (std::int64_t o = 0; o < m; ++o) y[o] = to_output<T>(fn(acc[std::size_t(o)]));
    };
    auto same = [](A a) { return a; };
    switch (kind_) {
      case Reduce::kSum:
      case Reduce::kMean:
      case Reduce::kLogSum:
        walk_all(
            x, acc.data(), l, [](A& a, T v) { a += A(v); }, zero, sum);
        if (kind_ == Reduce::kMean) return finish([n](A a) { return a / A(n); });
        if (kind_ == Reduce::kLogSum) return finish([](A a) { return std::log(a); });
        return finish(same);
      case Reduce::kL1:
        walk_all(
            x, acc.data(), l,
            [](A& a, T v) {
              if constexpr (std::is_signed_v<T> || std::is_floating_point_v<T>) a += v < 0 ? -A(v) : A(v);
              else a += A(v);
            },
            zero, sum);
        return finish(same);
      case Reduce::kL2:
      case Reduce::kSumSquare:
        walk_all(
            x, acc.data(), l, [](A& a, T v) { a += A(v) * A(v); }, zero, sum);
        if (kind_ == Reduce::kL2) return finish([](A a) { return std::sqrt(a); });
        return finish(same);
      case Reduce::kProd:
        std::fill(acc.begin(), acc.end(), A(1));
        walk_all(
            x, acc.data(), l, [](A& a, T v) { a *= A(v); }, [](const A&) { return A(1); },
            [](A& a, const A& b) { a *= b; });
        return finish(same);
      case Reduce::kMax:
      case Reduce::kMin: {
        const A init = A(empty_value<T>());  // -inf (lowest) for Max, +inf (max) for Min
        auto start = [init](const A&) { return init; };
        std::fill(acc.begin(), acc.end(), init);
        if (kind_ == Reduce::kMax) walk_all(x, acc.data(), l, max, start, max);
        else walk_all(x, acc.data(), l, min, start, min);
        return finish(same);
      }
      case Reduce::kLogSumExp: {
        // max first, then sum(exp(x - max)): no overflow for large inputs.
        if constexpr (std::is_floating_point_v<A>) {
          const A lowest = -std::numeric_limits<A>::infinity();
          std::fill(acc.begin(), acc.end(), lowest);
          walk_all(
              x, acc.data(), l, max, [lowest](const A&) { return lowest; }, max);
          struct State {
            A max, sum;
          };
          std::vector<State> st(static_cast<std::size_t>(m));
          for (std::int64_t o = 0; o < m; ++o) st[std::size_t(o)] = {acc[std::size_t(o)], A(0)};
          walk_all(
              x, st.data(), l, [](State& s, T v) { s.sum += std::exp(A(v) - s.max); },
              [](const State& s) {
                return State{s.max, A(0)};
              },
              [](State& s, const State& p) { s.sum += p.sum; });
          for (std::int64_t o = 0; o < m; ++o) {
            const State& s = st[std::size_t(o)];
            y[o] = to_output<T>(std::isfinite(s.max) ? s.max + std::log(s.sum) : s.max);
          }
        }
        return;
      }
    }
  }

  Node node_;
  Reduce kind_;
  bool axes_input_, keepdims_, noop_;
};

// ---- ArgMax, ArgMin --------------------------------------------------------------------------

// select_last_index from opset 12. NaN wins over numbers (numpy's argmax/argmin convention).
class ArgOp final : public Op {
 public:
  ArgOp(const Node& node, bool is_max)
      : node_(node),
        max_(is_max),
        axis_(node.get_int("axis", 0)),
        keepdims_(node.get_int("keepdims", 1) != 0),
        last_(node.opset >= 12 && node.get_int("select_last_index", 0) != 0) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    if (in[0]->dtype == DType::kBool) fail(node_, "bool input is not supported");
    visit_storage(in[0]->dtype, [](auto) {});
    const Shape& s = in[0]->shape;
    if (s.empty()) fail(node_, "input must have rank >= 1");
    const std::size_t axis = std::size_t(normalize_axis(node_, axis_, int(s.size())));
    if (s[axis] == 0)
      fail(node_,
           "cannot take the arg of an empty axis " + std::to_string(axis) + " (shape " + shape_to_string(s) + ")");
    Shape out;
    for (std::size_t d = 0; d < s.size(); ++d) {
      if (d != axis) out.push_back(s[d]);
      else if (keepdims_) out.push_back(1);
    }
    return {meta_of(DType::kInt64, out)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    const std::size_t axis = std::size_t(normalize_axis(node_, axis_, x.rank()));
    const std::int64_t n = x.shape()[axis];
    std::int64_t inner = 1;
    for (std::size_t d = axis + 1; d < x.shape().size(); ++d) inner *= x.shape()[d];
    const std::int64_t outer = n * inner == 0 ? 0 : x.numel() / (n * inner);
    std::int64_t* y = out[0]->data<std::int64_t>();
    visit_storage(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, bool>) {
        const T* px = x.data<T>();
        if (max_) {
          if (last_) scan<T, true, true>(px, y, outer, n, inner);
          else scan<T, true, false>(px, y, outer, n, inner);
        } else {
          if (last_) scan<T, false, true>(px, y, outer, n, inner);
          else scan<T, false, false>(px, y, outer, n, inner);
        }
      }
    });
  }

 private:
  template <bool Max, bool Last, class T>
  static bool better(T v, T best) {
    if constexpr (Last) {
      if (is_nan(best)) return is_nan(v);
      return is_nan(v) || (Max ? v >= best : v <= best);
    } else {
      return (Max ? v > best : v < best) || (is_nan(v) && !is_nan(best));
    }
  }
  template <class T, bool Max, bool Last>
  static void scan(const T* px, std::int64_t* y, std::int64_t outer, std::int64_t n, std::int64_t inner) {
    auto body = [&](std::int64_t ob, std::int64_t oe) {
      if (inner == 1) {
        for (std::int64_t o = ob; o < oe; ++o) {
          const T* base = px + o * n;
          T best = base[0];
          std::int64_t at = 0;
          for (std::int64_t k = 1; k < n; ++k)
            if (better<Max, Last>(base[k], best)) {
              best = base[k];
              at = k;
            }
          y[o] = at;
        }
        return;
      }
      std::vector<T> best(static_cast<std::size_t>(inner));
      for (std::int64_t o = ob; o < oe; ++o) {
        const T* base = px + o * n * inner;
        std::int64_t* yo = y + o * inner;
        std::copy_n(base, inner, best.begin());
        std::fill_n(yo, inner, std::int64_t(0));
        for (std::int64_t k = 1; k < n; ++k)
          for (std::int64_t j = 0; j < inner; ++j)
            if (better<Max, Last>(base[k * inner + j], best[std::size_t(j)])) {
              best[std::size_t(j)] = base[k * inner + j];
              yo[j] = k;
            }
      }
    };
    if (outer > 1 && outer * n * inner >= (std::int64_t(1) << 18)) {
      const std::int64_t grain =
          std::max<std::int64_t>(1, (std::int64_t(1) << 15) / std::max<std::int64_t>(1, n * inner));
      tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, outer, std::size_t(grain)),
                        [&](const tbb::blocked_range<std::int64_t>& r) { body(r.begin(), r.end()); });
    } else {
      body(0, outer);
    }
  }

  Node node_;
  bool max_;
  std::int64_t axis_;
  bool keepdims_, last_;
};

template <Reduce K, bool AxesInput>
std::unique_ptr<Op> make_reduce(const Node& n) {
  return std::make_unique<ReduceOp>(n, K, AxesInput);
}

template <Reduce K>
void add_reduce(std::vector<OpSchema>& out, std::string_view name, int axes_input_since) {
  out.push_back({name, "", 1, axes_input_since - 1, make_reduce<K, false>});
  out.push_back({name, "", axes_input_since, kMaxOpset, make_reduce<K, true>});
}

}  // namespace

void register_reduce_ops(std::vector<OpSchema>& out) {
  add_reduce<Reduce::kSum>(out, "ReduceSum", 13);  // ReduceSum took axes as an input first
  add_reduce<Reduce::kMean>(out, "ReduceMean", 18);
  add_reduce<Reduce::kMax>(out, "ReduceMax", 18);
  add_reduce<Reduce::kMin>(out, "ReduceMin", 18);
  add_reduce<Reduce::kProd>(out, "ReduceProd", 18);
  add_reduce<Reduce::kL1>(out, "ReduceL1", 18);
  add_reduce<Reduce::kL2>(out, "ReduceL2", 18);
  add_reduce<Reduce::kSumSquare>(out, "ReduceSumSquare", 18);
  add_reduce<Reduce::kLogSum>(out, "ReduceLogSum", 18);
  add_reduce<Reduce::kLogSumExp>(out, "ReduceLogSumExp", 18);
  // select_last_index from opset 12.
  auto arg_max = [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<ArgOp>(n, true); };
  auto arg_min = [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<ArgOp>(n, false); };
  out.push_back({"ArgMax", "", 1, 11, arg_max});
  out.push_back({"ArgMax", "", 12, kMaxOpset, arg_max});
  out.push_back({"ArgMin", "", 1, 11, arg_min});
  out.push_back({"ArgMin", "", 12, kMaxOpset, arg_min});
}

}  // namespace qeval::eval
