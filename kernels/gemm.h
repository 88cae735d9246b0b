// Matrix multiplication: single-precision GEMM (portable reference and packed, register-blocked,
// multithreaded fast path), batched GEMM, and a generic GEMM for double and integer types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace qeval::kernels {

// All matrices are row-major with a leading dimension (elements between consecutive rows).
// op(A) is m x k: A is stored m x k (trans_a false) or k x m (trans_a true); op(B) is k x n likewise.
// C (m x n) = alpha * op(A) op(B) + beta * C. With beta == 0, C is not read (NaN/garbage in the
// output buffer does not propagate), as BLAS specifies; the executor's outputs are not zeroed.
//
// Determinism: each element of C is summed over k in fixed blocks of kGemmKC, in order; the work
// is split over m and n only, so results are bitwise identical for any thread count.
struct GemmShape {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
};

class PackedA;
class PackedB;

// Chooses the path by size: tiny problems run register-blocked loops without packing (the
// reference loops when B is transposed), m <= 4 the few-rows kernel,
// the rest the packed kernel. The packed kernel uses `packed_a` / `packed_b` (op(A) / op(B) packed
// beforehand, e.g. constant weights) where given instead of packing the operand itself; the
// results are the same bits either way. a and b are still needed for the other paths.
void sgemm(const GemmShape& s, float alpha, const float* a, const float* b, float beta, float* c,
           const PackedA* packed_a = nullptr, const PackedB* packed_b = nullptr);
// Whether sgemm takes the packed path for this shape (when prepacking an operand pays).
bool sgemm_uses_packing(const GemmShape& s);
// Always the packed kernel (tests compare it with the reference on tiny and odd shapes).
void sgemm_packed(const GemmShape& s, float alpha, const float* a, const float* b, float beta, float* c);
// For m <= 4 (sgemm's choice there): rows of C straight from unpacked B, since packing B would cost
// more than the product. Throws std::invalid_argument for larger m.
void sgemm_few_rows(const GemmShape& s, float alpha, const float* a, const float* b, float beta, float* c);
// The obvious loops, single-threaded; accumulates each element in float over k in order.
void sgemm_reference(const GemmShape& s, float alpha, const float* a, const float* b, float beta, float* c);

// `batch` independent products with one shape; operand i is a[i], b[i], c[i]. Pointers may repeat
// (broadcast operands): a B matrix shared by consecutive entries is packed once. The c[i] must not
// overlap. Parallel over batch entries and blocks of each. `packed_b`, where given, is op(B) of
// every entry (all b[i] equal), packed beforehand.
void sgemm_batched(const GemmShape& s, std::int64_t batch, float alpha, const float* const* a, const float* const* b,
                   float beta, float* const* c, const PackedB* packed_b = nullptr);
void sgemm_batched_reference(const GemmShape& s, std::int64_t batch, float alpha, const float* const* a,
                             const float* const* b, float beta, float* const* c);

// C = op(A) op(B) for double and integer element types (ONNX MatMul of those types). Accumulates in
// T: integer products are exact (wrapping as the element type does, like numpy). Parallel over rows.
template <class T>
void gemm_generic(const GemmShape& s, const T* a, const T* b, T* c);

// ---- panel-level interface (used by conv to pack im2col columns straight into panels) ---------

// Micro-kernel tile: kGemmMR rows of C by kGemmNR columns; k is processed in blocks of kGemmKC.
inline constexpr int kGemmMR = 14;
inline constexpr int kGemmNR = 32;
inline constexpr int kGemmKC = 256;
inline constexpr int kGemmMC = 8 * kGemmMR;

struct AlignedFloatsFree {
  void operator()(float* p) const;
};
using AlignedFloats = std::unique_ptr<float[], AlignedFloatsFree>;
// Uninitialised, 64-byte-aligned storage for n floats.
AlignedFloats alloc_aligned_floats(std::size_t n);

inline std::int64_t round_up(std::int64_t x, std::int64_t to) { return (x + to - 1) / to * to; }

// How a packed operand keeps its panels: floats, or, where every value is exactly a float16 (an FP16
// model's weights), float16 codes: half the bytes, widened a block at a time where they are read
// (the products are the same bits either way). Values that are not all exact stay floats.
enum class PanelStorage : std::uint8_t { kFloat, kFloat16IfExact };

// float16 panels: the codes of a packed operand's floats when they are all exact (else empty).
struct HalfPanels {
  struct Free {
    void operator()(std::uint16_t* p) const;
  };
  std::unique_ptr<std::uint16_t[], Free> codes;
  // Replaces `floats` (n of them) by their codes where every one is exact.
  bool take(AlignedFloats& floats, std::size_t n);
  // The n values from `offset` widened into `scratch`.
  const float* widen(std::int64_t offset, std::int64_t n, float* scratch) const;
};

// op(A) (m x k) packed once for reuse against many B blocks (conv weights). Layout: for each k block
// (kGemmKC rows of k, the last one shorter), round_up(m, kGemmMR) / kGemmMR panels of kc x kGemmMR,
// rows past m zero.
class PackedA {
 public:
  PackedA(bool trans, std::int64_t m, std::int64_t k, const float* a, std::int64_t lda,
          PanelStorage storage = PanelStorage::kFloat);
  std::int64_t m() const { return m_; }
  std::int64_t k() const { return k_; }
  bool trans() const { return trans_; }
  bool half() const { return half_.codes != nullptr; }
  // The panels of rows [i0, i0 + rows) for k block starting at k0 (i0 a multiple of kGemmMR, k0 of
  // kGemmKC): in place, or (float16 panels) widened into `scratch`, which then holds at least
  // kGemmKC * round_up(rows, kGemmMR) floats.
  const float* block(std::int64_t i0, std::int64_t k0, std::int64_t rows, float* scratch) const;

 private:
  float* float_block(std::int64_t i0, std::int64_t k0) const;
  std::int64_t offset(std::int64_t i0, std::int64_t k0) const;
  bool trans_;
  std::int64_t m_, k_, m_padded_;
  AlignedFloats data_;
  HalfPanels half_;
};

// op(B) (k x n) packed once for reuse against many A (constant weights): k blocks of kGemmKC rows,
// each round_up(n, kGemmNR) / kGemmNR panels laid out as below.
class PackedB {
 public:
  PackedB() = default;
  PackedB(bool trans, std::int64_t k, std::int64_t n, const float* b, std::int64_t ldb,
          PanelStorage storage = PanelStorage::kFloat);
  // Packs another operand as floats, reusing the storage when it is large enough.
  void pack(bool trans, std::int64_t k, std::int64_t n, const float* b, std::int64_t ldb);
  std::int64_t k() const { return k_; }
  std::int64_t n() const { return n_; }
  bool trans() const { return trans_; }
  bool half() const { return half_.codes != nullptr; }
  // The panels of columns [j0, ...) for the k block starting at k0 (j0 a multiple of kGemmNR).
  // Float panels only.
  const float* block(std::int64_t j0, std::int64_t k0) const;
  // Those of columns [j0, j0 + cols): in place, or (float16 panels) widened into `scratch`, which
  // then holds at least kGemmKC * round_up(cols, kGemmNR) floats.
  const float* block(std::int64_t j0, std::int64_t k0, std::int64_t cols, float* scratch) const;

 private:
  std::int64_t offset(std::int64_t j0, std::int64_t k0) const;
  bool trans_ = false;
  std::int64_t k_ = 0, n_ = 0, n_padded_ = 0;
  std::size_t capacity_ = 0;
  AlignedFloats data_;
  HalfPanels half_;
};

// Rows [i0, i0 + mc) and the k range [k0, k0 + kc) of op(A) into kGemmMR-row panels, zero rows
// past mc: the layout gemm_packed_block reads (mc <= kGemmMC not required). Single-threaded.
void pack_a_panels(bool trans, const float* a, std::int64_t lda, std::int64_t i0, std::int64_t mc, std::int64_t k0,
                   std::int64_t kc, float* dst);

// A packed B block of kc rows and nc columns is ceil(nc / kGemmNR) panels; panel j holds, for each
// row r < kc, kGemmNR consecutive floats: columns j*kGemmNR ... (+kGemmNR-1), zero past nc. So element
// (r, col) lives at block[(col / kGemmNR) * kc * kGemmNR + r * kGemmNR + col % kGemmNR].
inline std::int64_t packed_b_floats(std::int64_t kc, std::int64_t nc) { return kc * round_up(nc, kGemmNR); }

// C (mc x nc) = alpha * A_block (mc x kc) * B_block (kc x nc) + beta * C, from packed blocks (A panels
// as PackedA::block gives them, B as described above). beta == 0: C is not read. Single-threaded.
void gemm_packed_block(std::int64_t mc, std::int64_t nc, std::int64_t kc, const float* a_panels, const float* b_panels,
                       float alpha, float beta, float* c, std::int64_t ldc);

}  // namespace qeval::kernels
