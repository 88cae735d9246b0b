// The operator interface: shape/type inference separate from compute, one op a file, registered
// by (domain, op type, opset range) as ONNX Runtime does.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <typeindex>
#include <utility>
#include <vector>

#include "eval/exec/graph.h"
#include "kernels/error.h"
#include "kernels/tensor.h"

namespace qeval::eval {

// What is known about a value before running: its storage type, its shape, and, for values that
// are constant (initializers, folded sub-graphs, Shape of a statically shaped tensor), its value.
//
// Storage vs declared type: float16/bfloat16 values are stored and computed as float32 (the
// numerics contract: FP32 accumulation, values rounded to the format). `declared` keeps the ONNX
// type so the executor rounds such values and writes them back in their own format.
struct ValueMeta {
  DType dtype = DType::kFloat32;     // storage type the kernels see
  DType declared = DType::kFloat32;  // the ONNX element type
  Shape shape;
  std::shared_ptr<const Tensor> value;  // set when the value is a known constant
};

// Storage type for an ONNX element type: the float formats narrower than 32 bits compute in f32.
DType storage_type(DType declared);

// What ops derive from constant tensors (packed weights) and sessions from initializers (rounded
// or widened copies, device copies), shared by every session given the same object
// (SessionOptions::constants: the evaluator's worker threads, variants over one graph): made once,
// by whichever session asks first, under a lock. Keyed by the tensor, the form's type and a key
// naming what else the form depends on (a Gemm's transB). A tensor is known by its address, and
// must outlive the store (the graphs' initializers); a borrowed tensor (a mapped weight, whose
// copies share its bytes) by its bytes' address, type and shape, so that its copies find its forms
// (the store keeps one such copy: the bytes stay mapped).
class SharedConstants {
 public:
  SharedConstants() = default;
  // A store of its own whose forms of the tensors `parent` can vouch for come from `parent`:
  // borrowed tensors, and the forms `parent` made (a rounded copy, whose packed form is then
  // `parent`'s too). The evaluator's single-node sessions (graphs that copy the model's tensors and
  // live only as long as their worker) so share the model sessions' converted weights, packed forms
  // and device copies, while their own tensors' forms go when they do.
  explicit SharedConstants(std::shared_ptr<SharedConstants> parent) : parent_(std::move(parent)) {}

  template <class T, class Make>
  std::shared_ptr<const T> get(const std::shared_ptr<const Tensor>& tensor, const std::string& key, Make&& make) {
    if (parent_ && (tensor->is_borrowed() || parent_->made(tensor.get())))
      return parent_->get<T>(tensor, key, std::forward<Make>(make));
    Entry* e;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      e = &entries_[key_of(*tensor, std::type_index(typeid(T)), key)];
    }
    // Forms of different tensors are made in parallel; one form once.
    std::lock_guard<std::mutex> lock(e->making);
    if (!e->form) {
      e->form = std::make_shared<const T>(make(*tensor));
      e->tensor = tensor->is_borrowed() ? std::make_shared<const Tensor>(*tensor) : tensor;
      std::lock_guard<std::mutex> made_lock(mutex_);
      made_.insert(e->form.get());
    }
    return std::static_pointer_cast<const T>(e->form);
  }

 private:
  struct Entry {
    std::mutex making;
    std::shared_ptr<const Tensor> tensor;
    std::shared_ptr<const void> form;
  };
  // (address of the bytes, "dtype shape", form type, key)
  using Key = std::tuple<const void*, std::string, std::type_index, std::string>;
  static Key key_of(const Tensor& t, std::type_index type, const std::string& key);
  bool made(const void* form) {
    std::lock_guard<std::mutex> lock(mutex_);
    return made_.contains(form);
  }
  std::shared_ptr<SharedConstants> parent_;
  std::mutex mutex_;
  std::map<Key, Entry> entries_;
  std::set<const void*> made_;  // the forms made here
};

// Element (i_0, ..., i_k) of a dense destination over `counts` comes from
// src[base + sum(i_d * strides[d])]; strides are in elements and may be 0 (broadcast) or negative.
struct StridedView {
  Shape counts;
  std::vector<std::int64_t> strides;
  std::int64_t base = 0;
};

class Op {
 public:
  virtual ~Op() = default;
  // Where prepare() finds and leaves forms shared with other sessions (null: its own); set by the
  // session before any prepare().
  void share_constants(SharedConstants* shared) { shared_constants_ = shared; }
  // Output metas from input metas (nullptr for omitted optional inputs). Throws InputError,
  // prefixed with the node's description, on inconsistent inputs (shape mismatch, bad axis, a
  // shape input that is not a constant). An op may set `value` on an output it can compute from
  // metadata alone (Shape, Size).
  virtual std::vector<ValueMeta> infer(std::span<const ValueMeta* const> inputs) const = 0;
  // Computes outputs already allocated with the inferred storage types and shapes. Inputs are
  // nullptr where omitted.
  virtual void run(std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs) const = 0;
  // Inputs that must be known at plan time whatever their type (Resize's roi/scales/sizes). A
  // graph input feeding one of them directly is planned as a constant (a plan per value).
  virtual std::vector<std::size_t> constant_inputs() const { return {}; }
  // Called by the executor once per plan, after infer(), with the same input metas (constant
  // inputs carry their value), on the session's thread before any run: the op may precompute what
  // depends only on constant inputs (packed weights) and use it in run() when run() receives that
  // very tensor (`in[i] == meta.value.get()`; the executor passes constants by that pointer, which
  // stays valid for the session's lifetime). run() must give the same results without it.
  virtual void prepare(std::span<const ValueMeta* const> inputs) { (void)inputs; }
  // Ops whose output is a strided view of their first input (Slice, Transpose): that view for
  // inputs with these metas (constant inputs carry their value), so that a device backend copies
  // it without computing an index map element by element; nullopt for every other op.
  virtual std::optional<StridedView> strided_view(std::span<const ValueMeta* const> inputs) const {
    (void)inputs;
    return std::nullopt;
  }

  // Elementwise float32 ops whose output has their input's shape may offer their computation on
  // runs of elements, so the executor can run a chain of them in one pass over memory (fusion when
  // no observer is attached). 0: not offered; 1: unary (y = f(a)); 2: binary (y = f(a, b)).
  virtual int elementwise_arity() const { return 0; }
  // y[i] = f(a[i * a_step], b[i * b_step]) for i < n (b unused by unary ops); steps are 0 (one value
  // for the whole run) or 1. Must give the bits run() gives for the same float32 values.
  virtual void run_elementwise(const float* a, std::int64_t a_step, const float* b, std::int64_t b_step, float* y,
                               std::int64_t n) const {
    (void)a, (void)a_step, (void)b, (void)b_step, (void)y, (void)n;
  }

 protected:
  SharedConstants* shared_constants() const { return shared_constants_; }

 private:
  SharedConstants* shared_constants_ = nullptr;
};

using OpFactory = std::unique_ptr<Op> (*)(const Node& node);

// The highest ai.onnx opset any op is registered for (each family registers up to it).
inline constexpr int kMaxOpset = 22;

struct OpSchema {
  std::string_view op_type;
  std::string_view domain;  // "" = ai.onnx
  int since_version;        // inclusive
  int until_version;        // inclusive
  OpFactory make;
};

// Every registered op (eval/exec/ops/registry.cc).
std::span<const OpSchema> op_schemas();
// The schema for a node, or nullptr when (domain, op type, opset) is not supported.
const OpSchema* find_op(std::string_view domain, std::string_view op_type, int opset);
// Why a node is unsupported, for load-time errors: unknown op, or known op at another opset.
std::string unsupported_reason(std::string_view domain, std::string_view op_type, int opset);

// ---- helpers for op implementations --------------------------------------------------------

// Throws InputError "<node>: <message>".
[[noreturn]] void fail(const Node& node, const std::string& message);
// The constant value of input i, or InputError naming the input when it is not constant.
const Tensor& constant_input(const Node& node, std::span<const ValueMeta* const> inputs, std::size_t i,
                             const char* what);
// Values of a 1-D (or scalar) int32/int64 tensor.
std::vector<std::int64_t> to_int64s(const Tensor& t);
// Normalises a possibly negative axis for a tensor of the given rank; InputError if out of range.
int normalize_axis(const Node& node, std::int64_t axis, int rank);
// Numpy broadcasting of two shapes; InputError naming both when incompatible.
Shape broadcast_shapes(const Node& node, const Shape& a, const Shape& b);
// A meta for an output with the given shape that has the storage and declared type of `like`.
ValueMeta meta_like(const ValueMeta& like, Shape shape);
ValueMeta meta_of(DType declared, Shape shape);

inline std::string type_name(DType t) { return std::string(dtype_name(t)); }

// What an op derives from a constant input in Op::prepare (packed weights), kept per tensor: a
// session's plans share their weights, so one entry usually serves them all.
template <class T>
class ConstantCache {
 public:
  // Makes the entry for `meta`'s value with make(const Tensor&) unless it exists; nothing when the
  // input is absent or not constant.
  // With `shared`, the entry other sessions made for the tensor and `key` is taken (or made there).
  // The entry replaces the tensor: a mapped weight's pages leave memory (Tensor::release_pages).
  template <class Make>
  void prepare(const ValueMeta* meta, Make&& make, SharedConstants* shared = nullptr, const std::string& key = {}) {
    if (!meta || !meta->value || find(meta->value.get())) return;
    entries_.emplace_back(
        meta->value, shared ? shared->get<T>(meta->value, key, make) : std::make_shared<const T>(make(*meta->value)));
    meta->value->release_pages();
  }
  // The entry made for this very tensor, or nullptr.
  const T* find(const Tensor* t) const {
    for (const auto& [tensor, entry] : entries_)
      if (tensor.get() == t) return entry.get();
    return nullptr;
  }

 private:
  std::vector<std::pair<std::shared_ptr<const Tensor>, std::shared_ptr<const T>>> entries_;
};

// Calls f(T{}) with the C++ type of a storage type (narrow floats are stored as float);
// UnsupportedError for types that are not storage types.
template <class F>
void visit_storage(DType t, F&& f) {
  switch (t) {
    case DType::kFloat32: return f(float{});
    case DType::kFloat64: return f(double{});
    case DType::kInt8: return f(std::int8_t{});
    case DType::kUInt8: return f(std::uint8_t{});
    case DType::kInt16: return f(std::int16_t{});
    case DType::kUInt16: return f(std::uint16_t{});
    case DType::kInt32: return f(std::int32_t{});
    case DType::kUInt32: return f(std::uint32_t{});
    case DType::kInt64: return f(std::int64_t{});
    case DType::kUInt64: return f(std::uint64_t{});
    case DType::kBool: return f(bool{});
    default: throw UnsupportedError("element type " + std::string(dtype_name(t)) + " is not a storage type");
  }
}

}  // namespace qeval::eval
