// Fused attention against the unfused sequence it replaces (batched SGEMM, elementwise scale, row
// softmax, batched SGEMM): the same bits on every path (packed, small, mixed), with rounding, for
// any thread count, and scratch reuse across calls of other shapes.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/numeric.h"
#include "kernels/softmax.h"

namespace qeval::kernels {
namespace {

std::vector<float> random_floats(std::size_t n, std::mt19937& rng, float range) {
  std::uniform_real_distribution<float> u(-range, range);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

void round_all(std::vector<float>& v, RoundTo r) {
  if (r == RoundTo::kFp16) round_to_float16(v.data(), v.size());
  if (r == RoundTo::kBf16) round_to_bfloat16(v.data(), v.size());
}

// What the executor runs without fusion: each op over the whole tensor, then its output rounded.
// The ops' outputs: scores, scaled scores (empty without a scale), probabilities, output.
struct Unfused {
  std::vector<float> scores, scaled, probs, out;
};
Unfused unfused(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& kt,
                const std::vector<float>& v) {
  const std::int64_t L = s.q_len, Lk = s.kv_len, d = s.head_dim, dv = s.v_dim;
  Unfused u;
  std::vector<float> scores(std::size_t(s.batch * L * Lk)), probs(scores.size()), out(std::size_t(s.batch * L * dv));
  std::vector<const float*> a, b;
  std::vector<float*> c;
  for (std::int64_t e = 0; e < s.batch; ++e) {
    a.push_back(q.data() + e * L * d);
    b.push_back(kt.data() + e * d * Lk);
    c.push_back(scores.data() + e * L * Lk);
  }
  sgemm_batched({false, false, L, Lk, d, d, Lk, Lk}, s.batch, 1.0f, a.data(), b.data(), 0.0f, c.data());
  round_all(scores, s.round_scores);
  u.scores = scores;
  if (s.scale_kind != ScoreScale::kNone) {
    for (auto& x : scores) x = s.scale_kind == ScoreScale::kMul ? x * s.scale : x / s.scale;
    round_all(scores, s.round_scaled);
    u.scaled = scores;
  }
  softmax(scores.data(), probs.data(), s.batch * L, Lk, 1, false);
  round_all(probs, s.round_probs);
  a.clear(), b.clear(), c.clear();
  for (std::int64_t e = 0; e < s.batch; ++e) {
    a.push_back(probs.data() + e * L * Lk);
    b.push_back(v.data() + e * Lk * dv);
    c.push_back(out.data() + e * L * dv);
  }
  sgemm_batched({false, false, L, dv, Lk, Lk, dv, dv}, s.batch, 1.0f, a.data(), b.data(), 0.0f, c.data());
  u.probs = std::move(probs);
  u.out = std::move(out);
  return u;
}

AttentionShape shape(std::int64_t batch, std::int64_t L, std::int64_t Lk, std::int64_t d, std::int64_t dv,
                     ScoreScale kind = ScoreScale::kMul, float scale = 0.125f) {
  AttentionShape s;
  s.batch = batch, s.q_len = L, s.kv_len = Lk, s.head_dim = d, s.v_dim = dv, s.scale_kind = kind, s.scale = scale;
  return s;
}

TEST(Attention, SameBitsAsTheUnfusedOps) {
  std::mt19937 rng(3);
  AttentionShape fp16 = shape(2, 70, 90, 40, 24);
  fp16.round_scores = fp16.round_scaled = fp16.round_probs = RoundTo::kFp16;
  AttentionShape bf16 = shape(1, 50, 33, 16, 8, ScoreScale::kDiv, 4.0f);
  bf16.round_scores = bf16.round_probs = RoundTo::kBf16;
  const std::vector<AttentionShape> cases = {
      shape(3, 300, 200, 40, 24),                       // packed path, several row blocks, edge tiles
      shape(2, 64, 4096, 32, 32),                       // long keys: row blocks of one panel
      shape(1, 29, 700, 300, 20, ScoreScale::kDiv, 8),  // head_dim over one k block
      shape(4, 16, 77, 32, 32, ScoreScale::kNone),      // cross-attention sizes, no scale
      shape(4, 100, 300, 16, 16),                       // 16-wide heads: one-vector micro-kernel
      shape(2, 8, 8, 4, 4),                             // small: sgemm's reference loops
      shape(3, 4, 100, 64, 64),                         // 4 query rows: sgemm's few-rows kernel
      shape(1, 40, 30, 2, 30),                          // scores small, output product packed: mixed
      fp16,
      bf16,
  };
  AttentionScratch scratch;  // shared by all cases: buffers regrow and are reused
  for (const AttentionShape& s : cases) {
    const auto q = random_floats(std::size_t(s.batch * s.q_len * s.head_dim), rng, 1.5f);
    const auto kt = random_floats(std::size_t(s.batch * s.head_dim * s.kv_len), rng, 1.5f);
    const auto v = random_floats(std::size_t(s.batch * s.kv_len * s.v_dim), rng, 1.0f);
    const Unfused u = unfused(s, q, kt, v);
    const std::vector<float>& want = u.out;
    std::vector<float> got(want.size(), std::nanf(""));
    attention(s, q.data(), kt.data(), v.data(), got.data(), scratch);
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
        << "batch " << s.batch << ", L " << s.q_len << ", Lk " << s.kv_len << ", d " << s.head_dim << ", dv "
        << s.v_dim;
    // Kept intermediates: the unfused ops' outputs, to the bit (what an observer sees).
    std::vector<float> scores(u.scores.size(), std::nanf("")), scaled(u.scores.size(), std::nanf("")),
        probs(u.scores.size(), std::nanf("")), out(want.size(), std::nanf(""));
    AttentionIntermediates keep{scores.data(), u.scaled.empty() ? nullptr : scaled.data(), probs.data()};
    attention(s, q.data(), kt.data(), v.data(), out.data(), scratch, keep);
    auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
      return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
    };
    EXPECT_TRUE(same(out, want)) << "kept, L " << s.q_len;
    EXPECT_TRUE(same(scores, u.scores)) << "scores, L " << s.q_len;
    if (!u.scaled.empty()) {
      EXPECT_TRUE(same(scaled, u.scaled)) << "scaled, L " << s.q_len;
    }
    EXPECT_TRUE(same(probs, u.probs)) << "probs, L " << s.q_len;
    std::vector<float> one(want.size());
    {
      tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 1);
      attention(s, q.data(), kt.data(), v.data(), one.data(), scratch);
    }
    EXPECT_EQ(0, std::memcmp(want.data(), one.data(), want.size() * sizeof(float))) << "1 thread, L " << s.q_len;
  }
}

}  // namespace
}  // namespace qeval::kernels
