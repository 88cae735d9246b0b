// int8 x int8 -> int32 GEMM: operand packing, the AVX-512 VNNI and portable micro-kernels, cache
// blocking and TBB threading.
#include "kernels/int8_gemm.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <utility>

#include "kernels/threads.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#include <immintrin.h>
#define QEVAL_HAVE_AVX512_VNNI 1
#endif

namespace qeval::kernels {
namespace {

constexpr int MR = kInt8MR, NR = kInt8NR;
// Cache blocking: a block of kKcGroups * 4 k values; B panels of that depth (16 KiB) stay in L1
// while the kernel walks the m panels of a task's A block (kMcRows x 512 bytes in L2).
constexpr std::int64_t kKcGroups = 128;
constexpr std::int64_t kMcRows = 12 * MR;
constexpr std::int64_t kNcCols = 8 * NR;

AlignedBytes alloc_bytes(std::size_t n) {
  const std::size_t bytes = std::max<std::size_t>(64, (n + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw std::bad_alloc();
  return AlignedBytes(static_cast<std::uint8_t*>(p));
}

template <class F>
void parallel_panels(std::int64_t panels, std::int64_t bytes_per_panel, F&& f) {
  if (panels * bytes_per_panel < (std::int64_t(1) << 18)) {
    for (std::int64_t p = 0; p < panels; ++p) f(p);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, panels), [&](const tbb::blocked_range<std::int64_t>& r) {
    for (std::int64_t p = r.begin(); p < r.end(); ++p) f(p);
  });
}

// One MR x NR tile over k groups [g0, g0 + gn): C = (first ? 0 : C) + sum (a - 128 ... ) b.
// The portable kernel undoes the +128 offset of A on each byte: sum over (a_u8 - 128) * b.
void kernel_portable(std::int64_t gn, const std::uint8_t* __restrict pa, const std::int8_t* __restrict pb,
                     std::int32_t* c, std::int64_t ldc, int mr, int nr, bool first) {
  std::int32_t acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) acc[r][j] = (first || r >= mr || j >= nr) ? 0 : c[r * ldc + j];
  for (std::int64_t g = 0; g < gn; ++g) {
    for (int r = 0; r < MR; ++r) {
      const std::int32_t a0 = std::int32_t(pa[r * 4 + 0]) - 128, a1 = std::int32_t(pa[r * 4 + 1]) - 128;
      const std::int32_t a2 = std::int32_t(pa[r * 4 + 2]) - 128, a3 = std::int32_t(pa[r * 4 + 3]) - 128;
      for (int j = 0; j < NR; ++j)
        acc[r][j] += a0 * pb[j * 4 + 0] + a1 * pb[j * 4 + 1] + a2 * pb[j * 4 + 2] + a3 * pb[j * 4 + 3];
    }
    pa += MR * 4;
    pb += NR * 4;
  }
  for (int r = 0; r < mr; ++r)
    for (int j = 0; j < nr; ++j) c[r * ldc + j] = acc[r][j];
}

#if QEVAL_HAVE_AVX512_VNNI
// vpdpbusd multiplies unsigned bytes of A (a + 128) by signed bytes of B, 4 per int32 lane:
// sum (a + 128) b = sum a b + 128 colsum(B), so the accumulators start at -128 colsum(B) (first k
// block) and end exactly at sum a b. No intermediate saturates (vpdpbusd, not vpdpbusds).
// The column terms of 16 columns from j0 (lanes past the mask 0).
struct ColumnTerms {
  __m512i add;
  __m512 scale, bias;
};
inline ColumnTerms column_terms(std::int64_t j0, __mmask16 mask, const Int8Epilogue& e) {
  ColumnTerms t;
  t.add = e.col_add ? _mm512_maskz_loadu_epi32(mask, e.col_add + j0) : _mm512_setzero_si512();
  t.scale = e.col_scale ? _mm512_maskz_loadu_ps(mask, e.col_scale + j0) : _mm512_setzero_ps();
  t.bias = e.col_bias ? _mm512_maskz_loadu_ps(mask, e.col_bias + j0) : _mm512_setzero_ps();
  return t;
}
// The epilogue's float for 16 sums s of row i with the columns' terms t (lanes past the mask unused).
inline __m512 epilogue16(__m512i s, std::int64_t i, const ColumnTerms& t, const Int8Epilogue& e) {
  if (e.row_add) s = _mm512_add_epi32(s, _mm512_set1_epi32(e.row_add[i]));
  if (e.col_add) s = _mm512_add_epi32(s, t.add);
  __m512 v = _mm512_maskz_cvtepi32_ps(__mmask16(0xffff), s);  // (maskz: GCC 12 warns on the unmasked form)
  if (e.row_scale) v = _mm512_mul_ps(v, _mm512_set1_ps(e.row_scale[i]));
  if (e.col_scale) v = _mm512_mul_ps(v, t.scale);
  if (e.row_bias) v = _mm512_add_ps(v, _mm512_set1_ps(e.row_bias[i]));
  if (e.col_bias) v = _mm512_add_ps(v, t.bias);
  return v;
}
inline __m512 epilogue16(__m512i s, std::int64_t i, std::int64_t j0, __mmask16 mask, const Int8Epilogue& e) {
  return epilogue16(s, i, column_terms(j0, mask, e), e);
}

// e (the last k block only): the tile at (i0, j0) of C is finished into floats from the registers.
// R: the rows computed (mr <= R <= MR): a panel with fewer live rows than MR (the last of an m that
// is not a multiple of MR, e.g. 24 output channels = 14 + 10) skips the dot products of its zero
// rows; kernel_vnni_rows picks the instance by mr.
template <int R>
void kernel_vnni(std::int64_t gn, const std::uint8_t* __restrict pa, const std::int8_t* __restrict pb, std::int32_t* c,
                 std::int64_t ldc, int mr, int nr, bool first, const std::int32_t* col_sums,
                 const Int8Epilogue* e = nullptr, std::int64_t i0 = 0, std::int64_t j0 = 0) {
  static_assert(R >= 1 && R <= MR);
  const __mmask16 m0 = nr >= 16 ? __mmask16(0xffff) : __mmask16((1u << nr) - 1);
  const __mmask16 m1 = nr >= 32 ? __mmask16(0xffff) : nr > 16 ? __mmask16((1u << (nr - 16)) - 1) : __mmask16(0);
  __m512i acc[R][2];
  if (first) {
    const __m512i minus128 = _mm512_set1_epi32(-128);
    const __m512i c0 = _mm512_mullo_epi32(_mm512_maskz_loadu_epi32(m0, col_sums), minus128);
    const __m512i c1 = _mm512_mullo_epi32(_mm512_maskz_loadu_epi32(m1, col_sums + 16), minus128);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      acc[r][0] = c0;
      acc[r][1] = c1;
    }
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const bool live = r < mr;
      acc[r][0] = live ? _mm512_maskz_loadu_epi32(m0, c + r * ldc) : _mm512_setzero_si512();
      acc[r][1] = live ? _mm512_maskz_loadu_epi32(m1, c + r * ldc + 16) : _mm512_setzero_si512();
    }
  }
  for (std::int64_t g = 0; g < gn; ++g) {
    const __m512i b0 = _mm512_load_si512(pb);
    const __m512i b1 = _mm512_load_si512(pb + 64);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      std::int32_t a4;
      std::memcpy(&a4, pa + r * 4, 4);
      const __m512i av = _mm512_set1_epi32(a4);
      acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], av, b1);
    }
    pa += MR * 4;
    pb += NR * 4;
  }
  // Unrolled with a test per row (not a loop to mr): a runtime trip count would index acc
  // dynamically and make GCC keep the accumulators in memory.
  if (e) {
    float* y = reinterpret_cast<float*>(c);
    // The column terms once per tile, not per row: stores through y may alias them as far as the
    // compiler knows, so it reloaded them for every row (a k = 64 MatMul's tile spent a fifth of
    // its time in the epilogue). The same operations in the same order (epilogue16's).
    const ColumnTerms t0 = column_terms(j0, m0, *e), t1 = column_terms(j0 + 16, m1, *e);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      if (r >= mr) break;
      _mm512_mask_storeu_ps(y + r * ldc, m0, epilogue16(acc[r][0], i0 + r, t0, *e));
      if (nr > 16) _mm512_mask_storeu_ps(y + r * ldc + 16, m1, epilogue16(acc[r][1], i0 + r, t1, *e));
    }
    return;
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    if (r >= mr) break;
    _mm512_mask_storeu_epi32(c + r * ldc, m0, acc[r][0]);
    _mm512_mask_storeu_epi32(c + r * ldc + 16, m1, acc[r][1]);
  }
}

using VnniKernel = void (*)(std::int64_t, const std::uint8_t*, const std::int8_t*, std::int32_t*, std::int64_t, int,
                            int, bool, const std::int32_t*, const Int8Epilogue*, std::int64_t, std::int64_t);
template <std::size_t... I>
constexpr std::array<VnniKernel, MR> vnni_kernels(std::index_sequence<I...>) {
  return {&kernel_vnni<int(I) + 1>...};
}
constexpr std::array<VnniKernel, MR> kVnniKernels = vnni_kernels(std::make_index_sequence<MR>());

// The kernel computing exactly the tile's mr rows.
inline void kernel_vnni_rows(std::int64_t gn, const std::uint8_t* pa, const std::int8_t* pb, std::int32_t* c,
                             std::int64_t ldc, int mr, int nr, bool first, const std::int32_t* col_sums,
                             const Int8Epilogue* e = nullptr, std::int64_t i0 = 0, std::int64_t j0 = 0) {
  kVnniKernels[std::size_t(mr - 1)](gn, pa, pb, c, ldc, mr, nr, first, col_sums, e, i0, j0);
}

// One panel of A (mr <= MR rows of k bytes, leading dimension lda) in the packed layout with its
// rows' sums: 16 k groups (64 bytes) of every row loaded at a time (bytes past k and rows past mr
// read as 0), a 16 x 16 transpose of 4-byte lanes turning them into one vector per k group (lane
// r = row r's 4 bytes), summed per lane with vpdpbusd against ones and stored +128. The same
// bytes and sums as the scalar loop it replaces (4 bytes at a time per row): tiny-sd's linear
// layers (k = 64 to 384) spent a fifth of their int8 MatMul time packing A that way.
void pack_a_panel(const std::int8_t* a, std::int64_t lda, int mr, std::int64_t k, std::uint8_t* dst,
                  std::int32_t* sums) {
  static_assert(MR <= 16);
  const std::int64_t groups = (k + 3) / 4;
  const __m512i ones = _mm512_set1_epi8(1), offset = _mm512_set1_epi8(char(0x80));
  const __mmask16 lanes = __mmask16((1u << MR) - 1);
  __m512i acc = _mm512_setzero_si512();
  for (std::int64_t g0 = 0; g0 < groups; g0 += 16) {
    const std::int64_t bytes = std::min<std::int64_t>(64, k - g0 * 4);
    const __mmask64 mask = bytes == 64 ? ~__mmask64(0) : (__mmask64(1) << bytes) - 1;
    __m512i r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i)
      r[i] = i < mr ? _mm512_maskz_loadu_epi8(mask, a + i * lda + g0 * 4) : _mm512_setzero_si512();
    // Pairs of rows interleaved by lanes, then by pairs of lanes: t[4q + c] holds rows 4q..4q+3 of
    // lanes c, c + 4, c + 8, c + 12 (one per 128-bit block).
    __m512i t[16];
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
      const __m512i lo01 = _mm512_unpacklo_epi32(r[4 * q], r[4 * q + 1]);
      const __m512i hi01 = _mm512_unpackhi_epi32(r[4 * q], r[4 * q + 1]);
      const __m512i lo23 = _mm512_unpacklo_epi32(r[4 * q + 2], r[4 * q + 3]);
      const __m512i hi23 = _mm512_unpackhi_epi32(r[4 * q + 2], r[4 * q + 3]);
      t[4 * q + 0] = _mm512_unpacklo_epi64(lo01, lo23);
      t[4 * q + 1] = _mm512_unpackhi_epi64(lo01, lo23);
      t[4 * q + 2] = _mm512_unpacklo_epi64(hi01, hi23);
      t[4 * q + 3] = _mm512_unpackhi_epi64(hi01, hi23);
    }
    // Then 128-bit blocks: column c + 4 b (b = block) gathers block b of t[c], t[4 + c], t[8 + c],
    // t[12 + c].
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512i even01 = _mm512_shuffle_i32x4(t[c], t[4 + c], 0x88),
                    odd01 = _mm512_shuffle_i32x4(t[c], t[4 + c], 0xdd);
      const __m512i even23 = _mm512_shuffle_i32x4(t[8 + c], t[12 + c], 0x88);
      const __m512i odd23 = _mm512_shuffle_i32x4(t[8 + c], t[12 + c], 0xdd);
      const __m512i col[4] = {_mm512_shuffle_i32x4(even01, even23, 0x88), _mm512_shuffle_i32x4(odd01, odd23, 0x88),
                              _mm512_shuffle_i32x4(even01, even23, 0xdd), _mm512_shuffle_i32x4(odd01, odd23, 0xdd)};
#pragma GCC unroll 4
      for (int b = 0; b < 4; ++b) {
        const std::int64_t g = g0 + c + 4 * b;
        if (g >= groups) continue;
        acc = _mm512_dpbusd_epi32(acc, ones, col[b]);
        _mm512_mask_storeu_epi32(dst + g * MR * 4, lanes, _mm512_xor_si512(col[b], offset));
      }
    }
  }
  alignas(64) std::int32_t all[16];
  _mm512_store_si512(all, acc);
  std::copy_n(all, mr, sums);
}
#endif

}  // namespace

void AlignedBytesFree::operator()(std::uint8_t* p) const { std::free(p); }

PackedInt8A::PackedInt8A(std::int64_t m, std::int64_t k, const std::int8_t* a, std::int64_t lda) { pack(m, k, a, lda); }

void PackedInt8A::pack(std::int64_t m, std::int64_t k, const std::int8_t* a, std::int64_t lda) {
  if (m < 0 || k < 0 || lda < k) throw std::invalid_argument("PackedInt8A: bad shape");
  m_ = m;
  k_ = k;
  k_groups_ = (k + 3) / 4;
  const std::int64_t panels = (m + MR - 1) / MR;
  const std::int64_t panel_bytes = k_groups_ * MR * 4;
  if (!data_ || std::size_t(panels * panel_bytes) > bytes_) {
    data_ = alloc_bytes(std::size_t(panels * panel_bytes));
    bytes_ = std::size_t(panels * panel_bytes);
  }
  if (!row_sums_ || std::size_t(std::max<std::int64_t>(1, m)) > sums_) {
    sums_ = std::size_t(std::max<std::int64_t>(1, m));
    row_sums_.reset(new std::int32_t[sums_]);
  }
#if QEVAL_HAVE_AVX512_VNNI
  parallel_panels(panels, panel_bytes, [&](std::int64_t p) {
    const int mr = int(std::min<std::int64_t>(MR, m - p * MR));
    pack_a_panel(a + p * MR * lda, lda, mr, k, data_.get() + p * panel_bytes, row_sums_.get() + p * MR);
  });
#else
  parallel_panels(panels, panel_bytes, [&](std::int64_t p) {
    std::uint8_t* dst = data_.get() + p * panel_bytes;
    std::memset(dst, 0x80, std::size_t(panel_bytes));  // the +128 code of 0
    for (int r = 0; r < MR && p * MR + r < m; ++r) {
      const std::int64_t i = p * MR + r;
      const std::int8_t* src = a + i * lda;
      std::int32_t sum = 0;
      for (std::int64_t q = 0; q < k; ++q) sum += src[q];
      row_sums_[std::size_t(i)] = sum;
      // Four bytes (one k group) at a time, offset by +128.
      const std::int64_t full = k / 4;
      for (std::int64_t g = 0; g < full; ++g) {
        std::uint32_t v;
        std::memcpy(&v, src + 4 * g, 4);
        v ^= 0x80808080u;
        std::memcpy(dst + g * MR * 4 + r * 4, &v, 4);
      }
      for (std::int64_t q = full * 4; q < k; ++q) dst[full * MR * 4 + r * 4 + q % 4] = std::uint8_t(src[q]) ^ 0x80;
    }
  });
#endif
}

PackedInt8B::PackedInt8B(std::int64_t k, std::int64_t n, const std::int8_t* b, std::int64_t ldb, bool trans)
    : k_(0), n_(0), k_groups_(0) {
  pack(k, n, b, ldb, trans);
}

void PackedInt8B::pack(std::int64_t k, std::int64_t n, const std::int8_t* b, std::int64_t ldb, bool trans) {
  if (k < 0 || n < 0 || ldb < (trans ? k : n)) throw std::invalid_argument("PackedInt8B: bad shape");
  reset(k, n, false);  // every panel byte and sum is written below
  const std::int64_t panels = (n + NR - 1) / NR;
  const std::int64_t panel_bytes = k_groups_ * NR * 4;
  parallel_panels(panels, panel_bytes, [&](std::int64_t p) {
    std::int8_t* dst = reinterpret_cast<std::int8_t*>(data_.get()) + p * panel_bytes;
    std::memset(dst, 0, std::size_t(panel_bytes));
    const std::int64_t j0 = p * NR;
    const int nr = int(std::min<std::int64_t>(NR, n - j0));
    std::int32_t sums[NR] = {};
    if (trans) {
      // Column j is a contiguous row of the given matrix: 4 bytes per k group.
      for (int j = 0; j < nr; ++j) {
        const std::int8_t* src = b + (j0 + j) * ldb;
        for (std::int64_t q = 0; q < k; ++q) {
          dst[(q / 4) * NR * 4 + j * 4 + q % 4] = src[q];
          sums[j] += src[q];
        }
      }
    } else {
      // Row by row: each k reads nr contiguous bytes.
      for (std::int64_t q = 0; q < k; ++q) {
        const std::int8_t* src = b + q * ldb + j0;
        std::int8_t* d = dst + (q / 4) * NR * 4 + q % 4;
        for (int j = 0; j < nr; ++j) {
          d[j * 4] = src[j];
          sums[j] += src[j];
        }
      }
    }
    for (int j = 0; j < NR; ++j) col_sums_[std::size_t(j0 + j)] = sums[j];
  });
}

PackedInt8B::PackedInt8B(std::int64_t k, std::int64_t n) : k_(0), n_(0), k_groups_(0) { reset(k, n); }

void PackedInt8B::reset(std::int64_t k, std::int64_t n, bool clear) {
  if (k < 0 || n < 0) throw std::invalid_argument("PackedInt8B: bad shape");
  k_ = k;
  n_ = n;
  k_groups_ = (k + 3) / 4;
  const std::int64_t panels = (n + NR - 1) / NR;
  const std::size_t bytes = std::size_t(panels * k_groups_ * NR * 4), sums = std::size_t(panels * NR);
  if (bytes > bytes_ || !data_) {
    data_ = alloc_bytes(bytes);
    bytes_ = bytes;
  }
  if (sums > sums_ || !col_sums_) {
    col_sums_.reset(new std::int32_t[std::max<std::size_t>(sums, 1)]);
    sums_ = sums;
  }
  if (!clear) return;
  std::memset(data_.get(), 0, bytes);
  std::fill_n(col_sums_.get(), sums, 0);
}

std::string_view int8_gemm_path_name(Int8GemmPath p) {
  return p == Int8GemmPath::kAvx512Vnni ? "avx512-vnni" : "portable";
}

bool int8_gemm_path_available(Int8GemmPath p) {
#if QEVAL_HAVE_AVX512_VNNI
  (void)p;
  return true;
#else
  return p == Int8GemmPath::kPortable;
#endif
}

Int8GemmPath int8_gemm_best_path() {
#if QEVAL_HAVE_AVX512_VNNI
  return Int8GemmPath::kAvx512Vnni;
#else
  return Int8GemmPath::kPortable;
#endif
}

namespace {

// The epilogue over rows [0, mr) and columns [0, nr) of a tile whose top-left element is (i0, j0)
// of C: c holds int32 sums and receives the floats in place.
void finish_tile(std::int32_t* c, std::int64_t ldc, std::int64_t mr, std::int64_t nr, std::int64_t i0, std::int64_t j0,
                 const Int8Epilogue& e) {
  for (std::int64_t r = 0; r < mr; ++r) {
    const std::int64_t i = i0 + r;
    const std::int32_t ra = e.row_add ? e.row_add[i] : 0;
    std::int32_t* cr = c + r * ldc;
    std::int64_t j = 0;
#if QEVAL_HAVE_AVX512_VNNI
    for (; j < nr; j += 16) {
      const __mmask16 mask = nr - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (nr - j)) - 1);
      const __m512 v = epilogue16(_mm512_maskz_loadu_epi32(mask, cr + j), i, j0 + j, mask, e);
      _mm512_mask_storeu_ps(reinterpret_cast<float*>(cr + j), mask, v);
    }
#endif
    for (; j < nr; ++j) {
      float v = float(cr[j] + ra + (e.col_add ? e.col_add[j0 + j] : 0));
      if (e.row_scale) v = v * e.row_scale[i];
      if (e.col_scale) v = v * e.col_scale[j0 + j];
      if (e.row_bias) v = v + e.row_bias[i];
      if (e.col_bias) v = v + e.col_bias[j0 + j];
      std::memcpy(cr + j, &v, sizeof v);
    }
  }
}

void gemm_impl(const PackedInt8A& a, const PackedInt8B& b, std::int32_t* c, std::int64_t ldc, Int8GemmPath path,
               const Int8Epilogue* e) {
  if (a.k() != b.k())
    throw std::invalid_argument("int8_gemm: A has k = " + std::to_string(a.k()) + ", B has " + std::to_string(b.k()));
  if (!int8_gemm_path_available(path)) throw std::invalid_argument("int8_gemm: path not available in this build");
  const std::int64_t m = a.m(), n = b.n(), groups = a.k_groups();
  if (m == 0 || n == 0) return;
  if (groups == 0) {
    for (std::int64_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0);
    if (e) finish_tile(c, ldc, m, n, 0, 0, *e);
    return;
  }
  const std::int64_t mb = (m + kMcRows - 1) / kMcRows, nb = (n + kNcCols - 1) / kNcCols;
  auto task = [&](std::int64_t t) {
    const std::int64_t i_begin = (t / nb) * kMcRows, i_end = std::min(m, i_begin + kMcRows);
    const std::int64_t j_begin = (t % nb) * kNcCols, j_end = std::min(n, j_begin + kNcCols);
    for (std::int64_t g0 = 0; g0 < groups; g0 += kKcGroups) {
      const std::int64_t gn = std::min(kKcGroups, groups - g0);
      for (std::int64_t j = j_begin; j < j_end; j += NR) {
        const std::int8_t* pb = b.panel(j) + g0 * NR * 4;
        const int nr = int(std::min<std::int64_t>(NR, j_end - j));
        for (std::int64_t i = i_begin; i < i_end; i += MR) {
          const std::uint8_t* pa = a.panel(i) + g0 * MR * 4;
          const int mr = int(std::min<std::int64_t>(MR, i_end - i));
          std::int32_t* ct = c + i * ldc + j;
          const bool last = g0 + gn == groups;
#if QEVAL_HAVE_AVX512_VNNI
          if (path == Int8GemmPath::kAvx512Vnni) {
            kernel_vnni_rows(gn, pa, pb, ct, ldc, mr, nr, g0 == 0, b.col_sums() + j, last ? e : nullptr, i, j);
            continue;
          }
#endif
          kernel_portable(gn, pa, pb, ct, ldc, mr, nr, g0 == 0);
          if (e && last) finish_tile(ct, ldc, mr, nr, i, j, *e);
        }
      }
    }
  };
  const std::int64_t tasks = mb * nb;
  // One thread (`--threads 1`): the tasks in turn, without a parallel loop's scheduling per call.
  if (tasks == 1 || double(m) * double(n) * double(groups) < 32768.0 || worker_threads() == 1) {
    for (std::int64_t t = 0; t < tasks; ++t) task(t);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, tasks, 1), [&](const tbb::blocked_range<std::int64_t>& r) {
    for (std::int64_t t = r.begin(); t < r.end(); ++t) task(t);
  });
}

}  // namespace

void int8_gemm(const PackedInt8A& a, const PackedInt8B& b, std::int32_t* c, std::int64_t ldc, Int8GemmPath path) {
  gemm_impl(a, b, c, ldc, path, nullptr);
}

void int8_gemm(const PackedInt8A& a, const PackedInt8B& b, float* out, std::int64_t ldo, const Int8Epilogue& e,
               Int8GemmPath path) {
  gemm_impl(a, b, reinterpret_cast<std::int32_t*>(out), ldo, path, &e);
}

void int8_epilogue(std::int32_t* c, std::int64_t m, std::int64_t n, std::int64_t ld, const Int8Epilogue& e) {
  finish_tile(c, ld, m, n, 0, 0, e);
}

Int8Epilogue Int8Epilogue::rows_from(std::int64_t r0) const {
  Int8Epilogue e = *this;
  if (e.row_add) e.row_add += r0;
  if (e.row_scale) e.row_scale += r0;
  if (e.row_bias) e.row_bias += r0;
  return e;
}

void int8_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const std::int8_t* a, std::int64_t lda,
               const std::int8_t* b, std::int64_t ldb, std::int32_t* c, std::int64_t ldc, Int8GemmPath path) {
  const PackedInt8A pa(m, k, a, lda);
  const PackedInt8B pb(k, n, b, ldb);
  int8_gemm(pa, pb, c, ldc, path);
}

void int8_gemm_reference(std::int64_t m, std::int64_t n, std::int64_t k, const std::int8_t* a, std::int64_t lda,
                         const std::int8_t* b, std::int64_t ldb, std::int32_t* c, std::int64_t ldc) {
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      std::int32_t s = 0;
      for (std::int64_t p = 0; p < k; ++p) s += std::int32_t(a[i * lda + p]) * std::int32_t(b[p * ldb + j]);
      c[i * ldc + j] = s;
    }
}

}  // namespace qeval::kernels
