// Cast and CastLike (ONNX element types, float8 saturation).
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
          if constexpr (std::is_same_v<S, float> || std::is_same_v<S, bool> || sizeof(S) <= 2)
            dst[i] = static_cast<float>(src[i]);
          else dst[i] = round_to_odd_float(static_cast<double>(src[i]));
        }
        if (to == DType::kFloat16) round_to_float16(dst, std::size_t(n));
        else if (to == DType::kBFloat16) round_to_bfloat16(dst, std::size_t(n));
        else
          for (std::int64_t i = 0; i < n; ++i) dst[i] = round_to_format(dst[i], to, saturate_);
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

}  // namespace

void register_cast_ops(std::vector<OpSchema>& out) {
  // Cast-1 took 'to' as a string; from 6 it is an int. 'saturate' from 19.
  auto cast = [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<CastOp>(n, false); };
  auto cast_like = [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<CastOp>(n, true); };
  out.push_back({"Cast", "", 6, 18, cast});
  out.push_back({"Cast", "", 19, kMaxOpset, cast});
  out.push_back({"CastLike", "", 15, 18, cast_like});
  out.push_back({"CastLike", "", 19, kMaxOpset, cast_like});
}

}  // namespace qeval::eval
