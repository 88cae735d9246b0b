// Fused attention: per (entry, block of query rows), scores into a cache-sized block through the
// packed GEMM micro-kernel, scale, row softmax, and the product with V, all on one thread.
#include "kernels/attention.h"

#include <tbb/blocked_range.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/numeric.h"
#include "kernels/softmax.h"

namespace qeval::kernels {

namespace {

// Scores kept per task: about 512 KiB, half of this machine's L2, whatever the key length.
constexpr std::int64_t kScoreBlockFloats = 128 * 1024;

struct ThreadBuffers {
  AlignedFloats scores, a_panels;
  std::size_t scores_size = 0, a_panels_size = 0;
  float* get_scores(std::size_t n) {
    if (n > scores_size) scores = alloc_aligned_floats(n), scores_size = n;
    return scores.get();
  }
  float* get_a_panels(std::size_t n) {
    if (n > a_panels_size) a_panels = alloc_aligned_floats(n), a_panels_size = n;
    return a_panels.get();
  }
};

void round_values(float* v, std::size_t n, RoundTo r) {
  if (r == RoundTo::kFp16) round_to_float16(v, n);
  else if (r == RoundTo::kBf16) round_to_bfloat16(v, n);
}

// Where the product of Q and K^T goes for `rows` rows starting `offset` elements into the
// intermediates: the kept scores themselves, else the task's scratch.
float* scores_at(const AttentionIntermediates& keep, std::int64_t offset, float* scratch) {
  return keep.scores ? keep.scores + offset : scratch;
}

// What the unfused ops do between the two products, on `rows` rows of `scores` (scores_at()):
// each stage writes its kept intermediate directly (no copies), else the scratch in place.
// Returns where the probabilities are.
float* scale_and_softmax(const AttentionShape& s, float* scores, float* scratch, std::int64_t rows,
                         const AttentionIntermediates& keep, std::int64_t offset) {
  const std::size_t n = std::size_t(rows * s.kv_len);
  round_values(scores, n, s.round_scores);
  float* x = scores;
  if (s.scale_kind != ScoreScale::kNone) {
    float* y = keep.scaled ? keep.scaled + offset : scratch;
    const float c = s.scale;
    // One operation per element, as the elementwise Mul / Div computes it.
    if (s.scale_kind == ScoreScale::kMul)
      for (std::size_t i = 0; i < n; ++i) y[i] = x[i] * c;
    else
      for (std::size_t i = 0; i < n; ++i) y[i] = x[i] / c;
    round_values(y, n, s.round_scaled);
    x = y;
  }
  float* p = keep.probs ? keep.probs + offset : scratch;
  softmax_rows(x, p, rows, s.kv_len, false);
  round_values(p, n, s.round_probs);
  return p;
}

}  // namespace

struct AttentionScratch::State {
  std::vector<PackedB> k_packed, v_packed;
  tbb::enumerable_thread_specific<ThreadBuffers> buffers;
};

AttentionScratch::AttentionScratch() : state(std::make_unique<State>()) {}
AttentionScratch::~AttentionScratch() = default;

namespace {

bool packed_path(const AttentionShape& s) {
  const std::int64_t L = s.q_len, Lk = s.kv_len, d = s.head_dim, dv = s.v_dim;
  return Lk > 0 && sgemm_uses_packing(GemmShape{false, false, L, Lk, d, d, Lk, Lk}) &&
         sgemm_uses_packing(GemmShape{false, false, L, dv, Lk, Lk, dv, dv});
}

}  // namespace

std::int64_t attention_task_rows(const AttentionShape& s) {
  // Packed: whole micro-kernel panels, at most kGemmMC rows, scores within the block budget.
  // Small products: one entry per task (through sgemm itself).
  if (!packed_path(s)) return std::max<std::int64_t>(s.q_len, 1);
  return std::clamp<std::int64_t>(kScoreBlockFloats / s.kv_len / kGemmMR * kGemmMR, kGemmMR, kGemmMC);
}

bool attention_task_boundary(const AttentionShape& s, std::int64_t row) {
  if (row < 0 || row > s.batch * s.q_len) return false;
  if (row == s.batch * s.q_len || s.q_len <= 0) return true;
  return (row % s.q_len) % attention_task_rows(s) == 0;
}

void attention(const AttentionShape& s, const float* q, const float* kt, const float* v, float* out,
               AttentionScratch& scratch, const AttentionIntermediates& keep) {
  attention_rows(s, q, kt, v, out, scratch, keep, 0, s.batch * s.q_len);
}

void attention_rows(const AttentionShape& s, const float* q, const float* kt, const float* v, float* out,
                    AttentionScratch& scratch, const AttentionIntermediates& keep, std::int64_t row0,
                    std::int64_t row1) {
  if (s.batch <= 0 || s.q_len <= 0 || s.v_dim <= 0 || row1 <= row0) return;
  if (!attention_task_boundary(s, row0) || !attention_task_boundary(s, row1))
    throw std::invalid_argument("attention_rows: rows " + std::to_string(row0) + ".." + std::to_string(row1) +
                                " do not start and end at task boundaries");
  const std::int64_t L = s.q_len, Lk = s.kv_len, d = s.head_dim, dv = s.v_dim;
  const GemmShape qk{false, false, L, Lk, d, d, Lk, Lk};
  const GemmShape pv{false, false, L, dv, Lk, Lk, dv, dv};
  // keep's pointers start at row0: a value of row r is at (r - row0) * Lk.
  const AttentionIntermediates& at = keep;
  const std::int64_t base = row0 * Lk;
  const std::int64_t e0 = row0 / L, e1 = (row1 + L - 1) / L;  // entries touched
  if (!packed_path(s)) {
    // Small products take sgemm's unpacked paths: per entry, through sgemm itself (the scores of
    // one entry are small here: sgemm packs whenever L * Lk * d or L * Lk * dv is large).
    tbb::parallel_for(e0, e1, [&](std::int64_t e) {
      std::vector<float> entry(std::size_t(std::max<std::int64_t>(1, L * Lk)));
      float* scores = scores_at(at, e * L * Lk - base, entry.data());
      sgemm(qk, 1.0f, q + e * L * d, kt + e * d * Lk, 0.0f, scores);
      const float* probs = scale_and_softmax(s, scores, entry.data(), L, at, e * L * Lk - base);
      if (out) sgemm(pv, 1.0f, probs, v + e * Lk * dv, 0.0f, out + e * L * dv);
    });
    return;
  }
  AttentionScratch::State& st = *scratch.state;
  st.k_packed.resize(std::size_t(s.batch));
  st.v_packed.resize(std::size_t(s.batch));
  tbb::parallel_for(e0, e1, [&](std::int64_t e) {
    st.k_packed[std::size_t(e)].pack(false, d, Lk, kt + e * d * Lk, Lk);
    if (out) st.v_packed[std::size_t(e)].pack(false, Lk, dv, v + e * Lk * dv, dv);
  });
  const std::int64_t rows = attention_task_rows(s);
  const std::int64_t blocks = (L + rows - 1) / rows;
  auto task_of = [&](std::int64_t row) {
    return row == s.batch * L ? s.batch * blocks : row / L * blocks + row % L / rows;
  };
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(task_of(row0), task_of(row1)), [&](const auto& range) {
    ThreadBuffers& buf = st.buffers.local();
    float* block_scores = buf.get_scores(std::size_t(rows * Lk));
    float* a_panels = buf.get_a_panels(std::size_t(round_up(rows, kGemmMR) * kGemmKC));
    for (std::int64_t t = range.begin(); t < range.end(); ++t) {
      const std::int64_t e = t / blocks, i0 = (t % blocks) * rows, mb = std::min(rows, L - i0);
      float* scores = scores_at(at, (e * L + i0) * Lk - base, block_scores);
      const PackedB& kp = st.k_packed[std::size_t(e)];
      // Scores = Q rows x K^T, k blocked as sgemm blocks it.
      for (std::int64_t k0 = 0; k0 < d; k0 += kGemmKC) {
        const std::int64_t kc = std::min<std::int64_t>(kGemmKC, d - k0);
        pack_a_panels(false, q + e * L * d, d, i0, mb, k0, kc, a_panels);
        gemm_packed_block(mb, Lk, kc, a_panels, kp.block(0, k0), 1.0f, k0 == 0 ? 0.0f : 1.0f, scores, Lk);
      }
      const float* probs = scale_and_softmax(s, scores, block_scores, mb, at, (e * L + i0) * Lk - base);
      if (!out) continue;
      const PackedB& vp = st.v_packed[std::size_t(e)];
      float* o = out + (e * L + i0) * dv;
      for (std::int64_t k0 = 0; k0 < Lk; k0 += kGemmKC) {
        const std::int64_t kc = std::min<std::int64_t>(kGemmKC, Lk - k0);
        pack_a_panels(false, probs, Lk, 0, mb, k0, kc, a_panels);
        gemm_packed_block(mb, dv, kc, a_panels, vp.block(0, k0), 1.0f, k0 == 0 ? 0.0f : 1.0f, o, dv);
      }
    }
  });
}

}  // namespace qeval::kernels
