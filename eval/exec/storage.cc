// Storage forms and rounding: declared ONNX types <-> the float32/integer storage the kernels
// compute on, fp16/bf16 rounding, and the memory limits a plan checks (eval/exec/plan.h).
#include <sys/sysinfo.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <unordered_map>

#include "eval/exec/plan.h"
#include "kernels/error.h"
#include "kernels/numeric.h"

namespace qeval::eval {

Rounding rounding_for(DType storage, DType declared, Precision precision) {
  if (declared == DType::kFloat16) return Rounding::kFp16;
  if (declared == DType::kBFloat16) return Rounding::kBf16;
  if (storage != DType::kFloat32) return Rounding::kNone;
  if (precision == Precision::kFp16 || precision == Precision::kFp16Strict) return Rounding::kFp16;
  if (precision == Precision::kBf16 || precision == Precision::kBf16Strict) return Rounding::kBf16;
  return Rounding::kNone;
}

void apply_rounding(Tensor& t, Rounding r) {
  if (r == Rounding::kNone || t.dtype() != DType::kFloat32) return;
  if (r == Rounding::kFp16) round_to_float16(t.data<float>(), static_cast<std::size_t>(t.numel()));
  else round_to_bfloat16(t.data<float>(), static_cast<std::size_t>(t.numel()));
}

Tensor rounded(Tensor t, Rounding r) {
  apply_rounding(t, r);
  return t;
}

// A tensor in its declared ONNX type -> storage type (narrow floats widen to float32).
Tensor to_storage(const Tensor& t) {
  const DType storage = storage_type(t.dtype());
  if (storage == t.dtype()) return t;
  if (t.dtype() == DType::kFloat16 || t.dtype() == DType::kBFloat16) return widened_to_float32(t);
  Tensor out(storage, t.shape());
  float* dst = out.data<float>();
  const std::uint8_t* b = reinterpret_cast<const std::uint8_t*>(t.raw());
  const std::size_t n = static_cast<std::size_t>(t.numel());
  for (std::size_t i = 0; i < n; ++i) {
    switch (t.dtype()) {
      case DType::kFloat8E4M3FN: dst[i] = to_float(float8_e4m3fn{b[i]}); break;
      case DType::kFloat8E5M2: dst[i] = to_float(float8_e5m2{b[i]}); break;
      case DType::kFloat8E4M3FNUZ: dst[i] = to_float(float8_e4m3fnuz{b[i]}); break;
      case DType::kFloat8E5M2FNUZ: dst[i] = to_float(float8_e5m2fnuz{b[i]}); break;
      default: throw std::logic_error("to_storage: unexpected type");
    }
  }
  return out;
}

// Storage float32 -> declared narrow float type (values are already representable).
Tensor to_declared(const Tensor& t, DType declared) {
  if (declared == t.dtype()) return t;
  Tensor out(declared, t.shape());
  const float* src = t.data<float>();
  std::uint8_t* b = reinterpret_cast<std::uint8_t*>(out.raw());
  const std::size_t n = static_cast<std::size_t>(t.numel());
  for (std::size_t i = 0; i < n; ++i) {
    switch (declared) {
      case DType::kFloat16: {
        std::uint16_t bits = to_float16(src[i]).bits;
        std::memcpy(b + 2 * i, &bits, 2);
        break;
      }
      case DType::kBFloat16: {
        std::uint16_t bits = to_bfloat16(src[i]).bits;
        std::memcpy(b + 2 * i, &bits, 2);
        break;
      }
      // Values are already representable (Cast rounded them); no saturation, so an inf that a
      // non-saturating Cast produced stays inf.
      case DType::kFloat8E4M3FN: b[i] = to_float8_e4m3fn(src[i], false).bits; break;
      case DType::kFloat8E5M2: b[i] = to_float8_e5m2(src[i], false).bits; break;
      case DType::kFloat8E4M3FNUZ: b[i] = to_float8_e4m3fnuz(src[i], false).bits; break;
      case DType::kFloat8E5M2FNUZ: b[i] = to_float8_e5m2fnuz(src[i], false).bits; break;
      default: throw std::logic_error("to_declared: unexpected type");
    }
  }
  return out;
}

// The most one tensor may take: the machine's memory and swap. A larger one cannot be allocated
// (or would be killed by the OOM killer half-way), so the plan rejects it up front, naming the node,
// instead of a std::bad_alloc from somewhere in the run (exit 3, no node named).
std::uint64_t max_tensor_bytes() {
  struct sysinfo info {};
  if (::sysinfo(&info) != 0) return std::numeric_limits<std::uint64_t>::max();
  return (std::uint64_t(info.totalram) + std::uint64_t(info.totalswap)) * info.mem_unit;
}

// "output 'y' [2, 3] float32 (24 bytes)", for errors about a node's outputs.
std::string describe_output(const std::string& name, const ValueMeta& m) {
  std::string s = "output '" + name + "' " + shape_to_string(m.shape) + " " + std::string(dtype_name(m.dtype));
  const auto n = try_shape_numel(m.shape);
  const auto bytes = n ? try_nbytes(m.dtype, *n) : std::nullopt;
  return s + (bytes ? " (" + std::to_string(*bytes) + " bytes)" : " (more elements than fit in 64 bits)");
}

[[noreturn]] void fail_over_memory(const std::string& source, const Node& node, const std::string& output,
                                   const ValueMeta& m, std::uint64_t max_bytes) {
  throw InputError(source + ": " + node.describe() + ": " + describe_output(output, m) +
                   " is more than this machine's memory (" + std::to_string(max_bytes) + " bytes)");
}

// A bad_alloc while running or folding a node: the graph asks for more memory than this machine
// has, which is the model's (or its input shapes') doing, so it is an InputError naming the node
// and what its outputs ask for (`outputs`: name and meta of each).
[[noreturn]] void fail_out_of_memory(const std::string& source, const Node& node,
                                     const std::vector<std::pair<std::string, const ValueMeta*>>& outputs) {
  std::string list;
  for (const auto& [name, meta] : outputs) list += (list.empty() ? "" : ", ") + describe_output(name, *meta);
  throw InputError(source + ": " + node.describe() + ": out of memory" +
                   (list.empty() ? std::string() : " (its " + list + ")"));
}

}  // namespace qeval::eval
