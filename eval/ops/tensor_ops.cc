// Shape and data-movement ops (Reshape family, Transpose, Concat, Slice, Gather, Pad, ...), Cast, Range, TopK.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <type_traits>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "eval/onnx_import.h"
#include "eval/ops/families.h"
#include "kernels/numeric.h"

namespace qeval::eval {

namespace {

constexpr int kLatest = 22;

void copy_data(const Tensor& in, Tensor& out) {
  if (in.nbytes()) std::memcpy(out.raw(), in.raw(), in.nbytes());
}


// Like constant_input, but a value that only exists at run time is an unsupported configuration
// (the model is valid ONNX; qeval plans shapes before running), so the conformance runner and the
// CLI report it as unsupported rather than as a broken model.
const Tensor& plan_time_input(const Node& node, std::span<const ValueMeta* const> in, std::size_t i,
                              const char* what) {
  if (i >= in.size() || !in[i]) fail(node, std::string("missing input ") + what);
  if (!in[i]->value)
    throw UnsupportedError(node.describe() + ": input " + std::to_string(i) + " ('" + node.inputs[i] +
                           "', " + what + ") depends on runtime data; qeval needs it at plan time "
                           "(a constant, or computable from static shapes) to know output shapes");
  return *in[i]->value;
}

std::vector<std::int64_t> int_list(const Node& node, const Tensor& t, const char* what) {
  if (t.dtype() != DType::kInt64 && t.dtype() != DType::kInt32)
    fail(node, std::string(what) + " must be int64 (or int32), got " + type_name(t.dtype()));
  if (t.rank() > 1) fail(node, std::string(what) + " must be 1-D, got shape " + shape_to_string(t.shape()));
  return to_int64s(t);
}

std::vector<std::int64_t> dense_strides(const Shape& s) {
  std::vector<std::int64_t> st(s.size(), 1);
  for (int d = int(s.size()) - 2; d >= 0; --d) st[std::size_t(d)] = st[std::size_t(d) + 1] * s[std::size_t(d) + 1];
  return st;
}

std::int64_t prod(const Shape& s, std::size_t begin, std::size_t end) {
  std::int64_t p = 1;
  for (std::size_t i = begin; i < end && i < s.size(); ++i) p *= s[i];
  return p;
}

// Normalised, duplicate-free axes for a tensor of `rank`.
std::vector<int> unique_axes(const Node& node, const std::vector<std::int64_t>& axes, int rank, const char* what) {
  std::vector<int> out;
  for (auto a : axes) {
    if (a < -rank || a >= rank)
      fail(node, std::string(what) + " value " + std::to_string(a) + " is out of range for rank " + std::to_string(rank));
    const int n = int(a < 0 ? a + rank : a);
    if (std::find(out.begin(), out.end(), n) != out.end())
      fail(node, std::string(what) + " has axis " + std::to_string(a) + " more than once");
    out.push_back(n);
  }
  return out;
}

// Opsets moved shape-like attributes to inputs (Slice 10, Pad 11, Squeeze/Unsqueeze/Split 13);
// a node in the other form is malformed for its opset.
void check_form(const Node& node, const char* attr, std::size_t input, int input_since) {
  if (node.opset < input_since && node.has_input(input))
    fail(node, std::string("takes '") + attr + "' as an attribute before opset " + std::to_string(input_since) +
                   ", not as input " + std::to_string(input));
  if (node.opset >= input_since && node.has(attr))
    fail(node, std::string("takes '") + attr + "' as input " + std::to_string(input) + " from opset " +
                   std::to_string(input_since) + ", not as an attribute");
}

// Runs f(begin, end) over [0, n) items, in parallel when the work is large enough to pay for the
// threads. Callers make each item's result independent of the split, so results do not depend on
// the thread count.
template <class F>
void parallel_items(std::int64_t n, std::int64_t elems_per_item, F&& f) {
  constexpr std::int64_t kGrainElems = std::int64_t(1) << 16;
  const std::int64_t per = std::max<std::int64_t>(1, elems_per_item);
  if (n <= 1 || n * per < 4 * kGrainElems) {
    if (n > 0) f(std::int64_t(0), n);
    return;
  }
  const std::int64_t grain = std::max<std::int64_t>(1, kGrainElems / per);
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, std::size_t(grain)),
                    [&](const tbb::blocked_range<std::int64_t>& r) { f(r.begin(), r.end()); });
}

// Calls f(T{}) with an unsigned type of the element size: data movement is type-agnostic.
template <class F>
void with_element_size(std::size_t es, F&& f) {
  switch (es) {
    case 1: return f(std::uint8_t{});
    case 2: return f(std::uint16_t{});
    case 4: return f(std::uint32_t{});
    case 8: return f(std::uint64_t{});
    default: throw std::logic_error("unexpected element size " + std::to_string(es));
  }
}

// ---- strided copy: the kernel behind Transpose, Slice, Expand, Tile --------------------------

// Element (i_0, ..., i_k) of a dense destination over `counts` comes from
// src[base + sum(i_d * strides[d])]; strides are in elements and may be 0 (broadcast) or negative.
struct StridedView {
  Shape counts;
  std::vector<std::int64_t> strides;
  std::int64_t base = 0;
};

// Drops unit dimensions and merges dimensions that are contiguous in the source, so the inner
// loop (a memcpy where the source is contiguous) runs as long as possible.
void simplify(StridedView& v) {
  Shape c;
  std::vector<std::int64_t> s;
  for (std::size_t d = 0; d < v.counts.size(); ++d) {
    if (v.counts[d] == 1) continue;
    if (!c.empty() && s.back() == v.strides[d] * v.counts[d]) {
      c.back() *= v.counts[d];
      s.back() = v.strides[d];
      continue;
    }
    c.push_back(v.counts[d]);
    s.push_back(v.strides[d]);
  }
  v.counts = std::move(c);
  v.strides = std::move(s);
}

template <class T>
void copy_rows(const T* src, T* dst, const StridedView& v) {
  const int r = int(v.counts.size());
  const std::int64_t n = v.counts.back(), is = v.strides.back();
  const std::int64_t rows = shape_numel(v.counts) / n;
  parallel_items(rows, n, [&](std::int64_t b, std::int64_t e) {
    std::vector<std::int64_t> idx(std::size_t(std::max(r - 1, 0)), 0);
    std::int64_t off = 0;
    for (std::int64_t rem = b, d = r - 2; d >= 0; --d) {
      idx[std::size_t(d)] = rem % v.counts[std::size_t(d)];
      rem /= v.counts[std::size_t(d)];
      off += idx[std::size_t(d)] * v.strides[std::size_t(d)];
    }
    for (std::int64_t row = b; row < e; ++row) {
      T* out = dst + row * n;
      const T* in = src + off;
      if (is == 1) std::memcpy(out, in, std::size_t(n) * sizeof(T));
      else if (is == 0) std::fill(out, out + n, *in);
      else for (std::int64_t j = 0; j < n; ++j) out[j] = in[j * is];
      for (int d = r - 2; d >= 0; --d) {
        const std::size_t du = std::size_t(d);
        off += v.strides[du];
        if (++idx[du] < v.counts[du]) break;
        off -= v.strides[du] * v.counts[du];
        idx[du] = 0;
      }
    }
  });
}

// Transpose-like views (the destination's inner dimension is strided in the source, and another
// dimension t is contiguous there): 64x64 tiles keep both sides in cache, and 8x8 blocks go
// through a local array the compiler keeps in registers, so power-of-two source strides (which
// map every column of a tile to one cache set) do not thrash L1.
template <class T>
void copy_tiled(const T* src, T* dst, const StridedView& v, int t) {
  constexpr std::int64_t kTile = 64, kBlock = 8;
  const int r = int(v.counts.size());
  const auto dst_st = dense_strides(v.counts);
  std::vector<std::int64_t> oc, os, od;  // the other dimensions: counts, source and dest strides
  for (int d = 0; d < r - 1; ++d)
    if (d != t) {
      oc.push_back(v.counts[std::size_t(d)]);
      os.push_back(v.strides[std::size_t(d)]);
      od.push_back(dst_st[std::size_t(d)]);
    }
  const std::int64_t nt = v.counts[std::size_t(t)], nc = v.counts.back(), sc = v.strides.back();
  const std::int64_t dt = dst_st[std::size_t(t)];
  const std::int64_t tblocks = (nt + kTile - 1) / kTile;
  const std::int64_t outer = shape_numel(oc);
  parallel_items(outer * tblocks, kTile * nc, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t task = b; task < e; ++task) {
      std::int64_t o = task / tblocks, so = 0, dof = 0;
      const std::int64_t i0 = (task % tblocks) * kTile, i1 = std::min(nt, i0 + kTile);
      for (int d = int(oc.size()) - 1; d >= 0; --d) {
        const std::int64_t k = o % oc[std::size_t(d)];
        o /= oc[std::size_t(d)];
        so += k * os[std::size_t(d)];
        dof += k * od[std::size_t(d)];
      }
      const T* in = src + so;
      T* out = dst + dof;
      for (std::int64_t c0 = 0; c0 < nc; c0 += kTile) {
        const std::int64_t c1 = std::min(nc, c0 + kTile);
        for (std::int64_t i = i0; i < i1; i += kBlock)
          for (std::int64_t c = c0; c < c1; c += kBlock) {
            if (i + kBlock <= i1 && c + kBlock <= c1) {
              T block[kBlock][kBlock];
              for (std::int64_t cc = 0; cc < kBlock; ++cc)
                for (std::int64_t ii = 0; ii < kBlock; ++ii) block[ii][cc] = in[(c + cc) * sc + i + ii];
              for (std::int64_t ii = 0; ii < kBlock; ++ii)
                for (std::int64_t cc = 0; cc < kBlock; ++cc) out[(i + ii) * dt + c + cc] = block[ii][cc];
            } else {
              for (std::int64_t ii = i; ii < std::min(i1, i + kBlock); ++ii)
                for (std::int64_t cc = c; cc < std::min(c1, c + kBlock); ++cc) out[ii * dt + cc] = in[cc * sc + ii];
            }
          }
      }
    }
  });
}

void copy_view(const std::byte* src, std::byte* dst, std::size_t es, StridedView v) {
  if (shape_numel(v.counts) == 0) return;
  simplify(v);
  src += v.base * std::int64_t(es);
  if (v.counts.empty()) {
    std::memcpy(dst, src, es);
    return;
  }
  with_element_size(es, [&](auto tag) {
    using T = decltype(tag);
    const T* s = reinterpret_cast<const T*>(src);
    T* d = reinterpret_cast<T*>(dst);
    const int r = int(v.counts.size());
    int t = -1;
    for (int k = r - 2; k >= 0 && t < 0; --k)
      if (v.strides[std::size_t(k)] == 1) t = k;
    if (v.strides.back() != 1 && v.strides.back() != 0 && t >= 0 && v.counts[std::size_t(t)] >= 8 &&
        v.counts.back() >= 8)
      copy_tiled(s, d, v, t);
    else
      copy_rows(s, d, v);
  });
}

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
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    auto perm = permutation(x.shape().size());
    const auto st = dense_strides(x.shape());
    StridedView v;
    v.counts = out[0]->shape();
    for (auto p : perm) v.strides.push_back(st[std::size_t(p)]);
    copy_view(x.raw(), out[0]->raw(), dtype_size(x.dtype()), std::move(v));
  }

 private:
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
        fail(node_, "input '" + node_.inputs[i] + "' is " + type_name(in[i]->declared) + ", input '" +
                        node_.inputs[0] + "' is " + type_name(in[0]->declared));
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
          if (chunk[k]) std::memcpy(o.raw() + r * out_chunk + offset[k], in[k]->raw() + r * chunk[k], std::size_t(chunk[k]));
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
        fail(node_, "split has " + std::to_string(given->size()) + " sizes but the node has " +
                        std::to_string(parts) + " outputs");
      std::int64_t total = 0;
      for (auto v : *given) {
        if (v < 0) fail(node_, "split has a negative size " + std::to_string(v));
        total += v;
      }
      if (total != dim)
        fail(node_, "split sizes add up to " + std::to_string(total) + ", but the axis has size " + std::to_string(dim));
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

void check_index_type(const Node& node, const ValueMeta& m) {
  if (m.dtype != DType::kInt64 && m.dtype != DType::kInt32)
    fail(node, "indices must be int32 or int64, got " + type_name(m.declared));
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
        fail(node_, "cannot pad axis " + std::to_string(d) + " of size 0 in mode '" + node_.get_string("mode", "") + "'");
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
    const std::int64_t lo = std::clamp<std::int64_t>(b, 0, inner), hi = std::clamp<std::int64_t>(b + s.back(), lo, inner);
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
        if (hi > lo) std::memcpy(dst + std::size_t(lo) * es, row_src + std::size_t(lo - b) * es, std::size_t(hi - lo) * es);
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

// ---- Cast, CastLike --------------------------------------------------------------------------

bool is_narrow_float(DType t) { return storage_type(t) == DType::kFloat32 && t != DType::kFloat32; }

// An ONNX element type code -> DType; types qeval does not implement (string, 4-bit) are
// unsupported, codes that are no ONNX type are bad input.
DType declared_from_onnx(const Node& node, std::int64_t code) {
  if (code == 8) throw UnsupportedError(node.describe() + ": string tensors are not supported (Cast 'to' = STRING)");
  if (code <= 0 || code > 25) fail(node, "'to' = " + std::to_string(code) + " is not an ONNX element type");
  try {
    return dtype_from_onnx(int(code), node.describe());
  } catch (const InputError&) {
    throw UnsupportedError(node.describe() + ": element type " + std::to_string(code) +
                           " (4-bit or complex) is not supported");
  }
}

// Rounds a double to float with round-to-odd, so that a second rounding to a narrower format (at
// least 2 bits shorter) gives the correctly rounded result of the double.
float round_to_odd_float(double d) {
  float f = static_cast<float>(d);
  if (std::isfinite(f) && static_cast<double>(f) != d) {
    if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits |= 1u;
    std::memcpy(&f, &bits, 4);
  }
  return f;
}

float round_to_format(float v, DType declared, bool saturate) {
  switch (declared) {
    case DType::kFloat16: return round_to_float16(v);
    case DType::kBFloat16: return round_to_bfloat16(v);
    case DType::kFloat8E4M3FN: return to_float(to_float8_e4m3fn(v, saturate));
    case DType::kFloat8E5M2: return to_float(to_float8_e5m2(v, saturate));
    case DType::kFloat8E4M3FNUZ: return to_float(to_float8_e4m3fnuz(v, saturate));
    case DType::kFloat8E5M2FNUZ: return to_float(to_float8_e5m2fnuz(v, saturate));
    default: return v;
  }
}

// One element, ONNX Cast semantics: float -> int truncates toward zero (out of range, which ONNX
// leaves undefined, saturates; NaN gives 0), anything -> bool is "!= 0" (NaN -> true), int -> int
// wraps as numpy does.
template <class D, class S>
D cast_value(S v) {
  if constexpr (std::is_same_v<D, bool>) {
    return v != S(0);
  } else if constexpr (std::is_floating_point_v<S> && std::is_integral_v<D>) {
    if (std::isnan(v)) return D(0);
    const double t = std::trunc(static_cast<double>(v));
    if (t <= static_cast<double>(std::numeric_limits<D>::lowest())) return std::numeric_limits<D>::lowest();
    if (t >= static_cast<double>(std::numeric_limits<D>::max())) return std::numeric_limits<D>::max();
    return static_cast<D>(t);
  } else {
    return static_cast<D>(v);
  }
}

// Cast (to: attribute) and CastLike (to: the second input's type); 'saturate' from opset 19
// (float8 targets only).
class CastOp final : public Op {
 public:
  CastOp(const Node& node, bool like)
      : node_(node), like_(like), saturate_(node.opset < 19 || node.get_int("saturate", 1) != 0) {
    if (!like) {
      if (!node.has("to")) fail(node, "missing attribute 'to'");
      to_ = declared_from_onnx(node, node.get_int("to", 0));
    }
  }
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    if (like_) {
      if (in.size() < 2 || !in[1]) fail(node_, "needs the 'target_type' input");
      // run() sees only storage types; the declared target (e.g. float8 vs float32) is a property
      // of the graph, the same for every plan, so it is kept here.
      to_ = in[1]->declared;
    }
    return {meta_of(to_, in[0]->shape)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    Tensor& o = *out[0];
    const std::int64_t n = x.numel();
    const DType to = to_;
    visit_storage(x.dtype(), [&](auto stag) {
      using S = decltype(stag);
      const S* src = x.data<S>();
      if (is_narrow_float(to)) {
        // Widen to float (once-rounded, see round_to_odd_float), then round to the format in bulk.
        float* dst = o.data<float>();
        for (std::int64_t i = 0; i < n; ++i) {
          if constexpr (std::is_same_v<S, float> || std::is_same_v<S, bool> || sizeof(S) <= 2) dst[i] = static_cast<float>(src[i]);
          else dst[i] = round_to_odd_float(static_cast<double>(src[i]));
        }
        if (to == DType::kFloat16) round_to_float16(dst, std::size_t(n));
        else if (to == DType::kBFloat16) round_to_bfloat16(dst, std::size_t(n));
        else for (std::int64_t i = 0; i < n; ++i) dst[i] = round_to_format(dst[i], to, saturate_);
        return;
      }
      visit_storage(o.dtype(), [&](auto dtag) {
        using D = decltype(dtag);
        D* dst = o.data<D>();
        for (std::int64_t i = 0; i < n; ++i) dst[i] = cast_value<D>(src[i]);
      });
    });
  }

 private:
  Node node_;
  bool like_;
  bool saturate_;
  mutable DType to_ = DType::kFloat32;
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
      if (q > T(std::int64_t(1) << 40)) fail(node_, "the range is too long (" + std::to_string(double(q)) + " elements)");
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
    if (shape_numel(in[1]->shape) != 1) fail(node_, "axis must be a scalar, got shape " + shape_to_string(in[1]->shape));
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
      : node_(node), axis_(node.get_int("axis", -1)),
        largest_(node.opset < 11 || node.get_int("largest", 1) != 0) {}
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

template <class T>
OpFactory factory() {
  return [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<T>(n); };
}

}  // namespace

void register_tensor_ops(std::vector<OpSchema>& out) {
  auto identity = [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<IdentityOp>(n); };
  out.push_back({"Identity", "", 1, kLatest, identity});
  out.push_back({"Dropout", "", 7, kLatest, identity});
  out.push_back({"Shape", "", 1, kLatest, factory<ShapeOp>()});
  out.push_back({"Reshape", "", 5, kLatest, factory<ReshapeOp>()});
  out.push_back({"Size", "", 1, kLatest, factory<SizeOp>()});

  // Squeeze/Unsqueeze: axes attribute 1-12, input 13+ (one class reads node.opset).
  auto squeeze = [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<RegroupOp>(n, Regroup::kSqueeze); };
  auto unsqueeze = [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<RegroupOp>(n, Regroup::kUnsqueeze); };
  out.push_back({"Squeeze", "", 1, 12, squeeze});
  out.push_back({"Squeeze", "", 13, kLatest, squeeze});
  out.push_back({"Unsqueeze", "", 1, 12, unsqueeze});
  out.push_back({"Unsqueeze", "", 13, kLatest, unsqueeze});
  out.push_back({"Flatten", "", 1, kLatest, [](const Node& n) -> std::unique_ptr<Op> {
                   return std::make_unique<RegroupOp>(n, Regroup::kFlatten);
                 }});

  out.push_back({"Transpose", "", 1, kLatest, factory<TransposeOp>()});
  out.push_back({"Concat", "", 1, 3, factory<ConcatOp>()});  // axis optional, default 1
  out.push_back({"Concat", "", 4, kLatest, factory<ConcatOp>()});
  // Split: 'split' input or attribute (1), attribute (2-12), input (13-17), + num_outputs (18+).
  out.push_back({"Split", "", 1, 1, factory<SplitOp>()});
  out.push_back({"Split", "", 2, 12, factory<SplitOp>()});
  out.push_back({"Split", "", 13, 17, factory<SplitOp>()});
  out.push_back({"Split", "", 18, kLatest, factory<SplitOp>()});
  out.push_back({"Slice", "", 1, 9, factory<SliceOp>()});  // attributes, no steps
  out.push_back({"Slice", "", 10, kLatest, factory<SliceOp>()});
  out.push_back({"Gather", "", 1, kLatest, factory<GatherOp>()});
  out.push_back({"GatherElements", "", 11, kLatest, factory<GatherElementsOp>()});
  out.push_back({"Expand", "", 8, kLatest, factory<ExpandOp>()});
  out.push_back({"Tile", "", 6, kLatest, factory<TileOp>()});  // Tile-1 (tiles, axis inputs) not supported
  // Pad: 'paddings' (1), 'pads' attribute (2-10), inputs (11-17), + axes (18), + wrap (19+).
  out.push_back({"Pad", "", 1, 1, factory<PadOp>()});
  out.push_back({"Pad", "", 2, 10, factory<PadOp>()});
  out.push_back({"Pad", "", 11, 17, factory<PadOp>()});
  out.push_back({"Pad", "", 18, 18, factory<PadOp>()});
  out.push_back({"Pad", "", 19, kLatest, factory<PadOp>()});
  out.push_back({"Trilu", "", 14, kLatest, factory<TriluOp>()});

  // Cast-1 took 'to' as a string; from 6 it is an int. 'saturate' from 19.
  auto cast = [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<CastOp>(n, false); };
  auto cast_like = [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<CastOp>(n, true); };
  out.push_back({"Cast", "", 6, 18, cast});
  out.push_back({"Cast", "", 19, kLatest, cast});
  out.push_back({"CastLike", "", 15, 18, cast_like});
  out.push_back({"CastLike", "", 19, kLatest, cast_like});
  out.push_back({"ConstantOfShape", "", 9, kLatest, factory<ConstantOfShapeOp>()});
  out.push_back({"Range", "", 11, kLatest, factory<RangeOp>()});
  out.push_back({"CumSum", "", 11, kLatest, factory<CumSumOp>()});
  // TopK: k attribute (1-9), k input (10), + largest/sorted (11+).
  out.push_back({"TopK", "", 1, 9, factory<TopKOp>()});
  out.push_back({"TopK", "", 10, 10, factory<TopKOp>()});
  out.push_back({"TopK", "", 11, kLatest, factory<TopKOp>()});
}

}  // namespace qeval::eval
