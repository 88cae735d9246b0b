// GEMM kernels: the reference loops, operand packing, the 14x32 register-blocked micro-kernel
// (GCC vector extensions: AVX-512 where the target has it), cache blocking and TBB threading.
#include "kernels/gemm.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
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

// C_tile = alpha * acc + beta * C_tile over a full MR x NR tile, beta == 0 meaning "do not read C".
// The edge path runs the same code on a copy of the tile, so an element's value never depends on
// whether it sat in an edge tile.
inline void store_tile(V (&acc)[MR][NV], float* c, std::int64_t ldc, float alpha, float beta) {
  if (beta == 0.0f) {
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) *reinterpret_cast<VU*>(c + i * ldc + v * kLanes) = alpha * acc[i][v];
  } else if (beta == 1.0f) {
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        VU* dst = reinterpret_cast<VU*>(c + i * ldc + v * kLanes);
        *dst = *dst + alpha * acc[i][v];
      }
  } else {
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        VU* dst = reinterpret_cast<VU*>(c + i * ldc + v * kLanes);
        *dst = beta * *dst + alpha * acc[i][v];
      }
  }
}

// acc = A panel (kc x MR, row r of the panel = k index) times B panel (kc x NR); then stores.
// Every element is a sequential sum over k starting from zero.
void micro_kernel(std::int64_t kc, const float* __restrict pa, const float* __restrict pb, float* c,
                  std::int64_t ldc, int mr, int nr, float alpha, float beta) {
  V acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = V{};
  for (std::int64_t p = 0; p < kc; ++p) {
    V b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = *reinterpret_cast<const V*>(pb + v * kLanes);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const float ai = pa[i];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] += ai * b[v];
    }
    pa += MR;
    pb += NR;
  }
  if (mr == MR && nr == NR) {
    store_tile(acc, c, ldc, alpha, beta);
    return;
  }
  alignas(64) float tile[MR * NR];
  if (beta != 0.0f) {
    std::fill(tile, tile + MR * NR, 0.0f);
    for (int i = 0; i < mr; ++i) std::memcpy(tile + i * NR, c + i * ldc, sizeof(float) * std::size_t(nr));
  }
  store_tile(acc, tile, NR, alpha, beta);
  for (int i = 0; i < mr; ++i) std::memcpy(c + i * ldc, tile + i * NR, sizeof(float) * std::size_t(nr));
}

// Rows [i0, i0 + mc) and k range [k0, k0 + kc) of op(A) into MR-row panels (zero rows past mc).
void pack_a(bool trans, const float* a, std::int64_t lda, std::int64_t i0, std::int64_t mc, std::int64_t k0,
            std::int64_t kc, float* dst) {
  for (std::int64_t ip = 0; ip < mc; ip += MR) {
    const int rows = int(std::min<std::int64_t>(MR, mc - ip));
    float* d = dst + (ip / MR) * kc * MR;
    if (!trans) {
      // 16 columns of k at a time: each source row contributes one cache line to a small tile
      // that is then transposed into the panel. Reading the MR rows element by element instead
      // thrashes L1 when lda is a power of two (all rows map to the same cache sets).
      const float* src = a + (i0 + ip) * lda + k0;
      alignas(64) float tile[MR][16];
      for (std::int64_t kb = 0; kb < kc; kb += 16) {
        const int width = int(std::min<std::int64_t>(16, kc - kb));
        if (width == 16) {
          for (int r = 0; r < rows; ++r) *reinterpret_cast<V*>(tile[r]) = *reinterpret_cast<const VU*>(src + r * lda + kb);
        } else {
          for (int r = 0; r < rows; ++r) std::copy(src + r * lda + kb, src + r * lda + kb + width, tile[r]);
        }
        for (int r = rows; r < MR; ++r) *reinterpret_cast<V*>(tile[r]) = V{};
        float* out = d + kb * MR;
        if (width == 16) {
#pragma GCC unroll 16
          for (int kk = 0; kk < 16; ++kk)
#pragma GCC unroll 16
            for (int r = 0; r < MR; ++r) out[kk * MR + r] = tile[r][kk];
        } else {
          for (int kk = 0; kk < width; ++kk)
            for (int r = 0; r < MR; ++r) out[kk * MR + r] = tile[r][kk];
        }
      }
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
      for (int j = 0; j < cols; ++j) {
        const float* src = b + (n0 + jp + j) * ldb + k0;
        for (std::int64_t kk = 0; kk < kc; ++kk) d[kk * NR + j] = src[kk];
      }
      for (int j = cols; j < NR; ++j)
        for (std::int64_t kk = 0; kk < kc; ++kk) d[kk * NR + j] = 0.0f;
    }
  }
}

// C = beta * C for k == 0 (beta == 0 writes zeros without reading C).
void scale_c(std::int64_t m, std::int64_t n, float beta, float* c, std::int64_t ldc) {
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
}

// All of op(B) packed: k blocks of KC rows, each round_up(n, NR) / NR panels.
struct PackedB {
  std::int64_t k = 0, n_padded = 0;
  AlignedFloats data;
  const float* block(std::int64_t j0, std::int64_t k0) const {
    const std::int64_t kc = std::min<std::int64_t>(KC, k - k0);
    return data.get() + k0 * n_padded + (j0 / NR) * kc * NR;
  }
};

PackedB pack_all_b(bool trans, std::int64_t k, std::int64_t n, const float* b, std::int64_t ldb) {
  PackedB p;
  p.k = k;
  p.n_padded = round_up(n, NR);
  p.data = alloc_aligned_floats(std::size_t(k * p.n_padded));
  const std::int64_t panels = p.n_padded / NR;
  // Chunks of 8 panels (256 columns) keep a task's source rows contiguous enough to stream.
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, (panels + 7) / 8), [&](const auto& r) {
    for (std::int64_t chunk = r.begin(); chunk < r.end(); ++chunk) {
      const std::int64_t j0 = chunk * 8 * NR, nc = std::min<std::int64_t>(8 * NR, n - j0);
      for (std::int64_t k0 = 0; k0 < k; k0 += KC)
        pack_b(trans, b, ldb, k0, std::min<std::int64_t>(KC, k - k0), j0, nc, const_cast<float*>(p.block(j0, k0)));
    }
  });
  return p;
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

// One task: rows [i0, i0 + mc) by columns [j0, j0 + nc) of one product, over all of k.
void run_task(const GemmShape& s, float alpha, const float* a, const PackedB& pb, float beta, float* c,
              std::int64_t i0, std::int64_t mc, std::int64_t j0, std::int64_t nc, float* a_buf) {
  for (std::int64_t k0 = 0; k0 < s.k; k0 += KC) {
    const std::int64_t kc = std::min<std::int64_t>(KC, s.k - k0);
    pack_a(s.trans_a, a, s.lda, i0, mc, k0, kc, a_buf);
    gemm_packed_block(mc, nc, kc, a_buf, pb.block(j0, k0), alpha, k0 == 0 ? beta : 1.0f,
                      c + i0 * s.ldc + j0, s.ldc);
  }
}

void check_shape(const GemmShape& s) {
  if (s.m < 0 || s.n < 0 || s.k < 0) throw std::invalid_argument("sgemm: negative dimension");
}

// The packed path for `batch` products: B operands packed once per distinct pointer run, then tasks
// over (entry, row block, column chunk), each packing its own A blocks.
void run_packed(const GemmShape& s, std::int64_t batch, float alpha, const float* const* a,
                const float* const* b, float beta, float* const* c) {
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
  std::vector<PackedB> packed(b_first.size());
  tbb::parallel_for(std::size_t(0), b_first.size(), [&](std::size_t u) {
    packed[u] = pack_all_b(s.trans_b, s.k, s.n, b[b_first[u]], s.ldb);
  });
  const TaskGrid g = task_grid(s.m, s.n, batch);
  const std::int64_t per = g.m_blocks * g.n_chunks;
  tbb::parallel_for(
      tbb::blocked_range<std::int64_t>(0, batch * per, 1),
      [&](const auto& r) {
        AlignedFloats a_buf = alloc_aligned_floats(std::size_t(MC) * KC);
        for (std::int64_t t = r.begin(); t < r.end(); ++t) {
          const std::int64_t e = t / per, tt = t % per;
          const std::int64_t i0 = (tt / g.n_chunks) * MC, j0 = (tt % g.n_chunks) * g.n_chunk;
          run_task(s, alpha, a[e], packed[std::size_t(b_index[std::size_t(e)])], beta, c[e], i0,
                   std::min<std::int64_t>(MC, s.m - i0), j0, std::min<std::int64_t>(g.n_chunk, s.n - j0),
                   a_buf.get());
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

void gemm_packed_block(std::int64_t mc, std::int64_t nc, std::int64_t kc, const float* a_panels,
                       const float* b_panels, float alpha, float beta, float* c, std::int64_t ldc) {
  // B micro-panel (kc x NR) stays in L1 while the A panels of the block stream from L2.
  for (std::int64_t jr = 0; jr < nc; jr += NR) {
    const int nr = int(std::min<std::int64_t>(NR, nc - jr));
    const float* bp = b_panels + (jr / NR) * kc * NR;
    for (std::int64_t ir = 0; ir < mc; ir += MR) {
      const int mr = int(std::min<std::int64_t>(MR, mc - ir));
      micro_kernel(kc, a_panels + (ir / MR) * kc * MR, bp, c + ir * ldc + jr, ldc, mr, nr, alpha, beta);
    }
  }
}

PackedA::PackedA(bool trans, std::int64_t m, std::int64_t k, const float* a, std::int64_t lda)
    : m_(m), k_(k), m_padded_(round_up(m, MR)) {
  data_ = alloc_aligned_floats(std::size_t(std::max<std::int64_t>(1, m_padded_ * k)));
  const std::int64_t k_blocks = (k + KC - 1) / KC, m_blocks = (m + MC - 1) / MC;
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, k_blocks * m_blocks), [&](const auto& r) {
    for (std::int64_t t = r.begin(); t < r.end(); ++t) {
      const std::int64_t k0 = (t / m_blocks) * KC, i0 = (t % m_blocks) * MC;
      pack_a(trans, a, lda, i0, std::min<std::int64_t>(MC, m - i0), k0, std::min<std::int64_t>(KC, k - k0),
             const_cast<float*>(block(i0, k0)));
    }
  });
}

const float* PackedA::block(std::int64_t i0, std::int64_t k0) const {
  const std::int64_t kc = std::min<std::int64_t>(KC, k_ - k0);
  return data_.get() + k0 * m_padded_ + (i0 / MR) * kc * MR;
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

void sgemm(const GemmShape& s, float alpha, const float* a, const float* b, float beta, float* c) {
  if (s.m * s.n * s.k <= kSmallGemmMacs) return sgemm_reference(s, alpha, a, b, beta, c);
  sgemm_packed(s, alpha, a, b, beta, c);
}

void sgemm_batched_reference(const GemmShape& s, std::int64_t batch, float alpha, const float* const* a,
                             const float* const* b, float beta, float* const* c) {
  for (std::int64_t i = 0; i < batch; ++i) sgemm_reference(s, alpha, a[i], b[i], beta, c[i]);
}

void sgemm_batched(const GemmShape& s, std::int64_t batch, float alpha, const float* const* a,
                   const float* const* b, float beta, float* const* c) {
  check_shape(s);
  if (batch <= 0 || s.m == 0 || s.n == 0) return;
  if (batch == 1) return sgemm(s, alpha, a[0], b[0], beta, c[0]);
  if (s.m * s.n * s.k <= kSmallGemmMacs) {
    tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, batch), [&](const auto& r) {
      for (std::int64_t i = r.begin(); i < r.end(); ++i) sgemm_reference(s, alpha, a[i], b[i], beta, c[i]);
    });
    return;
  }
  run_packed(s, batch, alpha, a, b, beta, c);
}

namespace {
// Integer sums wrap modulo 2^bits as numpy's do: accumulate unsigned (no signed-overflow UB) and
// convert back, which C++20 defines as modular.
template <class T> struct AccumulatorOf { using type = T; };
template <> struct AccumulatorOf<std::int32_t> { using type = std::uint32_t; };
template <> struct AccumulatorOf<std::int64_t> { using type = std::uint64_t; };
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
