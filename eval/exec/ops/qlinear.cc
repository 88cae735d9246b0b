// Integer ops on the int8 kernels: ONNX Runtime's quantizer outputs (DynamicQuantizeLinear,
// MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv, com.microsoft QGemm) and qeval's fused
// Q/DQ Conv/MatMul/Gemm (domain "qeval.int8", made by eval/exec/qdq_fusion): int8 x int8 -> int32
// exactly, then rescale.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>

#include "eval/exec/ops/families.h"
#include "eval/exec/ops/geometry.h"
#include "eval/exec/ops/quant_common.h"
#include "eval/exec/qdq_fusion.h"
#include "kernels/int8_conv.h"
#include "kernels/int8_gemm.h"
#include "kernels/numeric.h"
#include "kernels/scratch.h"

namespace qeval::eval {

namespace {

bool is_8bit(DType t) { return t == DType::kInt8 || t == DType::kUInt8; }

void require_8bit(const Node& node, const ValueMeta& m, std::size_t i, const char* role) {
  if (!is_8bit(m.declared))
    fail(node, std::string(role) + " '" + node.inputs[i] + "' has type " + type_name(m.declared) +
                   "; int8 or uint8 expected");
}

// An 8-bit tensor as int8: uint8 values v become v - 128 (bitwise v ^ 0x80), and the caller
// lowers the matching zero points by 128, so (v - zp) is unchanged.
const std::int8_t* as_int8(const Tensor& t, std::vector<std::int8_t>& buffer) {
  if (t.dtype() == DType::kInt8) return t.data<std::int8_t>();
  const std::uint8_t* src = t.data<std::uint8_t>();
  buffer.resize(std::size_t(t.numel()));
  for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = std::int8_t(src[i] ^ 0x80);
  return buffer.data();
}
std::int32_t int8_offset(DType t) { return t == DType::kUInt8 ? 128 : 0; }

// Zero points of an 8-bit operand (nullptr: 0), as the int8 form of the operand needs them.
std::vector<std::int32_t> zero_points(const Node& node, const Tensor* zp, std::size_t index, DType operand) {
  const std::int32_t off = int8_offset(operand);
  if (!zp) return {-off};
  if (zp->dtype() != operand)
    fail(node, "zero point '" + node.inputs[index] + "' has type " + type_name(zp->dtype()) + ", its operand " +
                   type_name(operand));
  std::vector<std::int32_t> v = zero_point_values(node, index, *zp, zp->dtype());
  for (auto& z : v) z -= off;
  return v;
}

// A zero point or scale of one element or `n` (per row / column / channel); InputError otherwise.
void check_count(const Node& node, const ValueMeta* m, std::size_t index, std::int64_t n, const char* what) {
  if (!m) return;
  const std::int64_t c = shape_numel(m->shape);
  if (m->shape.size() > 1 || (c != 1 && c != n))
    fail(node, std::string(what) + " '" + node.inputs[index] + "' has shape " + shape_to_string(m->shape) +
                   "; expected one value or [" + std::to_string(n) + "]");
}

// The scales and zero points of a two-operand integer op at inputs 1, 2 (A: one value) and 4, 5
// (B: one value or `b_count`): types, counts, and constant scales' values.
void check_operand_params(const Node& node, std::span<const ValueMeta* const> in, std::int64_t b_count,
                          const char* a_name, const char* b_name, bool allow_zero) {
  check_scale_meta(node, *in[1], 1);
  check_scale_meta(node, *in[4], 4);
  check_count(node, in[1], 1, 1, (std::string(a_name) + " scale").c_str());
  check_count(node, in[2], 2, 1, (std::string(a_name) + " zero point").c_str());
  check_count(node, in[4], 4, b_count, (std::string(b_name) + " scale").c_str());
  check_count(node, in[5], 5, b_count, (std::string(b_name) + " zero point").c_str());
  if (in[1]->value) check_scale_values(node, 1, *in[1]->value, allow_zero);
  if (in[4]->value) check_scale_values(node, 4, *in[4]->value, allow_zero);
}

float scalar_float(const Tensor& t) { return t.data<float>()[0]; }

// ---- integer engines: exact int32 sums of (a - za)(b - zb) ---------------------------------------

// B operands packed once when they are plan-time constants (weights). `note_constant` (from infer)
// records which tensor is constant; a runtime tensor is never cached (its buffer is reused).
class PackedBCache {
 public:
  void note_constant(const ValueMeta* m) { constant_ = m && m->value ? m->value.get() : nullptr; }
  bool cacheable(const Tensor& b) const { return &b == constant_; }
  // `data` gives b's int8 values; called only when b is (re)packed.
  template <class Data>
  const kernels::PackedInt8B& get(const Tensor& b, std::int64_t k, std::int64_t n, Data&& data, std::int64_t ldb,
                                  bool trans) {
    if (source_ != &b || !packed_) {
      packed_ = std::make_unique<kernels::PackedInt8B>(k, n, data(), ldb, trans);
      source_ = &b;
    }
    return *packed_;
  }

 private:
  const Tensor* source_ = nullptr;
  const Tensor* constant_ = nullptr;
  std::unique_ptr<kernels::PackedInt8B> packed_;
};

// sum (a - za[i])(b - zb[j]) from y = sum a b: - zb[j] rowsum_a[i] - za[i] colsum_b[j] + k za[i] zb[j].
void correct_zero_points(const kernels::PackedInt8A& a, const kernels::PackedInt8B& b,
                         const std::vector<std::int32_t>& za, const std::vector<std::int32_t>& zb, std::int32_t* y) {
  const bool any_za = std::any_of(za.begin(), za.end(), [](std::int32_t z) { return z != 0; });
  const bool any_zb = std::any_of(zb.begin(), zb.end(), [](std::int32_t z) { return z != 0; });
  if (!any_za && !any_zb) return;
  const std::int64_t m = a.m(), n = b.n(), k = a.k();
  const std::int32_t* rows = a.row_sums();
  const std::int32_t* cols = b.col_sums();
  for (std::int64_t i = 0; i < m; ++i) {
    const std::int32_t zai = za.size() == 1 ? za[0] : za[std::size_t(i)];
    std::int32_t* yr = y + i * n;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int32_t zbj = zb.size() == 1 ? zb[0] : zb[std::size_t(j)];
      yr[j] += -zbj * rows[i] - zai * cols[j] + std::int32_t(k) * zai * zbj;
    }
  }
}

// B without batch dimensions (a weight) and a per-tensor A zero point: A's batch folds into the
// rows of one product.
bool folds_into_one_product(const MatMulPlan& p, const std::vector<std::int32_t>& za) {
  const std::size_t ra = p.a.size() - 2, rb = p.b.size() - 2;
  return shape_numel(Shape(p.b.begin(), p.b.begin() + long(rb))) == 1 && za.size() == 1 &&
         shape_numel(p.batch) == shape_numel(Shape(p.a.begin(), p.a.begin() + long(ra)));
}

// y[batch..., m, n] = sum_k (a - za)(b - zb), numpy matmul broadcasting; za has 1 or m values,
// zb 1 or n (already in int8 form). `cache` packs B once when B has no batch dimensions.
void integer_matmul(const Node& node, const Tensor& a, const std::vector<std::int32_t>& za, const Tensor& b,
                    const std::vector<std::int32_t>& zb, std::int32_t* y, PackedBCache* cache,
                    kernels::PackedInt8A* a_scratch = nullptr) {
  const MatMulPlan p = plan_matmul(node, a.shape(), b.shape());
  std::vector<std::int8_t> abuf, bbuf;
  const std::int8_t* pa = as_int8(a, abuf);
  const std::int8_t* pb = nullptr;  // converted only when (re)packed
  auto b_data = [&] { return pb ? pb : (pb = as_int8(b, bbuf)); };
  const std::size_t rb = p.b.size() - 2;
  const bool b_shared = shape_numel(Shape(p.b.begin(), p.b.begin() + long(rb))) == 1;
  auto packed_b_for = [&](std::int64_t index, std::unique_ptr<kernels::PackedInt8B>& own) {
    if (b_shared && cache && cache->cacheable(b)) return &cache->get(b, p.k, p.n, b_data, p.n, false);
    own = std::make_unique<kernels::PackedInt8B>(p.k, p.n, b_data() + index * p.k * p.n, p.n);
    return static_cast<const kernels::PackedInt8B*>(own.get());
  };
  std::unique_ptr<kernels::PackedInt8B> own_b;
  if (folds_into_one_product(p, za)) {
    const std::int64_t rows = shape_numel(p.batch) * p.m;
    std::optional<kernels::PackedInt8A> own_a;
    if (a_scratch) a_scratch->pack(rows, p.k, pa, p.k);
    else own_a.emplace(rows, p.k, pa, p.k);
    const kernels::PackedInt8A& packed_a = a_scratch ? *a_scratch : *own_a;
    const kernels::PackedInt8B* packed_b = packed_b_for(0, own_b);
    kernels::int8_gemm(packed_a, *packed_b, y, p.n);
    correct_zero_points(packed_a, *packed_b, za, zb, y);
    return;
  }
  const auto operands = matmul_batch_operands(p);
  for (std::size_t e = 0; e < operands.size(); ++e) {
    const kernels::PackedInt8A packed_a(p.m, p.k, pa + operands[e].first * p.m * p.k, p.k);
    const kernels::PackedInt8B* packed_b = packed_b_for(operands[e].second, own_b);
    std::int32_t* ye = y + std::int64_t(e) * p.m * p.n;
    kernels::int8_gemm(packed_a, *packed_b, ye, p.n);
    correct_zero_points(packed_a, *packed_b, za, zb, ye);
  }
}

// y[rows, n] (float) = scale[j] * sum (a - za)(b) for the common fused case, a weight B without
// batch dimensions, per-tensor za and zb = 0: the GEMM dequantizes each tile while it is in L1
// (kernels::Int8Epilogue), the same floats as integer_matmul and a pass of float(sum) * scale[j].
// Returns false (nothing written) for any other case.
bool integer_matmul(const Node& node, const Tensor& a, const std::vector<std::int32_t>& za, const Tensor& b,
                    const std::vector<std::int32_t>& zb, float* y, const std::vector<float>& scale, PackedBCache* cache,
                    kernels::PackedInt8A* a_scratch) {
  const MatMulPlan p = plan_matmul(node, a.shape(), b.shape());
  if (!folds_into_one_product(p, za) || !cache || !cache->cacheable(b) || !a_scratch ||
      std::any_of(zb.begin(), zb.end(), [](std::int32_t z) { return z != 0; }))
    return false;
  std::vector<std::int8_t> abuf, bbuf;
  const std::int64_t rows = shape_numel(p.batch) * p.m;
  a_scratch->pack(rows, p.k, as_int8(a, abuf), p.k);
  const kernels::PackedInt8B& packed_b = cache->get(
      b, p.k, p.n, [&] { return as_int8(b, bbuf); }, p.n, false);
  std::vector<std::int32_t> col_add;
  if (za[0] != 0) {
    col_add.resize(std::size_t(p.n));
    for (std::int64_t j = 0; j < p.n; ++j) col_add[std::size_t(j)] = -za[0] * packed_b.col_sums()[j];
  }
  kernels::Int8Epilogue e;
  e.col_add = col_add.empty() ? nullptr : col_add.data();
  e.col_scale = scale.data();
  kernels::int8_gemm(*a_scratch, packed_b, y, p.n, e);
  return true;
}

// Conv weights packed once when they are a plan-time constant (see PackedBCache).
class PackedConvCache {
 public:
  void note_constant(const ValueMeta* m) { constant_ = m && m->value ? m->value.get() : nullptr; }
  // The packed weights of w (converted to int8 only when they are packed, not on every run).
  const kernels::PackedInt8ConvWeights& get(const Tensor& w, const kernels::ConvParams& p) {
    if (&w != constant_ || source_ != &w || !packed_ || p.in_channels != in_ || p.groups != groups_) {
      std::vector<std::int8_t> buffer;
      packed_ = std::make_unique<kernels::PackedInt8ConvWeights>(p, as_int8(w, buffer));
      source_ = &w;
      in_ = p.in_channels;
      groups_ = p.groups;
    }
    return *packed_;
  }

 private:
  const Tensor* source_ = nullptr;
  const Tensor* constant_ = nullptr;
  std::int64_t in_ = 0, groups_ = 0;
  std::unique_ptr<kernels::PackedInt8ConvWeights> packed_;
};

// y[b, oc, ...] = sum over the window of (x - zx)(w - zw[oc]), padding reading zx (real 0).
void integer_conv(const kernels::ConvParams& p, const Tensor& x, std::int32_t zx, const Tensor& w,
                  const std::vector<std::int32_t>& zw, std::int32_t* y, PackedConvCache& cache) {
  std::vector<std::int8_t> xbuf;
  const std::int8_t* px = as_int8(x, xbuf);
  const kernels::PackedInt8ConvWeights& packed = cache.get(w, p);
  std::int64_t out_size = 1, kprod = 1;
  for (auto o : p.out_spatial) out_size *= o;
  for (auto k : p.kernel) kprod *= k;
  const std::int64_t k = p.in_channels / p.groups * kprod;
  const bool any_zw = std::any_of(zw.begin(), zw.end(), [](std::int32_t z) { return z != 0; });
  std::vector<std::int32_t> window_sums(any_zw ? std::size_t(p.batch * p.groups * out_size) : 0);
  kernels::int8_conv(p, px, std::int8_t(zx), packed, y, any_zw ? window_sums.data() : nullptr,
                     kernels::int8_gemm_best_path());  // the im2col matrix: this thread's lent one
  if (zx == 0 && !any_zw) return;
  const std::int64_t og = p.out_channels / p.groups;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t oc = 0; oc < p.out_channels; ++oc) {
      const std::int32_t z = zw.size() == 1 ? zw[0] : zw[std::size_t(oc)];
      const std::int32_t constant = -zx * packed.channel_sum(oc) + std::int32_t(k) * zx * z;
      std::int32_t* yo = y + (b * p.out_channels + oc) * out_size;
      const std::int32_t* ws = any_zw ? window_sums.data() + (b * p.groups + oc / og) * out_size : nullptr;
      for (std::int64_t j = 0; j < out_size; ++j) yo[j] += constant - (ws ? z * ws[j] : 0);
    }
}

// The int32 accumulator plus the int32 bias wraps, as int32 hardware adds (a signed overflow in
// C++ is undefined behaviour: fuzz_onnx_loader, a QLinearConv bias near INT32_MIN).
inline std::int32_t wrapping_add(std::int32_t a, std::int32_t b) {
  return std::int32_t(std::uint32_t(a) + std::uint32_t(b));
}

// Requantization as ONNX Runtime does it: float multiplier, round half to even, add the zero
// point, saturate.
template <class T>
T requantize(std::int32_t acc, float multiplier, std::int32_t zp) {
  const float v = std::nearbyint(float(acc) * multiplier) + float(zp);
  return T(std::clamp(v, float(std::numeric_limits<T>::lowest()), float(std::numeric_limits<T>::max())));
}

// ---- MatMulInteger / QLinearMatMul -------------------------------------------------------------

class MatMulIntegerOp final : public Op {
 public:
  explicit MatMulIntegerOp(const Node& node) : node_(node) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 2 || !in[0] || !in[1]) fail(node_, "needs inputs A and B");
    require_8bit(node_, *in[0], 0, "A");
    require_8bit(node_, *in[1], 1, "B");
    const MatMulPlan p = plan_matmul(node_, in[0]->shape, in[1]->shape);
    check_count(node_, in.size() > 2 ? in[2] : nullptr, 2, p.m, "a_zero_point");
    check_count(node_, in.size() > 3 ? in[3] : nullptr, 3, p.n, "b_zero_point");
    cache_.note_constant(in[1]);
    return {meta_of(DType::kInt32, p.out)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const auto za = zero_points(node_, in.size() > 2 ? in[2] : nullptr, 2, in[0]->dtype());
    const auto zb = zero_points(node_, in.size() > 3 ? in[3] : nullptr, 3, in[1]->dtype());
    integer_matmul(node_, *in[0], za, *in[1], zb, out[0]->data<std::int32_t>(), &cache_);
  }

 private:
  Node node_;
  mutable PackedBCache cache_;
};

class QLinearMatMulOp final : public Op {
 public:
  explicit QLinearMatMulOp(const Node& node) : node_(node) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    for (std::size_t i : {0, 1, 3, 4, 6, 7})
      if (in.size() <= i || !in[i])
        fail(node_, "needs 8 inputs (a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point)");
    require_8bit(node_, *in[0], 0, "a");
    require_8bit(node_, *in[3], 3, "b");
    const MatMulPlan p = plan_matmul(node_, in[0]->shape, in[3]->shape);
    for (std::size_t i : {1, 4, 6}) check_scale_meta(node_, *in[i], i);
    check_count(node_, in[1], 1, 1, "a_scale");
    check_count(node_, in[2], 2, 1, "a_zero_point");
    check_count(node_, in[4], 4, p.n, "b_scale");
    check_count(node_, in[5], 5, p.n, "b_zero_point");
    check_count(node_, in[6], 6, 1, "y_scale");
    check_count(node_, in[7], 7, 1, "y_zero_point");
    require_8bit(node_, *in[7], 7, "y_zero_point");
    for (std::size_t i : {1, 4, 6})
      if (in[i]->value) check_scale_values(node_, i, *in[i]->value, false);
    cache_.note_constant(in[3]);
    return {meta_of(in[7]->declared, p.out)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    for (std::size_t i : {1, 4, 6}) check_scale_values(node_, i, *in[i], false);
    const auto za = zero_points(node_, in[2], 2, in[0]->dtype());
    const auto zb = zero_points(node_, in[5], 5, in[3]->dtype());
    const MatMulPlan p = plan_matmul(node_, in[0]->shape(), in[3]->shape());
    std::vector<std::int32_t> acc(std::size_t(shape_numel(p.out)));
    integer_matmul(node_, *in[0], za, *in[3], zb, acc.data(), &cache_);
    const std::int32_t zy = zero_point_values(node_, 7, *in[7], in[7]->dtype())[0];
    const float sa = scalar_float(*in[1]), sy = scalar_float(*in[6]);
    const Tensor& sb = *in[4];
    std::vector<float> mult(std::size_t(sb.numel()));
    for (std::size_t j = 0; j < mult.size(); ++j) mult[j] = sa * sb.data<float>()[j] / sy;
    visit_storage(out[0]->dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, std::int8_t> || std::is_same_v<T, std::uint8_t>) {
        T* y = out[0]->data<T>();
        for (std::size_t i = 0; i < acc.size(); ++i)
          y[i] = requantize<T>(acc[i], mult.size() == 1 ? mult[0] : mult[i % std::size_t(p.n)], zy);
      }
    });
  }

 private:
  Node node_;
  mutable PackedBCache cache_;
};

// ---- ConvInteger / QLinearConv -----------------------------------------------------------------

class ConvIntegerOp final : public Op {
 public:
  explicit ConvIntegerOp(const Node& node) : node_(node), attrs_(read_conv_attributes(node)) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 2 || !in[0] || !in[1]) fail(node_, "needs inputs x and w");
    require_8bit(node_, *in[0], 0, "x");
    require_8bit(node_, *in[1], 1, "w");
    const kernels::ConvParams p = conv_forward_params(node_, attrs_, in[0]->shape, in[1]->shape);
    check_count(node_, in.size() > 2 ? in[2] : nullptr, 2, 1, "x_zero_point");
    check_count(node_, in.size() > 3 ? in[3] : nullptr, 3, p.out_channels, "w_zero_point");
    cache_.note_constant(in[1]);
    Shape y{p.batch, p.out_channels};
    y.insert(y.end(), p.out_spatial.begin(), p.out_spatial.end());
    return {meta_of(DType::kInt32, y)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const kernels::ConvParams p = conv_forward_params(node_, attrs_, in[0]->shape(), in[1]->shape());
    const auto zx = zero_points(node_, in.size() > 2 ? in[2] : nullptr, 2, in[0]->dtype());
    const auto zw = zero_points(node_, in.size() > 3 ? in[3] : nullptr, 3, in[1]->dtype());
    integer_conv(p, *in[0], zx[0], *in[1], zw, out[0]->data<std::int32_t>(), cache_);
  }

 private:
  Node node_;
  ConvAttributes attrs_;
  mutable PackedConvCache cache_;
};

class QLinearConvOp final : public Op {
 public:
  explicit QLinearConvOp(const Node& node) : node_(node), attrs_(read_conv_attributes(node)) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    for (std::size_t i = 0; i < 8; ++i)
      if (in.size() <= i || !in[i])
        fail(node_,
             "needs inputs x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point (B optional)");
    require_8bit(node_, *in[0], 0, "x");
    require_8bit(node_, *in[3], 3, "w");
    const kernels::ConvParams p = conv_forward_params(node_, attrs_, in[0]->shape, in[3]->shape);
    for (std::size_t i : {1, 4, 6}) check_scale_meta(node_, *in[i], i);
    check_count(node_, in[1], 1, 1, "x_scale");
    check_count(node_, in[2], 2, 1, "x_zero_point");
    check_count(node_, in[4], 4, p.out_channels, "w_scale");
    check_count(node_, in[5], 5, p.out_channels, "w_zero_point");
    check_count(node_, in[6], 6, 1, "y_scale");
    check_count(node_, in[7], 7, 1, "y_zero_point");
    require_8bit(node_, *in[7], 7, "y_zero_point");
    if (in.size() > 8 && in[8]) {
      if (in[8]->declared != DType::kInt32 || in[8]->shape != Shape{p.out_channels})
        fail(node_, "B '" + node_.inputs[8] + "' must be int32 [" + std::to_string(p.out_channels) + "], got " +
                        type_name(in[8]->declared) + " " + shape_to_string(in[8]->shape));
    }
    for (std::size_t i : {1, 4, 6})
      if (in[i]->value) check_scale_values(node_, i, *in[i]->value, false);
    cache_.note_constant(in[3]);
    Shape y{p.batch, p.out_channels};
    y.insert(y.end(), p.out_spatial.begin(), p.out_spatial.end());
    return {meta_of(in[7]->declared, y)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    for (std::size_t i : {1, 4, 6}) check_scale_values(node_, i, *in[i], false);
    const kernels::ConvParams p = conv_forward_params(node_, attrs_, in[0]->shape(), in[3]->shape());
    const auto zx = zero_points(node_, in[2], 2, in[0]->dtype());
    const auto zw = zero_points(node_, in[5], 5, in[3]->dtype());
    std::vector<std::int32_t> acc(std::size_t(out[0]->numel()));
    integer_conv(p, *in[0], zx[0], *in[3], zw, acc.data(), cache_);
    const std::int32_t zy = zero_point_values(node_, 7, *in[7], in[7]->dtype())[0];
    const float sx = scalar_float(*in[1]), sy = scalar_float(*in[6]);
    const float* sw = in[4]->data<float>();
    const std::int32_t* bias = in.size() > 8 && in[8] ? in[8]->data<std::int32_t>() : nullptr;
    const std::int64_t per_channel = out[0]->numel() / std::max<std::int64_t>(1, p.batch * p.out_channels);
    visit_storage(out[0]->dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, std::int8_t> || std::is_same_v<T, std::uint8_t>) {
        T* y = out[0]->data<T>();
        for (std::int64_t bc = 0; bc < p.batch * p.out_channels; ++bc) {
          const std::int64_t oc = bc % p.out_channels;
          const float m = sx * sw[in[4]->numel() == 1 ? 0 : oc] / sy;
          const std::int32_t b = bias ? bias[oc] : 0;
          for (std::int64_t j = 0; j < per_channel; ++j)
            y[bc * per_channel + j] = requantize<T>(wrapping_add(acc[std::size_t(bc * per_channel + j)], b), m, zy);
        }
      }
    });
  }

 private:
  Node node_;
  ConvAttributes attrs_;
  mutable PackedConvCache cache_;
};

// ---- QGemm (com.microsoft) ---------------------------------------------------------------------

// ONNX Runtime's QGemm: inputs A, a_scale, a_zero_point, B, b_scale, b_zero_point, C (int32 bias,
// optional), y_scale, y_zero_point (both optional); attributes transA, transB, alpha.
// acc = C + sum (a - za)(b - zb[j]) exactly in int32; with y_zero_point the output is 8-bit,
// saturate(round_half_even(acc * (alpha * a_scale * b_scale[j] / y_scale)) + y_zero_point), else
// float acc * (alpha * a_scale * b_scale[j]) (divided by y_scale when given), as ORT's kernel.
class QGemmOp final : public Op {
 public:
  explicit QGemmOp(const Node& node)
      : node_(node),
        trans_a_(node.get_int("transA", 0) != 0),
        trans_b_(node.get_int("transB", 0) != 0),
        alpha_(node.get_float("alpha", 1.0f)) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    for (std::size_t i : {0, 1, 2, 3, 4, 5})
      if (in.size() <= i || !in[i])
        fail(node_,
             "needs inputs A, a_scale, a_zero_point, B, b_scale, b_zero_point (C, y_scale, y_zero_point optional)");
    require_8bit(node_, *in[0], 0, "A");
    require_8bit(node_, *in[3], 3, "B");
    const Shape& a = in[0]->shape;
    const Shape& b = in[3]->shape;
    if (a.size() != 2 || b.size() != 2)
      fail(node_, "A and B must be 2-D, got " + shape_to_string(a) + " and " + shape_to_string(b));
    const std::int64_t m = trans_a_ ? a[1] : a[0], k = trans_a_ ? a[0] : a[1];
    const std::int64_t kb = trans_b_ ? b[1] : b[0], n = trans_b_ ? b[0] : b[1];
    if (k != kb) fail(node_, "inner dimensions differ: A " + shape_to_string(a) + ", B " + shape_to_string(b));
    check_operand_params(node_, in, n, "a", "b", false);
    if (in.size() > 6 && in[6]) {
      const Shape& c = in[6]->shape;
      bool ok = in[6]->declared == DType::kInt32 && c.size() <= 2;
      for (std::size_t d = 0; ok && d < c.size(); ++d) ok = c[d] == 1 || c[d] == (d + 2 - c.size() == 0 ? m : n);
      if (!ok)
        fail(node_, "C '" + node_.inputs[6] + "' must be int32 broadcasting to [" + std::to_string(m) + ", " +
                        std::to_string(n) + "], got " + type_name(in[6]->declared) + " " + shape_to_string(c));
    }
    const bool has_ys = in.size() > 7 && in[7], has_yz = in.size() > 8 && in[8];
    if (has_ys) {
      check_scale_meta(node_, *in[7], 7);
      check_count(node_, in[7], 7, 1, "y_scale");
      if (in[7]->value) check_scale_values(node_, 7, *in[7]->value, false);
    }
    if (has_yz) {
      if (!has_ys) fail(node_, "y_zero_point '" + node_.inputs[8] + "' is given without y_scale");
      check_count(node_, in[8], 8, 1, "y_zero_point");
      require_8bit(node_, *in[8], 8, "y_zero_point");
    }
    cache_.note_constant(in[3]);
    return {meta_of(has_yz ? in[8]->declared : DType::kFloat32, {m, n})};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    for (std::size_t i : {1, 4}) check_scale_values(node_, i, *in[i], false);
    const Tensor& a = *in[0];
    const Tensor& b = *in[3];
    const std::int64_t m = trans_a_ ? a.shape()[1] : a.shape()[0], k = trans_a_ ? a.shape()[0] : a.shape()[1];
    const std::int64_t n = trans_b_ ? b.shape()[0] : b.shape()[1];
    std::vector<std::int8_t> abuf, bbuf;
    const std::int8_t* pa = as_int8(a, abuf);
    std::vector<std::int8_t> a_rows;
    if (trans_a_) {  // A given as k x m
      a_rows.resize(std::size_t(m * k));
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t p = 0; p < k; ++p) a_rows[std::size_t(i * k + p)] = pa[p * m + i];
      pa = a_rows.data();
    }
    const kernels::PackedInt8A packed_a(m, k, pa, k);
    auto b_data = [&] { return as_int8(b, bbuf); };
    std::unique_ptr<kernels::PackedInt8B> own;
    const kernels::PackedInt8B* packed_b;
    if (cache_.cacheable(b)) {
      packed_b = &cache_.get(b, k, n, b_data, trans_b_ ? k : n, trans_b_);
    } else {
      own = std::make_unique<kernels::PackedInt8B>(k, n, b_data(), trans_b_ ? k : n, trans_b_);
      packed_b = own.get();
    }
    std::vector<std::int32_t> acc(std::size_t(m * n));
    kernels::int8_gemm(packed_a, *packed_b, acc.data(), n);
    correct_zero_points(packed_a, *packed_b, zero_points(node_, in[2], 2, a.dtype()),
                        zero_points(node_, in[5], 5, b.dtype()), acc.data());
    if (const Tensor* c = in.size() > 6 ? in[6] : nullptr) {
      const Shape& cs = c->shape();
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          std::int64_t ci = 0;
          if (cs.size() == 2) ci = (cs[0] == 1 ? 0 : i) * cs[1] + (cs[1] == 1 ? 0 : j);
          else if (cs.size() == 1) ci = cs[0] == 1 ? 0 : j;
          acc[std::size_t(i * n + j)] = wrapping_add(acc[std::size_t(i * n + j)], c->data<std::int32_t>()[ci]);
        }
    }
    const Tensor* ys = in.size() > 7 ? in[7] : nullptr;
    if (ys) check_scale_values(node_, 7, *ys, false);
    const float sa = scalar_float(*in[1]);
    const Tensor& sb = *in[4];
    std::vector<float> scale(std::size_t(sb.numel()));
    for (std::size_t j = 0; j < scale.size(); ++j) {
      scale[j] = alpha_ * sa * sb.data<float>()[j];
      if (ys) scale[j] /= scalar_float(*ys);
    }
    auto scale_of = [&](std::int64_t j) { return scale[scale.size() == 1 ? 0 : std::size_t(j)]; };
    if (out[0]->dtype() == DType::kFloat32) {
      float* y = out[0]->data<float>();
      for (std::int64_t i = 0; i < m * n; ++i) y[i] = float(acc[std::size_t(i)]) * scale_of(i % n);
      return;
    }
    const std::int32_t zy = zero_point_values(node_, 8, *in[8], in[8]->dtype())[0];
    visit_storage(out[0]->dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, std::int8_t> || std::is_same_v<T, std::uint8_t>) {
        T* y = out[0]->data<T>();
        for (std::int64_t i = 0; i < m * n; ++i) y[i] = requantize<T>(acc[std::size_t(i)], scale_of(i % n), zy);
      }
    });
  }

 private:
  Node node_;
  bool trans_a_, trans_b_;
  float alpha_;
  mutable PackedBCache cache_;
};

// ---- DynamicQuantizeLinear ---------------------------------------------------------------------

// uint8, asymmetric: scale = (max(x, 0) - min(x, 0)) / 255 (1/255 when that range is 0, as ONNX
// Runtime and onnx.reference do), zero point = saturate(round(-min / scale)).
class DynamicQuantizeLinearOp final : public Op {
 public:
  explicit DynamicQuantizeLinearOp(const Node& node) : node_(node) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.empty() || !in[0]) fail(node_, "needs input x");
    if (in[0]->declared != DType::kFloat32)
      fail(node_, "x '" + node_.inputs[0] + "' has type " + type_name(in[0]->declared) + "; float expected");
    return {meta_of(DType::kUInt8, in[0]->shape), meta_of(DType::kFloat32, {}), meta_of(DType::kUInt8, {})};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& x = *in[0];
    const float* v = x.data<float>();
    float lo = 0, hi = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      lo = std::min(lo, v[i]);
      hi = std::max(hi, v[i]);
    }
    const float scale = (hi == lo ? 1.0f : hi - lo) / 255.0f;
    const float zpf = std::clamp(0.0f - lo / scale, 0.0f, 255.0f);
    const std::int32_t zp = std::int32_t(std::nearbyint(zpf));
    if (out[1]) out[1]->data<float>()[0] = scale;
    if (out[2]) out[2]->data<std::uint8_t>()[0] = std::uint8_t(zp);
    if (out[0]) {
      std::uint8_t* y = out[0]->data<std::uint8_t>();
      for (std::int64_t i = 0; i < x.numel(); ++i) y[i] = quantize_to<std::uint8_t>(v[i], scale, zp);
    }
  }

 private:
  Node node_;
};

// ---- fused Q/DQ Conv / MatMul / Gemm (eval/exec/qdq_fusion) ------------------------------------

// Inputs: a_q, a_scale, a_zero_point, b_q, b_scale, b_zero_point[, bias / C]; a float output in
// the scale's type, = float(exact int32 sum) * (a_scale * b_scale[channel]) (+ bias). The float
// path it replaces computes the same sum of dequantized products with float rounding in every term.
class FusedQdqOp : public Op {
 public:
  explicit FusedQdqOp(const Node& node) : node_(node) {}

 protected:
  // Checks the quantized operands; returns the scale count allowed for b (1 or `channels`).
  void check_operands(std::span<const ValueMeta* const> in, std::int64_t channels) const {
    for (std::size_t i : {0, 1, 3, 4})
      if (in.size() <= i || !in[i]) fail(node_, "fused Q/DQ node lacks input " + std::to_string(i));
    require_8bit(node_, *in[0], 0, "quantized activation");
    require_8bit(node_, *in[3], 3, "quantized weight");
    check_operand_params(node_, in, channels, "activation", "weight", true);
    for (std::size_t i : {1, 2, 4, 5})
      constants_[i] = in.size() > i && in[i] && in[i]->value ? in[i]->value.get() : nullptr;
    multipliers_count_ = -1;
    za_.clear();
    zb_.clear();
  }
  // Whether inputs 1, 2 (4, 5) of this run are the plan-time constants infer saw: their values
  // are then the same on every run, and what is derived from them is kept.
  bool constant_operand(std::span<const Tensor* const> in, std::size_t scale) const {
    return constants_[scale] && in[scale] == constants_[scale] &&
           (in.size() > scale + 1 && in[scale + 1] ? in[scale + 1] == constants_[scale + 1] : !constants_[scale + 1]);
  }
  // multipliers() for `count` output channels (a per-tensor b scale repeated), kept across runs
  // while both scales are constants (per run they cost an allocation and a pass each op).
  const std::vector<float>& channel_multipliers(std::span<const Tensor* const> in, std::int64_t count) const {
    const bool constant = constant_operand(in, 1) && constant_operand(in, 4);
    if (constant && multipliers_count_ == count) return multipliers_;
    const float sa = scalar_float(*in[1]);
    const Tensor& sb = *in[4];
    const float* b = sb.data<float>();
    multipliers_.resize(std::size_t(count));
    for (std::size_t j = 0; j < multipliers_.size(); ++j) multipliers_[j] = sa * b[sb.numel() == 1 ? 0 : j];
    multipliers_count_ = constant ? count : -1;
    return multipliers_;
  }
  // za() / zb(), kept while the operand's scale and zero point are constants.
  const std::vector<std::int32_t>& cached_za(std::span<const Tensor* const> in) const {
    if (za_.empty() || !constant_operand(in, 1)) za_ = za(in);
    return za_;
  }
  const std::vector<std::int32_t>& cached_zb(std::span<const Tensor* const> in) const {
    if (zb_.empty() || !constant_operand(in, 4)) zb_ = zb(in);
    return zb_;
  }
  // a_scale * b_scale per output channel.
  std::vector<float> multipliers(std::span<const Tensor* const> in) const {
    const float sa = scalar_float(*in[1]);
    const Tensor& sb = *in[4];
    std::vector<float> m(std::size_t(sb.numel()));
    for (std::size_t j = 0; j < m.size(); ++j) m[j] = sa * sb.data<float>()[j];
    return m;
  }
  std::vector<std::int32_t> za(std::span<const Tensor* const> in) const {
    return zero_points(node_, in.size() > 2 ? in[2] : nullptr, 2, in[0]->dtype());
  }
  std::vector<std::int32_t> zb(std::span<const Tensor* const> in) const {
    return zero_points(node_, in.size() > 5 ? in[5] : nullptr, 5, in[3]->dtype());
  }

  Node node_;

 private:
  mutable const Tensor* constants_[6] = {};
  mutable std::vector<float> multipliers_;
  mutable std::int64_t multipliers_count_ = -1;  // multipliers_ kept for this many channels; -1: not kept
  mutable std::vector<std::int32_t> za_, zb_;
};

// The int32 accumulators of one run, lent by the thread (kept per op across runs, they held an
// int32 output's worth for every layer).
using LentAccumulators = kernels::Lent<kernels::Int32Scratch>;

class FusedConvOp final : public FusedQdqOp {
 public:
  explicit FusedConvOp(const Node& node) : FusedQdqOp(node), attrs_(read_conv_attributes(node)) {}
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 5 || !in[0] || !in[3]) fail(node_, "fused Q/DQ Conv lacks inputs");
    const kernels::ConvParams p = conv_forward_params(node_, attrs_, in[0]->shape, in[3]->shape);
    check_operands(in, p.out_channels);
    if (in.size() > 6 && in[6] && (in[6]->dtype != DType::kFloat32 || in[6]->shape != Shape{p.out_channels}))
      fail(node_, "B '" + node_.inputs[6] + "' must be float [" + std::to_string(p.out_channels) + "], got " +
                      type_name(in[6]->declared) + " " + shape_to_string(in[6]->shape));
    cache_.note_constant(in[3]);
    Shape y{p.batch, p.out_channels};
    y.insert(y.end(), p.out_spatial.begin(), p.out_spatial.end());
    return {meta_of(in[1]->declared, y)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const kernels::ConvParams p = conv_forward_params(node_, attrs_, in[0]->shape(), in[3]->shape());
    const std::int32_t zx = cached_za(in)[0];
    const std::vector<std::int32_t>& zw = cached_zb(in);
    const std::vector<float>& m = channel_multipliers(in, p.out_channels);
    const float* bias = in.size() > 6 && in[6] ? in[6]->data<float>() : nullptr;
    float* y = out[0]->data<float>();
    if (std::all_of(zw.begin(), zw.end(), [](std::int32_t z) { return z == 0; })) {
      // Symmetric weights (the usual case): the zero-point correction is one constant per output
      // channel, so the GEMM finishes each tile into floats while it is in L1 (kernels::Int8Epilogue).
      std::vector<std::int8_t> xbuf;
      const kernels::PackedInt8ConvWeights& packed = cache_.get(*in[3], p);
      std::vector<std::int32_t> row_add;
      if (zx != 0) {
        row_add.resize(std::size_t(p.out_channels));
        for (std::int64_t oc = 0; oc < p.out_channels; ++oc) row_add[std::size_t(oc)] = -zx * packed.channel_sum(oc);
      }
      kernels::Int8Epilogue e;
      e.row_add = row_add.empty() ? nullptr : row_add.data();
      e.row_scale = m.data();
      e.row_bias = bias;
      // the im2col matrix: this thread's lent one
      kernels::int8_conv(p, as_int8(*in[0], xbuf), std::int8_t(zx), packed, y, e);
      return;
    }
    const LentAccumulators lent;
    std::vector<std::int32_t>& acc = lent->values;
    acc.resize(std::size_t(out[0]->numel()));
    integer_conv(p, *in[0], zx, *in[3], zw, acc.data(), cache_);
    const std::int64_t per_channel = out[0]->numel() / std::max<std::int64_t>(1, p.batch * p.out_channels);
    for (std::int64_t bc = 0; bc < p.batch * p.out_channels; ++bc) {
      const std::int64_t oc = bc % p.out_channels;
      const float mc = m[std::size_t(oc)], b = bias ? bias[oc] : 0.0f;
      const std::int32_t* a = acc.data() + bc * per_channel;
      float* yc = y + bc * per_channel;
      for (std::int64_t j = 0; j < per_channel; ++j) yc[j] = float(a[j]) * mc + b;
    }
  }

 private:
  ConvAttributes attrs_;
  mutable PackedConvCache cache_;
};

class FusedMatMulOp final : public FusedQdqOp {
 public:
  using FusedQdqOp::FusedQdqOp;
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 5 || !in[0] || !in[3]) fail(node_, "fused Q/DQ MatMul lacks inputs");
    const MatMulPlan p = plan_matmul(node_, in[0]->shape, in[3]->shape);
    check_operands(in, p.n);
    cache_.note_constant(in[3]);
    return {meta_of(in[1]->declared, p.out)};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const MatMulPlan p = plan_matmul(node_, in[0]->shape(), in[3]->shape());
    const std::vector<float>& m = channel_multipliers(in, p.n);
    float* y = out[0]->data<float>();
    const std::vector<std::int32_t>&a_zero = cached_za(in), &b_zero = cached_zb(in);
    if (std::all_of(b_zero.begin(), b_zero.end(), [](std::int32_t z) { return z == 0; }) &&
        integer_matmul(node_, *in[0], a_zero, *in[3], b_zero, y, m, &cache_, &a_scratch_))
      return;
    const LentAccumulators lent;
    std::vector<std::int32_t>& acc = lent->values;
    acc.resize(std::size_t(out[0]->numel()));
    integer_matmul(node_, *in[0], a_zero, *in[3], b_zero, acc.data(), &cache_, &a_scratch_);
    const std::size_t n = std::size_t(p.n), rows = acc.size() / std::max<std::size_t>(1, n);
    for (std::size_t r = 0; r < rows; ++r) {
      const std::int32_t* a = acc.data() + r * n;
      float* yr = y + r * n;
      for (std::size_t j = 0; j < n; ++j) yr[j] = float(a[j]) * m[j];
    }
  }

 private:
  mutable PackedBCache cache_;
  mutable kernels::PackedInt8A a_scratch_{0, 0, nullptr, 0};  // the activations' packing, kept across runs
};

class FusedGemmOp final : public FusedQdqOp {
 public:
  explicit FusedGemmOp(const Node& node)
      : FusedQdqOp(node),
        trans_b_(node.get_int("transB", 0) != 0),
        alpha_(node.get_float("alpha", 1.0f)),
        beta_(node.get_float("beta", 1.0f)) {
    if (node.get_int("transA", 0) != 0) fail(node, "fused Q/DQ Gemm with transA is not supported");
  }
  std::vector<ValueMeta> infer(std::span<const ValueMeta* const> in) const override {
    if (in.size() < 5 || !in[0] || !in[3]) fail(node_, "fused Q/DQ Gemm lacks inputs");
    const Shape& a = in[0]->shape;
    const Shape& b = in[3]->shape;
    if (a.size() != 2 || b.size() != 2)
      fail(node_, "A and B must be 2-D, got " + shape_to_string(a) + " and " + shape_to_string(b));
    const std::int64_t k = trans_b_ ? b[1] : b[0], n = trans_b_ ? b[0] : b[1];
    if (k != a[1]) fail(node_, "inner dimensions differ: A " + shape_to_string(a) + ", B " + shape_to_string(b));
    check_operands(in, n);
    if (in.size() > 6 && in[6]) {
      const Shape& c = in[6]->shape;
      bool ok = c.size() <= 2;
      for (std::size_t d = 0; ok && d < c.size(); ++d) {
        const std::int64_t want = d + 2 - c.size() == 0 ? a[0] : n;
        ok = c[d] == 1 || c[d] == want;
      }
      if (!ok || in[6]->dtype != DType::kFloat32)
        fail(node_, "C of shape " + shape_to_string(c) + " does not broadcast to [" + std::to_string(a[0]) + ", " +
                        std::to_string(n) + "]");
    }
    cache_.note_constant(in[3]);
    return {meta_of(in[1]->declared, {a[0], n})};
  }
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) const override {
    const Tensor& a = *in[0];
    const Tensor& b = *in[3];
    const std::int64_t m_rows = a.shape()[0], k = a.shape()[1], n = trans_b_ ? b.shape()[0] : b.shape()[1];
    std::vector<std::int8_t> abuf, bbuf;
    const std::int8_t* pa = as_int8(a, abuf);
    auto b_data = [&] { return as_int8(b, bbuf); };
    const kernels::PackedInt8A packed_a(m_rows, k, pa, k);
    std::unique_ptr<kernels::PackedInt8B> own;
    const kernels::PackedInt8B* packed_b;
    if (cache_.cacheable(b)) {
      packed_b = &cache_.get(b, k, n, b_data, trans_b_ ? k : n, trans_b_);
    } else {
      own = std::make_unique<kernels::PackedInt8B>(k, n, b_data(), trans_b_ ? k : n, trans_b_);
      packed_b = own.get();
    }
    const LentAccumulators lent;
    std::vector<std::int32_t>& acc = lent->values;
    acc.resize(std::size_t(m_rows * n));
    kernels::int8_gemm(packed_a, *packed_b, acc.data(), n);
    correct_zero_points(packed_a, *packed_b, za(in), zb(in), acc.data());
    const std::vector<float> mult = multipliers(in);
    const Tensor* c = in.size() > 6 ? in[6] : nullptr;
    float* y = out[0]->data<float>();
    for (std::int64_t i = 0; i < m_rows; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        float v = alpha_ * (float(acc[std::size_t(i * n + j)]) * mult[mult.size() == 1 ? 0 : std::size_t(j)]);
        if (c && beta_ != 0.0f) {
          const Shape& cs = c->shape();
          std::int64_t ci = 0;
          if (cs.size() == 2) ci = (cs[0] == 1 ? 0 : i) * cs[1] + (cs[1] == 1 ? 0 : j);
          else if (cs.size() == 1) ci = cs[0] == 1 ? 0 : j;
          v += beta_ * c->data<float>()[ci];
        }
        y[i * n + j] = v;
      }
  }

 private:
  bool trans_b_;
  float alpha_, beta_;
  mutable PackedBCache cache_;
};

}  // namespace

void register_qlinear_ops(std::vector<OpSchema>& out) {
  auto make = [](auto* tag) -> OpFactory {
    using T = std::remove_pointer_t<decltype(tag)>;
    return [](const Node& n) -> std::unique_ptr<Op> { return std::make_unique<T>(n); };
  };
  out.push_back({"MatMulInteger", "", 10, kMaxOpset, make(static_cast<MatMulIntegerOp*>(nullptr))});
  out.push_back({"ConvInteger", "", 10, kMaxOpset, make(static_cast<ConvIntegerOp*>(nullptr))});
  // QLinearMatMul-21 only widened the types (float8, float16 scales); 8-bit semantics are the same.
  out.push_back({"QLinearMatMul", "", 10, kMaxOpset, make(static_cast<QLinearMatMulOp*>(nullptr))});
  out.push_back({"QLinearConv", "", 10, kMaxOpset, make(static_cast<QLinearConvOp*>(nullptr))});
  out.push_back({"DynamicQuantizeLinear", "", 11, kMaxOpset, make(static_cast<DynamicQuantizeLinearOp*>(nullptr))});
  out.push_back({"QGemm", "com.microsoft", 1, 1, make(static_cast<QGemmOp*>(nullptr))});
  // The Q/DQ fusion's rewrites (never in files: made in memory by eval/exec/qdq_fusion).
  out.push_back({"Conv", quant::kFusedDomain, 1, 1, make(static_cast<FusedConvOp*>(nullptr))});
  out.push_back({"MatMul", quant::kFusedDomain, 1, 1, make(static_cast<FusedMatMulOp*>(nullptr))});
  out.push_back({"Gemm", quant::kFusedDomain, 1, 1, make(static_cast<FusedGemmOp*>(nullptr))});
}

}  // namespace qeval::eval
