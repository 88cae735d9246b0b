// Data layout ops: Transpose, Concat, Split, Expand, Tile, Pad, Trilu.
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

// ---- Transpose -------------------------------------------------------------------------------

class TransposeOp final : public Op {
 public:
  explicit TransposeOp(const Node& node) : node_(node) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    const Shape& s = in[0]->shape;
    auto perm = permutation(s.size());
    Shape out(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) out[i] = s[std::size_t(perm[i])];
    return {meta_like(*in[0], out)};
  }
  std::optional<StridedView> strided_view(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) return std::nullopt;
    return view(in[0]->shape);
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    copy_view(x.raw(), out[0]->raw(), dtype_size(x.dtype()), view(x.shape()));
  }

 private:
  StridedView view(const Shape& s) const {
    const auto perm = permutation(s.size());
    const auto st = dense_strides(s);
    StridedView v;
    for (auto p : perm) {
      v.counts.push_back(s[std::size_t(p)]);
      v.strides.push_back(st[std::size_t(p)]);
    }
    return v;
  }
  std::vector<std::int64_t> permutation(std::size_t rank) const {
    std::vector<std::int64_t> perm;
    if (node_.has("perm")) {
      perm = node_.get_ints("perm");
    } else {
      for (std::size_t i = rank; i-- > 0;) perm.push_back(std::int64_t(i));
    }
    std::vector<bool> seen(rank, false);
    bool ok = perm.size() == rank;
    for (std::size_t i = 0; ok && i < perm.size(); ++i) {
      ok = perm[i] >= 0 && perm[i] < std::int64_t(rank) && !seen[std::size_t(perm[i])];
      if (ok) seen[std::size_t(perm[i])] = true;
    }
    if (!ok) {
      std::string p;
      for (auto a : perm) p += (p.empty() ? "" : ", ") + std::to_string(a);
      fail(node_, "perm [" + p + "] is not a permutation of the input's " + std::to_string(rank) + " axes");
    }
    return perm;
  }
  Node node_;
};

// ---- Concat, Split ---------------------------------------------------------------------------

class ConcatOp final : public Op {
 public:
  explicit ConcatOp(const Node& node) : node_(node) {
    // Concat-1 had axis optional (default 1); from opset 4 it is required.
    if (node.opset >= 4 && !node.has("axis")) fail(node, "missing required attribute 'axis'");
    axis_ = node.get_int("axis", 1);
  }
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty()) fail(node_, "needs at least one input");
    for (std::size_t i = 0; i < in.size(); ++i)
      if (!in[i]) fail(node_, "input " + std::to_string(i) + " is missing");
    const Shape& s0 = in[0]->shape;
    const int rank = int(s0.size());
    if (rank == 0) fail(node_, "cannot concatenate scalars (input '" + node_.inputs[0] + "' has rank 0)");
    const int axis = normalize_axis(node_, axis_, rank);
    Shape out = s0;
    out[std::size_t(axis)] = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
      const Shape& s = in[i]->shape;
      if (in[i]->declared != in[0]->declared)
        fail(node_, "input '" + node_.inputs[i] + "' is " + type_name(in[i]->declared) + ", input '" + node_.inputs[0] +
                        "' is " + type_name(in[0]->declared));
      bool ok = int(s.size()) == rank;
      for (int d = 0; ok && d < rank; ++d) ok = d == axis || s[std::size_t(d)] == s0[std::size_t(d)];
      if (!ok)
        fail(node_, "input '" + node_.inputs[i] + "' has shape " + shape_to_string(s) + ", which does not match " +
                        shape_to_string(s0) + " outside axis " + std::to_string(axis));
      out[std::size_t(axis)] += s[std::size_t(axis)];
    }
    return {meta_like(*in[0], out)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    Tensor& o = *out[0];
    const std::size_t axis = std::size_t(normalize_axis(node_, axis_, o.rank()));
    const std::size_t es = dtype_size(o.dtype());
    const std::int64_t outer = prod(o.shape(), 0, axis);
    const std::int64_t inner = prod(o.shape(), axis + 1, o.shape().size()) * std::int64_t(es);
    const std::int64_t out_chunk = o.shape()[axis] * inner;
    std::vector<std::int64_t> chunk(in.size()), offset(in.size());
    for (std::size_t k = 0, off = 0; k < in.size(); ++k) {
      chunk[k] = in[k]->shape()[axis] * inner;
      offset[k] = std::int64_t(off);
      off += std::size_t(chunk[k]);
    }
    parallel_items(outer, out_chunk / std::int64_t(es), [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t r = b; r < e; ++r)
        for (std::size_t k = 0; k < in.size(); ++k)
          if (chunk[k])
            std::memcpy(o.raw() + r * out_chunk + offset[k], in[k]->raw() + r * chunk[k], std::size_t(chunk[k]));
    });
  }

 private:
  Node node_;
  std::int64_t axis_;
};

// Split: sizes from the 'split' attribute (opsets 1-12; opset 1 also took them as input 1), from
// the optional 'split' input (13+), or equal parts: one per output, and from opset 18 the
// 'num_outputs' attribute, whose last part may be smaller.
class SplitOp final : public Op {
 public:
  explicit SplitOp(const Node& node) : node_(node), axis_(node.get_int("axis", 0)) {
    if (node.opset >= 2) check_form(node, "split", 1, 13);  // Split-1 took either
  }
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    const Shape& s = in[0]->shape;
    if (s.empty()) fail(node_, "cannot split a scalar");
    const int axis = normalize_axis(node_, axis_, int(s.size()));
    std::optional<std::vector<std::int64_t>> given;
    if (in.size() > 1 && in[1]) given = int_list(node_, plan_time_input(node_, in, 1, "split"), "split");
    std::vector<ValueMeta> out;
    for (auto n : sizes(given, s[std::size_t(axis)])) {
      Shape o = s;
      o[std::size_t(axis)] = n;
      out.push_back(meta_like(*in[0], o));
    }
    return out;
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    const std::size_t axis = std::size_t(normalize_axis(node_, axis_, x.rank()));
    std::optional<std::vector<std::int64_t>> given;
    if (in.size() > 1 && in[1]) given = to_int64s(*in[1]);
    const auto parts = sizes(given, x.shape()[axis]);  // omitted outputs still take their part
    const std::size_t es = dtype_size(x.dtype());
    const std::int64_t outer = prod(x.shape(), 0, axis);
    const std::int64_t inner = prod(x.shape(), axis + 1, x.shape().size()) * std::int64_t(es);
    const std::int64_t in_chunk = x.shape()[axis] * inner;
    std::vector<std::int64_t> chunk(out.size()), offset(out.size());
    for (std::size_t k = 0, off = 0; k < out.size(); ++k) {
      chunk[k] = parts[k] * inner;
      offset[k] = std::int64_t(off);
      off += std::size_t(chunk[k]);
    }
    parallel_items(outer, in_chunk / std::int64_t(es), [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t r = b; r < e; ++r)
        for (std::size_t k = 0; k < out.size(); ++k)
          if (out[k] && chunk[k])
            std::memcpy(out[k]->raw() + r * chunk[k], x.raw() + r * in_chunk + offset[k], std::size_t(chunk[k]));
    });
  }

  std::vector<std::size_t> constant_inputs() const override { return {1}; }

 private:
  std::vector<std::int64_t> sizes(std::optional<std::vector<std::int64_t>> given, std::int64_t dim) const {
    const std::size_t parts = node_.outputs.size();
    if (!given && node_.opset < 13 && node_.has("split")) given = node_.get_ints("split");
    if (node_.opset >= 18 && node_.has("num_outputs")) {
      if (given) fail(node_, "has both the 'split' input and the 'num_outputs' attribute; give one");
      const std::int64_t n = node_.get_int("num_outputs", 0);
      if (n < 1) fail(node_, "num_outputs must be positive, got " + std::to_string(n));
      if (std::size_t(n) != parts)
        fail(node_, "num_outputs is " + std::to_string(n) + " but the node has " + std::to_string(parts) + " outputs");
      // Opset 18: ceil(dim / n) each; the last part takes what remains (less, possibly 0).
      const std::int64_t each = (dim + n - 1) / n;
      std::vector<std::int64_t> out;
      for (std::int64_t k = 0; k < n; ++k) out.push_back(std::clamp<std::int64_t>(dim - each * k, 0, each));
      return out;
    }
    if (given) {
      if (given->size() != parts)
        fail(node_, "split has " + std::to_string(given->size()) + " sizes but the node has " + std::to_string(parts) +
                        " outputs");
      std::int64_t total = 0;
      for (auto v : *given) {
        if (v < 0) fail(node_, "split has a negative size " + std::to_string(v));
        total += v;
      }
      if (total != dim)
        fail(node_,
             "split sizes add up to " + std::to_string(total) + ", but the axis has size " + std::to_string(dim));
      return *given;
    }
    if (parts == 0) fail(node_, "has no outputs");
    if (dim % std::int64_t(parts) != 0)
      fail(node_, "cannot split an axis of size " + std::to_string(dim) + " into " + std::to_string(parts) +
                      " equal parts (give 'split'" + (node_.opset >= 18 ? std::string(" or 'num_outputs'") : "") + ")");
    return std::vector<std::int64_t>(parts, dim / std::int64_t(parts));
  }
  Node node_;
  std::int64_t axis_;
};

// ---- Expand, Tile ----------------------------------------------------------------------------

class ExpandOp final : public Op {
 public:
  explicit ExpandOp(const Node& node) : node_(node) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 2 || !in[0]) fail(node_, "needs input and shape");
    auto shape = int_list(node_, plan_time_input(node_, in, 1, "shape"), "shape");
    for (auto d : shape)
      if (d < 0) fail(node_, "shape has a negative dimension: " + shape_to_string(shape));
    return {meta_like(*in[0], broadcast_shapes(node_, in[0]->shape, shape))};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Shape& os = out[0]->shape();
    const Shape& is = in[0]->shape();
    const auto st = dense_strides(is);
    StridedView v;
    v.counts = os;
    v.strides.assign(os.size(), 0);
    const std::size_t lead = os.size() - is.size();
    for (std::size_t d = 0; d < is.size(); ++d) v.strides[lead + d] = is[d] == 1 ? 0 : st[d];
    copy_view(in[0]->raw(), out[0]->raw(), dtype_size(in[0]->dtype()), std::move(v));
  }

  std::vector<std::size_t> constant_inputs() const override { return {1}; }

 private:
  Node node_;
};

class TileOp final : public Op {
 public:
  explicit TileOp(const Node& node) : node_(node) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 2 || !in[0]) fail(node_, "needs input and repeats");
    auto reps = int_list(node_, plan_time_input(node_, in, 1, "repeats"), "repeats");
    const Shape& s = in[0]->shape;
    if (reps.size() != s.size())
      fail(node_, "repeats has " + std::to_string(reps.size()) + " values for input shape " + shape_to_string(s));
    Shape out = s;
    for (std::size_t d = 0; d < s.size(); ++d) {
      if (reps[d] < 0) fail(node_, "repeats has a negative value " + std::to_string(reps[d]));
      out[d] *= reps[d];
    }
    return {meta_like(*in[0], out)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Shape& s = in[0]->shape();
    const Shape& os = out[0]->shape();
    const auto st = dense_strides(s);
    // Output coordinate rep*dim + k reads input k: a view over (rep_0, k_0, rep_1, k_1, ...).
    StridedView v;
    for (std::size_t d = 0; d < s.size(); ++d) {
      v.counts.push_back(s[d] == 0 ? 0 : os[d] / s[d]);
      v.strides.push_back(0);
      v.counts.push_back(s[d]);
      v.strides.push_back(st[d]);
    }
    copy_view(in[0]->raw(), out[0]->raw(), dtype_size(in[0]->dtype()), std::move(v));
  }

  std::vector<std::size_t> constant_inputs() const override { return {1}; }

 private:
  Node node_;
};

// ---- Pad -------------------------------------------------------------------------------------

enum class PadMode { kConstant, kReflect, kEdge, kWrap };

// Pads: 'paddings' attribute at opset 1, 'pads' attribute 2-10, inputs from 11 (pads,
// constant_value), optional 'axes' input from 18, 'wrap' mode from 19. Negative pads crop.
class PadOp final : public Op {
 public:
  explicit PadOp(const Node& node) : node_(node) {
    check_form(node, node.opset < 2 ? "paddings" : "pads", 1, 11);
    const std::string mode = node.get_string("mode", "constant");
    if (mode == "constant") mode_ = PadMode::kConstant;
    else if (mode == "reflect") mode_ = PadMode::kReflect;
    else if (mode == "edge") mode_ = PadMode::kEdge;
    else if (mode == "wrap" && node.opset >= 19) mode_ = PadMode::kWrap;
    else
      fail(node, "mode must be 'constant', 'reflect', 'edge'" + std::string(node.opset >= 19 ? " or 'wrap'" : "") +
                     " at opset " + std::to_string(node.opset) + ", got '" + mode + "'");
  }
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    if (node_.opset >= 11 && in.size() > 2 && in[2]) {
      if (in[2]->dtype != in[0]->dtype)
        fail(node_, "constant_value is " + type_name(in[2]->declared) + ", data is " + type_name(in[0]->declared));
      if (shape_numel(in[2]->shape) != 1)
        fail(node_, "constant_value must be a scalar, got shape " + shape_to_string(in[2]->shape));
    }
    const Shape& s = in[0]->shape;
    auto [begin, end] = pads(s, [&](std::size_t i, const char* what) -> std::optional<std::vector<std::int64_t>> {
      if (i >= in.size() || !in[i]) return std::nullopt;
      return int_list(node_, plan_time_input(node_, in, i, what), what);
    });
    Shape out = s;
    for (std::size_t d = 0; d < s.size(); ++d) {
      out[d] = s[d] + begin[d] + end[d];
      if (out[d] < 0)
        fail(node_, "pads " + std::to_string(begin[d]) + ", " + std::to_string(end[d]) + " on axis " +
                        std::to_string(d) + " of shape " + shape_to_string(s) + " leave a negative size");
      if (mode_ != PadMode::kConstant && s[d] == 0 && out[d] > 0)
        fail(node_,
             "cannot pad axis " + std::to_string(d) + " of size 0 in mode '" + node_.get_string("mode", "") + "'");
      // Wider pads have no agreed meaning: ONNX Runtime rejects them, and the reference
      // (numpy.pad) re-pads from the padded array, which is not a periodic extension.
      const std::int64_t widest = std::max(begin[d], end[d]);
      const std::int64_t limit = mode_ == PadMode::kReflect ? s[d] - 1 : s[d];
      if ((mode_ == PadMode::kReflect || mode_ == PadMode::kWrap) && s[d] > 0 && widest > limit)
        throw UnsupportedError(node_.describe() + ": a pad of " + std::to_string(widest) + " on axis " +
                               std::to_string(d) + " of shape " + shape_to_string(s) + " in mode '" +
                               node_.get_string("mode", "") + "' is wider than the axis allows (at most " +
                               std::to_string(limit) + ")");
    }
    return {meta_like(*in[0], out)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    Tensor& o = *out[0];
    const Shape& s = x.shape();
    const Shape& os = o.shape();
    const std::size_t es = dtype_size(x.dtype());
    auto [begin, end] = pads(s, [&](std::size_t i, const char*) -> std::optional<std::vector<std::int64_t>> {
      if (i >= in.size() || !in[i]) return std::nullopt;
      return to_int64s(*in[i]);
    });
    const std::vector<std::byte> fill = fill_value(x.dtype(), in);
    if (o.numel() == 0) return;
    const int r = x.rank();
    if (r == 0) return copy_data(x, o);
    // Per axis: the source index of every output index (-1: the constant).
    std::vector<std::vector<std::int64_t>> map(static_cast<std::size_t>(r));
    for (int d = 0; d < r; ++d) {
      const std::size_t du = std::size_t(d);
      const std::int64_t n = s[du];
      map[du].resize(std::size_t(os[du]));
      for (std::int64_t j = 0; j < os[du]; ++j) map[du][std::size_t(j)] = source_index(j - begin[du], n);
    }
    const auto xs = dense_strides(s);
    const std::int64_t inner = os.back(), rows = o.numel() / inner;
    // The inner run whose source is contiguous: output [lo, hi) <- input [lo - b, hi - b).
    const std::int64_t b = begin.back();
    const std::int64_t lo = std::clamp<std::int64_t>(b, 0, inner),
                       hi = std::clamp<std::int64_t>(b + s.back(), lo, inner);
    parallel_items(rows, inner, [&](std::int64_t rb, std::int64_t re) {
      for (std::int64_t row = rb; row < re; ++row) {
        std::byte* dst = o.raw() + std::size_t(row * inner) * es;
        std::int64_t src = 0, rem = row;
        bool constant = false;
        for (int d = r - 2; d >= 0; --d) {
          const std::int64_t k = map[std::size_t(d)][std::size_t(rem % os[std::size_t(d)])];
          rem /= os[std::size_t(d)];
          if (k < 0) constant = true;
          else src += k * xs[std::size_t(d)];
        }
        if (constant) {
          for (std::int64_t j = 0; j < inner; ++j) std::memcpy(dst + std::size_t(j) * es, fill.data(), es);
          continue;
        }
        const std::byte* row_src = x.raw() + std::size_t(src) * es;
        auto one = [&](std::int64_t j) {
          const std::int64_t k = map.back()[std::size_t(j)];
          std::memcpy(dst + std::size_t(j) * es, k < 0 ? fill.data() : row_src + std::size_t(k) * es, es);
        };
        for (std::int64_t j = 0; j < lo; ++j) one(j);
        if (hi > lo)
          std::memcpy(dst + std::size_t(lo) * es, row_src + std::size_t(lo - b) * es, std::size_t(hi - lo) * es);
        for (std::int64_t j = hi; j < inner; ++j) one(j);
      }
    });
  }

  std::vector<std::size_t> constant_inputs() const override {
    if (node_.opset < 11) return {};
    return {1, 3};
  }

 private:
  std::int64_t source_index(std::int64_t i, std::int64_t n) const {
    if (i >= 0 && i < n) return i;
    switch (mode_) {
      case PadMode::kConstant: return -1;
      case PadMode::kEdge: return i < 0 ? 0 : n - 1;
      case PadMode::kWrap: return ((i % n) + n) % n;
      case PadMode::kReflect: {
        if (n == 1) return 0;
        // numpy's 'reflect' (the edge is not repeated); the period form also serves negative
        // (cropping) pads on the other side.
        const std::int64_t period = 2 * (n - 1);
        std::int64_t k = ((i % period) + period) % period;
        return k < n ? k : period - k;
      }
    }
    return -1;
  }
  template <class Get>
  std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>> pads(const Shape& s, Get get) const {
    const int rank = int(s.size());
    std::vector<std::int64_t> p;
    std::vector<int> axes;
    if (node_.opset < 11) {
      const char* attr = node_.opset < 2 ? "paddings" : "pads";
      if (!node_.has(attr)) fail(node_, std::string("missing attribute '") + attr + "'");
      p = node_.get_ints(attr);
    } else {
      auto given = get(1, "pads");
      if (!given) fail(node_, "needs the 'pads' input");
      p = *given;
      if (node_.opset >= 18)
        if (auto a = get(3, "axes")) axes = unique_axes(node_, *a, rank, "axes");
    }
    if (axes.empty() && !(node_.opset >= 18 && get(3, "axes")))
      for (int d = 0; d < rank; ++d) axes.push_back(d);
    if (p.size() != 2 * axes.size())
      fail(node_, "pads has " + std::to_string(p.size()) + " values; expected " + std::to_string(2 * axes.size()) +
                      " (begin and end for each of " + std::to_string(axes.size()) + " axes) for shape " +
                      shape_to_string(s));
    std::vector<std::int64_t> begin(s.size(), 0), end(s.size(), 0);
    for (std::size_t i = 0; i < axes.size(); ++i) {
      begin[std::size_t(axes[i])] = p[i];
      end[std::size_t(axes[i])] = p[i + axes.size()];
    }
    return {begin, end};
  }
  // The constant's bytes in the data's storage type.
  std::vector<std::byte> fill_value(DType storage, std::span<const Tensor* const> in) const {
    std::vector<std::byte> bytes(dtype_size(storage), std::byte{0});
    if (mode_ != PadMode::kConstant) return bytes;
    if (node_.opset >= 11) {
      if (in.size() > 2 && in[2] && in[2]->numel() > 0) std::memcpy(bytes.data(), in[2]->raw(), bytes.size());
      return bytes;
    }
    const double value = node_.get_float("value", 0.0f);
    visit_storage(storage, [&](auto tag) {
      using T = decltype(tag);
      const T v = static_cast<T>(value);
      std::memcpy(bytes.data(), &v, sizeof(T));
    });
    return bytes;
  }
  Node node_;
  PadMode mode_ = PadMode::kConstant;
};

// ---- Trilu -----------------------------------------------------------------------------------

class TriluOp final : public Op {
 public:
  explicit TriluOp(const Node& node) : node_(node), upper_(node.get_int("upper", 1) != 0) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    if (in[0]->shape.size() < 2) fail(node_, "input must have rank >= 2, got shape " + shape_to_string(in[0]->shape));
    if (in.size() > 1 && in[1]) {
      if (in[1]->dtype != DType::kInt64) fail(node_, "k must be int64, got " + type_name(in[1]->declared));
      if (shape_numel(in[1]->shape) != 1) fail(node_, "k must be a scalar, got shape " + shape_to_string(in[1]->shape));
    }
    return {meta_like(*in[0], in[0]->shape)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    const std::int64_t k = in.size() > 1 && in[1] ? in[1]->data<std::int64_t>()[0] : 0;
    const std::int64_t rows = x.shape()[std::size_t(x.rank() - 2)], cols = x.shape().back();
    const std::size_t es = dtype_size(x.dtype());
    const std::int64_t mats = rows * cols == 0 ? 0 : x.numel() / (rows * cols);
    // Zero is all-zero bytes in every storage type.
    for (std::int64_t m = 0; m < mats * rows; ++m) {
      const std::int64_t i = m % rows;
      const std::byte* src = x.raw() + std::size_t(m * cols) * es;
      std::byte* dst = out[0]->raw() + std::size_t(m * cols) * es;
      // Kept columns: j >= i + k (upper) or j <= i + k (lower).
      std::int64_t lo = upper_ ? std::clamp<std::int64_t>(i + k, 0, cols) : 0;
      std::int64_t hi = upper_ ? cols : std::clamp<std::int64_t>(i + k + 1, 0, cols);
      std::memset(dst, 0, std::size_t(cols) * es);
      if (hi > lo) std::memcpy(dst + std::size_t(lo) * es, src + std::size_t(lo) * es, std::size_t(hi - lo) * es);
    }
  }

 private:
  Node node_;
  bool upper_;
};

}  // namespace

void register_layout_ops(std::vector<OpSchema>& out) {
  out.push_back({"Transpose", "", 1, kMaxOpset, factory<TransposeOp>()});
  out.push_back({"Concat", "", 1, 3, factory<ConcatOp>()});  // axis optional, default 1
  out.push_back({"Concat", "", 4, kMaxOpset, factory<ConcatOp>()});
  // Split: 'split' input or attribute (1), attribute (2-12), input (13-17), + num_outputs (18+).
  out.push_back({"Split", "", 1, 1, factory<SplitOp>()});
  out.push_back({"Split", "", 2, 12, factory<SplitOp>()});
  out.push_back({"Split", "", 13, 17, factory<SplitOp>()});
  out.push_back({"Split", "", 18, kMaxOpset, factory<SplitOp>()});
  out.push_back({"Expand", "", 8, kMaxOpset, factory<ExpandOp>()});
  out.push_back({"Tile", "", 6, kMaxOpset, factory<TileOp>()});  // Tile-1 (tiles, axis inputs) not supported
  // Pad: 'paddings' (1), 'pads' attribute (2-10), inputs (11-17), + axes (18), + wrap (19+).
  out.push_back({"Pad", "", 1, 1, factory<PadOp>()});
  out.push_back({"Pad", "", 2, 10, factory<PadOp>()});
  out.push_back({"Pad", "", 11, 17, factory<PadOp>()});
  out.push_back({"Pad", "", 18, 18, factory<PadOp>()});
  out.push_back({"Pad", "", 19, kMaxOpset, factory<PadOp>()});
  out.push_back({"Trilu", "", 14, kMaxOpset, factory<TriluOp>()});
}

}  // namespace qeval::eval
