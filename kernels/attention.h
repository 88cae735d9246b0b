// Scaled dot-product attention as one kernel: out = softmax(scale(Q K)) V per batch entry, in row
// blocks that keep the scores in cache, with the same bits as the unfused sequence (batched SGEMM,
// elementwise scale, row softmax, batched SGEMM), so an executor may switch between the two.
#pragma once

#include <cstdint>
#include <memory>

namespace qeval::kernels {

// How the scores are scaled between the two products: not at all, s * scale, or s / scale
// (the exported Mul / Div by a constant).
enum class ScoreScale : std::uint8_t { kNone, kMul, kDiv };
// Reduced-precision emulation: intermediate values rounded to a format, as the unfused ops'
// outputs are.
enum class RoundTo : std::uint8_t { kNone, kFp16, kBf16 };

struct AttentionShape {
  std::int64_t batch = 1;   // independent entries (batch x heads)
  std::int64_t q_len = 0;   // rows of Q and of the output
  std::int64_t kv_len = 0;  // columns of K (given as K^T: head_dim x kv_len) and rows of V
  std::int64_t head_dim = 0;
  std::int64_t v_dim = 0;
  ScoreScale scale_kind = ScoreScale::kNone;
  float scale = 1.0f;
  RoundTo round_scores = RoundTo::kNone, round_scaled = RoundTo::kNone, round_probs = RoundTo::kNone;
  // The format Q, K^T and V are all exact in (kNone: not known to be), for a kernel that may then
  // multiply 16-bit copies of them: the same products, exact in FP32, summed in its own order.
  RoundTo inputs_exact = RoundTo::kNone;
};

// Buffers an attention call keeps between calls (packed K and V, per-thread score blocks), so
// repeated calls neither allocate nor fault in fresh pages. Not shareable between threads that
// call attention() at the same time.
class AttentionScratch {
 public:
  AttentionScratch();
  ~AttentionScratch();
  struct State;
  std::unique_ptr<State> state;
};

// Where the intermediate tensors go when a caller wants them too (each batch x q_len x kv_len,
// the values the unfused ops would have written, rounded as they round them); null: not kept.
struct AttentionIntermediates {
  float* scores = nullptr;  // q kt
  float* scaled = nullptr;  // scale(q kt) (only with a scale)
  float* probs = nullptr;   // softmax of the scaled scores
};

// out[e] (q_len x v_dim) = softmax_rows(scale(q[e] kt[e])) v[e] for each entry e, all dense
// row-major: q[e] is q_len x head_dim, kt[e] head_dim x kv_len, v[e] kv_len x v_dim, entries
// consecutive. Bitwise equal to sgemm_batched, the elementwise scale, softmax (inner == 1) and
// sgemm_batched run one after the other, for any thread count; `keep` receives the intermediates.
void attention(const AttentionShape& s, const float* q, const float* kt, const float* v, float* out,
               AttentionScratch& scratch, const AttentionIntermediates& keep = {});

// How attention() splits the batch x q_len rows (entry e's row i is row e * q_len + i) into
// tasks: a task computes this many consecutive rows of one entry (an entry's last task the rest).
std::int64_t attention_task_rows(const AttentionShape& s);
// Whether `row` starts a task (or is batch * q_len, the end).
bool attention_task_boundary(const AttentionShape& s, std::int64_t row);

// attention() on rows [row0, row1) only (both task boundaries; else std::invalid_argument): the
// same bits for those rows. `keep` receives the intermediates of those rows only (its pointers at
// row0's first value); `out`, when not null, is the whole output (rows outside untouched); with a
// null `out` the product with V is skipped. A caller may so compute a large call in pieces (an
// observer's chunks of the scores) or compute its intermediates again later.
void attention_rows(const AttentionShape& s, const float* q, const float* kt, const float* v, float* out,
                    AttentionScratch& scratch, const AttentionIntermediates& keep, std::int64_t row0,
                    std::int64_t row1);

}  // namespace qeval::kernels
