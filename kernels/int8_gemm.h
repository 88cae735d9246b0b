// Integer GEMM: int8 x int8 -> int32 with exact int32 accumulation, as hardware integer units do.
// An AVX-512 VNNI kernel (vpdpbusd) where the target has it, a portable kernel everywhere; both
// read the same packed operands and are tested against each other and the naive loops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

namespace qeval::kernels {

// Micro-tile: kInt8MR rows of C by kInt8NR columns; k runs in groups of 4 (one int32 lane of
// vpdpbusd multiplies 4 byte pairs).
inline constexpr int kInt8MR = 14;
inline constexpr int kInt8NR = 32;

struct AlignedBytesFree {
  void operator()(std::uint8_t* p) const;
};
using AlignedBytes = std::unique_ptr<std::uint8_t[], AlignedBytesFree>;

// A (m x k, int8, row-major with leading dimension lda) packed into panels of kInt8MR rows: for each
// group g of 4 k values, the panel holds kInt8MR x 4 bytes (row r's a[r][4g..4g+3]). Bytes are
// stored offset by +128 (as uint8: a ^ 0x80), the unsigned operand vpdpbusd wants; rows past m and
// k past the end hold the code of 0. Also keeps each row's sum of A (zero-point corrections).
class PackedInt8A {
 public:
  PackedInt8A(std::int64_t m, std::int64_t k, const std::int8_t* a, std::int64_t lda);
  // Packs another A into this one's storage, reallocated only when too small (a caller's scratch,
  // kept across calls: no allocation and no fresh pages per call). Same bytes as constructing.
  void pack(std::int64_t m, std::int64_t k, const std::int8_t* a, std::int64_t lda);
  std::int64_t m() const { return m_; }
  std::int64_t k() const { return k_; }
  std::int64_t k_groups() const { return k_groups_; }
  const std::uint8_t* panel(std::int64_t i0) const { return data_.get() + (i0 / kInt8MR) * k_groups_ * kInt8MR * 4; }
  const std::int32_t* row_sums() const { return row_sums_.get(); }

 private:
  std::int64_t m_ = 0, k_ = 0, k_groups_ = 0;
  AlignedBytes data_;
  std::unique_ptr<std::int32_t[]> row_sums_;
  std::size_t bytes_ = 0, sums_ = 0;  // allocated sizes (pack reuses them)
};

// B (k x n, int8) packed into panels of kInt8NR columns: for each group g of 4 k values, the panel
// holds kInt8NR x 4 bytes (column c's b[4g..4g+3][c]); k and columns past the end are 0. Also keeps
// each column's sum of B (the +128 offset of A and zero points are corrected with it).
// trans: B is given as n x k (b[j * ldb + p] is element (p, j)), e.g. conv weights / Gemm transB.
class PackedInt8B {
 public:
  PackedInt8B(std::int64_t k, std::int64_t n, const std::int8_t* b, std::int64_t ldb, bool trans = false);
  // Packs another B into this one's storage (as reset, then the constructor's packing).
  void pack(std::int64_t k, std::int64_t n, const std::int8_t* b, std::int64_t ldb, bool trans = false);
  // Zero-filled storage that a producer writes in the layout above (im2col packs straight into it):
  // element (p, col) at mutable_panel(col)[(p / 4) * kInt8NR * 4 + (col % kInt8NR) * 4 + p % 4],
  // and every column's sum into mutable_col_sums() (columns past n stay 0).
  PackedInt8B(std::int64_t k, std::int64_t n);
  // The same, reusing this one's storage when it is large enough (a caller's scratch, kept across
  // calls: no allocation and no fresh pages per call). clear = false leaves the bytes and sums
  // undefined, for a producer that writes every one of them (padding columns and k included).
  void reset(std::int64_t k, std::int64_t n, bool clear = true);
  std::int8_t* mutable_panel(std::int64_t j0) {
    return reinterpret_cast<std::int8_t*>(data_.get()) + (j0 / kInt8NR) * k_groups_ * kInt8NR * 4;
  }
  std::int32_t* mutable_col_sums() { return col_sums_.get(); }
  std::int64_t k() const { return k_; }
  std::int64_t n() const { return n_; }
  std::int64_t k_groups() const { return k_groups_; }
  const std::int8_t* panel(std::int64_t j0) const {
    return reinterpret_cast<const std::int8_t*>(data_.get()) + (j0 / kInt8NR) * k_groups_ * kInt8NR * 4;
  }
  const std::int32_t* col_sums() const { return col_sums_.get(); }
  std::size_t capacity_bytes() const { return bytes_ + sums_ * sizeof(std::int32_t); }

 private:
  std::int64_t k_, n_, k_groups_;
  AlignedBytes data_;
  std::unique_ptr<std::int32_t[]> col_sums_;
  std::size_t bytes_ = 0, sums_ = 0;  // allocated sizes (reset reuses them)
};

enum class Int8GemmPath { kPortable, kAvx512Vnni };
std::string_view int8_gemm_path_name(Int8GemmPath p);
// The fastest path this build and CPU run (AVX-512 VNNI when compiled for a target with it).
Int8GemmPath int8_gemm_best_path();
bool int8_gemm_path_available(Int8GemmPath p);

// C (m x n, int32, leading dimension ldc) = A B, exactly (int32 sums wrap only past 2^31, which
// needs k > 131072 at full-scale values). C is written, not read. Parallel over blocks of C;
// integer sums make the result independent of the split.
void int8_gemm(const PackedInt8A& a, const PackedInt8B& b, std::int32_t* c, std::int64_t ldc,
               Int8GemmPath path = int8_gemm_best_path());
// What int8_gemm can do with each finished sum s = (A B)[i][j] instead of storing it as int32 (the
// dequantizing epilogue of a fused Q/DQ Conv or MatMul, applied while the tile is in L1):
//   v = float(s + row_add[i] + col_add[j]); v = v * row_scale[i]; v = v * col_scale[j];
//   v = v + row_bias[i]; v = v + col_bias[j]
// in that order, each a separately rounded float operation (no fused multiply-add), so the result
// equals the same steps run as a second pass over the int32 sums. A null pointer leaves its term
// out. Row terms are indexed by A's rows, column terms by B's columns.
struct Int8Epilogue {
  const std::int32_t* row_add = nullptr;
  const std::int32_t* col_add = nullptr;
  const float* row_scale = nullptr;
  const float* col_scale = nullptr;
  const float* row_bias = nullptr;
  const float* col_bias = nullptr;
  // The same epilogue for rows [r0, ...) of a larger A (row pointers advanced by r0).
  Int8Epilogue rows_from(std::int64_t r0) const;
};
// out (m x n, float, leading dimension ldo) = the epilogue applied to A B. While k blocks are
// summed, out holds the partial int32 sums (its storage is reused; nothing else is allocated).
void int8_gemm(const PackedInt8A& a, const PackedInt8B& b, float* out, std::int64_t ldo, const Int8Epilogue& e,
               Int8GemmPath path = int8_gemm_best_path());
// The epilogue as a separate pass over int32 sums c (m x n, leading dimension ld), written as
// floats into the same storage (the depthwise conv's path, and the reference for tests).
void int8_epilogue(std::int32_t* c, std::int64_t m, std::int64_t n, std::int64_t ld, const Int8Epilogue& e);

// Packs both operands and multiplies (convenience for one-off products and tests).
void int8_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const std::int8_t* a, std::int64_t lda,
               const std::int8_t* b, std::int64_t ldb, std::int32_t* c, std::int64_t ldc,
               Int8GemmPath path = int8_gemm_best_path());
// The obvious triple loop, single-threaded.
void int8_gemm_reference(std::int64_t m, std::int64_t n, std::int64_t k, const std::int8_t* a, std::int64_t lda,
                         const std::int8_t* b, std::int64_t ldb, std::int32_t* c, std::int64_t ldc);

}  // namespace qeval::kernels
