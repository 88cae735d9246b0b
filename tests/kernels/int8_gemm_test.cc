// int8 GEMM: the VNNI and portable kernels against the naive loops, on random and extreme values
// (-128 everywhere, +-127 mixtures), odd shapes and tails, and transposed B packing.
#include <gtest/gtest.h>

#include <random>
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

TEST(Int8Gemm, EmptyKGivesZeros) {
  std::vector<std::int32_t> c(6, 5);
  int8_gemm(2, 3, 0, nullptr, 0, nullptr, 3, c.data(), 3);
  EXPECT_EQ(c, std::vector<std::int32_t>(6, 0));
}

}  // namespace
}  // namespace qeval::kernels
