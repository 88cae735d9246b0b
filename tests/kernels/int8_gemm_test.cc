// int8 GEMM: the VNNI and portable kernels against the naive loops, on random and extreme values
// (-128 everywhere, +-127 mixtures), odd shapes and tails, and transposed B packing.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/int8_gemm.h"

namespace qeval::kernels {
namespace {

std::vector<std::int8_t> random_int8(std::size_t n, unsigned seed, int lo = -128, int hi = 127) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<std::int8_t> v(n);
  for (auto& x : v) x = std::int8_t(d(rng));
  return v;
}

std::vector<Int8GemmPath> paths() {
  std::vector<Int8GemmPath> p{Int8GemmPath::kPortable};
  if (int8_gemm_path_available(Int8GemmPath::kAvx512Vnni)) p.push_back(Int8GemmPath::kAvx512Vnni);
  return p;
}

// C written with a leading dimension wider than n: the columns past n must stay untouched.
void check_against_reference(std::int64_t m, std::int64_t n, std::int64_t k, const std::vector<std::int8_t>& a,
                             const std::vector<std::int8_t>& b) {
  const std::int64_t ldc = n + 3;
  std::vector<std::int32_t> want(std::size_t(m * ldc), -7);
  int8_gemm_reference(m, n, k, a.data(), k, b.data(), n, want.data(), ldc);
  for (auto path : paths()) {
    SCOPED_TRACE(std::string(int8_gemm_path_name(path)) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                 " k=" + std::to_string(k));
    std::vector<std::int32_t> got(std::size_t(m * ldc), -7);
    int8_gemm(m, n, k, a.data(), k, b.data(), n, got.data(), ldc, path);
    ASSERT_EQ(got, want);
  }
}

TEST(Int8Gemm, RandomShapesWithTailsMatchTheReferenceExactly) {
  unsigned seed = 1;
  for (std::int64_t m : {1, 3, 8, 9, 23, 100})
    for (std::int64_t n : {1, 17, 32, 33, 70})
      for (std::int64_t k : {1, 3, 4, 5, 31, 64, 515}) {
        auto a = random_int8(std::size_t(m * k), seed++), b = random_int8(std::size_t(k * n), seed++);
        check_against_reference(m, n, k, a, b);
      }
}

TEST(Int8Gemm, ExtremeValuesAccumulateExactlyInInt32) {
  // -128 x -128 over k = 4099: 4099 * 16384 = 67,158,016 per element, beyond float32 exactness (2^24).
  const std::int64_t m = 13, n = 37, k = 4099;
  std::vector<std::int8_t> a(std::size_t(m * k), -128), b(std::size_t(k * n), -128);
  check_against_reference(m, n, k, a, b);
  std::vector<std::int32_t> c(std::size_t(m * n));
  int8_gemm(m, n, k, a.data(), k, b.data(), n, c.data(), n);
  EXPECT_EQ(c[0], 4099 * 16384);
  // -128 against 127 (the most negative products) and mixtures of the extremes only.
  std::fill(b.begin(), b.end(), std::int8_t(127));
  check_against_reference(m, n, k, a, b);
  auto ea = random_int8(std::size_t(m * k), 5, -128, 127), eb = random_int8(std::size_t(k * n), 6, -128, 127);
  for (auto& v : ea) v = v < 0 ? std::int8_t(-128) : std::int8_t(127);
  for (auto& v : eb) v = v < 0 ? std::int8_t(-128) : std::int8_t(127);
  check_against_reference(m, n, k, ea, eb);
}

TEST(Int8Gemm, LargeProductUsesEveryBlockAndThread) {
  const std::int64_t m = 200, n = 300, k = 1100;  // several m/n/k blocks
  auto a = random_int8(std::size_t(m * k), 11), b = random_int8(std::size_t(k * n), 12);
  check_against_reference(m, n, k, a, b);
}

TEST(Int8Gemm, TransposedBPackingAndSums) {
  const std::int64_t m = 9, n = 35, k = 21;
  auto a = random_int8(std::size_t(m * k), 21), b = random_int8(std::size_t(k * n), 22);
  std::vector<std::int8_t> bt(std::size_t(n * k));
  for (std::int64_t p = 0; p < k; ++p)
    for (std::int64_t j = 0; j < n; ++j) bt[std::size_t(j * k + p)] = b[std::size_t(p * n + j)];
  std::vector<std::int32_t> want(std::size_t(m * n)), got(std::size_t(m * n));
  int8_gemm_reference(m, n, k, a.data(), k, b.data(), n, want.data(), n);
  const PackedInt8A pa(m, k, a.data(), k);
  const PackedInt8B pbt(k, n, bt.data(), k, true);
  for (auto path : paths()) {
    int8_gemm(pa, pbt, got.data(), n, path);
    EXPECT_EQ(got, want) << int8_gemm_path_name(path);
  }
  for (std::int64_t j = 0; j < n; ++j) {
    std::int32_t s = 0;
    for (std::int64_t p = 0; p < k; ++p) s += b[std::size_t(p * n + j)];
    EXPECT_EQ(pbt.col_sums()[j], s);
  }
  for (std::int64_t i = 0; i < m; ++i) {
    std::int32_t s = 0;
    for (std::int64_t p = 0; p < k; ++p) s += a[std::size_t(i * k + p)];
    EXPECT_EQ(pa.row_sums()[i], s);
  }
}

// Packed A against its documented layout, byte for byte, with the row sums: odd m (partial
// panels), k with 1 to 3 bytes past the last whole group and across several 16-group blocks of the
// vectorised packer, a leading dimension wider than k (the bytes between rows are never read: they
// hold 99), extremes, and a scratch repacked smaller and larger (stale bytes must not survive).
TEST(Int8Gemm, PackedAHoldsTheDocumentedLayoutAndRowSums) {
  PackedInt8A scratch(0, 0, nullptr, 0);
  unsigned seed = 300;
  for (std::int64_t m : {1, 13, 14, 15, 29, 100})
    for (std::int64_t k : {1, 2, 3, 4, 7, 63, 64, 65, 66, 67, 128, 130, 257}) {
      SCOPED_TRACE("m=" + std::to_string(m) + " k=" + std::to_string(k));
      const std::int64_t lda = k + 5;
      std::vector<std::int8_t> a(std::size_t(m * lda), 99);
      const auto values = random_int8(std::size_t(m * k), seed++);
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t q = 0; q < k; ++q) {
          std::int8_t v = values[std::size_t(i * k + q)];
          if (seed % 3 == 0) v = v < 0 ? std::int8_t(-128) : std::int8_t(127);
          a[std::size_t(i * lda + q)] = v;
        }
      scratch.pack(m, k, a.data(), lda);
      const PackedInt8A fresh(m, k, a.data(), lda);
      const std::int64_t groups = (k + 3) / 4, panels = (m + kInt8MR - 1) / kInt8MR;
      ASSERT_EQ(scratch.k_groups(), groups);
      for (const PackedInt8A* packed : {static_cast<const PackedInt8A*>(&scratch), &fresh}) {
        for (std::int64_t p = 0; p < panels; ++p) {
          const std::uint8_t* panel = packed->panel(p * kInt8MR);
          for (std::int64_t g = 0; g < groups; ++g)
            for (int r = 0; r < kInt8MR; ++r)
              for (int b = 0; b < 4; ++b) {
                const std::int64_t i = p * kInt8MR + r, q = 4 * g + b;
                const std::uint8_t want = i < m && q < k ? std::uint8_t(a[std::size_t(i * lda + q)]) ^ 0x80 : 0x80;
                ASSERT_EQ(panel[(g * kInt8MR + r) * 4 + b], want) << "panel " << p << " group " << g << " row " << r;
              }
        }
        for (std::int64_t i = 0; i < m; ++i) {
          std::int32_t sum = 0;
          for (std::int64_t q = 0; q < k; ++q) sum += a[std::size_t(i * lda + q)];
          ASSERT_EQ(packed->row_sums()[i], sum) << "row " << i;
        }
      }
    }
}

TEST(Int8Gemm, EmptyKGivesZeros) {
  std::vector<std::int32_t> c(6, 5);
  int8_gemm(2, 3, 0, nullptr, 0, nullptr, 3, c.data(), 3);
  EXPECT_EQ(c, std::vector<std::int32_t>(6, 0));
}

// The dequantizing epilogue: each term in its documented order, every step rounded on its own
// (volatile keeps the compiler from fusing a multiply and an add).
float epilogue_value(std::int32_t s, std::int64_t i, std::int64_t j, const Int8Epilogue& e) {
  volatile float v = float(s + (e.row_add ? e.row_add[i] : 0) + (e.col_add ? e.col_add[j] : 0));
  if (e.row_scale) v = v * e.row_scale[i];
  if (e.col_scale) v = v * e.col_scale[j];
  if (e.row_bias) v = v + e.row_bias[i];
  if (e.col_bias) v = v + e.col_bias[j];
  return v;
}

TEST(Int8Gemm, EpilogueGivesTheSameFloatsAsASecondPassOverTheSums) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> scale(1e-4f, 3e-2f), bias(-2.0f, 2.0f);
  std::uniform_int_distribution<std::int32_t> add(-40000, 40000);
  // k = 1100 spans three k blocks (the partial sums live in the output between them); tails in m
  // and n; ldo wider than n.
  for (auto [m, n, k] : {std::tuple{1, 1, 1}, {15, 33, 7}, {29, 70, 1100}, {170, 300, 64}}) {
    const auto a = random_int8(std::size_t(m * k), 5 + unsigned(m));
    const auto b = random_int8(std::size_t(k * n), 9 + unsigned(n));
    std::vector<std::int32_t> row_add(static_cast<std::size_t>(m)), col_add(static_cast<std::size_t>(n));
    std::vector<float> row_scale(static_cast<std::size_t>(m)), col_scale(static_cast<std::size_t>(n)),
        row_bias(static_cast<std::size_t>(m)), col_bias(static_cast<std::size_t>(n));
    for (auto& v : row_add) v = add(rng);
    for (auto& v : col_add) v = add(rng);
    for (auto& v : row_scale) v = scale(rng);
    for (auto& v : col_scale) v = scale(rng);
    for (auto& v : row_bias) v = bias(rng);
    for (auto& v : col_bias) v = bias(rng);
    const std::int64_t ldo = n + 5;
    std::vector<std::int32_t> sums(std::size_t(m * ldo));
    int8_gemm_reference(m, n, k, a.data(), k, b.data(), n, sums.data(), ldo);
    // Every subset of terms that the fused ops use, and all of them.
    for (int mask : {0x3f, 0x14, 0x0a, 0x09, 0x02, 0x00}) {
      Int8Epilogue e;
      if (mask & 0x01) e.row_add = row_add.data();
      if (mask & 0x02) e.col_add = col_add.data();
      if (mask & 0x04) e.row_scale = row_scale.data();
      if (mask & 0x08) e.col_scale = col_scale.data();
      if (mask & 0x10) e.row_bias = row_bias.data();
      if (mask & 0x20) e.col_bias = col_bias.data();
      std::vector<float> want(std::size_t(m * ldo), -3.0f);
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j)
          want[std::size_t(i * ldo + j)] = epilogue_value(sums[std::size_t(i * ldo + j)], i, j, e);
      std::vector<std::int32_t> pass(sums);
      int8_epilogue(pass.data(), m, n, ldo, e);
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          float v;
          std::memcpy(&v, &pass[std::size_t(i * ldo + j)], sizeof v);
          ASSERT_EQ(v, want[std::size_t(i * ldo + j)]) << "second pass, mask " << mask << " at " << i << "," << j;
        }
      const PackedInt8A pa(m, k, a.data(), k);
      const PackedInt8B pb(k, n, b.data(), n);
      for (auto path : paths()) {
        SCOPED_TRACE(std::string(int8_gemm_path_name(path)) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                     " k=" + std::to_string(k) + " mask=" + std::to_string(mask));
        std::vector<float> got(std::size_t(m * ldo), -3.0f);
        int8_gemm(pa, pb, got.data(), ldo, e, path);
        ASSERT_EQ(got, want);  // the columns past n untouched too
      }
      // Rows from an offset: the row terms of a larger A.
      if (m > 1 && (mask & 0x15)) {
        const PackedInt8A tail(m - 1, k, a.data() + k, k);
        std::vector<float> got(std::size_t((m - 1) * ldo), -3.0f);
        int8_gemm(tail, pb, got.data(), ldo, e.rows_from(1));
        ASSERT_TRUE(std::equal(got.begin(), got.end(), want.begin() + ldo));
      }
    }
  }
}

}  // namespace
}  // namespace qeval::kernels
