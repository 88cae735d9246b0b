// GEMM: the packed fast path and the reference loops against a double-precision oracle on random,
// odd and degenerate shapes; batching; integer exactness; thread-count independence.
#include <gtest/gtest.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/numeric.h"

namespace qeval::kernels {
namespace {

struct Case {
  bool ta, tb;
  std::int64_t m, n, k;
  float alpha, beta;
  std::int64_t pad = 0;  // extra elements per row beyond the minimum leading dimension
};

std::string describe(const Case& c) {
  return "m " + std::to_string(c.m) + ", n " + std::to_string(c.n) + ", k " + std::to_string(c.k) + ", transA " +
         std::to_string(c.ta) + ", transB " + std::to_string(c.tb) + ", alpha " + std::to_string(c.alpha) + ", beta " +
         std::to_string(c.beta) + ", pad " + std::to_string(c.pad);
}

struct Operands {
  GemmShape s;
  std::vector<float> a, b, c;
};

Operands make_operands(const Case& cs, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  Operands o;
  const std::int64_t a_rows = cs.ta ? cs.k : cs.m, a_cols = cs.ta ? cs.m : cs.k;
  const std::int64_t b_rows = cs.tb ? cs.n : cs.k, b_cols = cs.tb ? cs.k : cs.n;
  o.s = {cs.ta, cs.tb, cs.m, cs.n, cs.k, a_cols + cs.pad, b_cols + cs.pad, cs.n + cs.pad};
  o.a.resize(std::size_t(std::max<std::int64_t>(1, a_rows * o.s.lda)));
  o.b.resize(std::size_t(std::max<std::int64_t>(1, b_rows * o.s.ldb)));
  o.c.resize(std::size_t(std::max<std::int64_t>(1, cs.m * o.s.ldc)));
  for (auto& x : o.a) x = u(rng);
  for (auto& x : o.b) x = u(rng);
  for (auto& x : o.c) x = u(rng);
  return o;
}

// Exact-ish result (double) and the magnitude sum |alpha| sum |a||b| + |beta c| that bounds the
// rounding error of any float summation order: |error| <= (k + 2) * eps * magnitude.
void oracle(const Operands& o, float alpha, float beta, std::vector<double>& value, std::vector<double>& magnitude) {
  const GemmShape& s = o.s;
  value.assign(std::size_t(s.m * s.n), 0.0);
  magnitude.assign(std::size_t(s.m * s.n), 0.0);
  for (std::int64_t i = 0; i < s.m; ++i)
    for (std::int64_t j = 0; j < s.n; ++j) {
      double sum = 0, mag = 0;
      for (std::int64_t p = 0; p < s.k; ++p) {
        const double av = s.trans_a ? o.a[std::size_t(p * s.lda + i)] : o.a[std::size_t(i * s.lda + p)];
        const double bv = s.trans_b ? o.b[std::size_t(j * s.ldb + p)] : o.b[std::size_t(p * s.ldb + j)];
        sum += av * bv;
        mag += std::abs(av * bv);
      }
      const double cv = beta == 0 ? 0.0 : double(o.c[std::size_t(i * s.ldc + j)]);
      value[std::size_t(i * s.n + j)] = alpha * sum + beta * cv;
      magnitude[std::size_t(i * s.n + j)] = std::abs(alpha) * mag + std::abs(beta * cv);
    }
}

using GemmFn = void (*)(const GemmShape&, float, const float*, const float*, float, float*);

// Runs fn on a copy of C and checks every element against the oracle; padding columns of C must
// be untouched.
void expect_matches_oracle(GemmFn fn, const char* name, const Case& cs, const Operands& o) {
  std::vector<double> want, mag;
  oracle(o, cs.alpha, cs.beta, want, mag);
  std::vector<float> c = o.c;
  if (cs.beta == 0) {
    // beta == 0 must not read C: garbage there must not leak into the result.
    for (std::int64_t i = 0; i < cs.m; ++i)
      for (std::int64_t j = 0; j < cs.n; ++j) c[std::size_t(i * o.s.ldc + j)] = std::numeric_limits<float>::quiet_NaN();
  }
  fn(o.s, cs.alpha, o.a.data(), o.b.data(), cs.beta, c.data());
  const double eps = std::numeric_limits<float>::epsilon();
  int reported = 0;
  for (std::int64_t i = 0; i < cs.m; ++i) {
    for (std::int64_t j = 0; j < cs.n; ++j) {
      const double got = c[std::size_t(i * o.s.ldc + j)];
      const double tol = double(cs.k + 2) * eps * mag[std::size_t(i * cs.n + j)] + 1e-30;
      if (!(std::abs(got - want[std::size_t(i * cs.n + j)]) <= tol) && reported++ < 3)
        ADD_FAILURE() << name << " (" << describe(cs) << "): C[" << i << "][" << j << "] = " << got << ", oracle "
                      << want[std::size_t(i * cs.n + j)] << ", tolerance " << tol;
    }
    for (std::int64_t j = cs.n; j < o.s.ldc; ++j)
      if (c[std::size_t(i * o.s.ldc + j)] != o.c[std::size_t(i * o.s.ldc + j)] && reported++ < 3)
        ADD_FAILURE() << name << " (" << describe(cs) << "): wrote C padding at row " << i << ", column " << j;
  }
}

std::vector<Case> cases() {
  std::vector<Case> v;
  // Degenerate and tail shapes around the micro-tile (14 x 32) and k block (256).
  const std::int64_t shapes[][3] = {{1, 1, 1},     {1, 37, 5},     {37, 1, 5},     {1, 1, 300},   {17, 33, 65},
                                    {14, 32, 256}, {15, 33, 257},  {13, 31, 255},  {28, 64, 512}, {3, 100, 1},
                                    {100, 3, 2},   {113, 97, 300}, {129, 257, 31}, {2, 513, 40},  {300, 47, 513},
                                    {5, 5, 0},     {0, 5, 5},      {5, 0, 5}};
  for (const auto& s : shapes)
    for (int t = 0; t < 4; ++t) v.push_back({bool(t & 1), bool(t & 2), s[0], s[1], s[2], 1.0f, 0.0f});
  // The few-rows path: every m up to 4, column tails around its 64-wide tile and 256-wide chunks.
  for (std::int64_t m = 1; m <= 4; ++m)
    for (const std::int64_t n : {1, 63, 64, 65, 300})
      for (int t = 0; t < 4; ++t)
        v.push_back({bool(t & 1), bool(t & 2), m, n, 70 + 13 * m, 0.5f, t == 3 ? 1.5f : 0.0f, t});
  // alpha/beta variants and strided operands.
  v.push_back({false, false, 45, 70, 300, 0.5f, -1.5f});
  v.push_back({true, true, 45, 70, 300, -2.0f, 1.0f});
  v.push_back({false, true, 33, 65, 129, 1.0f, 1.0f, 7});
  v.push_back({true, false, 33, 65, 129, 0.25f, 0.35f, 3});
  v.push_back({false, false, 7, 9, 0, 1.0f, 0.5f});
  // Random shapes.
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::int64_t> dim(1, 200);
  for (int i = 0; i < 24; ++i)
    v.push_back({bool(i & 1), bool(i & 2), dim(rng), dim(rng), dim(rng) * (i % 3 == 0 ? 3 : 1),
                 i % 5 == 0 ? 0.75f : 1.0f, i % 4 == 0 ? 0.5f : 0.0f, i % 6 == 0 ? 5 : 0});
  return v;
}

TEST(Gemm, PackedAndReferenceMatchDoubleOracle) {
  std::mt19937 rng(42);
  for (const Case& cs : cases()) {
    const Operands o = make_operands(cs, rng);
    expect_matches_oracle(sgemm_packed, "sgemm_packed", cs, o);
    expect_matches_oracle(sgemm_reference, "sgemm_reference", cs, o);
    expect_matches_oracle([](const GemmShape& g, float al, const float* a, const float* b, float be,
                             float* c) { sgemm(g, al, a, b, be, c); },
                          "sgemm", cs, o);
    if (cs.m <= 4) expect_matches_oracle(sgemm_few_rows, "sgemm_few_rows", cs, o);
  }
}

TEST(Gemm, BatchedWithSharedOperandsMatchesReference) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const auto& [m, n, k] : {std::array<std::int64_t, 3>{50, 70, 300}, {3, 4, 5}, {77, 77, 64}}) {
    const std::int64_t batch = 6;
    std::vector<float> a(std::size_t(batch * m * k)), b(std::size_t(2 * k * n));
    for (auto& x : a) x = u(rng);
    for (auto& x : b) x = u(rng);
    std::vector<float> c(std::size_t(batch * m * n), std::numeric_limits<float>::quiet_NaN()), want(c.size());
    std::vector<const float*> as, bs;
    std::vector<float*> cs, ws;
    for (std::int64_t e = 0; e < batch; ++e) {
      as.push_back(a.data() + e * m * k);
      bs.push_back(b.data() + (e < 4 ? 0 : k * n));  // two runs of one shared B each
      cs.push_back(c.data() + e * m * n);
      ws.push_back(want.data() + e * m * n);
    }
    const GemmShape s{false, false, m, n, k, k, n, n};
    sgemm_batched(s, batch, 1.0f, as.data(), bs.data(), 0.0f, cs.data());
    sgemm_batched_reference(s, batch, 1.0f, as.data(), bs.data(), 0.0f, ws.data());
    for (std::size_t i = 0; i < c.size(); ++i)
      ASSERT_NEAR(c[i], want[i], 2e-6 * double(k)) << "m " << m << ", n " << n << ", k " << k << ", element " << i;
  }
}

TEST(Gemm, ResultsDoNotDependOnThreadCount) {
  std::mt19937 rng(11);
  // Many tasks and several k blocks with edge tiles in both directions (packed path), and a
  // few-rows product wide enough for several column chunks.
  for (const Case& cs : {Case{false, true, 301, 203, 700, 1.0f, 0.5f}, Case{false, false, 3, 1000, 300, 1.0f, 0.0f},
                         Case{true, true, 2, 700, 129, 1.0f, 0.0f}}) {
    const Operands o = make_operands(cs, rng);
    auto run = [&] {
      std::vector<float> c = o.c;
      sgemm(o.s, cs.alpha, o.a.data(), o.b.data(), cs.beta, c.data());
      return c;
    };
    const std::vector<float> def = run();
    std::vector<float> other;
    {
      tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 1);
      other = run();
    }
    EXPECT_EQ(0, std::memcmp(def.data(), other.data(), def.size() * sizeof(float))) << describe(cs) << ": 1 thread";
    // Arenas of other sizes also change how the work is split into tasks.
    for (int threads : {1, 3}) {
      tbb::task_arena(threads).execute([&] { other = run(); });
      EXPECT_EQ(0, std::memcmp(def.data(), other.data(), def.size() * sizeof(float)))
          << describe(cs) << ": arena of " << threads;
    }
  }
}

TEST(Gemm, PrepackedOperandsGiveTheSameBits) {
  std::mt19937 rng(12);
  for (const Case& cs : cases()) {
    const Operands o = make_operands(cs, rng);
    std::vector<float> plain = o.c, packed = o.c;
    sgemm(o.s, cs.alpha, o.a.data(), o.b.data(), cs.beta, plain.data());
    const PackedA pa(o.s.trans_a, o.s.m, o.s.k, o.a.data(), o.s.lda);
    const PackedB pb(o.s.trans_b, o.s.k, o.s.n, o.b.data(), o.s.ldb);
    sgemm(o.s, cs.alpha, o.a.data(), o.b.data(), cs.beta, packed.data(), &pa, &pb);
    ASSERT_EQ(0, std::memcmp(plain.data(), packed.data(), plain.size() * sizeof(float))) << describe(cs);
    packed = o.c;
    sgemm(o.s, cs.alpha, o.a.data(), o.b.data(), cs.beta, packed.data(), nullptr, &pb);
    ASSERT_EQ(0, std::memcmp(plain.data(), packed.data(), plain.size() * sizeof(float))) << describe(cs) << ", B only";
  }
  // Operands packed for another shape are refused on the packed path.
  const Operands o = make_operands(Case{false, false, 40, 50, 60, 1.0f, 0.0f}, rng);
  const PackedB wrong(false, 60, 49, o.b.data(), o.s.ldb);
  std::vector<float> c = o.c;
  EXPECT_THROW(sgemm(o.s, 1.0f, o.a.data(), o.b.data(), 0.0f, c.data(), nullptr, &wrong), std::invalid_argument);
}

// float16 panels (PanelStorage::kFloat16IfExact) of operands exact in float16: half the bytes and
// the bits of float panels; operands that are not all exact keep float panels.
TEST(Gemm, Float16PanelsOfExactOperandsGiveTheFloatPanelsBits) {
  std::mt19937 rng(16);
  int packed_path = 0;  // cases where sgemm reads the packed operands (the others ignore them)
  for (const Case& cs : cases()) {
    Operands o = make_operands(cs, rng);
    packed_path += sgemm_uses_packing(o.s);
    round_to_float16(o.a.data(), o.a.size());
    round_to_float16(o.b.data(), o.b.size());
    std::vector<float> plain = o.c, half = o.c;
    const PackedA pa(o.s.trans_a, o.s.m, o.s.k, o.a.data(), o.s.lda);
    const PackedB pb(o.s.trans_b, o.s.k, o.s.n, o.b.data(), o.s.ldb);
    sgemm(o.s, cs.alpha, o.a.data(), o.b.data(), cs.beta, plain.data(), &pa, &pb);
    const PackedA ha(o.s.trans_a, o.s.m, o.s.k, o.a.data(), o.s.lda, PanelStorage::kFloat16IfExact);
    const PackedB hb(o.s.trans_b, o.s.k, o.s.n, o.b.data(), o.s.ldb, PanelStorage::kFloat16IfExact);
    EXPECT_TRUE(ha.half() && hb.half()) << describe(cs);
    EXPECT_FALSE(pa.half() || pb.half());
    sgemm(o.s, cs.alpha, o.a.data(), o.b.data(), cs.beta, half.data(), &ha, &hb);
    ASSERT_EQ(0, std::memcmp(plain.data(), half.data(), plain.size() * sizeof(float))) << describe(cs);
  }
  EXPECT_GE(packed_path, 3);
  // One value not exact in float16 (and one NaN): float panels, still the same bits.
  Operands o = make_operands(Case{false, false, 40, 50, 300, 1.0f, 0.0f}, rng);
  round_to_float16(o.b.data(), o.b.size());
  o.b[123] = 1.0f + 0x1p-20f;
  EXPECT_FALSE(PackedB(false, 300, 50, o.b.data(), o.s.ldb, PanelStorage::kFloat16IfExact).half());
  o.b[123] = std::numeric_limits<float>::quiet_NaN();
  const PackedB nan(false, 300, 50, o.b.data(), o.s.ldb, PanelStorage::kFloat16IfExact);
  const PackedB nan_float(false, 300, 50, o.b.data(), o.s.ldb);
  std::vector<float> a = o.c, b = o.c;
  sgemm(o.s, 1.0f, o.a.data(), o.b.data(), 0.0f, a.data(), nullptr, &nan);
  sgemm(o.s, 1.0f, o.a.data(), o.b.data(), 0.0f, b.data(), nullptr, &nan_float);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

TEST(Gemm, GenericIntegerProductsAreExact) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<std::int64_t> u(-3000000, 3000000);  // products beyond float's 24 bits
  const std::int64_t m = 9, n = 11, k = 13;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      std::vector<std::int64_t> a(std::size_t(m * k)), b(std::size_t(k * n)), c(std::size_t(m * n));
      for (auto& x : a) x = u(rng);
      for (auto& x : b) x = u(rng);
      const GemmShape s{ta, tb, m, n, k, ta ? m : k, tb ? k : n, n};
      gemm_generic<std::int64_t>(s, a.data(), b.data(), c.data());
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          std::int64_t want = 0;
          for (std::int64_t p = 0; p < k; ++p)
            want += a[std::size_t(ta ? p * m + i : i * k + p)] * b[std::size_t(tb ? j * k + p : p * n + j)];
          ASSERT_EQ(c[std::size_t(i * n + j)], want) << "transA " << ta << ", transB " << tb;
        }
    }
  // int32 wraps like numpy rather than overflowing into undefined behaviour.
  const std::int32_t big[] = {65536, 65536};
  const std::int32_t ones[] = {65536, 1};
  std::int32_t out = 0;
  gemm_generic<std::int32_t>({false, false, 1, 1, 2, 2, 1, 1}, big, ones, &out);
  EXPECT_EQ(out, 65536);  // 2^32 wraps to 0, plus 65536
}

TEST(Gemm, GenericDoubleMatchesLoops) {
  const double a[] = {1, 2, 3, 4, 5, 6};     // 2 x 3
  const double b[] = {7, 8, 9, 10, 11, 12};  // 3 x 2
  double c[4];
  gemm_generic<double>({false, false, 2, 2, 3, 3, 2, 2}, a, b, c);
  EXPECT_EQ(c[0], 58);
  EXPECT_EQ(c[1], 64);
  EXPECT_EQ(c[2], 139);
  EXPECT_EQ(c[3], 154);
}

}  // namespace
}  // namespace qeval::kernels
