// The CUDA backend: device memory (CudaMemory), rounding on the device, and compile(): a
// StepKernel per node it runs on the GPU (kernels/cuda/ and cuBLAS), null with the reason for the
// rest. Attributes are read as the CPU ops read them (their helpers where exposed: conv and matmul
// geometry, resize plans); pure data movement is compiled from the CPU op itself (an index map).
#include "eval/exec/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <optional>
#include <cstring>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "eval/exec/cuda/device_memory.h"
#include "eval/exec/device_scan.h"
#include "eval/exec/ops/geometry.h"
#include "eval/exec/ops/moves.h"
#include "eval/exec/ops/quant_common.h"
#include "eval/exec/ops/resize_plan.h"
#include "eval/exec/plan.h"
#include "eval/exec/qdq_fusion.h"
#include "kernels/cuda/kernels.h"
#include "kernels/error.h"
#include "kernels/index_map.h"

namespace qeval::eval {
namespace {

namespace kc = kernels::cuda;
using i64 = std::int64_t;

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLAS ") + what + ": " + cublasGetStatusString(s));
}

// A node compiled to a closure over device tensors.
class ClosureKernel final : public StepKernel {
 public:
  using Body = std::function<void(std::span<const Tensor* const>, std::span<Tensor* const>)>;
  explicit ClosureKernel(Body body) : body_(std::move(body)) {}
  void run(std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs) override { body_(inputs, outputs); }

 private:
  Body body_;
};

std::unique_ptr<StepKernel> kernel(ClosureKernel::Body body) {
  return std::make_unique<ClosureKernel>(std::move(body));
}

std::optional<kc::Elem> elem_of(DType t) {
  switch (t) {
    case DType::kFloat32: return kc::Elem::kF32;
    case DType::kFloat64: return kc::Elem::kF64;
    case DType::kInt8: return kc::Elem::kI8;
    case DType::kUInt8: return kc::Elem::kU8;
    case DType::kInt16: return kc::Elem::kI16;
    case DType::kUInt16: return kc::Elem::kU16;
    case DType::kInt32: return kc::Elem::kI32;
    case DType::kUInt32: return kc::Elem::kU32;
    case DType::kInt64: return kc::Elem::kI64;
    case DType::kUInt64: return kc::Elem::kU64;
    case DType::kBool: return kc::Elem::kBool;
    default: return std::nullopt;
  }
}

std::vector<i64> dense_strides(const Shape& s) {
  std::vector<i64> st(s.size(), 1);
  for (int d = int(s.size()) - 2; d >= 0; --d) st[std::size_t(d)] = st[std::size_t(d) + 1] * s[std::size_t(d) + 1];
  return st;
}

// A walk over `out` with operands of numpy-broadcast shapes (right-aligned, size-1 dims stride 0).
std::optional<kc::Walk> broadcast_walk(const Shape& out, std::vector<const Shape*> operands) {
  if (out.size() > std::size_t(kc::kMaxRank) || operands.size() > 4) return std::nullopt;
  kc::Walk w;
  w.rank = int(out.size());
  for (std::size_t d = 0; d < out.size(); ++d) w.counts[d] = out[d];
  for (std::size_t k = 0; k < operands.size(); ++k) {
    const Shape& s = *operands[k];
    if (s.size() > out.size()) return std::nullopt;
    const auto st = dense_strides(s);
    const std::size_t lead = out.size() - s.size();
    for (std::size_t d = 0; d < s.size(); ++d) w.strides[k][lead + d] = s[d] == 1 ? 0 : st[d];
  }
  if (w.rank == 0) {
    w.rank = 1;
    w.counts[0] = 1;
  }
  return w;
}

struct Scratch {
  std::shared_ptr<Tensor> t;
  void* get(CudaMemory& mem, std::size_t bytes) {
    if (!t || t->nbytes() < bytes)
      t = nullptr, t = std::make_shared<Tensor>(DType::kUInt8, Shape{i64(std::max<std::size_t>(bytes, 1))}, mem.shared());
    return t->device_data();
  }
};

// Scratch every kernel of a backend shares: its kernels run one at a time on one stream (under
// CudaMemory::lock), so a buffer one kernel wrote is dead when the next starts (a larger one
// replaces it after cudaFree's synchronisation). Per-kernel buffers grew with the number of kernels:
// every conv kept its im2col columns, every product its 16-bit operand copies, and the evaluator's
// thousands of single-node sessions each kept theirs. Slots: kColumns (im2col, transposed or resized
// intermediates), kSecond (a second such buffer in the same kernel), kOperandA / kOperandB (16-bit
// copies of a product's runtime operands).
struct Workspace {
  enum Slot { kColumns, kSecond, kOperandA, kOperandB, kSlots };
  Scratch slots[kSlots];
  void* get(CudaMemory& mem, Slot slot, std::size_t bytes) { return slots[slot].get(mem, bytes); }
};

// What compile() sees of one node.
struct Site {
  const Node& node;
  const Op& op;
  std::span<const ValueMeta* const> in;
  std::span<const Rounding> exact;  // per input: the format its values are exact in
  std::span<const ValueMeta> out;
  std::string& why;
  CudaMemory& mem;
  cublasHandle_t blas;    // pedantic FP32 (no TF32)
  cublasHandle_t blas16;  // default math: 16-bit operands on tensor cores, FP32 accumulation
  std::shared_ptr<Workspace> work;  // the backend's shared scratch

  kc::Stream stream() const { return mem.stream(); }
  bool has(std::size_t i) const { return i < in.size() && in[i]; }
  std::nullptr_t decline(std::string reason) const {
    why = std::move(reason);
    return nullptr;
  }
  bool all_float(std::size_t n) const {
    for (std::size_t i = 0; i < n && i < in.size(); ++i)
      if (in[i] && in[i]->dtype != DType::kFloat32) return false;
    return true;
  }
};

const float* fptr(const Tensor* t) { return t ? static_cast<const float*>(t->device_data()) : nullptr; }
float* fptr(Tensor* t) { return t ? static_cast<float*>(t->device_data()) : nullptr; }

// A device buffer owned by a compiled kernel (scratch, uploaded parameters).
struct DeviceBuffer {
  std::shared_ptr<Tensor> t;
  void* get() const { return t ? t->device_data() : nullptr; }
};
DeviceBuffer upload(CudaMemory& mem, const Tensor& host) {
  auto dev = std::make_shared<Tensor>(host.to_device(mem.shared()));
  return {dev};
}
template <class T>
DeviceBuffer upload_vector(CudaMemory& mem, const std::vector<T>& v) {
  Tensor host(dtype_of<T>::value, Shape{i64(v.size())});
  if (!v.empty()) std::memcpy(host.raw(), v.data(), v.size() * sizeof(T));
  return upload(mem, host);
}
// ---- data movement: strided copies and index maps ----------------------------------------------

// Output (dense over `os`) element i = input 0's element base + sum_d i_d * strides[d].
std::unique_ptr<StepKernel> strided_kernel(const Site& s, i64 base, std::span<const i64> strides, const Shape& os,
                                           int es) {
  kc::Walk w;
  w.rank = std::max<int>(1, int(os.size()));
  w.counts[0] = 1;
  w.base[0] = base;
  const auto ost = dense_strides(os);
  for (std::size_t d = 0; d < os.size(); ++d) {
    w.counts[d] = os[d];
    w.strides[0][d] = strides[d];
    w.strides[1][d] = ost[d];
  }
  CudaMemory* mem = &s.mem;
  return kernel([w, es, mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    kc::strided_copy(in[0]->device_data(), out[0]->device_data(), es, w, mem->stream());
  });
}

// The copy `sep` describes over the output shape `os` (rank <= kc::kMaxRank): a strided copy when
// every table is j * stride, else a gather through the tables (`fill`: one element's bytes).
std::unique_ptr<StepKernel> separable_kernel(const Site& s, const kernels::SeparableMap& sep, const Shape& os, int es,
                                             std::vector<std::byte> fill) {
  if (const std::optional<std::vector<i64>> st = sep.strides()) return strided_kernel(s, sep.base, *st, os, es);
  kc::SeparableGather g;
  g.rank = int(os.size());
  g.base = sep.base;
  std::vector<i64> tables;
  for (std::size_t d = 0; d < os.size(); ++d) {
    g.counts[d] = os[d];
    g.offsets[d] = i64(tables.size());
    tables.insert(tables.end(), sep.tables[d].begin(), sep.tables[d].end());
  }
  DeviceBuffer dtables = upload_vector(s.mem, tables);
  CudaMemory* mem = &s.mem;
  return kernel([dtables, g, fill, es, mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    kc::gather_separable(in[0]->device_data(), out[0]->device_data(), es, g, static_cast<const i64*>(dtables.get()),
                         fill.data(), mem->stream());
  });
}

// For ops that select elements (ops/moves.h): a strided copy where the op describes its output as
// a view of its input (Slice, Transpose); else the op runs on int64 positions (1-based; 0 = fill)
// at plan time, and the resulting map becomes per-axis tables (kernels/index_map.h: a strided copy
// or a gather through the tables) or, where it is not separable, a device gather through the map.
std::unique_ptr<StepKernel> compile_index_map(const Site& s) {
  const Node& n = s.node;
  if (s.out.size() != 1) return s.decline("more than one output");
  for (std::size_t i = 1; i < s.in.size(); ++i)
    if (s.in[i] && !s.in[i]->value) {
      if (n.op_type == "Gather" && i == 1) return nullptr;  // runtime indices: the gather kernel
      return s.decline("input " + std::to_string(i) + " ('" + n.inputs[i] + "') is known only at run time");
    }
  if (n.op_type == "Pad" && n.opset < 11 && n.get_float("value", 0.0f) != 0.0f)
    return s.decline("Pad-2 with a nonzero value attribute");
  const ValueMeta& x = *s.in[0];
  const int es = int(dtype_size(x.dtype));
  const Shape& os = s.out[0].shape;
  if (os.size() <= std::size_t(kc::kMaxRank)) {
    if (const std::optional<StridedView> v = s.op.strided_view(s.in); v && v->counts == os)
      return strided_kernel(s, v->base, v->strides, os, es);
    if (keeps_element_order(n) && shape_numel(x.shape) == shape_numel(os))
      return strided_kernel(s, 0, dense_strides(os), os, es);
  }
  const i64 count = shape_numel(x.shape);
  Tensor positions(DType::kInt64, x.shape);
  for (i64 i = 0; i < count; ++i) positions.data<i64>()[i] = i + 1;
  // Pad's constant value input becomes an int64 zero (the fill marker); its value is the fill.
  std::vector<std::byte> fill(dtype_size(x.dtype), std::byte{0});
  Tensor zero(DType::kInt64, Shape{});
  std::vector<const Tensor*> ins;
  for (std::size_t i = 0; i < s.in.size(); ++i) {
    if (i == 0) ins.push_back(&positions);
    else if (!s.in[i]) ins.push_back(nullptr);
    else if (n.op_type == "Pad" && i == 2) {
      const Tensor& v = *s.in[i]->value;
      if (v.numel() > 0) {
        if (v.dtype() != x.dtype) return s.decline("Pad value type differs from the data's");
        std::memcpy(fill.data(), v.raw(), fill.size());
      }
      ins.push_back(v.numel() > 0 ? &zero : s.in[i]->value.get());
    } else {
      ins.push_back(s.in[i]->value.get());
    }
  }
  Tensor map(DType::kInt64, s.out[0].shape);
  Tensor* outs[] = {&map};
  try {
    s.op.run(ins, outs);
  } catch (const std::exception& e) {
    return s.decline(std::string("index map: ") + e.what());
  }
  const i64 total = map.numel();
  i64* m = map.data<i64>();
  for (i64 i = 0; i < total; ++i) m[i] -= 1;
  if (os.size() <= std::size_t(kc::kMaxRank))
    if (const std::optional<kernels::SeparableMap> sep = kernels::separable_map(m, os))
      return separable_kernel(s, *sep, os, es, fill);
  CudaMemory* mem = &s.mem;
  if (total == 0) return kernel([](std::span<const Tensor* const>, std::span<Tensor* const>) {});
  DeviceBuffer dmap = upload(s.mem, map);
  return kernel([dmap, fill, es, total, mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    kc::gather_map(in[0]->device_data(), out[0]->device_data(), es, static_cast<const i64*>(dmap.get()), total,
                   fill.data(), mem->stream());
  });
}

// ---- elementwise --------------------------------------------------------------------------------

std::optional<kc::Binary> binary_kind(const std::string& t) {
  static const std::pair<const char*, kc::Binary> kOps[] = {{"Add", kc::Binary::kAdd},
                                                            {"Sub", kc::Binary::kSub},
                                                            {"Mul", kc::Binary::kMul},
                                                            {"Div", kc::Binary::kDiv},
                                                            {"Pow", kc::Binary::kPow},
                                                            {"Max", kc::Binary::kMax},
                                                            {"Min", kc::Binary::kMin},
                                                            {"Sum", kc::Binary::kAdd},
                                                            {"Equal", kc::Binary::kEqual},
                                                            {"Greater", kc::Binary::kGreater},
                                                            {"Less", kc::Binary::kLess},
                                                            {"GreaterOrEqual", kc::Binary::kGreaterOrEqual},
                                                            {"LessOrEqual", kc::Binary::kLessOrEqual},
                                                            {"And", kc::Binary::kAnd},
                                                            {"Or", kc::Binary::kOr},
                                                            {"Xor", kc::Binary::kXor}};
  for (const auto& [name, k] : kOps)
    if (t == name) return k;
  return std::nullopt;
}

std::unique_ptr<StepKernel> compile_binary(const Site& s, kc::Binary op) {
  const std::size_t n = s.in.size();
  if (n < 1 || !s.in[0]) return s.decline("missing input");
  for (std::size_t i = 1; i < n; ++i)
    if (!s.in[i] || s.in[i]->dtype != s.in[0]->dtype) return s.decline("inputs of different element types");
  const DType t = s.in[0]->dtype;
  const auto e = elem_of(t);
  const bool logic = op == kc::Binary::kAnd || op == kc::Binary::kOr || op == kc::Binary::kXor;
  const bool arith = op < kc::Binary::kEqual;
  if (!e || (logic && t != DType::kBool) ||
      (!logic && t != DType::kFloat32 && t != DType::kFloat64 && t != DType::kInt32 && t != DType::kInt64) ||
      (op == kc::Binary::kPow && t != DType::kFloat32))
    return s.decline("element type " + type_name(s.in[0]->declared));
  if (s.node.op_type == "Div" && t != DType::kFloat32 && t != DType::kFloat64)
    return s.decline("integer Div (a zero divisor is an error the device cannot raise)");
  const Shape& os = s.out[0].shape;
  if (n == 1) {
    const int es = int(dtype_size(t));
    auto w = broadcast_walk(os, {&s.in[0]->shape, &os});
    if (!w) return s.decline("rank above 8");
    return kernel([w = *w, es, &mem = s.mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
      kc::strided_copy(in[0]->device_data(), out[0]->device_data(), es, w, mem.stream());
    });
  }
  if (n > 2 && !arith) return s.decline("comparison with more than two inputs");
  std::vector<kc::Walk> walks;
  for (std::size_t i = 1; i < n; ++i) {
    auto w = broadcast_walk(os, {i == 1 ? &s.in[0]->shape : &os, &s.in[i]->shape});
    if (!w) return s.decline("rank above 8");
    walks.push_back(*w);
  }
  return kernel([walks, op, e = *e, &mem = s.mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    kc::binary(op, e, in[0]->device_data(), in[1]->device_data(), out[0]->device_data(), walks[0], mem.stream());
    for (std::size_t i = 1; i < walks.size(); ++i)
      kc::binary(op, e, out[0]->device_data(), in[i + 1]->device_data(), out[0]->device_data(), walks[i], mem.stream());
  });
}

std::unique_ptr<StepKernel> compile_where(const Site& s) {
  if (s.in.size() < 3 || !s.in[0] || !s.in[1] || !s.in[2]) return s.decline("missing input");
  auto w = broadcast_walk(s.out[0].shape, {&s.in[0]->shape, &s.in[1]->shape, &s.in[2]->shape});
  if (!w) return s.decline("rank above 8");
  const int es = int(dtype_size(s.in[1]->dtype));
  return kernel([w = *w, es, &mem = s.mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    kc::where(in[0]->device_data(), in[1]->device_data(), in[2]->device_data(), out[0]->device_data(), es, w,
              mem.stream());
  });
}

// The device's unary function for node `n` on floats, with the parameters its attributes give
// (Clip's: its bounds as attributes before opset 11; compile_unary reads its bound inputs).
struct UnarySpec {
  kc::Unary op;
  float p0 = 0, p1 = 0;
};
std::optional<UnarySpec> unary_of(const Node& n) {
  const std::string& t = n.op_type;
  static const std::pair<const char*, kc::Unary> kOps[] = {{"Neg", kc::Unary::kNeg},
                                                           {"Abs", kc::Unary::kAbs},
                                                           {"Sqrt", kc::Unary::kSqrt},
                                                           {"Exp", kc::Unary::kExp},
                                                           {"Log", kc::Unary::kLog},
                                                           {"Erf", kc::Unary::kErf},
                                                           {"Tanh", kc::Unary::kTanh},
                                                           {"Sigmoid", kc::Unary::kSigmoid},
                                                           {"Relu", kc::Unary::kRelu},
                                                           {"Reciprocal", kc::Unary::kReciprocal},
                                                           {"Floor", kc::Unary::kFloor},
                                                           {"Ceil", kc::Unary::kCeil},
                                                           {"Round", kc::Unary::kRound},
                                                           {"Sign", kc::Unary::kSign},
                                                           {"Sin", kc::Unary::kSin},
                                                           {"Cos", kc::Unary::kCos},
                                                           {"Softplus", kc::Unary::kSoftplus},
                                                           {"Softsign", kc::Unary::kSoftsign},
                                                           {"LeakyRelu", kc::Unary::kLeakyRelu},
                                                           {"Elu", kc::Unary::kElu},
                                                           {"HardSigmoid", kc::Unary::kHardSigmoid},
                                                           {"HardSwish", kc::Unary::kHardSwish},
                                                           {"Gelu", kc::Unary::kGeluErf},
                                                           {"Clip", kc::Unary::kClip},
                                                           {"Not", kc::Unary::kNot}};
  std::optional<UnarySpec> u;
  for (const auto& [name, k] : kOps)
    if (t == name) u = UnarySpec{k};
  if (!u) return std::nullopt;
  switch (u->op) {
    case kc::Unary::kLeakyRelu: u->p0 = n.get_float("alpha", 0.01f); break;
    case kc::Unary::kElu: u->p0 = n.get_float("alpha", 1.0f); break;
    case kc::Unary::kHardSigmoid:
      u->p0 = n.get_float("alpha", 0.2f);
      u->p1 = n.get_float("beta", 0.5f);
      break;
    case kc::Unary::kGeluErf:
      if (n.get_string("approximate", "none") == "tanh") u->op = kc::Unary::kGeluTanh;
      break;
    case kc::Unary::kClip:
      u->p0 = -std::numeric_limits<float>::max();
      u->p1 = std::numeric_limits<float>::max();
      if (n.opset < 11) {
        u->p0 = n.get_float("min", u->p0);
        u->p1 = n.get_float("max", u->p1);
      }
      break;
    default: break;
  }
  return u;
}

std::unique_ptr<StepKernel> compile_unary(const Site& s) {
  const Node& n = s.node;
  const std::string& t = n.op_type;
  const std::optional<UnarySpec> u = unary_of(n);
  if (!u) return nullptr;
  std::optional<kc::Unary> op = u->op;
  if (!s.has(0)) return s.decline("missing input");
  const DType dt = s.in[0]->dtype;
  float p0 = u->p0, p1 = u->p1;
  switch (*op) {
    case kc::Unary::kClip:
      if (dt != DType::kFloat32) return s.decline("Clip of " + type_name(s.in[0]->declared));
      if (n.opset >= 11) {
        for (std::size_t i = 1; i < 3; ++i) {
          if (!s.has(i)) continue;
          if (!s.in[i]->value) return s.decline("Clip bounds known only at run time");
          (i == 1 ? p0 : p1) = s.in[i]->value->data<float>()[0];
        }
      }
      break;
    default: break;
  }
  kc::Elem e = kc::Elem::kF32;
  if (*op == kc::Unary::kNot) {
    if (dt != DType::kBool) return s.decline("Not of " + type_name(s.in[0]->declared));
    e = kc::Elem::kBool;
  } else if (dt == DType::kInt32 || dt == DType::kInt64) {
    if (*op != kc::Unary::kNeg && *op != kc::Unary::kAbs && *op != kc::Unary::kRelu && *op != kc::Unary::kSign)
      return s.decline(t + " of " + type_name(s.in[0]->declared));
    e = dt == DType::kInt32 ? kc::Elem::kI32 : kc::Elem::kI64;
  } else if (dt != DType::kFloat32) {
    return s.decline(t + " of " + type_name(s.in[0]->declared));
  }
  return kernel([op = *op, e, p0, p1, &mem = s.mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    kc::unary(op, e, in[0]->device_data(), out[0]->device_data(), in[0]->numel(), p0, p1, mem.stream());
  });
}

std::unique_ptr<StepKernel> compile_cast(const Site& s) {
  if (!s.has(0)) return s.decline("missing input");
  const auto from = elem_of(s.in[0]->dtype), to = elem_of(s.out[0].dtype);
  if (!from || !to)
    return s.decline("cast between " + type_name(s.in[0]->declared) + " and " + type_name(s.out[0].declared));
  const DType d = s.out[0].declared;
  if (d != s.out[0].dtype && d != DType::kFloat16 && d != DType::kBFloat16) return s.decline("cast to " + type_name(d));
  if (s.in[0]->dtype == DType::kFloat32 && s.out[0].dtype != DType::kFloat32 && s.out[0].dtype != DType::kFloat64 &&
      s.out[0].dtype != DType::kBool)
    return s.decline("float to integer cast (out-of-range values are the CPU's to define)");
  const int round = d == DType::kFloat16 ? 1 : (d == DType::kBFloat16 ? 2 : 0);
  return kernel(
      [f = *from, t = *to, round, &mem = s.mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
        const i64 n = in[0]->numel();
        kc::cast(f, t, in[0]->device_data(), out[0]->device_data(), n, mem.stream());
        if (round == 1) kc::round_float16(fptr(out[0]), n, mem.stream());
        if (round == 2) kc::round_bfloat16(fptr(out[0]), n, mem.stream());
      });
}

// ---- GEMM ---------------------------------------------------------------------------------------

// Row-major C[m, n] = alpha * op(A) op(B) + beta * C through column-major cuBLAS (C^T = B^T A^T).
void sgemm(cublasHandle_t h, bool ta, bool tb, i64 m, i64 n, i64 k, float alpha, const float* a, i64 lda,
           const float* b, i64 ldb, float beta, float* c, i64 ldc) {
  check_blas(cublasSgemm(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(n), int(m), int(k),
                         &alpha, b, int(ldb), a, int(lda), &beta, c, int(ldc)),
             "sgemm");
}

// `batch` row-major products C_i = A_i B_i, operands `sa` / `sb` / `sc` elements apart (0: one
// matrix for every i), as one strided-batched GEMM (one launch instead of one a product).
void sgemm_batched(cublasHandle_t h, i64 m, i64 n, i64 k, const float* a, i64 sa, const float* b, i64 sb, float* c,
                   i64 sc, i64 batch) {
  if (batch == 1) return sgemm(h, false, false, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
  const float one = 1.0f, zero = 0.0f;
  check_blas(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(m), int(k), &one, b, int(n), sb, a,
                                       int(k), sa, &zero, c, int(n), sc, int(batch)),
             "sgemm (strided batched)");
}

// The 16-bit format operands i and j of a product are both exact in, if they share one (true:
// bf16, false: fp16): the product may then run on tensor cores with the same products (one of two
// fp16 or bf16 values is exact in FP32) and FP32 accumulation. QEVAL_CUDA_16BIT=off keeps FP32 SIMT.
bool sixteen_bit_off() {
  static const bool off = [] {
    const char* v = std::getenv("QEVAL_CUDA_16BIT");
    return v && std::string_view(v) == "off";
  }();
  return off;
}
std::optional<bool> sixteen_bit(const Site& s, std::size_t i, std::size_t j) {
  if (sixteen_bit_off() || i >= s.exact.size() || j >= s.exact.size() || s.exact[i] != s.exact[j] ||
      s.exact[i] == Rounding::kNone || !s.has(i) || !s.has(j))
    return std::nullopt;
  return s.exact[i] == Rounding::kBf16;
}

// An operand's 16-bit copy: a constant's made at its first use and kept (its device copy does not
// change during a session), a runtime value's on every call into the backend's workspace slot.
struct Operand16 {
  bool constant = false, bf16 = false;
  std::shared_ptr<Tensor> buf;        // a constant's copy
  std::shared_ptr<Workspace> work;    // a runtime value's slot
  Workspace::Slot slot = Workspace::kOperandA;
  const void* of = nullptr;
  const void* get(CudaMemory& mem, const Tensor* t) {
    const i64 n = t->numel();
    if (!constant) {
      void* p = work->get(mem, slot, std::size_t(std::max<i64>(2 * n, 1)));
      kc::to_16bit(fptr(t), p, n, bf16, mem.stream());
      return p;
    }
    if (!buf || i64(buf->nbytes()) < 2 * n)
      buf = std::make_shared<Tensor>(DType::kUInt8, Shape{std::max<i64>(2 * n, 1)}, mem.shared());
    if (of != t->device_data()) kc::to_16bit(fptr(t), buf->device_data(), n, bf16, mem.stream());
    of = t->device_data();
    return buf->device_data();
  }
};
// Operand i of a product (its runtime copies in slot kOperandA for i == 0, else kOperandB).
std::shared_ptr<Operand16> operand16(const Site& s, std::size_t i, bool bf16) {
  auto o = std::make_shared<Operand16>();
  o->constant = s.in[i]->value != nullptr;
  o->bf16 = bf16;
  o->work = s.work;
  o->slot = i == 0 ? Workspace::kOperandA : Workspace::kOperandB;
  return o;
}

// Row-major C[m, n] (float32) = alpha * op(A) op(B) + beta * C for 16-bit A and B, `batch`
// products with operands `sa` / `sb` / `sc` elements apart (0: one matrix for all).
void gemm16(cublasHandle_t h, bool bf16, bool ta, bool tb, i64 m, i64 n, i64 k, float alpha, const void* a, i64 lda,
            const void* b, i64 ldb, float beta, float* c, i64 ldc, i64 batch = 1, i64 sa = 0, i64 sb = 0,
            i64 sc = 0) {
  const cudaDataType t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (batch == 1) {
    check_blas(cublasGemmEx(h, opb, opa, int(n), int(m), int(k), &alpha, b, t, int(ldb), a, t, int(lda), &beta, c,
                            CUDA_R_32F, int(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "gemm (16-bit operands)");
    return;
  }
  check_blas(cublasGemmStridedBatchedEx(h, opb, opa, int(n), int(m), int(k), &alpha, b, t, int(ldb), sb, a, t,
                                        int(lda), sa, &beta, c, CUDA_R_32F, int(ldc), sc, int(batch),
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "gemm (16-bit operands, strided batched)");
}

const void* at16(const void* p, i64 elements) { return static_cast<const char*>(p) + 2 * elements; }

std::unique_ptr<StepKernel> compile_matmul(const Site& s) {
  if (!s.has(0) || !s.has(1)) return s.decline("missing input");
  if (!s.all_float(2)) return s.decline("MatMul of " + type_name(s.in[0]->declared));
  const MatMulPlan p = plan_matmul(s.node, s.in[0]->shape, s.in[1]->shape);
  if (p.m > INT32_MAX || p.n > INT32_MAX || p.k > INT32_MAX) return s.decline("matrix beyond int32 sizes");
  const auto ops = matmul_batch_operands(p);
  const i64 m = p.m, n = p.n, k = p.k;
  // One GEMM when B is a single matrix and A's batch is dense: A's batches stack into rows.
  bool stacked = !ops.empty();
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (ops[i].first != i64(i) || ops[i].second != 0) stacked = false;
  // Otherwise one strided-batched GEMM when each operand's entry i is i or 0 (no other broadcast).
  bool strided = ops.size() > 1 && i64(ops.size()) <= INT32_MAX;
  const i64 sa = ops.size() > 1 && ops[1].first == 1 ? m * k : 0, sb = ops.size() > 1 && ops[1].second == 1 ? k * n : 0;
  for (std::size_t i = 0; strided && i < ops.size(); ++i)
    if (ops[i].first != (sa ? i64(i) : 0) || ops[i].second != (sb ? i64(i) : 0)) strided = false;
  cublasHandle_t h = s.blas;
  CudaMemory* mem = &s.mem;
  const std::optional<bool> half = sixteen_bit(s, 0, 1);
  auto a16 = half ? operand16(s, 0, *half) : nullptr, b16 = half ? operand16(s, 1, *half) : nullptr;
  cublasHandle_t h16 = s.blas16;
  return kernel([ops, m, n, k, stacked, strided, sa, sb, h, h16, mem, a16, b16](std::span<const Tensor* const> in,
                                                                                std::span<Tensor* const> out) {
    const float* a = fptr(in[0]);
    const float* b = fptr(in[1]);
    float* c = fptr(out[0]);
    if (k == 0 || m == 0 || n == 0) {
      if (out[0]->nbytes()) cudaMemsetAsync(c, 0, out[0]->nbytes(), static_cast<cudaStream_t>(mem->stream()));
      return;
    }
    if (a16) {
      const void* a_ = a16->get(*mem, in[0]);
      const void* b_ = b16->get(*mem, in[1]);
      const bool bf = a16->bf16;
      if (stacked) return gemm16(h16, bf, false, false, m * i64(ops.size()), n, k, 1.0f, a_, k, b_, n, 0.0f, c, n);
      if (strided)
        return gemm16(h16, bf, false, false, m, n, k, 1.0f, a_, k, b_, n, 0.0f, c, n, i64(ops.size()), sa, sb, m * n);
      for (std::size_t i = 0; i < ops.size(); ++i)
        gemm16(h16, bf, false, false, m, n, k, 1.0f, at16(a_, ops[i].first * m * k), k,
               at16(b_, ops[i].second * k * n), n, 0.0f, c + i64(i) * m * n, n);
      return;
    }
    if (stacked) return sgemm(h, false, false, m * i64(ops.size()), n, k, 1.0f, a, k, b, n, 0.0f, c, n);
    if (strided) return sgemm_batched(h, m, n, k, a, sa, b, sb, c, m * n, i64(ops.size()));
    for (std::size_t i = 0; i < ops.size(); ++i)
      sgemm(h, false, false, m, n, k, 1.0f, a + ops[i].first * m * k, k, b + ops[i].second * k * n, n, 0.0f,
            c + i64(i) * m * n, n);
  });
}

std::unique_ptr<StepKernel> compile_gemm(const Site& s) {
  if (!s.has(0) || !s.has(1)) return s.decline("missing input");
  if (!s.all_float(3)) return s.decline("Gemm of " + type_name(s.in[0]->declared));
  const Node& nd = s.node;
  const bool ta = nd.get_int("transA", 0) != 0, tb = nd.get_int("transB", 0) != 0;
  const float alpha = nd.get_float("alpha", 1.0f), beta = nd.get_float("beta", 1.0f);
  const Shape& as = s.in[0]->shape;
  const Shape& bs = s.in[1]->shape;
  if (as.size() != 2 || bs.size() != 2) return s.decline("Gemm operands of rank other than 2");
  const i64 m = ta ? as[1] : as[0], k = ta ? as[0] : as[1], n = tb ? bs[0] : bs[1];
  const bool with_c = s.has(2) && beta != 0.0f;
  std::optional<kc::Walk> cw;
  if (with_c) {
    cw = broadcast_walk(s.out[0].shape, {&s.in[2]->shape, &s.out[0].shape});
    if (!cw) return s.decline("C does not broadcast");
  }
  cublasHandle_t h = s.blas, h16 = s.blas16;
  const std::optional<bool> half = sixteen_bit(s, 0, 1);
  auto a16 = half ? operand16(s, 0, *half) : nullptr, b16 = half ? operand16(s, 1, *half) : nullptr;
  return kernel([=, &mem = s.mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    float* y = fptr(out[0]);
    if (with_c) kc::strided_copy(in[2]->device_data(), y, 4, *cw, mem.stream());
    if (a16)
      return gemm16(h16, a16->bf16, ta, tb, m, n, k, alpha, a16->get(mem, in[0]), ta ? m : k, b16->get(mem, in[1]),
                    tb ? k : n, with_c ? beta : 0.0f, y, n);
    sgemm(h, ta, tb, m, n, k, alpha, fptr(in[0]), ta ? m : k, fptr(in[1]), tb ? k : n, with_c ? beta : 0.0f, y, n);
  });
}

// A 1-D or 2-D convolution's geometry (x and w: the node's input and weight shapes); none for 3-D.
std::optional<kc::Conv2d> conv2d_of(const Node& node, const Shape& x, const Shape& w) {
  const ConvAttributes a = read_conv_attributes(node);
  const kernels::ConvParams cp = conv_forward_params(node, a, x, w);
  const kernels::ConvGeometry3 g = kernels::conv_geometry3(cp);
  if (g.in[0] != 1 || g.k[0] != 1 || g.out[0] != 1) return std::nullopt;
  kc::Conv2d p{};
  p.n = cp.batch;
  p.c = cp.in_channels;
  p.h = g.in[1];
  p.w = g.in[2];
  p.m = cp.out_channels;
  p.oh = g.out[1];
  p.ow = g.out[2];
  p.kh = g.k[1];
  p.kw = g.k[2];
  p.sh = g.s[1];
  p.sw = g.s[2];
  p.ph = g.pb[1];
  p.pw = g.pb[2];
  p.dh = g.d[1];
  p.dw = g.d[2];
  p.group = cp.groups;
  return p;
}

std::unique_ptr<StepKernel> compile_conv(const Site& s) {
  if (!s.has(0) || !s.has(1)) return s.decline("missing input");
  if (!s.all_float(3)) return s.decline("Conv of " + type_name(s.in[0]->declared));
  const std::optional<kc::Conv2d> geometry = conv2d_of(s.node, s.in[0]->shape, s.in[1]->shape);
  if (!geometry) return s.decline("3-D convolution");
  const kc::Conv2d p = *geometry;
  const bool bias = s.has(2);
  cublasHandle_t h = s.blas;
  if (p.group != 1) {
    return kernel([p, bias, &mem = s.mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
      kc::conv2d_direct(fptr(in[0]), fptr(in[1]), bias ? fptr(in[2]) : nullptr, fptr(out[0]), p, mem.stream());
    });
  }
  const bool pointwise =
      p.kh == 1 && p.kw == 1 && p.sh == 1 && p.sw == 1 && p.ph == 0 && p.pw == 0 && p.oh == p.h && p.ow == p.w;
  const i64 ckk = p.c * p.kh * p.kw, spatial = p.oh * p.ow;
  // Images per launch: the whole batch, unless its columns would pass 256 MiB.
  const i64 per_image = std::max<i64>(1, ckk * spatial * 4);
  const i64 images = std::clamp<i64>((i64(256) << 20) / per_image, 1, std::max<i64>(p.n, 1));
  std::shared_ptr<Workspace> work = s.work;
  if (const std::optional<bool> half = sixteen_bit(s, 0, 1)) {
    // Tensor cores: the columns written as 16-bit values (the input pointwise), weights converted once.
    auto w16 = operand16(s, 1, *half), x16 = operand16(s, 0, *half);
    cublasHandle_t h16 = s.blas16;
    const bool bf = *half;
    return kernel([=, &mem = s.mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
      const void* w = w16->get(mem, in[1]);
      const void* x = pointwise ? x16->get(mem, in[0]) : nullptr;
      void* col = pointwise ? nullptr : work->get(mem, Workspace::kColumns, std::size_t(images * ckk * spatial) * 2);
      float* y = fptr(out[0]);
      for (i64 b = 0; b < p.n; b += images) {
        const i64 count = std::min(images, p.n - b);
        if (!pointwise) kc::im2col_images_16bit(fptr(in[0]) + b * p.c * p.h * p.w, col, p, count, bf, mem.stream());
        const void* cols = pointwise ? at16(x, b * p.c * p.h * p.w) : col;
        gemm16(h16, bf, false, false, p.m, spatial, ckk, 1.0f, w, ckk, cols, spatial, 0.0f, y + b * p.m * spatial,
               spatial, count, 0, ckk * spatial, p.m * spatial);
      }
      if (bias) kc::add_channel_bias(y, fptr(in[2]), p.n, p.m, spatial, mem.stream());
    });
  }
  return kernel([=, &mem = s.mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    const float* x = fptr(in[0]);
    const float* w = fptr(in[1]);
    float* y = fptr(out[0]);
    float* col = pointwise ? nullptr : static_cast<float*>(work->get(mem, Workspace::kColumns, std::size_t(images * ckk * spatial) * 4));
    for (i64 b = 0; b < p.n; b += images) {
      const i64 count = std::min(images, p.n - b);
      const float* xb = x + b * p.c * p.h * p.w;
      if (!pointwise) kc::im2col_images(xb, col, p, count, mem.stream());
      // y_i [m, spatial] = w [m, ckk] x col_i [ckk, spatial]
      sgemm_batched(h, p.m, spatial, ckk, w, 0, pointwise ? xb : col, ckk * spatial, y + b * p.m * spatial,
                    p.m * spatial, count);
    }
    if (bias) kc::add_channel_bias(y, fptr(in[2]), p.n, p.m, spatial, mem.stream());
  });
}

// ---- quantization: QuantizeLinear, DequantizeLinear, the fused Q/DQ products --------------------

// A Q/DQ node's scale axis for an input of shape x (scale at input 1); none for blocked scales.
std::optional<kc::QuantAxis> quant_axis(const Node& node, const Shape& x, const Shape& scale) {
  const QuantLayout l = resolve_layout(node, read_quant_attributes(node), x, 0, scale, 1);
  if (l.kind == QuantLayout::Kind::kBlocked) return std::nullopt;
  kc::QuantAxis a;
  if (l.kind == QuantLayout::Kind::kPerAxis) a = {l.axis_dim, l.inner};
  return a;
}

// The zero points of input i uploaded as int32 (raw values, in the operand's own type); an empty
// buffer when the input is absent or a float8 zero point (0). False when they are not constant.
bool upload_zero_points(const Site& s, std::size_t i, DeviceBuffer& out) {
  if (!s.has(i)) return true;
  if (!s.in[i]->value) return false;
  const std::vector<std::int32_t> z = zero_point_values(s.node, i, *s.in[i]->value, s.in[i]->declared);
  if (!z.empty()) out = upload_vector(s.mem, z);
  return true;
}

// The scale must be a plan-time constant: the CPU checks a runtime scale's values on every run
// (an error for zero or non-finite ones), which a device kernel cannot report.
std::unique_ptr<StepKernel> compile_quantize(const Site& s) {
  if (!s.has(0) || !s.has(1)) return s.decline("missing input");
  if (s.in[0]->dtype != DType::kFloat32) return s.decline("QuantizeLinear of " + type_name(s.in[0]->declared));
  if (!s.in[1]->value || s.in[1]->dtype != DType::kFloat32) return s.decline("a runtime scale");
  const DType to = s.out[0].declared;
  std::optional<kc::QuantTo> target;
  if (to == DType::kInt8) target = kc::QuantTo::kInt8;
  if (to == DType::kUInt8) target = kc::QuantTo::kUInt8;
  if (to == DType::kFloat8E4M3FN) target = kc::QuantTo::kFloat8E4M3FN;
  if (!target) return s.decline("QuantizeLinear to " + type_name(to));
  const std::optional<kc::QuantAxis> axis = quant_axis(s.node, s.in[0]->shape, s.in[1]->shape);
  if (!axis) return s.decline("blocked scales");
  DeviceBuffer zp;
  if (!upload_zero_points(s, 2, zp)) return s.decline("a runtime zero point");
  const bool saturate = s.node.opset < 19 || s.node.get_int("saturate", 1) != 0;
  return kernel([=, to = *target, a = *axis, &mem = s.mem](std::span<const Tensor* const> in,
                                                           std::span<Tensor* const> out) {
    kc::quantize_linear(fptr(in[0]), out[0]->device_data(), in[0]->numel(), fptr(in[1]),
                        static_cast<const std::int32_t*>(zp.get()), a, to, saturate, mem.stream());
  });
}

std::unique_ptr<StepKernel> compile_dequantize(const Site& s) {
  if (!s.has(0) || !s.has(1)) return s.decline("missing input");
  if (!s.in[1]->value || s.in[1]->declared != DType::kFloat32) return s.decline("a runtime or non-float32 scale");
  const DType x = s.in[0]->dtype;
  std::optional<kc::Elem> elem;
  if (x == DType::kInt8 || x == DType::kUInt8 || x == DType::kInt32) elem = elem_of(x);
  if (x == DType::kFloat32 && is_float8(s.in[0]->declared)) elem = kc::Elem::kF32;
  if (!elem) return s.decline("DequantizeLinear of " + type_name(s.in[0]->declared));
  const std::optional<kc::QuantAxis> axis = quant_axis(s.node, s.in[0]->shape, s.in[1]->shape);
  if (!axis) return s.decline("blocked scales");
  DeviceBuffer zp;
  if (!upload_zero_points(s, 2, zp)) return s.decline("a runtime zero point");
  return kernel([=, e = *elem, a = *axis, &mem = s.mem](std::span<const Tensor* const> in,
                                                        std::span<Tensor* const> out) {
    kc::dequantize_linear(e, in[0]->device_data(), fptr(out[0]), in[0]->numel(), fptr(in[1]),
                          static_cast<const std::int32_t*>(zp.get()), a, mem.stream());
  });
}

// QEVAL_CUDA_INT8_GEMM=own: every int8 product on kernels/cuda's GEMM (read when a node compiles).
bool int8_gemm_own() {
  const char* v = std::getenv("QEVAL_CUDA_INT8_GEMM");
  return v && std::string_view(v) == "own";
}

// c (column-major m x n, leading dimension ldc, int32) = the exact sums of a's m rows by b's n rows
// (k int8 values each): cuBLAS's integer GEMM where it takes the shape (tensor cores) unless `own`,
// else kernels/cuda's; the same int32 either way (integer sums are exact whatever the order).
void int8_gemm(cublasHandle_t h, bool own, const std::int8_t* a, const std::int8_t* b, std::int32_t* c, i64 m, i64 n,
               i64 k, i64 ldc, kc::Stream st) {
  if (!own && m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX && k > 0) {
    const std::int32_t one = 1, zero = 0;
    const cublasStatus_t r = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(m), int(n), int(k), &one, a, CUDA_R_8I,
                                          int(k), b, CUDA_R_8I, int(k), &zero, c, CUDA_R_32I, int(ldc),
                                          CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT);
    if (r == CUBLAS_STATUS_SUCCESS) return;
    if (r != CUBLAS_STATUS_NOT_SUPPORTED && r != CUBLAS_STATUS_INVALID_VALUE) check_blas(r, "int8 gemm");
  }
  kc::int8_gemm_tn(a, b, c, m, n, k, ldc, st);
}

// What the fused Q/DQ products (quant::kFusedDomain, eval/exec/qdq_fusion.h) need as constants:
// inputs 1, 2 (activation scale, zero point), 3, 4, 5 (weight, scale, zero point). The activation's
// zero point in int8 form, the weight's zero points all 0 (asymmetric weights need the window sums:
// the CPU's), and a_scale * w_scale per output channel as the CPU computes it.
struct Int8Operands {
  std::int32_t za = 0;
  std::vector<float> multipliers;
};
std::optional<Int8Operands> int8_operands(const Site& s, i64 channels) {
  for (std::size_t i : {1, 3, 4})
    if (!s.has(i) || !s.in[i]->value) {
      s.decline("a runtime scale or weight");
      return std::nullopt;
    }
  for (std::size_t i : {2, 5})
    if (s.has(i) && !s.in[i]->value) {
      s.decline("a runtime zero point");
      return std::nullopt;
    }
  const DType xt = s.in[0]->dtype;
  if ((xt != DType::kInt8 && xt != DType::kUInt8) || s.in[3]->dtype != DType::kInt8) {
    s.decline("8-bit operands other than int8/uint8 activations and int8 weights");
    return std::nullopt;
  }
  if (s.has(5)) {
    const std::vector<std::int32_t> zw = zero_point_values(s.node, 5, *s.in[5]->value, s.in[5]->declared);
    if (std::any_of(zw.begin(), zw.end(), [](std::int32_t z) { return z != 0; })) {
      s.decline("weight zero points other than 0");
      return std::nullopt;
    }
  }
  Int8Operands o;
  if (s.has(2)) o.za = zero_point_values(s.node, 2, *s.in[2]->value, s.in[2]->declared).at(0);
  if (xt == DType::kUInt8) o.za -= 128;
  const Tensor& sa = *s.in[1]->value;
  const Tensor& sb = *s.in[4]->value;
  if (sa.numel() != 1 || (sb.numel() != 1 && sb.numel() != channels)) {
    s.decline("scales other than one activation scale and one or per-channel weight scales");
    return std::nullopt;
  }
  o.multipliers.resize(std::size_t(channels));
  for (i64 j = 0; j < channels; ++j) o.multipliers[std::size_t(j)] = sa.data<float>()[0] * sb.data<float>()[sb.numel() == 1 ? 0 : j];
  return o;
}

// -za * (sum of each output channel's weights): the activation zero point's share of every sum.
// `sum(j)` gives channel j's weight sum. Empty when za is 0.
template <class Sum>
std::vector<std::int32_t> zero_point_terms(std::int32_t za, i64 channels, Sum&& sum) {
  std::vector<std::int32_t> add;
  if (za == 0) return add;
  add.resize(std::size_t(channels));
  for (i64 j = 0; j < channels; ++j) add[std::size_t(j)] = -za * sum(j);
  return add;
}

// Fused Conv: x_q, x_scale, x_zp, w_q, w_scale, w_zp, B. The 8-bit im2col rows of each image times
// the weights' rows (both along k) into the output's storage as int32, then the epilogue in place.
std::unique_ptr<StepKernel> compile_int8_conv(const Site& s) {
  if (!s.has(0) || !s.has(3)) return s.decline("missing input");
  const std::optional<kc::Conv2d> geometry = conv2d_of(s.node, s.in[0]->shape, s.in[3]->shape);
  if (!geometry) return s.decline("3-D convolution");
  const kc::Conv2d p = *geometry;
  if (p.group != 1) return s.decline("grouped int8 convolution");
  const std::optional<Int8Operands> o = int8_operands(s, p.m);
  if (!o) return nullptr;
  const i64 k = p.c * p.kh * p.kw, spatial = p.oh * p.ow;
  const std::int8_t* w = s.in[3]->value->data<std::int8_t>();
  const std::vector<std::int32_t> add = zero_point_terms(o->za, p.m, [&](i64 oc) {
    std::int32_t t = 0;
    for (i64 j = 0; j < k; ++j) t += w[oc * k + j];
    return t;
  });
  const DeviceBuffer add_d = add.empty() ? DeviceBuffer{} : upload_vector(s.mem, add);
  const DeviceBuffer scale_d = upload_vector(s.mem, o->multipliers);
  const bool from_uint8 = s.in[0]->dtype == DType::kUInt8, bias = s.has(6);
  const std::int8_t pad = std::int8_t(o->za);
  const i64 images = std::clamp<i64>((i64(256) << 20) / std::max<i64>(1, k * spatial), 1, std::max<i64>(p.n, 1));
  std::shared_ptr<Workspace> work = s.work;
  cublasHandle_t h = s.blas16;
  const bool own = int8_gemm_own();
  return kernel([=, &mem = s.mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    auto* rows = static_cast<std::int8_t*>(work->get(mem, Workspace::kColumns, std::size_t(images * k * spatial)));
    auto* c = static_cast<std::int32_t*>(out[0]->device_data());  // the sums, then the floats
    const auto* x = static_cast<const std::uint8_t*>(in[0]->device_data());
    const auto* wd = static_cast<const std::int8_t*>(in[3]->device_data());
    for (i64 b = 0; b < p.n; b += images) {
      const i64 count = std::min(images, p.n - b);
      kc::im2col_int8_rows(x + b * p.c * p.h * p.w, from_uint8, rows, p, count, pad, mem.stream());
      // y_i [m, spatial] row-major = column-major [spatial, m]: rows_i [spatial, k] by w [m, k]
      for (i64 i = 0; i < count; ++i)
        int8_gemm(h, own, rows + i * spatial * k, wd, c + (b + i) * p.m * spatial, spatial, p.m, k, spatial, mem.stream());
    }
    kc::int8_epilogue(c, out[0]->numel(), static_cast<const std::int32_t*>(add_d.get()),
                      static_cast<const float*>(scale_d.get()), bias ? fptr(in[6]) : nullptr, {p.m, spatial},
                      mem.stream());
  });
}

// Fused MatMul: a_q [..., m, k], a_scale, a_zp, b_q [k, n] (a 2-D weight), b_scale, b_zp. The
// weight transposed once to rows of k; A's rows stacked into one product.
std::unique_ptr<StepKernel> compile_int8_matmul(const Site& s) {
  if (!s.has(0) || !s.has(3)) return s.decline("missing input");
  const Shape& bs = s.in[3]->shape;
  if (bs.size() != 2 || s.in[0]->shape.size() < 2) return s.decline("int8 MatMul with other than a 2-D weight");
  const i64 k = bs[0], n = bs[1];
  const i64 rows = shape_numel(s.in[0]->shape) / std::max<i64>(k, 1);
  if (s.in[0]->shape.back() != k) return s.decline("inner dimensions differ");
  const std::optional<Int8Operands> o = int8_operands(s, n);
  if (!o) return nullptr;
  const std::int8_t* b = s.in[3]->value->data<std::int8_t>();
  Tensor wt(DType::kInt8, Shape{n, k});  // [n, k]: each output column's weights along k
  for (i64 kk = 0; kk < k; ++kk)
    for (i64 j = 0; j < n; ++j) wt.data<std::int8_t>()[j * k + kk] = b[kk * n + j];
  const DeviceBuffer wt_d = upload(s.mem, wt);
  const std::vector<std::int32_t> add = zero_point_terms(o->za, n, [&](i64 j) {
    std::int32_t t = 0;
    for (i64 kk = 0; kk < k; ++kk) t += b[kk * n + j];
    return t;
  });
  const DeviceBuffer add_d = add.empty() ? DeviceBuffer{} : upload_vector(s.mem, add);
  const DeviceBuffer scale_d = upload_vector(s.mem, o->multipliers);
  const bool from_uint8 = s.in[0]->dtype == DType::kUInt8;
  std::shared_ptr<Workspace> work = s.work;
  cublasHandle_t h = s.blas16;
  const bool own = int8_gemm_own();
  return kernel([=, &mem = s.mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    const auto* a = static_cast<const std::int8_t*>(in[0]->device_data());
    if (from_uint8) {
      auto* a8 = static_cast<std::int8_t*>(work->get(mem, Workspace::kOperandA, std::size_t(std::max<i64>(rows * k, 1))));
      kc::to_int8(in[0]->device_data(), true, a8, rows * k, mem.stream());
      a = a8;
    }
    auto* c = static_cast<std::int32_t*>(out[0]->device_data());
    // y [rows, n] row-major = column-major [n, rows]: wt [n, k] by a [rows, k]
    int8_gemm(h, own, static_cast<const std::int8_t*>(wt_d.get()), a, c, n, rows, k, n, mem.stream());
    kc::int8_epilogue(c, out[0]->numel(), static_cast<const std::int32_t*>(add_d.get()),
                      static_cast<const float*>(scale_d.get()), nullptr, {n, 1}, mem.stream());
  });
}

// ---- softmax, norms, reductions -------------------------------------------------------------

std::unique_ptr<StepKernel> compile_softmax(const Site& s, bool log) {
  if (!s.has(0) || !s.all_float(1)) return s.decline("Softmax of a non-float32 input");
  const Shape& xs = s.in[0]->shape;
  const int rank = int(xs.size());
  const int axis = normalize_axis(s.node, s.node.get_int("axis", s.node.opset < 13 ? 1 : -1), std::max(rank, 1));
  i64 outer = 1, n = 1, inner = 1;
  for (int d = 0; d < rank; ++d) {
    if (d < axis) outer *= xs[std::size_t(d)];
    else if (d == axis || s.node.opset < 13) n *= xs[std::size_t(d)];
    else inner *= xs[std::size_t(d)];
  }
  return kernel([=, &mem = s.mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    kc::softmax(fptr(in[0]), fptr(out[0]), outer, n, inner, log, mem.stream());
  });
}

std::unique_ptr<StepKernel> compile_layer_norm(const Site& s) {
  if (!s.all_float(3)) return s.decline("LayerNormalization of a non-float32 input");
  for (std::size_t o = 1; o < s.out.size(); ++o)
    if (!s.node.outputs[o].empty() && s.out[o].dtype != DType::kFloat32)
      return s.decline("stash_type other than float");
  const Shape& xs = s.in[0]->shape;
  const int axis = normalize_axis(s.node, s.node.get_int("axis", -1), int(xs.size()));
  i64 n = 1;
  for (std::size_t d = std::size_t(axis); d < xs.size(); ++d) n *= xs[d];
  const i64 rows = n == 0 ? 0 : shape_numel(xs) / n;
  for (std::size_t i = 1; i < 3; ++i)
    if (s.has(i) && shape_numel(s.in[i]->shape) != n && shape_numel(s.in[i]->shape) != 1)
      return s.decline("scale/bias varying over the leading dimensions");
  const i64 sn = s.has(1) ? shape_numel(s.in[1]->shape) : 1, bn = s.has(2) ? shape_numel(s.in[2]->shape) : 1;
  if (s.has(1) && s.has(2) && sn != bn) return s.decline("scale and bias of different lengths");
  const double eps = s.node.get_float("epsilon", 1e-5f);
  const bool has_b = s.has(2);
  const std::size_t scratch = kc::normalize_rows_scratch_bytes(rows, n);
  return kernel([=, &mem = s.mem, ws = s.work](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    kc::normalize_rows(fptr(in[0]), fptr(out[0]), rows, n, eps, fptr(in[1]), has_b ? fptr(in[2]) : nullptr,
                       std::max(sn, bn), 1, out.size() > 1 ? fptr(out[1]) : nullptr,
                       out.size() > 2 ? fptr(out[2]) : nullptr,
                       scratch ? ws->get(mem, Workspace::kColumns, scratch) : nullptr, mem.stream());
  });
}

std::unique_ptr<StepKernel> compile_group_norm(const Site& s, bool instance) {
  if (!s.all_float(3) || !s.has(0)) return s.decline("normalization of a non-float32 input");
  const Shape& xs = s.in[0]->shape;
  if (xs.size() < 2) return s.decline("input of rank below 2");
  const i64 batch = xs[0], c = xs[1];
  const i64 spatial = c == 0 || batch == 0 ? 0 : shape_numel(xs) / (batch * c);
  const i64 groups = instance ? c : s.node.get_int("num_groups", 1);
  if (groups <= 0 || c % groups) return s.decline("channels not divisible by num_groups");
  const bool per_group = !instance && s.node.opset < 21;
  const i64 channels = per_group ? groups : c, channel_inner = per_group ? (c / groups) * spatial : spatial;
  for (std::size_t i = 1; i < 3; ++i)
    if (!s.has(i) || shape_numel(s.in[i]->shape) != channels) return s.decline("scale/bias length");
  const double eps = s.node.get_float("epsilon", 1e-5f);
  const i64 rows = batch * groups, n = (c / groups) * spatial;
  const std::size_t scratch = kc::normalize_rows_scratch_bytes(rows, n);
  return kernel([=, &mem = s.mem, ws = s.work](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    kc::normalize_rows(fptr(in[0]), fptr(out[0]), rows, n, eps, fptr(in[1]), fptr(in[2]), channels, channel_inner,
                       nullptr, nullptr, scratch ? ws->get(mem, Workspace::kColumns, scratch) : nullptr, mem.stream());
  });
}

std::unique_ptr<StepKernel> compile_batch_norm(const Site& s) {
  if (!s.all_float(5)) return s.decline("BatchNormalization of a non-float32 input");
  if (s.node.opset < 9 && s.node.get_int("spatial", 1) == 0) return s.decline("spatial=0");
  std::vector<std::vector<double>> params;
  for (std::size_t i = 1; i < 5; ++i) {
    if (!s.has(i) || !s.in[i]->value) return s.decline("parameters known only at run time");
    const Tensor& t = *s.in[i]->value;
    params.emplace_back(t.data<float>(), t.data<float>() + t.numel());
  }
  const Shape& xs = s.in[0]->shape;
  const i64 outer = xs[0], channels = i64(params[0].size());
  const i64 inner = outer == 0 || channels == 0 ? 0 : shape_numel(xs) / (outer * channels);
  std::vector<DeviceBuffer> dev;
  for (const auto& v : params) dev.push_back(upload_vector(s.mem, v));
  const double eps = s.node.get_float("epsilon", 1e-5f);
  return kernel([=, &mem = s.mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    auto d = [&](int i) { return static_cast<const double*>(dev[std::size_t(i)].get()); };
    kc::batch_norm(fptr(in[0]), fptr(out[0]), outer, channels, inner, d(0), d(1), d(2), d(3), eps, mem.stream());
  });
}

std::unique_ptr<StepKernel> compile_reduce(const Site& s, kc::Reduce op) {
  if (!s.has(0) || s.in[0]->dtype != DType::kFloat32) return s.decline("reduction of a non-float32 input");
  const Node& nd = s.node;
  const Shape& xs = s.in[0]->shape;
  const int rank = int(xs.size());
  std::vector<i64> axes;
  if (s.has(1)) {
    if (!s.in[1]->value) return s.decline("axes known only at run time");
    axes = to_int64s(*s.in[1]->value);
  } else {
    axes = nd.get_ints("axes");
  }
  const bool noop = s.has(1) || nd.opset >= 18 ? nd.get_int("noop_with_empty_axes", 0) != 0 : false;
  std::vector<bool> reduced(std::size_t(rank), axes.empty() && !noop);
  for (i64 a : axes) reduced[std::size_t(normalize_axis(nd, a, rank))] = true;
  // Kept dimensions first, reduced last: a permuted copy unless they already are.
  Shape kept_shape, red_shape;
  std::vector<int> perm;
  for (int d = 0; d < rank; ++d)
    if (!reduced[std::size_t(d)]) kept_shape.push_back(xs[std::size_t(d)]), perm.push_back(d);
  for (int d = 0; d < rank; ++d)
    if (reduced[std::size_t(d)]) red_shape.push_back(xs[std::size_t(d)]), perm.push_back(d);
  bool in_order = true;
  for (int d = 0; d < rank; ++d) {
    if (perm[std::size_t(d)] != d && xs[std::size_t(perm[std::size_t(d)])] != 1) in_order = false;
  }
  const i64 rows = shape_numel(kept_shape), n = shape_numel(red_shape);
  if (rank > kc::kMaxRank) return s.decline("rank above 8");
  kc::Walk w;
  w.rank = std::max(rank, 1);
  w.counts[0] = 1;
  const auto st = dense_strides(xs);
  Shape permuted;
  for (int d = 0; d < rank; ++d) permuted.push_back(xs[std::size_t(perm[std::size_t(d)])]);
  const auto pst = dense_strides(permuted);
  for (int d = 0; d < rank; ++d) {
    w.counts[d] = permuted[std::size_t(d)];
    w.strides[0][d] = st[std::size_t(perm[std::size_t(d)])];
    w.strides[1][d] = pst[std::size_t(d)];
  }
  std::shared_ptr<Workspace> work = s.work;
  return kernel([=, &mem = s.mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    const float* x = fptr(in[0]);
    if (!in_order) {
      float* t = static_cast<float*>(work->get(mem, Workspace::kColumns, std::size_t(rows * n) * 4));
      kc::strided_copy(x, t, 4, w, mem.stream());
      x = t;
    }
    kc::reduce_rows(op, x, fptr(out[0]), rows, n, mem.stream());
  });
}

// ---- pooling, resize, gather, concat, split ---------------------------------------------------------

std::unique_ptr<StepKernel> compile_pool(const Site& s) {
  if (!s.has(0) || s.in[0]->dtype != DType::kFloat32) return s.decline("pooling of a non-float32 input");
  const Node& nd = s.node;
  const Shape& xs = s.in[0]->shape;
  const Shape& os = s.out[0].shape;
  const bool global = nd.op_type.rfind("Global", 0) == 0;
  const bool max = nd.op_type == "MaxPool" || nd.op_type == "GlobalMaxPool";
  if (xs.size() != 4 && xs.size() != 3) return s.decline("pooling over other than 1 or 2 spatial dimensions");
  if (s.out.size() > 1 && !nd.outputs[1].empty()) return s.decline("MaxPool indices output");
  const bool one_d = xs.size() == 3;
  kc::Pool2d p{};
  p.planes = xs[0] * xs[1];
  p.h = one_d ? 1 : xs[2];
  p.w = xs.back();
  p.oh = one_d ? 1 : os[2];
  p.ow = os.back();
  p.kh = p.kw = 1;
  p.sh = p.sw = p.dh = p.dw = 1;
  if (global) {
    p.kh = p.h;
    p.kw = p.w;
  } else {
    if (nd.get_string("auto_pad", "NOTSET") != "NOTSET") return s.decline("auto_pad");
    const auto k = nd.get_ints("kernel_shape");
    const std::size_t r = xs.size() - 2;
    if (k.size() != r) return s.decline("kernel_shape rank");
    const auto st = nd.get_ints("strides", std::vector<i64>(r, 1));
    const auto dl = nd.get_ints("dilations", std::vector<i64>(r, 1));
    const auto pd = nd.get_ints("pads", std::vector<i64>(2 * r, 0));
    p.kw = k.back();
    p.sw = st.back();
    p.dw = dl.back();
    p.pw = pd[r - 1];
    p.pad_w_end = pd[2 * r - 1];
    if (!one_d) {
      p.kh = k[0];
      p.sh = st[0];
      p.dh = dl[0];
      p.ph = pd[0];
      p.pad_h_end = pd[2];
    }
    p.count_include_pad = nd.get_int("count_include_pad", 0) != 0;
    if (p.count_include_pad && nd.get_int("ceil_mode", 0) != 0) return s.decline("count_include_pad with ceil_mode");
  }
  p.max = max;
  return kernel([p, &mem = s.mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    kc::pool2d(fptr(in[0]), fptr(out[0]), p, mem.stream());
  });
}

std::unique_ptr<StepKernel> compile_resize(const Site& s) {
  if (!s.has(0)) return s.decline("missing input");
  auto plan = resize_plan(s.op, s.in);
  if (!plan) return s.decline("not a Resize op");
  const kernels::ResizeOptions& o = plan->options;
  if (o.mode == kernels::ResizeMode::kNearest) {
    // Each output axis reads its input axis through the nearest filter's indices: per-axis tables
    // straight from the filters (no index map over every element).
    const Shape& os = s.out[0].shape;
    if (os.size() > std::size_t(kc::kMaxRank) || plan->axes.size() != os.size()) return compile_index_map(s);
    const auto ist = dense_strides(s.in[0]->shape);
    kernels::SeparableMap sep;
    for (std::size_t d = 0; d < os.size(); ++d) {
      const kernels::AxisFilter f = kernels::resize_filter(plan->axes[d], o);
      std::vector<i64>& t = sep.tables.emplace_back(std::size_t(f.out));
      for (i64 j = 0; j < f.out; ++j) {
        const bool outside = !f.extrapolate.empty() && f.extrapolate[std::size_t(j)];
        t[std::size_t(j)] = outside ? kernels::SeparableMap::kFill : f.index[std::size_t(j)] * ist[d];
        sep.has_fill |= outside;
      }
    }
    sep.normalize();
    const DType dt = s.in[0]->dtype;
    std::vector<std::byte> fill(dtype_size(dt), std::byte{0});
    if (sep.has_fill && o.extrapolation_value != 0) {
      if (dt != DType::kFloat32) return s.decline("nearest extrapolation value for a non-float32 input");
      const float v = float(o.extrapolation_value);
      std::memcpy(fill.data(), &v, sizeof v);
    }
    return separable_kernel(s, sep, os, int(fill.size()), fill);
  }
  if (s.in[0]->dtype != DType::kFloat32) return s.decline("interpolation of a non-float32 input");
  if (o.antialias) return s.decline("antialias");
  struct AxisPass {
    i64 outer, in, out, inner;
    int taps;
    DeviceBuffer index, weight, extrapolate;
  };
  std::vector<AxisPass> passes;
  Shape cur = s.in[0]->shape;
  for (std::size_t d = 0; d < plan->axes.size(); ++d) {
    const auto& ax = plan->axes[d];
    const kernels::AxisFilter f = kernels::resize_filter(ax, o);
    if (f.identity) continue;
    AxisPass p;
    p.outer = 1;
    for (std::size_t e = 0; e < d; ++e) p.outer *= cur[e];
    p.inner = 1;
    for (std::size_t e = d + 1; e < cur.size(); ++e) p.inner *= cur[e];
    p.in = ax.in;
    p.out = ax.out;
    p.taps = f.taps;
    p.index = upload_vector(s.mem, f.index);
    p.weight = upload_vector(s.mem, f.weight);
    if (!f.extrapolate.empty()) p.extrapolate = upload_vector(s.mem, f.extrapolate);
    passes.push_back(p);
    cur[d] = ax.out;
  }
  const double value = o.extrapolation_value;
  std::shared_ptr<Workspace> work = s.work;
  return kernel([=, &mem = s.mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    if (passes.empty()) {
      cudaMemcpyAsync(out[0]->device_data(), in[0]->device_data(), in[0]->nbytes(), cudaMemcpyDeviceToDevice,
                      static_cast<cudaStream_t>(mem.stream()));
      return;
    }
    const float* x = fptr(in[0]);
    for (std::size_t i = 0; i < passes.size(); ++i) {
      const AxisPass& p = passes[i];
      float* y = i + 1 == passes.size()
                     ? fptr(out[0])
                     : static_cast<float*>(work->get(mem, i % 2 ? Workspace::kSecond : Workspace::kColumns,
                                                    std::size_t(p.outer * p.out * p.inner) * 4));
      kc::resize_axis(x, y, p.outer, p.in, p.out, p.inner, p.taps, static_cast<const i64*>(p.index.get()),
                      static_cast<const double*>(p.weight.get()), static_cast<const std::uint8_t*>(p.extrapolate.get()),
                      value, mem.stream());
      x = y;
    }
  });
}

std::unique_ptr<StepKernel> compile_gather(const Site& s) {
  if (!s.has(0) || !s.has(1)) return s.decline("missing input");
  if (s.in[1]->value) return compile_index_map(s);
  const DType it = s.in[1]->dtype;
  if (it != DType::kInt64 && it != DType::kInt32) return s.decline("indices of " + type_name(it));
  const Shape& xs = s.in[0]->shape;
  const int axis = normalize_axis(s.node, s.node.get_int("axis", 0), int(xs.size()));
  i64 outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= xs[std::size_t(d)];
  for (std::size_t d = std::size_t(axis) + 1; d < xs.size(); ++d) inner *= xs[d];
  const i64 axis_dim = xs[std::size_t(axis)], count = shape_numel(s.in[1]->shape);
  const int es = int(dtype_size(s.in[0]->dtype));
  const bool idx64 = it == DType::kInt64;
  return kernel([=, &mem = s.mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    kc::gather_axis(in[0]->device_data(), in[1]->device_data(), idx64, out[0]->device_data(), es, outer, axis_dim,
                    inner, count, mem.stream());
  });
}

// Concat (inputs into slabs of the output) and Split (slabs of the input into outputs) along an axis.
std::unique_ptr<StepKernel> compile_slabs(const Site& s, bool concat) {
  const Shape& whole = concat ? s.out[0].shape : s.in[0]->shape;
  const int rank = int(whole.size());
  if (rank == 0) return s.decline("scalar");
  const int axis = normalize_axis(s.node, s.node.get_int("axis", concat ? 1 : 0), rank);
  i64 outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= whole[std::size_t(d)];
  for (int d = axis + 1; d < rank; ++d) inner *= whole[std::size_t(d)];
  const i64 total = whole[std::size_t(axis)];
  std::vector<std::pair<std::size_t, kc::Walk>> parts;  // (input or output index, walk)
  i64 offset = 0;
  const std::size_t count = concat ? s.in.size() : s.out.size();
  for (std::size_t i = 0; i < count; ++i) {
    if (concat && !s.in[i]) continue;
    const Shape& ps = concat ? s.in[i]->shape : s.out[i].shape;
    if (!concat && s.node.outputs[i].empty()) continue;
    const i64 a = ps.empty() ? 0 : ps[std::size_t(axis)];
    kc::Walk w;
    w.rank = 3;
    w.counts[0] = outer;
    w.counts[1] = a;
    w.counts[2] = inner;
    const int part = concat ? 0 : 1, slab = concat ? 1 : 0;
    w.strides[part][0] = a * inner;
    w.strides[part][1] = inner;
    w.strides[part][2] = 1;
    w.strides[slab][0] = total * inner;
    w.strides[slab][1] = inner;
    w.strides[slab][2] = 1;
    w.base[slab] = offset * inner;
    offset += a;
    parts.emplace_back(i, w);
  }
  const int es = int(dtype_size(concat ? s.out[0].dtype : s.in[0]->dtype));
  return kernel([=, &mem = s.mem](std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    for (const auto& [i, w] : parts) {
      if (concat) kc::strided_copy(in[i]->device_data(), out[0]->device_data(), es, w, mem.stream());
      else if (out[i]) kc::strided_copy(in[0]->device_data(), out[i]->device_data(), es, w, mem.stream());
    }
  });
}

// ---- fused kernels ----------------------------------------------------------------------------------

// Device memory the fused attention kernels of one backend share (their runs are serialised by the
// memory's lock): 16-bit copies of Q, K^T and V, and a chunk of scores and probabilities.
using AttentionScratch = Scratch;

// MatMul(Q, K^T) -> [Mul | Div by a scalar] -> Softmax -> MatMul(., V) as one device step. Three
// forms of the same arithmetic (QEVAL_CUDA_ATTENTION=tc|gemm|fused picks one where it applies):
// - kc::attention16 (the default where Q, K^T and V are exact in the probabilities' 16-bit format,
//   as in fp16/bf16 variants): both products on tensor cores with FP32 sums, flash style (the scores
//   never exist).
// - as GEMMs (16-bit shapes attention16 does not take, FP32 shapes the flash kernel does not
//   take): the scores of a chunk of entries and rows (at most kScoreBytes) by cuBLAS, the
//   probabilities by kc::attention_probs, their product with V by cuBLAS; 16-bit operands on tensor
//   cores with FP32 sums where exact, else pedantic FP32. The scores exist only a chunk at a time.
// - kc::attention (FP32 SIMT, flash style: the scores never exist), the FP32 default.
// Observed (run_all), the members' outputs come from the kernels their nodes run (the scores'
// GEMM as compile_matmul runs it, the scale, row softmax, rounding as the executor rounds them)
// and the output from the same computation as run(): the same bits either way.
class CudaAttention final : public FusedKernel {
 public:
  static constexpr i64 kScoreBytes = i64(256) << 20;
  enum class Form : std::uint8_t { kFlash, kTensorCores, kGemms };
  CudaAttention(const kernels::AttentionShape& shape, std::shared_ptr<CudaMemory> memory, cublasHandle_t blas,
                cublasHandle_t blas16, std::shared_ptr<AttentionScratch> scratch, Form form, std::optional<bool> sixteen)
      : shape_(shape), memory_(std::move(memory)), blas_(blas), blas16_(blas16), scratch_(std::move(scratch)),
        form_(form), half_(sixteen) {}
  void run(std::span<const Tensor* const> in, Tensor& out) override {
    const auto held = memory_->lock();
    product(in, fptr(&out));
  }
  // outputs: the scores, [the scaled scores,] the probabilities, the output.
  void run_all(std::span<const Tensor* const> in, std::span<Tensor* const> outputs) override {
    const auto held = memory_->lock();
    const kernels::AttentionShape& a = shape_;
    const std::size_t n = outputs.size();
    const i64 L = a.q_len, Lk = a.kv_len, d = a.head_dim, count = a.batch * L * Lk;
    float* scores = fptr(outputs[0]);
    void* stream = memory_->stream();
    // As the MatMul node runs it (compile_matmul: one strided-batched GEMM, 16-bit where exact).
    std::optional<Copies> c16;
    if (half_) {
      const Copies& c = c16.emplace(copies16(in, chunking().bytes()));
      gemm16(blas16_, *half_, false, false, L, Lk, d, 1.0f, c.q, d, c.kt, Lk, 0.0f, scores, Lk, a.batch, L * d,
             d * Lk, L * Lk);
    } else {
      sgemm_batched(blas_, L, Lk, d, fptr(in[0]), L * d, fptr(in[1]), d * Lk, scores, L * Lk, a.batch);
    }
    round(scores, count, a.round_scores);
    const float* x = scores;
    if (n == 4) {
      float* scaled = fptr(outputs[1]);
      kc::scale(scores, scaled, count, a.scale_kind == kernels::ScoreScale::kDiv, a.scale, stream);
      round(scaled, count, a.round_scaled);
      x = scaled;
    }
    float* probs = fptr(outputs[n - 2]);
    kc::softmax(x, probs, a.batch * L, Lk, 1, false, stream);
    round(probs, count, a.round_probs);
    product(in, fptr(outputs[n - 1]), c16 ? &*c16 : nullptr);
  }

 private:
  // 16-bit copies of Q, K^T and V at the front of the scratch, and `extra` bytes after them.
  struct Copies {
    const void *q, *kt, *v;
    char* rest;
  };
  Copies copies16(std::span<const Tensor* const> in, std::size_t extra = 0) {
    const kernels::AttentionShape& a = shape_;
    const i64 nq = a.batch * a.q_len * a.head_dim, nk = a.batch * a.head_dim * a.kv_len,
              nv = a.batch * a.kv_len * a.v_dim;
    const std::size_t front = std::size_t(2 * (nq + nk + nv) + 255) / 256 * 256;
    char* q = static_cast<char*>(scratch_->get(*memory_, front + extra));
    char *k = q + 2 * nq, *v = k + 2 * nk;
    kc::to_16bit(fptr(in[0]), q, nq, *half_, memory_->stream());
    kc::to_16bit(fptr(in[1]), k, nk, *half_, memory_->stream());
    kc::to_16bit(fptr(in[2]), v, nv, *half_, memory_->stream());
    return {q, k, v, q + front};
  }

  // Chunks of the scores: whole entries while one fits kScoreBytes, else rows of one entry; FP32
  // scores, then (16-bit operands) the probabilities in 16 bits.
  struct Chunking {
    i64 rows, entries;
    std::size_t scores_bytes, probs_bytes;
    std::size_t bytes() const { return scores_bytes + probs_bytes; }
  };
  Chunking chunking() const {
    const kernels::AttentionShape& a = shape_;
    const i64 L = std::max<i64>(a.q_len, 1), Lk = std::max<i64>(a.kv_len, 1), per_row = Lk * i64(sizeof(float));
    const i64 rows = std::clamp<i64>(kScoreBytes / per_row, 1, L);
    const i64 entries = rows < L ? 1 : std::clamp<i64>(kScoreBytes / (per_row * L), 1, std::max<i64>(a.batch, 1));
    return {rows, entries, std::size_t(entries * rows * per_row), half_ ? std::size_t(entries * rows * Lk * 2) : 0};
  }

  // `made`: 16-bit copies of the inputs already in the scratch (copies16 with chunking()'s bytes).
  void product(std::span<const Tensor* const> in, float* y, const Copies* made = nullptr) {
    const kernels::AttentionShape& a = shape_;
    if (form_ == Form::kFlash) return kc::attention(a, fptr(in[0]), fptr(in[1]), fptr(in[2]), y, memory_->stream());
    if (form_ == Form::kTensorCores)  // its padded copies replace `made` (dead after the scores' GEMM)
      return kc::attention16(a, fptr(in[0]), fptr(in[1]), fptr(in[2]), y,
                             scratch_->get(*memory_, kc::attention16_scratch_bytes(a)), memory_->stream());
    const i64 L = a.q_len, Lk = a.kv_len, d = a.head_dim, dv = a.v_dim;
    if (a.batch <= 0 || L <= 0 || dv <= 0) return;
    const Chunking ch = chunking();
    const i64 rows = ch.rows, entries = ch.entries;
    const bool p16 = half_.has_value();
    const Copies c = !p16 ? Copies{} : made ? *made : copies16(in, ch.bytes());
    char* chunk = p16 ? c.rest : static_cast<char*>(scratch_->get(*memory_, ch.scores_bytes));
    float* s = reinterpret_cast<float*>(chunk);
    void* p = p16 ? static_cast<void*>(chunk + ch.scores_bytes) : static_cast<void*>(s);
    for (i64 e0 = 0; e0 < a.batch; e0 += entries) {
      const i64 ne = std::min(entries, a.batch - e0);
      for (i64 r0 = 0; r0 < L; r0 += rows) {
        const i64 nr = std::min(rows, L - r0), qa = e0 * L * d + r0 * d, ya = e0 * L * dv + r0 * dv;
        if (p16) {
          gemm16(blas16_, *half_, false, false, nr, Lk, d, 1.0f, at16(c.q, qa), d, at16(c.kt, e0 * d * Lk), Lk,
                 0.0f, s, Lk, ne, L * d, d * Lk, nr * Lk);
        } else {
          sgemm_batched(blas_, nr, Lk, d, fptr(in[0]) + qa, L * d, fptr(in[1]) + e0 * d * Lk, d * Lk, s, nr * Lk, ne);
        }
        kc::attention_probs(a, s, p, ne * nr, memory_->stream());
        if (p16) {
          gemm16(blas16_, *half_, false, false, nr, dv, Lk, 1.0f, p, Lk, at16(c.v, e0 * Lk * dv), dv, 0.0f, y + ya, dv,
                 ne, nr * Lk, Lk * dv, L * dv);
        } else {
          sgemm_batched(blas_, nr, dv, Lk, s, nr * Lk, fptr(in[2]) + e0 * Lk * dv, Lk * dv, y + ya, L * dv, ne);
        }
      }
    }
  }
  void round(float* p, i64 count, kernels::RoundTo r) {
    if (r == kernels::RoundTo::kFp16) kc::round_float16(p, count, memory_->stream());
    else if (r == kernels::RoundTo::kBf16) kc::round_bfloat16(p, count, memory_->stream());
  }
  kernels::AttentionShape shape_;
  std::shared_ptr<CudaMemory> memory_;
  cublasHandle_t blas_, blas16_;
  std::shared_ptr<AttentionScratch> scratch_;
  Form form_;
  std::optional<bool> half_;  // 16-bit operands (true: bf16), else FP32
};

// A chain of elementwise ops (and a terminal 8-bit quantizer) as one device kernel: each stage the
// device function its node's kernel uses, rounded between stages as the executor rounds.
class CudaChain final : public FusedKernel {
 public:
  CudaChain(const kc::Chain& chain, std::vector<int> others, std::shared_ptr<CudaMemory> memory)
      : chain_(chain), others_(std::move(others)), memory_(std::move(memory)) {}
  void run(std::span<const Tensor* const> in, Tensor& out) override { launch(in, out.device_data(), {}); }
  void run_all(std::span<const Tensor* const> in, std::span<Tensor* const> outputs) override {
    launch(in, outputs.back()->device_data(), outputs);
  }

 private:
  void launch(std::span<const Tensor* const> in, void* y, std::span<Tensor* const> keep) {
    const auto held = memory_->lock();
    kc::Chain c = chain_;
    for (int k = 0; k < c.count; ++k) {
      kc::ChainStep& st = c.steps[k];
      if (st.kind == kc::ChainStep::kBinary) st.other = fptr(in[std::size_t(others_[std::size_t(k)])]);
      st.keep = !keep.empty() && k + 1 < c.count ? fptr(keep[std::size_t(k)]) : nullptr;
    }
    kc::elementwise_chain(c, fptr(in[0]), y, in[0]->numel(), memory_->stream());
  }
  kc::Chain chain_;
  std::vector<int> others_;  // per stage: the input index of a binary stage's other operand
  std::shared_ptr<CudaMemory> memory_;
};

// The device chain for these stages, or null where a stage has no device form.
std::shared_ptr<FusedKernel> make_chain(const std::vector<ChainStage>& stages, std::shared_ptr<CudaMemory> memory) {
  if (stages.empty() || stages.size() > std::size_t(kc::kMaxChainSteps)) return nullptr;
  kc::Chain c;
  c.count = int(stages.size());
  std::vector<int> others;
  for (std::size_t k = 0; k < stages.size(); ++k) {
    const ChainStage& st = stages[k];
    kc::ChainStep& d = c.steps[k];
    if (!st.node || (!st.node->domain.empty() && st.node->domain != "ai.onnx")) return nullptr;
    d.rounding = round_to(st.rounding);
    others.push_back(st.other);
    if (st.quantize != DType::kFloat32) {
      if (k + 1 != stages.size() || (st.quantize != DType::kInt8 && st.quantize != DType::kUInt8)) return nullptr;
      d.kind = st.quantize == DType::kInt8 ? kc::ChainStep::kQuantizeInt8 : kc::ChainStep::kQuantizeUInt8;
      d.p0 = st.scale;
      d.zero_point = st.zero_point;
    } else if (st.arity == 1) {
      const std::optional<UnarySpec> u = unary_of(*st.node);
      if (!u || u->op == kc::Unary::kNot || u->op == kc::Unary::kClip) return nullptr;
      d.kind = kc::ChainStep::kUnary;
      d.unary = u->op;
      d.p0 = u->p0;
      d.p1 = u->p1;
    } else if (st.arity == 2) {
      const std::optional<kc::Binary> b = binary_kind(st.node->op_type);
      const std::string& t = st.node->op_type;
      if (!b || (t != "Add" && t != "Sub" && t != "Mul" && t != "Div" && t != "Pow") || st.other < 0) return nullptr;
      d.kind = kc::ChainStep::kBinary;
      d.binary = *b;
      d.chain_operand = std::uint8_t(st.chain_operand);
      d.other_scalar = st.other_scalar;
      d.period = st.period;
      d.repeat = st.repeat;
    } else {
      return nullptr;
    }
  }
  return std::make_shared<CudaChain>(c, std::move(others), std::move(memory));
}

// ---- the backend ------------------------------------------------------------------------------------

// A compiled node run under the backend's lock (CudaMemory::lock): sessions on several threads
// share the stream and the cuBLAS handle.
class Serialized final : public StepKernel {
 public:
  Serialized(std::unique_ptr<StepKernel> kernel, std::shared_ptr<CudaMemory> memory)
      : kernel_(std::move(kernel)), memory_(std::move(memory)) {}
  void run(std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs) override {
    const auto held = memory_->lock();
    kernel_->run(inputs, outputs);
  }

 private:
  std::unique_ptr<StepKernel> kernel_;
  std::shared_ptr<CudaMemory> memory_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : memory_(std::make_shared<CudaMemory>(device)) {
    check_blas(cublasCreate(&blas_), "cublasCreate");
    check_blas(cublasSetStream(blas_, static_cast<cudaStream_t>(memory_->stream())), "cublasSetStream");
    // True FP32 (no TF32, no reduced-precision shortcuts): the numerics contract.
    check_blas(cublasSetMathMode(blas_, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
    // fp16/bf16 variants: operands exact in that format on tensor cores, FP32 accumulation
    // (CUBLAS_COMPUTE_32F) and FP32 results: the deployment's arithmetic (docs/cuda.md).
    check_blas(cublasCreate(&blas16_), "cublasCreate");
    check_blas(cublasSetStream(blas16_, static_cast<cudaStream_t>(memory_->stream())), "cublasSetStream");
    check_blas(cublasSetMathMode(blas16_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    name_ = memory_->name();
  }
  ~CudaBackend() override {
    if (blas_) cublasDestroy(blas_);
    if (blas16_) cublasDestroy(blas16_);
  }

  std::string_view name() const override { return name_; }
  void run(const Op& op, std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs) override {
    op.run(inputs, outputs);
  }
  std::shared_ptr<DeviceMemory> memory() const override { return memory_; }

  std::unique_ptr<StepKernel> compile(const Node& node, const Op& op, std::span<const ValueMeta* const> inputs,
                                      std::span<const Rounding> exact, std::span<const ValueMeta> outputs,
                                      std::string& why) override {
    why.clear();
    const auto held = memory_->lock();
    if (!workspace_) workspace_ = std::make_shared<Workspace>();
    Site s{node, op, inputs, exact, outputs, why, *memory_, blas_, blas16_, workspace_};
    const bool fused_int8 = node.domain == quant::kFusedDomain;
    if (!node.domain.empty() && node.domain != "ai.onnx" && !fused_int8)
      return s.decline("no CUDA kernel for domain " + node.domain);
    if (outputs.empty()) return s.decline("no outputs");
    try {
      auto k = fused_int8 ? dispatch_int8(s) : dispatch(s);
      if (!k && why.empty()) why = "no CUDA kernel for " + node.op_type;
      if (!k) return k;
      return std::make_unique<Serialized>(std::move(k), memory_);
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const InputError&) {
      throw;
    } catch (const std::exception& e) {
      return s.decline(std::string("compile failed: ") + e.what());
    }
  }

  std::shared_ptr<FusedKernel> attention(const kernels::AttentionShape& shape) override {
    const auto held = memory_->lock();
    if (shape.batch <= 0 || shape.q_len <= 0 || shape.kv_len <= 0 || shape.head_dim <= 0 || shape.v_dim <= 0)
      return nullptr;  // the nodes run one by one
    // 16-bit products where Q, K^T and V are exact in the format the probabilities are rounded to.
    const bool exact16 = shape.inputs_exact != kernels::RoundTo::kNone && shape.inputs_exact == shape.round_probs;
    std::optional<bool> half;
    if (exact16 && !sixteen_bit_off()) half = shape.inputs_exact == kernels::RoundTo::kBf16;
    // Read at every plan (not once): tests compare the forms in one process.
    const char* env = std::getenv("QEVAL_CUDA_ATTENTION");
    const std::string asked = env ? env : "";
    using Form = CudaAttention::Form;
    Form form = Form::kGemms;
    if (half && asked != "gemm" && asked != "fused" && kc::attention16_supported(shape)) form = Form::kTensorCores;
    else if (asked != "gemm" && (!half || asked == "fused") && kc::attention_supported(shape)) form = Form::kFlash;
    if (form == Form::kGemms && (shape.q_len > INT32_MAX || shape.kv_len > INT32_MAX || shape.batch > INT32_MAX))
      return nullptr;  // the nodes run one by one
    if (!attention_scratch_) attention_scratch_ = std::make_shared<AttentionScratch>();
    return std::make_shared<CudaAttention>(shape, memory_, blas_, blas16_, attention_scratch_, form, half);
  }
  std::shared_ptr<FusedKernel> elementwise_chain(std::vector<ChainStage> stages) override {
    return make_chain(stages, memory_);
  }

  void round(Tensor& value, Rounding rounding) override {
    if (rounding == Rounding::kNone) return;
    if (!value.on_device()) return apply_rounding(value, rounding);
    if (value.dtype() != DType::kFloat32) return;
    const auto held = memory_->lock();
    float* p = static_cast<float*>(value.device_data());
    if (rounding == Rounding::kFp16) kc::round_float16(p, value.numel(), memory_->stream());
    else kc::round_bfloat16(p, value.numel(), memory_->stream());
  }

 private:
  static std::unique_ptr<StepKernel> dispatch_int8(const Site& s) {
    if (s.node.op_type == "Conv") return compile_int8_conv(s);
    if (s.node.op_type == "MatMul") return compile_int8_matmul(s);
    return s.decline("no CUDA kernel for the fused int8 " + s.node.op_type);
  }
  std::unique_ptr<StepKernel> dispatch(const Site& s) {
    const std::string& t = s.node.op_type;
    if (t == "QuantizeLinear") return compile_quantize(s);
    if (t == "DequantizeLinear") return compile_dequantize(s);
    if (t == "Gather") return compile_gather(s);
    if (t == "Resize" || t == "Upsample") return compile_resize(s);
    if (selects_elements(s.node)) return compile_index_map(s);
    if (auto b = binary_kind(t)) return compile_binary(s, *b);
    if (t == "Where") return compile_where(s);
    if (t == "Cast" || t == "CastLike") return compile_cast(s);
    if (t == "MatMul") return compile_matmul(s);
    if (t == "Gemm") return compile_gemm(s);
    if (t == "Conv") return compile_conv(s);
    if (t == "Softmax") return compile_softmax(s, false);
    if (t == "LogSoftmax") return compile_softmax(s, true);
    if (t == "LayerNormalization") return compile_layer_norm(s);
    if (t == "InstanceNormalization") return compile_group_norm(s, true);
    if (t == "GroupNormalization") return compile_group_norm(s, false);
    if (t == "BatchNormalization") return compile_batch_norm(s);
    if (t == "Concat") return compile_slabs(s, true);
    if (t == "Split") return compile_slabs(s, false);
    if (t == "MaxPool" || t == "AveragePool" || t == "GlobalAveragePool" || t == "GlobalMaxPool")
      return compile_pool(s);
    static const std::pair<const char*, kc::Reduce> kReduce[] = {
        {"ReduceSum", kc::Reduce::kSum},       {"ReduceMean", kc::Reduce::kMean},
        {"ReduceMax", kc::Reduce::kMax},       {"ReduceMin", kc::Reduce::kMin},
        {"ReduceProd", kc::Reduce::kProd},     {"ReduceL1", kc::Reduce::kL1},
        {"ReduceL2", kc::Reduce::kL2},         {"ReduceSumSquare", kc::Reduce::kSumSquare},
        {"ReduceLogSum", kc::Reduce::kLogSum}, {"ReduceLogSumExp", kc::Reduce::kLogSumExp}};
    for (const auto& [name, k] : kReduce)
      if (t == name) return compile_reduce(s, k);
    return compile_unary(s);
  }

  std::shared_ptr<CudaMemory> memory_;
  std::shared_ptr<AttentionScratch> attention_scratch_;  // shared by the fused attention kernels
  std::shared_ptr<Workspace> workspace_;                 // shared by the other kernels
  cublasHandle_t blas_ = nullptr;
  cublasHandle_t blas16_ = nullptr;
  std::string name_;
};

// Observers' statistics of values in a CUDA device's memory (eval/exec/device_scan.h).
bool scan_cuda_values(const Tensor& t, const Tensor* ref, float clip_amax, const Tensor* channel_clip,
                      kernels::ScanTotals& out) {
  auto* memory = dynamic_cast<CudaMemory*>(t.device().get());
  return memory && memory->scan(t, ref, clip_amax, channel_clip, out);
}

bool channel_amax_cuda(const Tensor& t, Tensor& amax) {
  auto* memory = dynamic_cast<CudaMemory*>(t.device().get());
  return memory && memory->channel_amax(t, amax);
}

std::unique_ptr<ScanQueue> cuda_scan_queue(const std::shared_ptr<DeviceMemory>& device) {
  auto memory = std::dynamic_pointer_cast<CudaMemory>(device);
  return memory ? make_cuda_scan_queue(std::move(memory)) : nullptr;
}

}  // namespace

std::shared_ptr<Backend> make_cuda_backend(int device) {
  check_cuda_device(device);
  register_device_scan(&scan_cuda_values, &cuda_scan_queue, &channel_amax_cuda);
  return std::make_shared<CudaBackend>(device);
}

}  // namespace qeval::eval
