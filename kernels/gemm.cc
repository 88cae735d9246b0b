// GEMM kernels: the reference loops, operand packing, the 14x32 register-blocked micro-kernel
// (GCC vector extensions: AVX-512 where the target has it), cache blocking and TBB threading.
#include "kernels/gemm.h"

#include "kernels/numeric.h"
#include "kernels/scratch.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <array>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace qeval::kernels {
namespace {

typedef float V __attribute__((vector_size(64)));
// C rows are not aligned; packed panels are (64-byte buffers, panel sizes multiples of 64 bytes).
typedef float VU __attribute__((vector_size(64), aligned(4)));
constexpr int kLanes = 16;
constexpr int MR = kGemmMR, NR = kGemmNR, KC = kGemmKC, MC = kGemmMC;
constexpr int NV = NR / kLanes;
static_assert(NR % kLanes == 0, "NR must be a whole number of vectors");

// Below this many multiply-adds the packing and task overhead outweighs the fast kernel.
constexpr std::int64_t kSmallGemmMacs = 24 * 24 * 24;

// C_tile = alpha * acc + beta * C_tile over R full rows of a W-vector tile, beta == 0 meaning
// "do not read C". The edge path runs the same code on a copy of the tile, so an element's value
// never depends on whether it sat in an edge tile. alpha == 1 skips the multiply (1 * x == x for
// every float, NaN included: the same bits).
template <int R, int W>
inline void store_tile(V (&acc)[R][W], float* c, std::int64_t ldc, float alpha, float beta) {
  if (beta == 0.0f && alpha == 1.0f) {
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < W; ++v) *reinterpret_cast<VU*>(c + i * ldc + v * kLanes) = acc[i][v];
  } else if (beta == 0.0f) {
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < W; ++v) *reinterpret_cast<VU*>(c + i * ldc + v * kLanes) = alpha * acc[i][v];
  } else if (beta == 1.0f && alpha == 1.0f) {
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < W; ++v) {
        VU* dst = reinterpret_cast<VU*>(c + i * ldc + v * kLanes);
        *dst = *dst + acc[i][v];
      }
  } else if (beta == 1.0f) {
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < W; ++v) {
        VU* dst = reinterpret_cast<VU*>(c + i * ldc + v * kLanes);
        *dst = *dst + alpha * acc[i][v];
      }
  } else {
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < W; ++v) {
        VU* dst = reinterpret_cast<VU*>(c + i * ldc + v * kLanes);
        *dst = beta * *dst + alpha * acc[i][v];
      }
  }
}

// acc = the first R rows of an A panel (kc x MR, row r of the panel = k index) times the first W
// vectors of a B panel (kc x NR); then stores. Every element is a sequential sum over k starting
// from zero, the same operations whatever R and W: edge panels with fewer rows (R = mr) or at most
// one vector of columns (W = 1, e.g. attention's P x V with 16-wide heads) skip the zero rows' and
// columns' work and give the bits the full kernel would.
template <int R, int W>
void micro_kernel(std::int64_t kc, const float* __restrict pa, const float* __restrict pb, float* c, std::int64_t ldc,
                  int nr, float alpha, float beta) {
  V acc[R][W];
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < W; ++v) acc[i][v] = V{};
  for (std::int64_t p = 0; p < kc; ++p) {
    V b[W];
#pragma GCC unroll 4
    for (int v = 0; v < W; ++v) b[v] = *reinterpret_cast<const V*>(pb + v * kLanes);
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const float ai = pa[i];
#pragma GCC unroll 4
      for (int v = 0; v < W; ++v) acc[i][v] += ai * b[v];
    }
    pa += MR;
    pb += NR;
  }
  constexpr int kCols = W * kLanes;
  if (nr == kCols) {
    store_tile<R, W>(acc, c, ldc, alpha, beta);
    return;
  }
  alignas(64) float tile[R * kCols];
  if (beta != 0.0f) {
    std::fill(tile, tile + R * kCols, 0.0f);
    for (int i = 0; i < R; ++i) std::memcpy(tile + i * kCols, c + i * ldc, sizeof(float) * std::size_t(nr));
  }
  store_tile<R, W>(acc, tile, kCols, alpha, beta);
  for (int i = 0; i < R; ++i) std::memcpy(c + i * ldc, tile + i * kCols, sizeof(float) * std::size_t(nr));
}

using MicroKernel = void (*)(std::int64_t, const float*, const float*, float*, std::int64_t, int, float, float);

template <int W, int... Rs>
constexpr std::array<MicroKernel, sizeof...(Rs)> micro_kernels(std::integer_sequence<int, Rs...>) {
  return {&micro_kernel<Rs + 1, W>...};
}
// kMicroKernels[w - 1][mr - 1] = micro_kernel<mr, w> for mr = 1 .. MR, w = 1 (nr <= 16) or NV.
constexpr std::array<std::array<MicroKernel, MR>, 2> kMicroKernels = {
    micro_kernels<1>(std::make_integer_sequence<int, MR>{}), micro_kernels<NV>(std::make_integer_sequence<int, MR>{})};
static_assert(NV == 2, "kMicroKernels holds the one- and two-vector kernels");

// out[j][i] = in[i][j] for a 16 x 16 tile, in four rounds of two-source shuffles (unpack 32-bit,
// unpack 64-bit, swap 128-bit lanes, swap 256-bit halves).
inline void transpose16(const V (&in)[16], V (&out)[16]) {
  // __builtin_shufflevector (constant indices into the 32-element concatenation) is GCC 12's and
  // clang's spelling; the fuzz build uses clang.
  V t[16], u[16];
  for (int p = 0; p < 8; ++p) {
    t[2 * p] =
        __builtin_shufflevector(in[2 * p], in[2 * p + 1], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29);
    t[2 * p + 1] =
        __builtin_shufflevector(in[2 * p], in[2 * p + 1], 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
  }
#define QEVAL_LO64 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define QEVAL_HI64 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define QEVAL_EVEN128 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27
#define QEVAL_ODD128 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define QEVAL_LO256 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define QEVAL_HI256 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
  // u[4q + c], lane L: column c + 4L of rows 4q .. 4q + 3.
  for (int q = 0; q < 4; ++q) {
    u[4 * q] = __builtin_shufflevector(t[4 * q], t[4 * q + 2], QEVAL_LO64);
    u[4 * q + 1] = __builtin_shufflevector(t[4 * q], t[4 * q + 2], QEVAL_HI64);
    u[4 * q + 2] = __builtin_shufflevector(t[4 * q + 1], t[4 * q + 3], QEVAL_LO64);
    u[4 * q + 3] = __builtin_shufflevector(t[4 * q + 1], t[4 * q + 3], QEVAL_HI64);
  }
  for (int c = 0; c < 4; ++c) {
    const V va = __builtin_shufflevector(u[c], u[4 + c], QEVAL_EVEN128);
    const V vb = __builtin_shufflevector(u[c], u[4 + c], QEVAL_ODD128);
    const V wa = __builtin_shufflevector(u[8 + c], u[12 + c], QEVAL_EVEN128);
    const V wb = __builtin_shufflevector(u[8 + c], u[12 + c], QEVAL_ODD128);
    out[c] = __builtin_shufflevector(va, wa, QEVAL_LO256);
    out[c + 8] = __builtin_shufflevector(va, wa, QEVAL_HI256);
    out[c + 4] = __builtin_shufflevector(vb, wb, QEVAL_LO256);
    out[c + 12] = __builtin_shufflevector(vb, wb, QEVAL_HI256);
  }
#undef QEVAL_LO64
#undef QEVAL_HI64
#undef QEVAL_EVEN128
#undef QEVAL_ODD128
#undef QEVAL_LO256
#undef QEVAL_HI256
}

// Rows [r0, r0 + 16) of a 16-column block: one vector per row, zero past `rows`.
inline void load_rows16(const float* src, std::int64_t ld, int r0, int rows, V (&tile)[16]) {
  for (int r = 0; r < 16; ++r) tile[r] = r0 + r < rows ? V(*reinterpret_cast<const VU*>(src + (r0 + r) * ld)) : V{};
}

// dst[kk * R + r] = src[r * ld + kk] for kk < kc, r < rows (zero for rows <= r < R): R source
// rows interleaved into a panel (R is MR or NR). Full 16-column blocks go through register
// transposes, reading one cache line per row; reading the R rows element by element instead
// thrashes L1 when ld is a power of two (all rows map to the same cache sets).
template <int R>
void interleave_rows(const float* src, std::int64_t ld, int rows, std::int64_t kc, float* dst) {
  static_assert(R <= 16 || R % 16 == 0, "panel heights: at most one vector, or whole vectors");
  std::int64_t kb = 0;
  for (; kb + 16 <= kc; kb += 16) {
    float* out = dst + kb * R;
    V tile[16], cols[16];
    for (int r0 = 0; r0 < R; r0 += 16) {
      load_rows16(src + kb, ld, r0, rows, tile);
      transpose16(tile, cols);
      if constexpr (R % 16 == 0) {
        for (int kk = 0; kk < 16; ++kk) *reinterpret_cast<VU*>(out + kk * R + r0) = cols[kk];
      } else {
        // Rows of R < 16 floats: each 16-float store spills into the next row, which the next
        // store overwrites; the last row is stored exactly.
        for (int kk = 0; kk < 15; ++kk) *reinterpret_cast<VU*>(out + kk * R) = cols[kk];
        std::memcpy(out + 15 * R, &cols[15], sizeof(float) * R);
      }
    }
  }
  for (; kb < kc; ++kb)
    for (int r = 0; r < R; ++r) dst[kb * R + r] = r < rows ? src[r * ld + kb] : 0.0f;
}

// Rows [i0, i0 + mc) and k range [k0, k0 + kc) of op(A) into MR-row panels (zero rows past mc).
void pack_a(bool trans, const float* a, std::int64_t lda, std::int64_t i0, std::int64_t mc, std::int64_t k0,
            std::int64_t kc, float* dst) {
  for (std::int64_t ip = 0; ip < mc; ip += MR) {
    const int rows = int(std::min<std::int64_t>(MR, mc - ip));
    float* d = dst + (ip / MR) * kc * MR;
    if (!trans) {
      interleave_rows<MR>(a + (i0 + ip) * lda + k0, lda, rows, kc, d);
    } else {
      for (std::int64_t kk = 0; kk < kc; ++kk) {
        const float* src = a + (k0 + kk) * lda + i0 + ip;
        float* row = d + kk * MR;
        for (int r = 0; r < rows; ++r) row[r] = src[r];
        for (int r = rows; r < MR; ++r) row[r] = 0.0f;
      }
    }
  }
}

// k range [k0, k0 + kc) and columns [n0, n0 + nc) of op(B) into NR-column panels (zero past nc).
void pack_b(bool trans, const float* b, std::int64_t ldb, std::int64_t k0, std::int64_t kc, std::int64_t n0,
            std::int64_t nc, float* dst) {
  for (std::int64_t jp = 0; jp < nc; jp += NR) {
    const int cols = int(std::min<std::int64_t>(NR, nc - jp));
    float* d = dst + (jp / NR) * kc * NR;
    if (!trans) {
      for (std::int64_t kk = 0; kk < kc; ++kk) {
        const float* src = b + (k0 + kk) * ldb + n0 + jp;
        float* row = d + kk * NR;
        if (cols == NR) {
          std::memcpy(row, src, sizeof(float) * NR);
        } else {
          for (int j = 0; j < cols; ++j) row[j] = src[j];
          for (int j = cols; j < NR; ++j) row[j] = 0.0f;
        }
      }
    } else {
      interleave_rows<NR>(b + (n0 + jp) * ldb + k0, ldb, cols, kc, d);
    }
  }
}

// C = beta * C for k == 0 (beta == 0 writes zeros without reading C).
void scale_c(std::int64_t m, std::int64_t n, float beta, float* c, std::int64_t ldc) {
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
}

// The split of C into tasks: row blocks of MC and column chunks (multiples of NR), fine enough to
// keep every thread busy. Any split gives the same bits: only the k blocking fixes the sums.
struct TaskGrid {
  std::int64_t m_blocks, n_chunk, n_chunks;
};

TaskGrid task_grid(std::int64_t m, std::int64_t n, std::int64_t batch) {
  TaskGrid g;
  g.m_blocks = (m + MC - 1) / MC;
  g.n_chunk = round_up(n, NR);
  const std::int64_t want = 4 * std::int64_t(tbb::this_task_arena::max_concurrency());
  while (batch * g.m_blocks * ((n + g.n_chunk - 1) / g.n_chunk) < want && g.n_chunk > 4 * NR)
    g.n_chunk = round_up(g.n_chunk / 2, NR);
  g.n_chunks = (n + g.n_chunk - 1) / g.n_chunk;
  return g;
}

// One task: rows [i0, i0 + mc) by columns [j0, j0 + nc) of one product, over all of k. A comes
// prepacked (pa) or is packed block by block into a_buf.
void run_task(const GemmShape& s, float alpha, const float* a, const PackedA* pa, const PackedB& pb, float beta,
              float* c, std::int64_t i0, std::int64_t mc, std::int64_t j0, std::int64_t nc, float* a_buf,
              float* b_buf) {
  for (std::int64_t k0 = 0; k0 < s.k; k0 += KC) {
    const std::int64_t kc = std::min<std::int64_t>(KC, s.k - k0);
    const float* a_panels = a_buf;
    if (pa) a_panels = pa->block(i0, k0, mc, a_buf);  // (a_buf is free when A comes packed)
    else pack_a(s.trans_a, a, s.lda, i0, mc, k0, kc, a_buf);
    gemm_packed_block(mc, nc, kc, a_panels, pb.block(j0, k0, nc, b_buf), alpha, k0 == 0 ? beta : 1.0f,
                      c + i0 * s.ldc + j0, s.ldc);
  }
}

// At most this many rows of C go through few_rows: packing B would cost more than the product.
constexpr std::int64_t kFewRows = 4;

// Columns [j0, j0 + nc) of C for R rows (R <= kFewRows) against B as stored, not transposed:
// R x 64 accumulators in registers, each B row segment loaded once for all R rows.
template <int R>
void few_rows_block(const GemmShape& s, float alpha, const float* a_rows, const float* b, float beta, float* c,
                    std::int64_t j0, std::int64_t nc) {
  constexpr int W = 4;  // vectors per row of the register tile
  std::int64_t j = j0;
  for (; j + W * kLanes <= j0 + nc; j += W * kLanes) {
    V acc[R][W];
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < W; ++v) acc[i][v] = V{};
    for (std::int64_t p = 0; p < s.k; ++p) {
      const float* brow = b + p * s.ldb + j;
      V bv[W];
#pragma GCC unroll 4
      for (int v = 0; v < W; ++v) bv[v] = *reinterpret_cast<const VU*>(brow + v * kLanes);
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) {
        const float aip = a_rows[i * s.k + p];
#pragma GCC unroll 4
        for (int v = 0; v < W; ++v) acc[i][v] += aip * bv[v];
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < W; ++v) {
        VU* dst = reinterpret_cast<VU*>(c + i * s.ldc + j + v * kLanes);
        *dst = beta == 0.0f ? alpha * acc[i][v] : beta * *dst + alpha * acc[i][v];
      }
  }
  for (; j < j0 + nc; ++j)
    for (int i = 0; i < R; ++i) {
      float acc = 0.0f;
      for (std::int64_t p = 0; p < s.k; ++p) acc += a_rows[i * s.k + p] * b[p * s.ldb + j];
      float& dst = c[i * s.ldc + j];
      dst = beta == 0.0f ? alpha * acc : beta * dst + alpha * acc;
    }
}

// dot(x, y) over n floats: 4 vector partial sums (latency), then a fixed-order reduction.
float dot(const float* x, const float* y, std::int64_t n) {
  V acc[4] = {V{}, V{}, V{}, V{}};
  std::int64_t p = 0;
  for (; p + 4 * kLanes <= n; p += 4 * kLanes)
    for (int u = 0; u < 4; ++u)
      acc[u] += *reinterpret_cast<const VU*>(x + p + u * kLanes) * *reinterpret_cast<const VU*>(y + p + u * kLanes);
  for (; p + kLanes <= n; p += kLanes)
    acc[0] += *reinterpret_cast<const VU*>(x + p) * *reinterpret_cast<const VU*>(y + p);
  const V v = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  float sum = 0.0f;
  for (int l = 0; l < kLanes; ++l) sum += v[l];
  for (; p < n; ++p) sum += x[p] * y[p];
  return sum;
}

// C for m <= kFewRows straight from the unpacked operands, parallel over column chunks (each
// element is computed by one task in a fixed order).
void few_rows(const GemmShape& s, float alpha, const float* a, const float* b, float beta, float* c) {
  // op(A)'s rows, contiguous.
  std::vector<float> a_rows(static_cast<std::size_t>(s.m * s.k));
  for (std::int64_t i = 0; i < s.m; ++i)
    for (std::int64_t p = 0; p < s.k; ++p)
      a_rows[std::size_t(i * s.k + p)] = s.trans_a ? a[p * s.lda + i] : a[i * s.lda + p];
  constexpr std::int64_t kChunk = 256;
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, (s.n + kChunk - 1) / kChunk), [&](const auto& r) {
    for (std::int64_t t = r.begin(); t < r.end(); ++t) {
      const std::int64_t j0 = t * kChunk, nc = std::min(kChunk, s.n - j0);
      if (s.trans_b) {
        for (std::int64_t j = j0; j < j0 + nc; ++j)
          for (std::int64_t i = 0; i < s.m; ++i) {
            const float acc = dot(a_rows.data() + i * s.k, b + j * s.ldb, s.k);
            float& dst = c[i * s.ldc + j];
            dst = beta == 0.0f ? alpha * acc : beta * dst + alpha * acc;
          }
        continue;
      }
      switch (s.m) {
        case 1: few_rows_block<1>(s, alpha, a_rows.data(), b, beta, c, j0, nc); break;
        case 2: few_rows_block<2>(s, alpha, a_rows.data(), b, beta, c, j0, nc); break;
        case 3: few_rows_block<3>(s, alpha, a_rows.data(), b, beta, c, j0, nc); break;
        default: few_rows_block<4>(s, alpha, a_rows.data(), b, beta, c, j0, nc); break;
      }
    }
  });
}

// C for products below kSmallGemmMacs with B not transposed: per row of C, W vectors of columns
// accumulate a[i][p] * b[p][j] over p in order in registers (each element a sequential sum from
// zero); leftover columns one at a time in the same order. No packing, no allocation.
template <int W>
inline void small_row_block(const GemmShape& s, float alpha, const float* a, const float* b, float beta, float* c,
                            std::int64_t i, std::int64_t j) {
  V acc[W];
  for (int v = 0; v < W; ++v) acc[v] = V{};
  for (std::int64_t p = 0; p < s.k; ++p) {
    const float aip = s.trans_a ? a[p * s.lda + i] : a[i * s.lda + p];
    const float* brow = b + p * s.ldb + j;
    for (int v = 0; v < W; ++v) acc[v] += aip * *reinterpret_cast<const VU*>(brow + v * kLanes);
  }
  for (int v = 0; v < W; ++v) {
    VU* dst = reinterpret_cast<VU*>(c + i * s.ldc + j + v * kLanes);
    *dst = beta == 0.0f ? alpha * acc[v] : alpha * acc[v] + beta * *dst;
  }
}

void small_gemm(const GemmShape& s, float alpha, const float* a, const float* b, float beta, float* c) {
  for (std::int64_t i = 0; i < s.m; ++i) {
    std::int64_t j = 0;
    for (; j + 4 * kLanes <= s.n; j += 4 * kLanes) small_row_block<4>(s, alpha, a, b, beta, c, i, j);
    for (; j + kLanes <= s.n; j += kLanes) small_row_block<1>(s, alpha, a, b, beta, c, i, j);
    for (; j < s.n; ++j) {
      float acc = 0.0f;
      for (std::int64_t p = 0; p < s.k; ++p)
        acc += (s.trans_a ? a[p * s.lda + i] : a[i * s.lda + p]) * b[p * s.ldb + j];
      float& dst = c[i * s.ldc + j];
      dst = beta == 0.0f ? alpha * acc : alpha * acc + beta * dst;
    }
  }
}

void check_shape(const GemmShape& s) {
  if (s.m < 0 || s.n < 0 || s.k < 0) throw std::invalid_argument("sgemm: negative dimension");
}

void check_packed(const GemmShape& s, const PackedA* pa, const PackedB* pb) {
  if (pa && (pa->trans() != s.trans_a || pa->m() != s.m || pa->k() != s.k))
    throw std::invalid_argument("sgemm: packed A is " + std::to_string(pa->m()) + "x" + std::to_string(pa->k()) +
                                ", the product needs " + std::to_string(s.m) + "x" + std::to_string(s.k));
  if (pb && (pb->trans() != s.trans_b || pb->k() != s.k || pb->n() != s.n))
    throw std::invalid_argument("sgemm: packed B is " + std::to_string(pb->k()) + "x" + std::to_string(pb->n()) +
                                ", the product needs " + std::to_string(s.k) + "x" + std::to_string(s.n));
}

// The packed path for `batch` products: B operands packed once per distinct pointer run (or
// prepacked), then tasks over (entry, row block, column chunk), each packing its own A blocks
// (unless A is prepacked, for batch 1).
void run_packed(const GemmShape& s, std::int64_t batch, float alpha, const float* const* a, const float* const* b,
                float beta, float* const* c, const PackedA* prepacked_a = nullptr,
                const PackedB* prepacked_b = nullptr) {
  if (batch <= 0 || s.m == 0 || s.n == 0) return;
  if (s.k == 0) {
    for (std::int64_t e = 0; e < batch; ++e) scale_c(s.m, s.n, beta, c[e], s.ldc);
    return;
  }
  std::vector<std::int64_t> b_index(static_cast<std::size_t>(batch));
  std::vector<std::int64_t> b_first;
  for (std::int64_t e = 0; e < batch; ++e) {
    if (e == 0 || b[e] != b[e - 1]) b_first.push_back(e);
    b_index[std::size_t(e)] = std::int64_t(b_first.size()) - 1;
  }
  std::vector<PackedB> packed(prepacked_b ? 0 : b_first.size());
  tbb::parallel_for(std::size_t(0), packed.size(),
                    [&](std::size_t u) { packed[u] = PackedB(s.trans_b, s.k, s.n, b[b_first[u]], s.ldb); });
  const TaskGrid g = task_grid(s.m, s.n, batch);
  const std::int64_t per = g.m_blocks * g.n_chunks;
  tbb::parallel_for(
      tbb::blocked_range<std::int64_t>(0, batch * per, 1),
      [&](const auto& r) {
        float* a_buf = thread_scratch(ScratchSlot::kGemmA, std::size_t(MC) * KC);
        // float16 panels of a prepacked B are widened a task's block at a time.
        float* b_buf = prepacked_b && prepacked_b->half()
                           ? thread_scratch(ScratchSlot::kGemmB, std::size_t(packed_b_floats(KC, g.n_chunk)))
                           : nullptr;
        for (std::int64_t t = r.begin(); t < r.end(); ++t) {
          const std::int64_t e = t / per, tt = t % per;
          const std::int64_t i0 = (tt / g.n_chunks) * MC, j0 = (tt % g.n_chunks) * g.n_chunk;
          run_task(s, alpha, a[e], prepacked_a,
                   prepacked_b ? *prepacked_b : packed[std::size_t(b_index[std::size_t(e)])], beta, c[e], i0,
                   std::min<std::int64_t>(MC, s.m - i0), j0, std::min<std::int64_t>(g.n_chunk, s.n - j0), a_buf,
                   b_buf);
        }
      },
      tbb::simple_partitioner());
}

}  // namespace

void AlignedFloatsFree::operator()(float* p) const { std::free(p); }

AlignedFloats alloc_aligned_floats(std::size_t n) {
  const std::size_t bytes = std::max<std::size_t>(64, (n * sizeof(float) + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw std::bad_alloc();
  return AlignedFloats(static_cast<float*>(p));
}

void gemm_packed_block(std::int64_t mc, std::int64_t nc, std::int64_t kc, const float* a_panels, const float* b_panels,
                       float alpha, float beta, float* c, std::int64_t ldc) {
  // B micro-panel (kc x NR) stays in L1 while the A panels of the block stream from L2.
  for (std::int64_t jr = 0; jr < nc; jr += NR) {
    const int nr = int(std::min<std::int64_t>(NR, nc - jr));
    const float* bp = b_panels + (jr / NR) * kc * NR;
    const auto& kernels = kMicroKernels[nr > kLanes ? 1 : 0];
    for (std::int64_t ir = 0; ir < mc; ir += MR) {
      const int mr = int(std::min<std::int64_t>(MR, mc - ir));
      kernels[std::size_t(mr - 1)](kc, a_panels + (ir / MR) * kc * MR, bp, c + ir * ldc + jr, ldc, nr, alpha, beta);
    }
  }
}

void pack_a_panels(bool trans, const float* a, std::int64_t lda, std::int64_t i0, std::int64_t mc, std::int64_t k0,
                   std::int64_t kc, float* dst) {
  pack_a(trans, a, lda, i0, mc, k0, kc, dst);
}

void PackedB::pack(bool trans, std::int64_t k, std::int64_t n, const float* b, std::int64_t ldb) {
  half_.codes.reset();
  trans_ = trans;
  k_ = k;
  n_ = n;
  n_padded_ = round_up(n, NR);
  const std::size_t need = std::size_t(std::max<std::int64_t>(1, k * n_padded_));
  if (need > capacity_) {
    data_ = alloc_aligned_floats(need);
    capacity_ = need;
  }
  const std::int64_t panels = n_padded_ / NR;
  // Chunks of 8 panels (256 columns) keep a task's source rows contiguous enough to stream.
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, (panels + 7) / 8), [&](const auto& r) {
    for (std::int64_t chunk = r.begin(); chunk < r.end(); ++chunk) {
      const std::int64_t j0 = chunk * 8 * NR, nc = std::min<std::int64_t>(8 * NR, n - j0);
      for (std::int64_t k0 = 0; k0 < k; k0 += KC)
        pack_b(trans, b, ldb, k0, std::min<std::int64_t>(KC, k - k0), j0, nc, const_cast<float*>(block(j0, k0)));
    }
  });
}

PackedB::PackedB(bool trans, std::int64_t k, std::int64_t n, const float* b, std::int64_t ldb, PanelStorage storage) {
  pack(trans, k, n, b, ldb);
  if (storage == PanelStorage::kFloat16IfExact && half_.take(data_, std::size_t(k * n_padded_))) capacity_ = 0;
}

std::int64_t PackedB::offset(std::int64_t j0, std::int64_t k0) const {
  const std::int64_t kc = std::min<std::int64_t>(KC, k_ - k0);
  return k0 * n_padded_ + (j0 / NR) * kc * NR;
}

const float* PackedB::block(std::int64_t j0, std::int64_t k0) const { return data_.get() + offset(j0, k0); }

const float* PackedB::block(std::int64_t j0, std::int64_t k0, std::int64_t cols, float* scratch) const {
  if (!half()) return block(j0, k0);
  return half_.widen(offset(j0, k0), std::min<std::int64_t>(KC, k_ - k0) * round_up(cols, NR), scratch);
}

PackedA::PackedA(bool trans, std::int64_t m, std::int64_t k, const float* a, std::int64_t lda, PanelStorage storage)
    : trans_(trans), m_(m), k_(k), m_padded_(round_up(m, MR)) {
  data_ = alloc_aligned_floats(std::size_t(std::max<std::int64_t>(1, m_padded_ * k)));
  const std::int64_t k_blocks = (k + KC - 1) / KC, m_blocks = (m + MC - 1) / MC;
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, k_blocks * m_blocks), [&](const auto& r) {
    for (std::int64_t t = r.begin(); t < r.end(); ++t) {
      const std::int64_t k0 = (t / m_blocks) * KC, i0 = (t % m_blocks) * MC;
      pack_a(trans, a, lda, i0, std::min<std::int64_t>(MC, m - i0), k0, std::min<std::int64_t>(KC, k - k0),
             float_block(i0, k0));
    }
  });
  if (storage == PanelStorage::kFloat16IfExact) half_.take(data_, std::size_t(m_padded_ * k));
}

std::int64_t PackedA::offset(std::int64_t i0, std::int64_t k0) const {
  const std::int64_t kc = std::min<std::int64_t>(KC, k_ - k0);
  return k0 * m_padded_ + (i0 / MR) * kc * MR;
}

float* PackedA::float_block(std::int64_t i0, std::int64_t k0) const { return data_.get() + offset(i0, k0); }

const float* PackedA::block(std::int64_t i0, std::int64_t k0, std::int64_t rows, float* scratch) const {
  if (!half()) return float_block(i0, k0);
  return half_.widen(offset(i0, k0), std::min<std::int64_t>(KC, k_ - k0) * round_up(rows, MR), scratch);
}

void HalfPanels::Free::operator()(std::uint16_t* p) const { std::free(p); }

bool HalfPanels::take(AlignedFloats& floats, std::size_t n) {
  void* p = std::aligned_alloc(64, std::max<std::size_t>(64, (n * 2 + 63) / 64 * 64));
  if (!p) throw std::bad_alloc();
  std::unique_ptr<std::uint16_t[], Free> h(static_cast<std::uint16_t*>(p));
  // In parallel chunks (a weight can hold tens of millions of values); any inexact one keeps floats.
  std::atomic<bool> exact{true};
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, std::size_t(1) << 16), [&](const auto& r) {
    if (exact.load(std::memory_order_relaxed) &&
        !narrow_to_float16_exact(floats.get() + r.begin(), h.get() + r.begin(), r.size()))
      exact.store(false, std::memory_order_relaxed);
  });
  if (!exact.load()) return false;
  codes = std::move(h);
  floats.reset();
  return true;
}

const float* HalfPanels::widen(std::int64_t offset, std::int64_t n, float* scratch) const {
  widen_float16(codes.get() + offset, scratch, std::size_t(n));
  return scratch;
}

void sgemm_reference(const GemmShape& s, float alpha, const float* a, const float* b, float beta, float* c) {
  check_shape(s);
  std::vector<float> acc(std::size_t(s.n));
  for (std::int64_t i = 0; i < s.m; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (std::int64_t p = 0; p < s.k; ++p) {
      const float aip = s.trans_a ? a[p * s.lda + i] : a[i * s.lda + p];
      if (!s.trans_b) {
        const float* brow = b + p * s.ldb;
        for (std::int64_t j = 0; j < s.n; ++j) acc[std::size_t(j)] += aip * brow[j];
      } else {
        for (std::int64_t j = 0; j < s.n; ++j) acc[std::size_t(j)] += aip * b[j * s.ldb + p];
      }
    }
    float* crow = c + i * s.ldc;
    for (std::int64_t j = 0; j < s.n; ++j)
      crow[j] = beta == 0.0f ? alpha * acc[std::size_t(j)] : alpha * acc[std::size_t(j)] + beta * crow[j];
  }
}

void sgemm_packed(const GemmShape& s, float alpha, const float* a, const float* b, float beta, float* c) {
  check_shape(s);
  run_packed(s, 1, alpha, &a, &b, beta, &c);
}

bool sgemm_uses_packing(const GemmShape& s) { return s.m * s.n * s.k > kSmallGemmMacs && s.m > kFewRows; }

void sgemm(const GemmShape& s, float alpha, const float* a, const float* b, float beta, float* c,
           const PackedA* packed_a, const PackedB* packed_b) {
  check_shape(s);
  if (s.m * s.n * s.k <= kSmallGemmMacs)
    return s.trans_b ? sgemm_reference(s, alpha, a, b, beta, c) : small_gemm(s, alpha, a, b, beta, c);
  if (s.m <= kFewRows) return few_rows(s, alpha, a, b, beta, c);
  check_packed(s, packed_a, packed_b);
  run_packed(s, 1, alpha, &a, &b, beta, &c, packed_a, packed_b);
}

void sgemm_few_rows(const GemmShape& s, float alpha, const float* a, const float* b, float beta, float* c) {
  check_shape(s);
  if (s.m > kFewRows)
    throw std::invalid_argument("sgemm_few_rows: m " + std::to_string(s.m) + " > " + std::to_string(kFewRows));
  if (s.m == 0 || s.n == 0) return;
  few_rows(s, alpha, a, b, beta, c);
}

void sgemm_batched_reference(const GemmShape& s, std::int64_t batch, float alpha, const float* const* a,
                             const float* const* b, float beta, float* const* c) {
  for (std::int64_t i = 0; i < batch; ++i) sgemm_reference(s, alpha, a[i], b[i], beta, c[i]);
}

void sgemm_batched(const GemmShape& s, std::int64_t batch, float alpha, const float* const* a, const float* const* b,
                   float beta, float* const* c, const PackedB* packed_b) {
  check_shape(s);
  if (batch <= 0 || s.m == 0 || s.n == 0) return;
  if (batch == 1) return sgemm(s, alpha, a[0], b[0], beta, c[0], nullptr, packed_b);
  if (s.m * s.n * s.k <= kSmallGemmMacs || s.m <= kFewRows) {
    tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, batch), [&](const auto& r) {
      for (std::int64_t i = r.begin(); i < r.end(); ++i) sgemm(s, alpha, a[i], b[i], beta, c[i]);
    });
    return;
  }
  check_packed(s, nullptr, packed_b);
  run_packed(s, batch, alpha, a, b, beta, c, nullptr, packed_b);
}

namespace {
// Integer sums wrap modulo 2^bits as numpy's do: accumulate unsigned (no signed-overflow UB) and
// convert back, which C++20 defines as modular.
template <class T>
struct AccumulatorOf {
  using type = T;
};
template <>
struct AccumulatorOf<std::int32_t> {
  using type = std::uint32_t;
};
template <>
struct AccumulatorOf<std::int64_t> {
  using type = std::uint64_t;
};
}  // namespace

template <class T>
void gemm_generic(const GemmShape& s, const T* a, const T* b, T* c) {
  using Acc = typename AccumulatorOf<T>::type;
  check_shape(s);
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, s.m, 16), [&](const auto& r) {
    std::vector<Acc> acc(std::size_t(s.n));
    for (std::int64_t i = r.begin(); i < r.end(); ++i) {
      std::fill(acc.begin(), acc.end(), Acc(0));
      for (std::int64_t p = 0; p < s.k; ++p) {
        const Acc aip = Acc(s.trans_a ? a[p * s.lda + i] : a[i * s.lda + p]);
        for (std::int64_t j = 0; j < s.n; ++j)
          acc[std::size_t(j)] += aip * Acc(s.trans_b ? b[j * s.ldb + p] : b[p * s.ldb + j]);
      }
      for (std::int64_t j = 0; j < s.n; ++j) c[i * s.ldc + j] = T(acc[std::size_t(j)]);
    }
  });
}

template void gemm_generic<double>(const GemmShape&, const double*, const double*, double*);
template void gemm_generic<std::int32_t>(const GemmShape&, const std::int32_t*, const std::int32_t*, std::int32_t*);
template void gemm_generic<std::int64_t>(const GemmShape&, const std::int64_t*, const std::int64_t*, std::int64_t*);
template void gemm_generic<std::uint32_t>(const GemmShape&, const std::uint32_t*, const std::uint32_t*, std::uint32_t*);
template void gemm_generic<std::uint64_t>(const GemmShape&, const std::uint64_t*, const std::uint64_t*, std::uint64_t*);

}  // namespace qeval::kernels
