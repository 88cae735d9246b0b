// Elementwise ops: broadcasting arithmetic, comparisons, logic, Where, unary math, activations.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>

#include "eval/exec/ops/families.h"
#include "kernels/broadcast.h"
#include "kernels/elementwise.h"
#include "kernels/vector_math.h"

namespace qeval::eval {

namespace {

// Integer division truncating toward zero, as ONNX Runtime. ONNX leaves two cases undefined; qeval
// defines them (docs/infer.md): a zero divisor is an InputError naming the node, and the minimum
// value divided by -1 wraps as two's complement hardware would (INT_MIN / -1 = INT_MIN), where the
// C++ division traps with SIGFPE on x86 (for int32/int64; narrower types are promoted to int).
template <class T>
T integer_divide(const Node& node, T x, T y) {
  if (y == 0) fail(node, "integer division by zero");
  if constexpr (std::is_signed_v<T>) {
    if (y == -1) return T(std::make_unsigned_t<T>(0) - std::make_unsigned_t<T>(x));  // -x, wrapping
  }
  return T(x / y);
}

template <class T, class F>
void binary_loop(const Tensor& a, const Tensor& b, Tensor& out, F f) {
  using R = decltype(f(T{}, T{}));
  kernels::broadcast_map(out.shape(), a.shape(), b.shape(), a.data<T>(), b.data<T>(), reinterpret_cast<R*>(out.raw()),
                         f);
}

// ---- binary arithmetic ---------------------------------------------------------------------

enum class Arith { kAdd, kSub, kMul, kDiv, kPow };

class ArithOp final : public Op {
 public:
  ArithOp(const Node& node, Arith kind) : node_(node), kind_(kind) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 2 || !in[0] || !in[1]) fail(node_, "needs two inputs");
    if (kind_ != Arith::kPow && in[0]->dtype != in[1]->dtype)
      fail(node_, "input types differ: " + std::string(dtype_name(in[0]->declared)) + " and " +
                      std::string(dtype_name(in[1]->declared)));
    return {meta_like(*in[0], broadcast_shapes(node_, in[0]->shape, in[1]->shape))};
  }
  int elementwise_arity() const override { return 2; }
  void run_elementwise(const float* a, std::int64_t a_step, const float* b, std::int64_t b_step, float* y,
                       std::int64_t n) const override {
    // The functors of apply<float> (for Pow: a float32 exponent).
    switch (kind_) {
      case Arith::kAdd:
        return kernels::binary_run(a, a_step, b, b_step, y, n, [](float x, float z) { return float(x + z); });
      case Arith::kSub:
        return kernels::binary_run(a, a_step, b, b_step, y, n, [](float x, float z) { return float(x - z); });
      case Arith::kMul:
        return kernels::binary_run(a, a_step, b, b_step, y, n, [](float x, float z) { return float(x * z); });
      case Arith::kDiv:
        return kernels::binary_run(a, a_step, b, b_step, y, n, [](float x, float z) { return float(x / z); });
      case Arith::kPow:
        return kernels::binary_run(a, a_step, b, b_step, y, n, [](float x, float e) {
          return std::pow(x, static_cast<float>(static_cast<double>(e)));
        });
    }
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& a = *in[0];
    const Tensor& b = *in[1];
    switch (a.dtype()) {
      case DType::kFloat32: return apply<float>(a, b, *out[0]);
      case DType::kFloat64: return apply<double>(a, b, *out[0]);
      case DType::kInt8: return apply<std::int8_t>(a, b, *out[0]);
      case DType::kUInt8: return apply<std::uint8_t>(a, b, *out[0]);
      case DType::kInt16: return apply<std::int16_t>(a, b, *out[0]);
      case DType::kUInt16: return apply<std::uint16_t>(a, b, *out[0]);
      case DType::kInt32: return apply<std::int32_t>(a, b, *out[0]);
      case DType::kUInt32: return apply<std::uint32_t>(a, b, *out[0]);
      case DType::kInt64: return apply<std::int64_t>(a, b, *out[0]);
      case DType::kUInt64: return apply<std::uint64_t>(a, b, *out[0]);
      default: fail(node_, "unsupported type " + std::string(dtype_name(a.dtype())));
    }
  }

 private:
  template <class T>
  void apply(const Tensor& a, const Tensor& b, Tensor& o) const {
    switch (kind_) {
      case Arith::kAdd: return binary_loop<T>(a, b, o, [](T x, T y) { return T(x + y); });
      case Arith::kSub: return binary_loop<T>(a, b, o, [](T x, T y) { return T(x - y); });
      case Arith::kMul: return binary_loop<T>(a, b, o, [](T x, T y) { return T(x * y); });
      case Arith::kDiv:
        if constexpr (std::is_integral_v<T>) {
          return binary_loop<T>(a, b, o, [this](T x, T y) { return integer_divide(node_, x, y); });
        } else {
          return binary_loop<T>(a, b, o, [](T x, T y) { return T(x / y); });
        }
      case Arith::kPow: return pow_apply<T>(a, b, o);
    }
  }
  template <class T>
  void pow_apply(const Tensor& a, const Tensor& b, Tensor& o) const {
    if constexpr (!std::is_same_v<T, float> && !std::is_same_v<T, double> && !std::is_same_v<T, std::int32_t> &&
                  !std::is_same_v<T, std::int64_t>) {
      fail(node_, "Pow base type " + std::string(dtype_name(a.dtype())) + " is not supported");
    }
    // The exponent may have another type (opset 12+); compute in double, cast to the base type.
    auto with_exponent = [&](auto e_zero) {
      using E = decltype(e_zero);
      kernels::broadcast_map(o.shape(), a.shape(), b.shape(), a.data<T>(), b.data<E>(), o.data<T>(), [](T x, E e) {
        if constexpr (std::is_same_v<T, float>) return std::pow(x, static_cast<float>(static_cast<double>(e)));
        else return static_cast<T>(std::pow(static_cast<double>(x), static_cast<double>(e)));
      });
    };
    switch (b.dtype()) {
      case DType::kFloat32: return with_exponent(float{});
      case DType::kFloat64: return with_exponent(double{});
      case DType::kInt32: return with_exponent(std::int32_t{});
      case DType::kInt64: return with_exponent(std::int64_t{});
      case DType::kUInt32: return with_exponent(std::uint32_t{});
      case DType::kUInt64: return with_exponent(std::uint64_t{});
      default: fail(node_, "unsupported exponent type " + std::string(dtype_name(b.dtype())));
    }
  }
  Node node_;
  Arith kind_;
};

// ---- Mod -------------------------------------------------------------------------------------

// fmod=0: the remainder takes the divisor's sign (Python's %, integers only); fmod=1: the dividend's
// (C's fmod and %). x mod -1 is 0 for every x, the minimum value included, where C++'s % traps
// (SIGFPE on x86, as division); a zero divisor is an InputError naming the node (docs/infer.md).
class ModOp final : public Op {
 public:
  explicit ModOp(const Node& node) : node_(node), fmod_(node.get_int("fmod", 0) != 0) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 2 || !in[0] || !in[1]) fail(node_, "needs two inputs");
    if (in[0]->declared != in[1]->declared)
      fail(node_, "input types differ: " + type_name(in[0]->declared) + " and " + type_name(in[1]->declared));
    const DType t = in[0]->dtype;
    if (t == DType::kBool) fail(node_, "bool inputs are not numbers");
    if ((t == DType::kFloat32 || t == DType::kFloat64) && !fmod_)
      fail(node_, "floating-point inputs need fmod=1 (the ONNX definition)");
    return {meta_like(*in[0], broadcast_shapes(node_, in[0]->shape, in[1]->shape))};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    visit_storage(in[0]->dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_floating_point_v<T>) {
        binary_loop<T>(*in[0], *in[1], *out[0], [](T x, T y) { return T(std::fmod(x, y)); });
      } else if constexpr (!std::is_same_v<T, bool>) {
        binary_loop<T>(*in[0], *in[1], *out[0], [this](T x, T y) { return remainder(x, y); });
      }
    });
  }

 private:
  template <class T>
  T remainder(T x, T y) const {
    if (y == 0) fail(node_, "integer modulo by zero");
    if constexpr (std::is_signed_v<T>) {
      if (y == -1) return T(0);
      const T r = T(x % y);
      return !fmod_ && r != 0 && ((r < 0) != (y < 0)) ? T(r + y) : r;
    } else {
      return T(x % y);
    }
  }
  Node node_;
  bool fmod_;
};

// ---- variadic Min, Max, Sum, Mean (numpy broadcasting across all inputs) ----------------------

enum class Variadic { kMin, kMax, kSum, kMean };

class VariadicOp final : public Op {
 public:
  VariadicOp(const Node& node, Variadic kind) : node_(node), kind_(kind) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs at least one input");
    Shape shape = in[0]->shape;
    for (std::size_t i = 1; i < in.size(); ++i) {
      if (!in[i]) fail(node_, "input " + std::to_string(i) + " is omitted");
      if (in[i]->dtype != in[0]->dtype)
        fail(node_, "input types differ: " + type_name(in[0]->declared) + " and " + type_name(in[i]->declared));
      shape = broadcast_shapes(node_, shape, in[i]->shape);
    }
    const DType t = in[0]->dtype;
    const bool is_float = t == DType::kFloat32 || t == DType::kFloat64;
    if (t == DType::kBool || (!is_float && (kind_ == Variadic::kSum || kind_ == Variadic::kMean)))
      throw UnsupportedError(node_.describe() + ": element type " + type_name(in[0]->declared) + " is not supported");
    return {meta_like(*in[0], shape)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    visit_storage(in[0]->dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, bool>) apply<T>(in, *out[0]);
    });
  }

 private:
  template <class T>
  void apply(std::span<const Tensor* const> in, Tensor& o) const {
    T* po = o.data<T>();
    const T* p0 = in[0]->data<T>();
    kernels::for_each_broadcast(o.shape(), in[0]->shape(), in[0]->shape(),
                                [&](std::int64_t i, std::int64_t ia, std::int64_t) { po[i] = p0[ia]; });
    for (std::size_t k = 1; k < in.size(); ++k) {
      const T* pk = in[k]->data<T>();
      kernels::for_each_broadcast(
          o.shape(), o.shape(), in[k]->shape(),
          [&](std::int64_t i, std::int64_t, std::int64_t ib) { po[i] = combine(po[i], pk[ib]); });
    }
    if (kind_ == Variadic::kMean)
      for (std::int64_t i = 0; i < o.numel(); ++i) po[i] = T(po[i] / T(in.size()));
  }
  // NaN propagates from either operand (numpy's minimum/maximum, ONNX Runtime).
  template <class T>
  T combine(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a)) return a;
      if (std::isnan(b)) return b;
    }
    switch (kind_) {
      case Variadic::kMin: return std::min(a, b);
      case Variadic::kMax: return std::max(a, b);
      default: return T(a + b);
    }
  }
  Node node_;
  Variadic kind_;
};

// ---- comparisons and logic -------------------------------------------------------------------

enum class Compare { kEqual, kGreater, kLess, kGreaterOrEqual, kLessOrEqual };

class CompareOp final : public Op {
 public:
  CompareOp(const Node& node, Compare kind) : node_(node), kind_(kind) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 2 || !in[0] || !in[1]) fail(node_, "needs two inputs");
    if (in[0]->dtype != in[1]->dtype) fail(node_, "input types differ");
    return {meta_of(DType::kBool, broadcast_shapes(node_, in[0]->shape, in[1]->shape))};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    switch (in[0]->dtype()) {
      case DType::kFloat32: return apply<float>(*in[0], *in[1], *out[0]);
      case DType::kFloat64: return apply<double>(*in[0], *in[1], *out[0]);
      case DType::kInt32: return apply<std::int32_t>(*in[0], *in[1], *out[0]);
      case DType::kInt64: return apply<std::int64_t>(*in[0], *in[1], *out[0]);
      case DType::kBool: return apply<bool>(*in[0], *in[1], *out[0]);
      case DType::kInt8: return apply<std::int8_t>(*in[0], *in[1], *out[0]);
      case DType::kUInt8: return apply<std::uint8_t>(*in[0], *in[1], *out[0]);
      default: fail(node_, "unsupported type " + std::string(dtype_name(in[0]->dtype())));
    }
  }

 private:
  template <class T>
  void apply(const Tensor& a, const Tensor& b, Tensor& o) const {
    switch (kind_) {
      case Compare::kEqual: return binary_loop<T>(a, b, o, [](T x, T y) { return x == y; });
      case Compare::kGreater: return binary_loop<T>(a, b, o, [](T x, T y) { return x > y; });
      case Compare::kLess: return binary_loop<T>(a, b, o, [](T x, T y) { return x < y; });
      case Compare::kGreaterOrEqual: return binary_loop<T>(a, b, o, [](T x, T y) { return x >= y; });
      case Compare::kLessOrEqual: return binary_loop<T>(a, b, o, [](T x, T y) { return x <= y; });
    }
  }
  Node node_;
  Compare kind_;
};

enum class Logic { kAnd, kOr, kXor };

class LogicOp final : public Op {
 public:
  LogicOp(const Node& node, Logic kind) : node_(node), kind_(kind) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 2 || !in[0] || !in[1]) fail(node_, "needs two inputs");
    if (in[0]->dtype != DType::kBool || in[1]->dtype != DType::kBool) fail(node_, "inputs must be bool");
    return {meta_of(DType::kBool, broadcast_shapes(node_, in[0]->shape, in[1]->shape))};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    switch (kind_) {
      case Logic::kAnd: return binary_loop<bool>(*in[0], *in[1], *out[0], [](bool x, bool y) { return x && y; });
      case Logic::kOr: return binary_loop<bool>(*in[0], *in[1], *out[0], [](bool x, bool y) { return x || y; });
      case Logic::kXor: return binary_loop<bool>(*in[0], *in[1], *out[0], [](bool x, bool y) { return x != y; });
    }
  }

 private:
  Node node_;
  Logic kind_;
};

class WhereOp final : public Op {
 public:
  explicit WhereOp(const Node& node) : node_(node) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 3 || !in[0] || !in[1] || !in[2]) fail(node_, "needs three inputs");
    if (in[0]->dtype != DType::kBool) fail(node_, "condition must be bool");
    if (in[1]->dtype != in[2]->dtype) fail(node_, "X and Y types differ");
    Shape s = broadcast_shapes(node_, in[0]->shape, in[1]->shape);
    return {meta_like(*in[1], broadcast_shapes(node_, s, in[2]->shape))};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& c = *in[0];
    const Tensor& x = *in[1];
    const Tensor& y = *in[2];
    Tensor& o = *out[0];
    const std::size_t es = dtype_size(x.dtype());
    const auto sc = kernels::broadcast_strides(c.shape(), o.shape());
    const auto sx = kernels::broadcast_strides(x.shape(), o.shape());
    const auto sy = kernels::broadcast_strides(y.shape(), o.shape());
    const int rank = o.rank();
    std::vector<std::int64_t> idx(std::size_t(rank), 0);
    const bool* pc = c.data<bool>();
    for (std::int64_t i = 0; i < o.numel(); ++i) {
      std::int64_t oc = 0, ox = 0, oy = 0, rem = i;
      for (int d = rank - 1; d >= 0; --d) {
        const std::int64_t k = rem % o.shape()[std::size_t(d)];
        rem /= o.shape()[std::size_t(d)];
        oc += k * sc[std::size_t(d)];
        ox += k * sx[std::size_t(d)];
        oy += k * sy[std::size_t(d)];
      }
      const std::byte* src = pc[oc] ? x.raw() + ox * std::int64_t(es) : y.raw() + oy * std::int64_t(es);
      std::memcpy(o.raw() + i * std::int64_t(es), src, es);
    }
  }

 private:
  Node node_;
};

// ---- unary ----------------------------------------------------------------------------------

// A float function applied elementwise: F is a stateless callable (float x, const float* params),
// a template parameter so the loop inlines and vectorises it. float64 and int inputs go through
// float, as the op's float definition.
class UnaryOpBase : public Op {
 public:
  UnaryOpBase(const Node& node, bool ints_ok) : node_(node), ints_ok_(ints_ok) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    const DType t = in[0]->dtype;
    if (t != DType::kFloat32 && t != DType::kFloat64 && !(ints_ok_ && (t == DType::kInt32 || t == DType::kInt64)))
      fail(node_, "unsupported type " + std::string(dtype_name(in[0]->declared)));
    return {meta_like(*in[0], in[0]->shape)};
  }

 protected:
  Node node_;
  bool ints_ok_;
};

// VF, where given (not std::nullptr_t), is F on 16-lane vectors (kernels/vector_math.h) with the
// same bits: float runs go through it 16 elements at a time, their tails through F.
template <class F, class VF = std::nullptr_t>
class UnaryOp final : public UnaryOpBase {
 public:
  UnaryOp(const Node& node, F fn, std::vector<float> params, bool ints_ok = false, VF vfn = {})
      : UnaryOpBase(node, ints_ok), fn_(fn), vfn_(vfn), params_(std::move(params)) {}
  int elementwise_arity() const override { return 1; }
  __attribute__((noinline)) void run_elementwise(const float* a, std::int64_t a_step, const float*, std::int64_t,
                                                 float* y, std::int64_t n) const override {
    const float* p = params_.data();
    if (a_step == 0) {
      const float v = fn_(a[0], p);
      for (std::int64_t i = 0; i < n; ++i) y[i] = v;
      return;
    }
    const float* __restrict xs = a;
    float* __restrict ys = y;
    std::int64_t i = 0;
    if constexpr (!std::is_same_v<VF, std::nullptr_t>) {
      namespace simd = kernels::simd;
      for (; i + simd::kLanes <= n; i += simd::kLanes) simd::store(ys + i, vfn_(simd::load(xs + i)));
    }
    for (; i < n; ++i) ys[i] = fn_(xs[i], p);
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    Tensor& o = *out[0];
    const std::int64_t n = x.numel();
    const float* p = params_.data();
    const F fn = fn_;
    switch (x.dtype()) {
      case DType::kFloat32: {
        // Through run_elementwise, so fused chains (eval/exec/session.cc) run the very same loop.
        const float* px = x.data<float>();
        float* po = o.data<float>();
        return kernels::for_each_chunk(
            n, [&](std::int64_t i0, std::int64_t i1) { run_elementwise(px + i0, 1, nullptr, 0, po + i0, i1 - i0); });
      }
      case DType::kFloat64:
        return kernels::unary_map(x.data<double>(), o.data<double>(), n,
                                  [fn, p](double v) { return double(fn(float(v), p)); });
      case DType::kInt32:
        return kernels::unary_map(x.data<std::int32_t>(), o.data<std::int32_t>(), n,
                                  [fn, p](std::int32_t v) { return std::int32_t(fn(float(v), p)); });
      case DType::kInt64:
        return kernels::unary_map(x.data<std::int64_t>(), o.data<std::int64_t>(), n,
                                  [fn, p](std::int64_t v) { return std::int64_t(fn(float(v), p)); });
      default: fail(node_, "unsupported type");
    }
  }

 private:
  F fn_;
  [[no_unique_address]] VF vfn_;
  std::vector<float> params_;
};

template <class F>
std::unique_ptr<Op> make_unary(const Node& node, F fn, std::vector<float> params = {}, bool ints_ok = false) {
  return std::make_unique<UnaryOp<F>>(node, fn, std::move(params), ints_ok);
}

// A float function with its 16-lane form (same bits), no parameters, float inputs only.
template <class F, class VF>
std::unique_ptr<Op> make_vector_unary(const Node& node, F fn, VF vfn) {
  return std::make_unique<UnaryOp<F, VF>>(node, fn, std::vector<float>{}, false, vfn);
}

// Integer Neg/Abs must stay exact beyond float's 24 bits: a dedicated op.
class IntExactUnaryOp final : public Op {
 public:
  IntExactUnaryOp(const Node& node, bool neg, std::unique_ptr<Op> float_op)
      : node_(node), neg_(neg), float_(std::move(float_op)) {}
  int elementwise_arity() const override { return 1; }
  void run_elementwise(const float* a, std::int64_t a_step, const float* b, std::int64_t b_step, float* y,
                       std::int64_t n) const override {
    float_->run_elementwise(a, a_step, b, b_step, y, n);
  }
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    const DType t = in[0]->dtype;
    if (t == DType::kInt32 || t == DType::kInt64 || t == DType::kInt8 || t == DType::kInt16)
      return {meta_like(*in[0], in[0]->shape)};
    return float_->infer(in);
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    switch (in[0]->dtype()) {
      case DType::kInt32: return apply<std::int32_t>(*in[0], *out[0]);
      case DType::kInt64: return apply<std::int64_t>(*in[0], *out[0]);
      case DType::kInt8: return apply<std::int8_t>(*in[0], *out[0]);
      case DType::kInt16: return apply<std::int16_t>(*in[0], *out[0]);
      default: return float_->run(in, out);
    }
  }

 private:
  template <class T>
  void apply(const Tensor& x, Tensor& o) const {
    const T* px = x.data<T>();
    T* po = o.data<T>();
    for (std::int64_t i = 0; i < x.numel(); ++i) po[i] = neg_ ? T(-px[i]) : T(px[i] < 0 ? -px[i] : px[i]);
  }
  Node node_;
  bool neg_;
  std::unique_ptr<Op> float_;
};

class NotOp final : public Op {
 public:
  explicit NotOp(const Node& node) : node_(node) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0] || in[0]->dtype != DType::kBool) fail(node_, "needs a bool input");
    return {meta_like(*in[0], in[0]->shape)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const bool* px = in[0]->data<bool>();
    bool* po = out[0]->data<bool>();
    for (std::int64_t i = 0; i < in[0]->numel(); ++i) po[i] = !px[i];
  }

 private:
  Node node_;
};

// Clip: bounds as attributes before opset 11, as optional inputs from 11 on.
class ClipOp final : public Op {
 public:
  explicit ClipOp(const Node& node) : node_(node) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs an input");
    for (std::size_t i = 1; i < in.size() && i < 3; ++i)
      if (in[i] && in[i]->dtype != in[0]->dtype) fail(node_, "min/max type differs from the input");
    return {meta_like(*in[0], in[0]->shape)};
  }
  // A float Clip whose bounds are attributes or constants joins fused elementwise chains
  // (eval/exec/fusion.cc): prepare() reads the bounds run() would read.
  void prepare(std::span<const ValueMeta* const> in) override {
    chain_ = false;
    if (in.empty() || !in[0] || in[0]->dtype != DType::kFloat32) return;
    for (std::size_t i = 1; i < in.size() && node_.opset >= 11; ++i)
      if (in[i] && (!in[i]->value || in[i]->value->numel() < 1)) return;
    std::array<const Tensor*, 3> bounds{};
    for (std::size_t i = 1; i < in.size() && i < 3; ++i) bounds[i] = in[i] ? in[i]->value.get() : nullptr;
    std::tie(lo_, hi_) = float_bounds(bounds);
    chain_ = true;
  }
  int elementwise_arity() const override { return chain_ ? 1 : 0; }
  void run_elementwise(const float* a, std::int64_t a_step, const float*, std::int64_t, float* y,
                       std::int64_t n) const override {
    for (std::int64_t i = 0; i < n; ++i) y[i] = clamp(a[i * a_step], lo_, hi_);
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    switch (in[0]->dtype()) {
      case DType::kFloat32: {
        std::array<const Tensor*, 3> bounds{};
        for (std::size_t i = 1; i < in.size() && i < 3; ++i) bounds[i] = in[i];
        const auto [lo, hi] = float_bounds(bounds);
        const float* px = in[0]->data<float>();
        float* po = out[0]->data<float>();
        for (std::int64_t i = 0; i < out[0]->numel(); ++i) po[i] = clamp(px[i], lo, hi);
        return;
      }
      case DType::kFloat64: return apply<double>(in, *out[0]);
      case DType::kInt32: return apply<std::int32_t>(in, *out[0]);
      case DType::kInt64: return apply<std::int64_t>(in, *out[0]);
      case DType::kInt8: return apply<std::int8_t>(in, *out[0]);
      case DType::kUInt8: return apply<std::uint8_t>(in, *out[0]);
      default: fail(node_, "unsupported type");
    }
  }

 private:
  template <class T>
  void apply(std::span<const Tensor* const> in, Tensor& o) const {
    T lo = std::numeric_limits<T>::lowest(), hi = std::numeric_limits<T>::max();
    if (node_.opset < 11) {
      // Float attributes taken into T's range first: casting -FLT_MAX (the default) or NaN to an
      // integer type is undefined behaviour (fuzz_onnx_loader: Clip-6 on int8).
      const auto bound = [&](const char* name, float fallback, T keep) {
        const double v = node_.get_float(name, fallback);
        if constexpr (std::is_integral_v<T>) {
          if (std::isnan(v)) return keep;
          return T(std::clamp(v, double(std::numeric_limits<T>::lowest()), double(std::numeric_limits<T>::max())));
        } else {
          return T(v);
        }
      };
      lo = bound("min", -std::numeric_limits<float>::max(), lo);
      hi = bound("max", std::numeric_limits<float>::max(), hi);
    } else {
      if (in.size() > 1 && in[1]) lo = in[1]->data<T>()[0];
      if (in.size() > 2 && in[2]) hi = in[2]->data<T>()[0];
    }
    const T* px = in[0]->data<T>();
    T* po = o.data<T>();
    for (std::int64_t i = 0; i < o.numel(); ++i) {
      T v = px[i];
      if constexpr (std::is_floating_point_v<T>) {
        if (std::isnan(v)) {
          po[i] = v;
          continue;
        }
      }
      po[i] = v < lo ? lo : (v > hi ? hi : v);
    }
  }
  // NaN kept; the bounds are float's finite extremes where not given (ONNX's defaults).
  static float clamp(float v, float lo, float hi) { return v != v ? v : (v < lo ? lo : (v > hi ? hi : v)); }
  std::pair<float, float> float_bounds(const std::array<const Tensor*, 3>& in) const {
    if (node_.opset < 11)
      return {node_.get_float("min", -std::numeric_limits<float>::max()),
              node_.get_float("max", std::numeric_limits<float>::max())};
    return {in[1] ? in[1]->data<float>()[0] : std::numeric_limits<float>::lowest(),
            in[2] ? in[2]->data<float>()[0] : std::numeric_limits<float>::max()};
  }
  Node node_;
  bool chain_ = false;
  float lo_ = 0.0f, hi_ = 0.0f;
};

// min(1, max(0, v)) with NaN kept (std::min/std::max return their first argument for a NaN).
inline float clamp01_keeping_nan(float v) { return v != v ? v : std::max(0.0f, std::min(1.0f, v)); }

#define QEVAL_UNARY(NAME, SINCE, EXPR, PARAMS, INTS)                       \
  OpSchema {                                                               \
    NAME, "", SINCE, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> { \
      return make_unary(                                                   \
          n,                                                               \
          [](float x, const float* p) -> float {                           \
            (void)p;                                                       \
            return EXPR;                                                   \
          },                                                               \
          std::vector<float> PARAMS, INTS);                                \
    }                                                                      \
  }

}  // namespace

void register_elementwise_ops(std::vector<OpSchema>& out) {
  auto arith = [](Arith k) {
    switch (k) {
      case Arith::kAdd:
        return +[](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<ArithOp>(n, Arith::kAdd); };
      case Arith::kSub:
        return +[](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<ArithOp>(n, Arith::kSub); };
      case Arith::kMul:
        return +[](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<ArithOp>(n, Arith::kMul); };
      case Arith::kDiv:
        return +[](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<ArithOp>(n, Arith::kDiv); };
      case Arith::kPow: break;
    }
    return +[](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<ArithOp>(n, Arith::kPow); };
  };
  out.push_back({"Add", "", 7, kMaxOpset, arith(Arith::kAdd)});
  out.push_back({"Sub", "", 7, kMaxOpset, arith(Arith::kSub)});
  out.push_back({"Mul", "", 7, kMaxOpset, arith(Arith::kMul)});
  out.push_back({"Div", "", 7, kMaxOpset, arith(Arith::kDiv)});
  out.push_back({"Pow", "", 7, kMaxOpset, arith(Arith::kPow)});
  out.push_back(
      {"Mod", "", 10, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<ModOp>(n); }});

  auto variadic = [](Variadic k) -> OpFactory {
    switch (k) {
      case Variadic::kMin:
        return [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<VariadicOp>(n, Variadic::kMin); };
      case Variadic::kMax:
        return [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<VariadicOp>(n, Variadic::kMax); };
      case Variadic::kSum:
        return [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<VariadicOp>(n, Variadic::kSum); };
      case Variadic::kMean: break;
    }
    return [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<VariadicOp>(n, Variadic::kMean); };
  };
  // Opset 8 added broadcasting (earlier versions had equal shapes, a special case); 12/13 types.
  out.push_back({"Min", "", 6, kMaxOpset, variadic(Variadic::kMin)});
  out.push_back({"Max", "", 6, kMaxOpset, variadic(Variadic::kMax)});
  out.push_back({"Sum", "", 6, kMaxOpset, variadic(Variadic::kSum)});
  out.push_back({"Mean", "", 6, kMaxOpset, variadic(Variadic::kMean)});
  out.push_back({"Equal", "", 7, kMaxOpset,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<CompareOp>(n, Compare::kEqual); }});
  out.push_back({"Greater", "", 7, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> {
                   return std::make_unique<CompareOp>(n, Compare::kGreater);
                 }});
  out.push_back({"Less", "", 7, kMaxOpset,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<CompareOp>(n, Compare::kLess); }});
  out.push_back({"GreaterOrEqual", "", 12, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> {
                   return std::make_unique<CompareOp>(n, Compare::kGreaterOrEqual);
                 }});
  out.push_back({"LessOrEqual", "", 12, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> {
                   return std::make_unique<CompareOp>(n, Compare::kLessOrEqual);
                 }});
  out.push_back({"And", "", 7, kMaxOpset,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<LogicOp>(n, Logic::kAnd); }});
  out.push_back({"Or", "", 7, kMaxOpset,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<LogicOp>(n, Logic::kOr); }});
  out.push_back({"Xor", "", 7, kMaxOpset,
                 [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<LogicOp>(n, Logic::kXor); }});
  out.push_back(
      {"Not", "", 1, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<NotOp>(n); }});
  out.push_back(
      {"Where", "", 9, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<WhereOp>(n); }});
  out.push_back(
      {"Clip", "", 6, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<ClipOp>(n); }});

  out.push_back({"Neg", "", 6, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> {
                   return std::make_unique<IntExactUnaryOp>(n, true,
                                                            make_unary(n, [](float x, const float*) { return -x; }));
                 }});
  out.push_back({"Abs", "", 6, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> {
                   return std::make_unique<IntExactUnaryOp>(
                       n, false, make_unary(n, [](float x, const float*) { return std::fabs(x); }));
                 }});
  out.push_back(QEVAL_UNARY("Sqrt", 6, std::sqrt(x), {}, false));
  out.push_back(QEVAL_UNARY("Exp", 6, std::exp(x), {}, false));
  out.push_back(QEVAL_UNARY("Log", 6, std::log(x), {}, false));
  out.push_back({"Erf", "", 9, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> {
                   return make_vector_unary(
                       n, [](float x, const float*) { return kernels::erf_vectorisable(x); },
                       [](kernels::simd::F32x16 x) { return kernels::simd::erf(x); });
                 }});
  out.push_back(QEVAL_UNARY("Tanh", 6, std::tanh(x), {}, false));
  out.push_back({"Sigmoid", "", 6, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> {
                   return make_vector_unary(
                       n, [](float x, const float*) { return kernels::sigmoid_vectorisable(x); },
                       [](kernels::simd::F32x16 x) { return kernels::simd::sigmoid(x); });
                 }});
  // NaN propagates through every activation (ONNX Runtime and PyTorch keep it): a comparison-based
  // form such as x > 0 ? x : 0 would turn NaN into 0 and hide it from the non-finite tracking.
  out.push_back(QEVAL_UNARY("Relu", 6, x > 0 ? x : (x == x ? 0.0f : x), {}, true));
  out.push_back(QEVAL_UNARY("Reciprocal", 6, 1.0f / x, {}, false));
  out.push_back(QEVAL_UNARY("Floor", 6, std::floor(x), {}, false));
  out.push_back(QEVAL_UNARY("Ceil", 6, std::ceil(x), {}, false));
  out.push_back(QEVAL_UNARY("Round", 11, std::nearbyint(x), {}, false));
  out.push_back(QEVAL_UNARY("Sign", 9, x > 0 ? 1.0f : (x < 0 ? -1.0f : x), {}, true));
  out.push_back(QEVAL_UNARY("Sin", 7, std::sin(x), {}, false));
  out.push_back(QEVAL_UNARY("Cos", 7, std::cos(x), {}, false));
  out.push_back(QEVAL_UNARY("Softplus", 1, x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)), {}, false));
  out.push_back(QEVAL_UNARY("Softsign", 1, x / (1.0f + std::fabs(x)), {}, false));
  out.push_back({"LeakyRelu", "", 6, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> {
                   return make_unary(
                       n, [](float x, const float* p) { return x >= 0 ? x : p[0] * x; },
                       std::vector<float>{n.get_float("alpha", 0.01f)});
                 }});
  out.push_back({"Elu", "", 6, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> {
                   return make_unary(
                       n, [](float x, const float* p) { return x >= 0 ? x : p[0] * (std::exp(x) - 1.0f); },
                       std::vector<float>{n.get_float("alpha", 1.0f)});
                 }});
  out.push_back({"HardSigmoid", "", 6, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> {
                   return make_unary(
                       n, [](float x, const float* p) { return clamp01_keeping_nan(p[0] * x + p[1]); },
                       std::vector<float>{n.get_float("alpha", 0.2f), n.get_float("beta", 0.5f)});
                 }});
  out.push_back(QEVAL_UNARY("HardSwish", 14, x * clamp01_keeping_nan(x / 6.0f + 0.5f), {}, false));
  out.push_back({"Gelu", "", 20, kMaxOpset, [](const Node& n) -> std::unique_ptr<Op> {
                   const std::string approx = n.get_string("approximate", "none");
                   if (approx == "tanh")
                     return make_unary(
                         n,
                         [](float x, const float*) {
                           return 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
                         },
                         std::vector<float>{});
                   if (approx != "none") fail(n, "approximate must be 'none' or 'tanh', got '" + approx + "'");
                   return make_unary(
                       n,
                       [](float x, const float*) {
                         return 0.5f * x * (1.0f + kernels::erf_vectorisable(x * 0.7071067811865476f));
                       },
                       std::vector<float>{});
                 }});
}

}  // namespace qeval::eval
