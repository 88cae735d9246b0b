// MatMul (numpy semantics: 1-D promotion, batch broadcasting), Gemm, and Einsum (matmul-shaped
// equations through batched GEMM, anything else through a direct sum over all labels).
#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <type_traits>

#include "eval/exec/ops/families.h"
#include "eval/exec/ops/geometry.h"
#include "eval/exec/ops/weight_panels.h"
#include "kernels/broadcast.h"
#include "kernels/gemm.h"

namespace qeval::eval {

MatMulPlan plan_matmul(const Node& node, const Shape& a_in, const Shape& b_in) {
  if (a_in.empty() || b_in.empty())
    fail(node, "operands must have rank >= 1, got shapes " + shape_to_string(a_in) + " and " + shape_to_string(b_in));
  MatMulPlan p;
  p.a = a_in.size() == 1 ? Shape{1, a_in[0]} : a_in;
  p.b = b_in.size() == 1 ? Shape{b_in[0], 1} : b_in;
  p.m = p.a[p.a.size() - 2];
  p.k = p.a[p.a.size() - 1];
  p.n = p.b[p.b.size() - 1];
  if (p.b[p.b.size() - 2] != p.k)
    fail(node, "inner dimensions differ: " + shape_to_string(a_in) + " x " + shape_to_string(b_in));
  p.batch = broadcast_shapes(node, Shape(p.a.begin(), p.a.end() - 2), Shape(p.b.begin(), p.b.end() - 2));
  p.out = p.batch;
  if (a_in.size() > 1) p.out.push_back(p.m);
  if (b_in.size() > 1) p.out.push_back(p.n);
  return p;
}

std::vector<std::pair<std::int64_t, std::int64_t>> matmul_batch_operands(const MatMulPlan& p) {
  const std::int64_t batch = shape_numel(p.batch);
  const auto sa = kernels::broadcast_strides(Shape(p.a.begin(), p.a.end() - 2), p.batch);
  const auto sb = kernels::broadcast_strides(Shape(p.b.begin(), p.b.end() - 2), p.batch);
  std::vector<std::pair<std::int64_t, std::int64_t>> out(static_cast<std::size_t>(batch));
  for (std::int64_t e = 0; e < batch; ++e) {
    std::int64_t oa = 0, ob = 0, rem = e;
    for (int d = int(p.batch.size()) - 1; d >= 0; --d) {
      const std::int64_t i = rem % p.batch[std::size_t(d)];
      rem /= p.batch[std::size_t(d)];
      oa += i * sa[std::size_t(d)];
      ob += i * sb[std::size_t(d)];
    }
    out[std::size_t(e)] = {oa, ob};
  }
  return out;
}

namespace {

[[noreturn]] void unsupported(const Node& node, const std::string& message) {
  throw UnsupportedError(node.describe() + ": " + message);
}

std::int64_t product(const Shape& s, std::size_t begin, std::size_t end) {
  std::int64_t p = 1;
  for (std::size_t i = begin; i < end; ++i) p *= s[i];
  return p;
}

// Runs f with a default-constructed T matching a storage type: float32 (also the storage of
// float16/bfloat16/fp8), float64, int32, int64, uint32, uint64.
template <class F>
void dispatch_numeric(const Node& node, DType t, F&& f) {
  switch (t) {
    case DType::kFloat32: return f(float{});
    case DType::kFloat64: return f(double{});
    case DType::kInt32: return f(std::int32_t{});
    case DType::kInt64: return f(std::int64_t{});
    case DType::kUInt32: return f(std::uint32_t{});
    case DType::kUInt64: return f(std::uint64_t{});
    default: unsupported(node, "element type " + type_name(t) + " is not supported");
  }
}

bool numeric_type(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kInt32 || t == DType::kInt64 ||
         t == DType::kUInt32 || t == DType::kUInt64;
}

// `batch` products of one shape: float32 through the packed SGEMM, other types through the
// generic loops.
template <class T>
void batched_matmul(const kernels::GemmShape& s, std::int64_t batch, const std::vector<const T*>& a,
                    const std::vector<const T*>& b, const std::vector<T*>& c,
                    const kernels::PackedB* packed_b = nullptr) {
  if constexpr (std::is_same_v<T, float>) {
    kernels::sgemm_batched(s, batch, 1.0f, a.data(), b.data(), 0.0f, c.data(), packed_b);
  } else {
    for (std::int64_t i = 0; i < batch; ++i)
      kernels::gemm_generic<T>(s, a[std::size_t(i)], b[std::size_t(i)], c[std::size_t(i)]);
  }
}

// ---- MatMul ---------------------------------------------------------------------------------

class MatMulOp final : public Op {
 public:
  explicit MatMulOp(const Node& node) : node_(node) {}

  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 2 || !in[0] || !in[1]) fail(node_, "needs two inputs");
    if (in[0]->dtype != in[1]->dtype)
      fail(node_, "input types differ: " + type_name(in[0]->declared) + " and " + type_name(in[1]->declared));
    if (!numeric_type(in[0]->dtype))
      unsupported(node_, "element type " + type_name(in[0]->declared) + " is not supported");
    return {meta_like(*in[0], plan_matmul(node_, in[0]->shape, in[1]->shape).out)};
  }

  void prepare(std::span<const ValueMeta* const> in) override {
    // A constant float B without batch dimensions (a weight) is packed once.
    if (in[0]->dtype != DType::kFloat32 || !in[1]->value) return;
    const MatMulPlan p = plan_matmul(node_, in[0]->shape, in[1]->shape);
    if (!b_is_matrix(p) || !kernels::sgemm_uses_packing(folded_shape(p))) return;
    packed_b_.prepare(
        in[1], [&](const Tensor& b) { return kernels::PackedB(false, p.k, p.n, b.data<float>(), p.n, panel_storage(*in[1])); },
        shared_constants(), "B");
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    dispatch_numeric(node_, in[0]->dtype(), [&](auto zero) { compute<decltype(zero)>(*in[0], *in[1], *out[0]); });
  }

 private:
  // B without batch dimensions (a weight): A's batch folds into the rows of one product.
  static bool b_is_matrix(const MatMulPlan& p) {
    const std::size_t ra = p.a.size() - 2, rb = p.b.size() - 2;
    return product(p.b, 0, rb) == 1 && product(p.batch, 0, p.batch.size()) == product(p.a, 0, ra);
  }
  static kernels::GemmShape folded_shape(const MatMulPlan& p) {
    const std::int64_t rows = product(p.a, 0, p.a.size() - 2) * p.m;
    return {false, false, rows, p.n, p.k, p.k, p.n, p.n};
  }

  template <class T>
  void compute(const Tensor& a, const Tensor& b, Tensor& y) const {
    const MatMulPlan p = plan_matmul(node_, a.shape(), b.shape());
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* py = y.data<T>();
    if (b_is_matrix(p)) {
      const kernels::PackedB* packed = nullptr;
      if constexpr (std::is_same_v<T, float>) packed = packed_b_.find(&b);
      batched_matmul<T>(folded_shape(p), 1, {pa}, {pb}, {py}, packed);
      return;
    }
    const auto operands = matmul_batch_operands(p);
    const std::int64_t batch = std::int64_t(operands.size());
    std::vector<const T*> as(static_cast<std::size_t>(batch)), bs(static_cast<std::size_t>(batch));
    std::vector<T*> ys(static_cast<std::size_t>(batch));
    for (std::int64_t e = 0; e < batch; ++e) {
      as[std::size_t(e)] = pa + operands[std::size_t(e)].first * p.m * p.k;
      bs[std::size_t(e)] = pb + operands[std::size_t(e)].second * p.k * p.n;
      ys[std::size_t(e)] = py + e * p.m * p.n;
    }
    batched_matmul<T>({false, false, p.m, p.n, p.k, p.k, p.n, p.n}, batch, as, bs, ys);
  }

  Node node_;
  ConstantCache<kernels::PackedB> packed_b_;
};

// ---- Gemm -----------------------------------------------------------------------------------

class GemmOp final : public Op {
 public:
  explicit GemmOp(const Node& node)
      : node_(node),
        trans_a_(node.get_int("transA", 0) != 0),
        trans_b_(node.get_int("transB", 0) != 0),
        alpha_(node.get_float("alpha", 1.0f)),
        beta_(node.get_float("beta", 1.0f)) {}

  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 2 || !in[0] || !in[1]) fail(node_, "needs inputs A and B");
    const ValueMeta& a = *in[0];
    const ValueMeta& b = *in[1];
    if (a.dtype != b.dtype)
      fail(node_, "A and B types differ: " + type_name(a.declared) + " and " + type_name(b.declared));
    if (a.dtype != DType::kFloat32 && a.dtype != DType::kFloat64)
      unsupported(node_, "element type " + type_name(a.declared) + " is not supported (float types only)");
    if (a.shape.size() != 2 || b.shape.size() != 2)
      fail(node_, "A and B must be 2-D, got " + shape_to_string(a.shape) + " and " + shape_to_string(b.shape));
    const Dims d = dims(a.shape, b.shape);
    if (d.k != d.k_b)
      fail(node_, "inner dimensions differ: op(A) is " + std::to_string(d.m) + "x" + std::to_string(d.k) +
                      ", op(B) is " + std::to_string(d.k_b) + "x" + std::to_string(d.n) + " (transA " +
                      std::to_string(trans_a_) + ", transB " + std::to_string(trans_b_) + ")");
    if (in.size() > 2 && in[2]) {
      const Shape& c = in[2]->shape;
      if (in[2]->dtype != a.dtype) fail(node_, "C type " + type_name(in[2]->declared) + " differs from A's");
      // C broadcasts one way to [M, N].
      const Shape y{d.m, d.n};
      bool ok = c.size() <= 2;
      for (std::size_t i = 0; ok && i < c.size(); ++i) {
        const std::int64_t want = y[2 - c.size() + i];
        ok = c[i] == want || c[i] == 1;
      }
      if (!ok)
        fail(node_, "C of shape " + shape_to_string(c) + " does not broadcast to the output " + shape_to_string(y));
    }
    return {meta_like(a, {d.m, d.n})};
  }

  void prepare(std::span<const ValueMeta* const> in) override {
    if (in[0]->dtype != DType::kFloat32 || !in[1]->value) return;
    const Dims d = dims(in[0]->shape, in[1]->shape);
    const std::int64_t ldb = in[1]->shape[1];
    if (!kernels::sgemm_uses_packing({trans_a_, trans_b_, d.m, d.n, d.k, in[0]->shape[1], ldb, d.n})) return;
    packed_b_.prepare(
        in[1],
        [&](const Tensor& b) { return kernels::PackedB(trans_b_, d.k, d.n, b.data<float>(), ldb, panel_storage(*in[1])); },
        shared_constants(), trans_b_ ? "B^T" : "B");
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor* c = in.size() > 2 ? in[2] : nullptr;
    if (in[0]->dtype() == DType::kFloat32) compute<float>(*in[0], *in[1], c, *out[0]);
    else compute<double>(*in[0], *in[1], c, *out[0]);
  }

 private:
  struct Dims {
    std::int64_t m, k, k_b, n;
  };
  Dims dims(const Shape& a, const Shape& b) const {
    return {trans_a_ ? a[1] : a[0], trans_a_ ? a[0] : a[1], trans_b_ ? b[1] : b[0], trans_b_ ? b[0] : b[1]};
  }

  template <class T>
  void compute(const Tensor& a, const Tensor& b, const Tensor* c, Tensor& y) const {
    const Dims d = dims(a.shape(), b.shape());
    const kernels::GemmShape s{trans_a_, trans_b_, d.m, d.n, d.k, a.shape()[1], b.shape()[1], d.n};
    T* py = y.data<T>();
    const bool use_c = c && beta_ != 0.0f;
    if (use_c) {
      // Y starts as C broadcast to [M, N]; the GEMM then computes alpha * AB + beta * Y.
      const T* pc = c->data<T>();
      const auto sc = kernels::broadcast_strides(c->shape(), y.shape());
      for (std::int64_t i = 0; i < d.m; ++i)
        for (std::int64_t j = 0; j < d.n; ++j) py[i * d.n + j] = pc[i * sc[0] + j * sc[1]];
    }
    if constexpr (std::is_same_v<T, float>) {
      kernels::sgemm(s, alpha_, a.data<float>(), b.data<float>(), use_c ? beta_ : 0.0f, py, nullptr,
                     packed_b_.find(&b));
    } else {
      std::vector<T> ab(std::size_t(d.m * d.n));
      kernels::gemm_generic<T>(s, a.data<T>(), b.data<T>(), ab.data());
      for (std::int64_t i = 0; i < d.m * d.n; ++i)
        py[i] = T(alpha_) * ab[std::size_t(i)] + (use_c ? T(beta_) * py[i] : T(0));
    }
  }

  Node node_;
  bool trans_a_, trans_b_;
  float alpha_, beta_;
  ConstantCache<kernels::PackedB> packed_b_;
};

// ---- Einsum ---------------------------------------------------------------------------------

// Labels are ints: letters are their character codes; the dimensions an ellipsis stands for are
// kEllipsisLabel + i, i counted from the left of the broadcast ellipsis shape.
constexpr int kEllipsisLabel = 256;

struct EinsumTerm {
  std::vector<int> letters;  // as written, kEllipsisMark where "..." stood
  bool has_ellipsis = false;
};
constexpr int kEllipsisMark = -1;

struct Equation {
  std::vector<EinsumTerm> inputs;
  EinsumTerm output;
  bool explicit_output = false;
};

EinsumTerm parse_term(const Node& node, const std::string& text) {
  EinsumTerm t;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch == '.') {
      if (text.compare(i, 3, "...") != 0 || t.has_ellipsis) fail(node, "malformed ellipsis in term '" + text + "'");
      t.has_ellipsis = true;
      t.letters.push_back(kEllipsisMark);
      i += 2;
    } else if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')) {
      t.letters.push_back(ch);
    } else {
      fail(node, std::string("equation has an invalid character '") + ch + "'");
    }
  }
  return t;
}

Equation parse_equation(const Node& node, std::string eq) {
  eq.erase(std::remove_if(eq.begin(), eq.end(), [](char ch) { return ch == ' ' || ch == '\t'; }), eq.end());
  Equation e;
  const auto arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::size_t start = 0;
  while (true) {
    const auto comma = lhs.find(',', start);
    e.inputs.push_back(
        parse_term(node, lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (arrow != std::string::npos) {
    e.explicit_output = true;
    e.output = parse_term(node, eq.substr(arrow + 2));
  } else {
    // Implicit output: the ellipsis dimensions, then letters used exactly once, in character order.
    std::map<int, int> counts;
    bool any_ellipsis = false;
    for (const auto& t : e.inputs)
      for (int l : t.letters) {
        if (l == kEllipsisMark) any_ellipsis = true;
        else ++counts[l];
      }
    if (any_ellipsis) {
      e.output.letters.push_back(kEllipsisMark);
      e.output.has_ellipsis = true;
    }
    for (const auto& [l, n] : counts)
      if (n == 1) e.output.letters.push_back(l);
  }
  return e;
}

// The equation resolved against operand shapes: each operand's axes as labels, every label's size.
struct EinsumPlan {
  std::vector<std::vector<int>> operand_labels;
  std::vector<int> output_labels;
  std::map<int, std::int64_t> sizes;
  Shape output_shape;
  bool ellipsis_broadcasts = false;  // some ellipsis dimension is 1 in one operand, n in another
};

EinsumPlan plan_einsum(const Node& node, const Equation& eq, const std::vector<Shape>& shapes) {
  if (shapes.size() != eq.inputs.size())
    fail(node,
         "equation has " + std::to_string(eq.inputs.size()) + " operands, the node " + std::to_string(shapes.size()));
  EinsumPlan p;
  std::size_t ellipsis_rank = 0;
  for (std::size_t o = 0; o < shapes.size(); ++o) {
    const auto& t = eq.inputs[o];
    const std::size_t named = t.letters.size() - (t.has_ellipsis ? 1 : 0);
    if (t.has_ellipsis ? shapes[o].size() < named : shapes[o].size() != named)
      fail(node, "operand " + std::to_string(o) + " has shape " + shape_to_string(shapes[o]) +
                     ", the equation's term has " + std::to_string(named) + " letters" +
                     (t.has_ellipsis ? " and an ellipsis" : ""));
    if (t.has_ellipsis) ellipsis_rank = std::max(ellipsis_rank, shapes[o].size() - named);
  }
  std::map<int, std::int64_t> ellipsis_seen;
  for (std::size_t o = 0; o < shapes.size(); ++o) {
    const auto& t = eq.inputs[o];
    const std::size_t erank = t.has_ellipsis ? shapes[o].size() - (t.letters.size() - 1) : 0;
    std::vector<int> labels;
    std::size_t axis = 0;
    for (int l : t.letters) {
      if (l == kEllipsisMark) {
        for (std::size_t j = 0; j < erank; ++j, ++axis) {
          const int label = kEllipsisLabel + int(ellipsis_rank - erank + j);
          const std::int64_t size = shapes[o][axis];
          auto [it, fresh] = ellipsis_seen.emplace(label, size);
          if (!fresh && it->second != size) {
            if (it->second != 1 && size != 1)
              fail(node, "ellipsis dimensions of the operands do not broadcast: " + std::to_string(it->second) +
                             " vs " + std::to_string(size));
            p.ellipsis_broadcasts = true;
            it->second = std::max(it->second, size);
          }
          labels.push_back(label);
        }
        continue;
      }
      const std::int64_t size = shapes[o][axis++];
      auto [it, fresh] = p.sizes.emplace(l, size);
      if (!fresh && it->second != size)
        fail(node, std::string("label '") + char(l) + "' has size " + std::to_string(it->second) + " and " +
                       std::to_string(size) + " in different places");
      labels.push_back(l);
    }
    p.operand_labels.push_back(std::move(labels));
  }
  for (const auto& [l, s] : ellipsis_seen) p.sizes[l] = s;
  for (int l : eq.output.letters) {
    if (l == kEllipsisMark) {
      for (std::size_t j = 0; j < ellipsis_rank; ++j) p.output_labels.push_back(kEllipsisLabel + int(j));
      continue;
    }
    if (!p.sizes.count(l)) fail(node, std::string("output label '") + char(l) + "' is in no operand");
    if (std::count(eq.output.letters.begin(), eq.output.letters.end(), l) > 1)
      fail(node, std::string("output label '") + char(l) + "' appears twice");
    p.output_labels.push_back(l);
  }
  // An operand's ellipsis dimensions missing from an explicit output are summed, like any label.
  for (int l : p.output_labels) p.output_shape.push_back(p.sizes.at(l));
  return p;
}

// dst[i] = src[...] with dst axis d = src axis perm[d].
template <class T>
void permute(const T* src, const Shape& src_shape, const std::vector<int>& perm, T* dst) {
  const std::size_t r = perm.size();
  std::vector<std::int64_t> src_strides(r, 1), dst_shape(r), strides(r);
  for (int d = int(r) - 2; d >= 0; --d)
    src_strides[std::size_t(d)] = src_strides[std::size_t(d) + 1] * src_shape[std::size_t(d) + 1];
  for (std::size_t d = 0; d < r; ++d) {
    dst_shape[d] = src_shape[std::size_t(perm[d])];
    strides[d] = src_strides[std::size_t(perm[d])];
  }
  const std::int64_t n = product(dst_shape, 0, r);
  std::vector<std::int64_t> idx(r, 0);
  std::int64_t off = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    dst[i] = src[off];
    for (int d = int(r) - 1; d >= 0; --d) {
      const std::size_t du = std::size_t(d);
      if (++idx[du] < dst_shape[du]) {
        off += strides[du];
        break;
      }
      off -= strides[du] * (dst_shape[du] - 1);
      idx[du] = 0;
    }
  }
}

template <class T>
struct SumOf {
  using type = T;
};
template <>
struct SumOf<std::int32_t> {
  using type = std::uint32_t;
};  // wraps like numpy, no UB
template <>
struct SumOf<std::int64_t> {
  using type = std::uint64_t;
};

class EinsumOp final : public Op {
 public:
  explicit EinsumOp(const Node& node) : node_(node), eq_(parse_equation(node, node.get_string("equation", ""))) {
    if (!node.has("equation")) fail(node, "missing attribute 'equation'");
  }

  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    std::vector<Shape> shapes;
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (!in[i]) fail(node_, "input " + std::to_string(i) + " is missing");
      if (in[i]->dtype != in[0]->dtype) fail(node_, "input types differ");
      shapes.push_back(in[i]->shape);
    }
    if (shapes.empty()) fail(node_, "needs at least one input");
    if (!numeric_type(in[0]->dtype))
      unsupported(node_, "element type " + type_name(in[0]->declared) + " is not supported");
    return {meta_like(*in[0], plan_einsum(node_, eq_, shapes).output_shape)};
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    std::vector<Shape> shapes;
    for (const Tensor* t : in) shapes.push_back(t->shape());
    const EinsumPlan p = plan_einsum(node_, eq_, shapes);
    dispatch_numeric(node_, in[0]->dtype(), [&](auto zero) {
      using T = decltype(zero);
      if (!as_matmul<T>(p, in, *out[0])) direct_sum<T>(p, in, *out[0]);
    });
  }

 private:
  // Two operands without repeated or one-sided summed labels: permute to [batch, M, K] x
  // [batch, K, N] (transposes instead of copies where the layout allows), one batched GEMM, permute
  // the [batch, M, N] result to the output order. Returns false when the equation is not of that form.
  template <class T>
  bool as_matmul(const EinsumPlan& p, std::span<const Tensor* const> in, Tensor& y) const {
    if (p.operand_labels.size() != 2 || p.ellipsis_broadcasts) return false;
    const auto& la = p.operand_labels[0];
    const auto& lb = p.operand_labels[1];
    const auto& lo = p.output_labels;
    auto has = [](const std::vector<int>& v, int l) { return std::find(v.begin(), v.end(), l) != v.end(); };
    auto unique = [](std::vector<int> v) {
      std::sort(v.begin(), v.end());
      return std::adjacent_find(v.begin(), v.end()) == v.end();
    };
    if (!unique(la) || !unique(lb)) return false;
    std::vector<int> batch, ml, nl, kl;
    for (int l : lo) {
      if (has(la, l) && has(lb, l)) batch.push_back(l);
      else if (has(la, l)) ml.push_back(l);
      else nl.push_back(l);
    }
    for (int l : la)
      if (!has(lo, l)) {
        if (!has(lb, l)) return false;  // summed over one operand only
        kl.push_back(l);
      }
    for (int l : lb)
      if (!has(lo, l) && !has(la, l)) return false;
    auto size_of = [&](const std::vector<int>& ls) {
      std::int64_t s = 1;
      for (int l : ls) s *= p.sizes.at(l);
      return s;
    };
    const std::int64_t nb = size_of(batch), m = size_of(ml), n = size_of(nl), k = size_of(kl);
    auto concat = [](std::initializer_list<const std::vector<int>*> parts) {
      std::vector<int> v;
      for (auto* part : parts) v.insert(v.end(), part->begin(), part->end());
      return v;
    };
    // The operand as stored if its label order is `plain` or `transposed`; else a permuted copy.
    std::vector<std::vector<T>> copies;
    copies.reserve(2);
    auto arrange = [&](const Tensor& t, const std::vector<int>& labels, const std::vector<int>& plain,
                       const std::vector<int>& transposed, bool& trans) -> const T* {
      trans = false;
      if (labels == plain) return t.data<T>();
      if (labels == transposed) {
        trans = true;
        return t.data<T>();
      }
      std::vector<int> perm;
      for (int l : plain) perm.push_back(int(std::find(labels.begin(), labels.end(), l) - labels.begin()));
      copies.emplace_back(std::size_t(t.numel()));
      permute(t.data<T>(), t.shape(), perm, copies.back().data());
      return copies.back().data();
    };
    bool ta = false, tb = false;
    const T* pa = arrange(*in[0], la, concat({&batch, &ml, &kl}), concat({&batch, &kl, &ml}), ta);
    const T* pb = arrange(*in[1], lb, concat({&batch, &kl, &nl}), concat({&batch, &nl, &kl}), tb);
    const std::vector<int> c_labels = concat({&batch, &ml, &nl});
    const bool direct = c_labels == lo;
    std::vector<T> c_buf(direct ? 0 : std::size_t(nb * m * n));
    T* pc = direct ? y.data<T>() : c_buf.data();
    std::vector<const T*> as(static_cast<std::size_t>(nb)), bs(static_cast<std::size_t>(nb));
    std::vector<T*> cs(static_cast<std::size_t>(nb));
    for (std::int64_t e = 0; e < nb; ++e) {
      as[std::size_t(e)] = pa + e * m * k;
      bs[std::size_t(e)] = pb + e * k * n;
      cs[std::size_t(e)] = pc + e * m * n;
    }
    batched_matmul<T>({ta, tb, m, n, k, ta ? m : k, tb ? k : n, n}, nb, as, bs, cs);
    if (!direct) {
      Shape c_shape;
      for (int l : c_labels) c_shape.push_back(p.sizes.at(l));
      std::vector<int> perm;
      for (int l : lo) perm.push_back(int(std::find(c_labels.begin(), c_labels.end(), l) - c_labels.begin()));
      permute(c_buf.data(), c_shape, perm, y.data<T>());
    }
    return true;
  }

  // Any equation: for every output element, the sum over the summed labels of the operands'
  // product. Slow but general (diagonals, one-sided sums, broadcast ellipses, 1 or 3+ operands).
  template <class T>
  void direct_sum(const EinsumPlan& p, std::span<const Tensor* const> in, Tensor& y) const {
    using Acc = typename SumOf<T>::type;
    std::vector<int> all = p.output_labels;
    for (const auto& [l, _] : p.sizes)
      if (std::find(all.begin(), all.end(), l) == all.end()) all.push_back(l);
    const std::size_t n_out = p.output_labels.size();
    std::vector<std::int64_t> dims;
    for (int l : all) dims.push_back(p.sizes.at(l));
    // Per operand, the stride each label contributes (0 where the operand broadcasts or lacks it).
    std::vector<std::vector<std::int64_t>> strides(in.size(), std::vector<std::int64_t>(all.size(), 0));
    for (std::size_t o = 0; o < in.size(); ++o) {
      const Shape& s = in[o]->shape();
      std::int64_t stride = 1;
      for (int ax = int(s.size()) - 1; ax >= 0; --ax) {
        const int l = p.operand_labels[o][std::size_t(ax)];
        const std::size_t pos = std::size_t(std::find(all.begin(), all.end(), l) - all.begin());
        if (s[std::size_t(ax)] != 1) strides[o][pos] += stride;
        stride *= s[std::size_t(ax)];
      }
    }
    const std::int64_t outer = product(dims, 0, n_out), inner = product(dims, n_out, dims.size());
    T* py = y.data<T>();
    std::vector<std::int64_t> idx(all.size());
    std::vector<const T*> data;
    for (const Tensor* t : in) data.push_back(t->data<T>());
    for (std::int64_t i = 0; i < outer; ++i) {
      std::int64_t rem = i;
      for (int d = int(n_out) - 1; d >= 0; --d) {
        idx[std::size_t(d)] = rem % dims[std::size_t(d)];
        rem /= dims[std::size_t(d)];
      }
      Acc sum = 0;
      for (std::int64_t j = 0; j < inner; ++j) {
        rem = j;
        for (int d = int(all.size()) - 1; d >= int(n_out); --d) {
          idx[std::size_t(d)] = rem % dims[std::size_t(d)];
          rem /= dims[std::size_t(d)];
        }
        Acc prod = 1;
        for (std::size_t o = 0; o < data.size(); ++o) {
          std::int64_t off = 0;
          for (std::size_t d = 0; d < all.size(); ++d) off += idx[d] * strides[o][d];
          prod *= Acc(data[o][off]);
        }
        sum += prod;
      }
      py[i] = T(sum);
    }
  }

  Node node_;
  Equation eq_;
};

}  // namespace

void register_matmul_ops(std::vector<OpSchema>& out) {
  // MatMul 1, 9 and 13 differ only in the types they list.
  out.push_back(
      {"MatMul", "", 1, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<MatMulOp>(n); }});
  // Gemm 7 dropped the `broadcast` attribute for unidirectional broadcasting of C; 11 made C
  // optional (accepted here at every version); 9 and 13 added types.
  out.push_back(
      {"Gemm", "", 7, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<GemmOp>(n); }});
  out.push_back({"Einsum", "", 12, kMaxOpset,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<EinsumOp>(n); }});
}

}  // namespace qeval::eval
