// Helpers shared by the shape, layout, index, cast and scan op files: plan-time inputs, axis and
// form checks, parallel loops over items, and the strided copy behind Transpose, Slice, Expand and
// Tile (strided_copy.cc).
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "eval/exec/onnx_import.h"
#include "eval/exec/ops/op.h"

namespace qeval::eval::tensor_ops {

inline void copy_data(const Tensor& in, Tensor& out) {
  if (in.nbytes()) std::memcpy(out.raw(), in.raw(), in.nbytes());
}

// Like constant_input, but a value that only exists at run time is an unsupported configuration
// (the model is valid ONNX; qeval plans shapes before running), so the conformance runner and the
// CLI report it as unsupported rather than as a broken model.
inline const Tensor& plan_time_input(const Node& node, std::span<const ValueMeta* const> in, std::size_t i,
                                     const char* what) {
  if (i >= in.size() || !in[i]) fail(node, std::string("missing input ") + what);
  if (!in[i]->value)
    throw UnsupportedError(node.describe() + ": input " + std::to_string(i) + " ('" + node.inputs[i] + "', " + what +
                           ") depends on runtime data; qeval needs it at plan time "
                           "(a constant, or computable from static shapes) to know output shapes");
  return *in[i]->value;
}

inline std::vector<std::int64_t> int_list(const Node& node, const Tensor& t, const char* what) {
  if (t.dtype() != DType::kInt64 && t.dtype() != DType::kInt32)
    fail(node, std::string(what) + " must be int64 (or int32), got " + type_name(t.dtype()));
  if (t.rank() > 1) fail(node, std::string(what) + " must be 1-D, got shape " + shape_to_string(t.shape()));
  return to_int64s(t);
}

inline std::vector<std::int64_t> dense_strides(const Shape& s) {
  std::vector<std::int64_t> st(s.size(), 1);
  for (int d = int(s.size()) - 2; d >= 0; --d) st[std::size_t(d)] = st[std::size_t(d) + 1] * s[std::size_t(d) + 1];
  return st;
}

inline std::int64_t prod(const Shape& s, std::size_t begin, std::size_t end) {
  std::int64_t p = 1;
  for (std::size_t i = begin; i < end && i < s.size(); ++i) p *= s[i];
  return p;
}

// Normalised, duplicate-free axes for a tensor of `rank`.
inline std::vector<int> unique_axes(const Node& node, const std::vector<std::int64_t>& axes, int rank,
                                    const char* what) {
  std::vector<int> out;
  for (auto a : axes) {
    if (a < -rank || a >= rank)
      fail(node,
           std::string(what) + " value " + std::to_string(a) + " is out of range for rank " + std::to_string(rank));
    const int n = int(a < 0 ? a + rank : a);
    if (std::find(out.begin(), out.end(), n) != out.end())
      fail(node, std::string(what) + " has axis " + std::to_string(a) + " more than once");
    out.push_back(n);
  }
  return out;
}

// Opsets moved shape-like attributes to inputs (Slice 10, Pad 11, Squeeze/Unsqueeze/Split 13);
// a node in the other form is malformed for its opset.
inline void check_form(const Node& node, const char* attr, std::size_t input, int input_since) {
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
inline void parallel_items(std::int64_t n, std::int64_t elems_per_item, F&& f) {
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
inline void with_element_size(std::size_t es, F&& f) {
  switch (es) {
    case 1: return f(std::uint8_t{});
    case 2: return f(std::uint16_t{});
    case 4: return f(std::uint32_t{});
    case 8: return f(std::uint64_t{});
    default: throw std::logic_error("unexpected element size " + std::to_string(es));
  }
}

// Gather/GatherElements indices and CumSum's axis.
inline void check_index_type(const Node& node, const ValueMeta& m) {
  if (m.dtype != DType::kInt64 && m.dtype != DType::kInt32)
    fail(node, "indices must be int32 or int64, got " + type_name(m.declared));
}

template <class T>
OpFactory factory() {
  return [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<T>(n); };
}

using eval::StridedView;  // op.h

// Copies the view of `src` (elements of `es` bytes) into the dense `dst`.
void copy_view(const std::byte* src, std::byte* dst, std::size_t es, StridedView v);

}  // namespace qeval::eval::tensor_ops
