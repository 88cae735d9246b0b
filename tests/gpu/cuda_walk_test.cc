// kernels::cuda::coalesced, the host side of the device's strided walks (Transpose, Slice, broadcast
// binary ops, Where): the merged walk must address exactly the elements the given one does, for
// every operand and index. Host code only: these tests run without a GPU (in CI too).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cuda/kernels.h"

namespace qeval::kernels::cuda {
namespace {

std::int64_t numel(const Walk& w) {
  std::int64_t n = 1;
  for (int d = 0; d < w.rank; ++d) n *= w.counts[d];
  return n;
}

// Operand k's offset for dense index i, as the contract in kernels.h defines it.
std::int64_t offset(const Walk& w, int k, std::int64_t i) {
  std::int64_t off = w.base[k];
  for (int d = w.rank - 1; d >= 0; --d) {
    off += (i % w.counts[d]) * w.strides[k][d];
    i /= w.counts[d];
  }
  return off;
}

void expect_same_offsets(const Walk& given) {
  const Walk c = coalesced(given);
  ASSERT_EQ(numel(c), numel(given));
  ASSERT_LE(c.rank, std::max(given.rank, 1));
  for (std::int64_t i = 0; i < numel(given); ++i)
    for (int k = 0; k < 4; ++k) ASSERT_EQ(offset(c, k, i), offset(given, k, i)) << "operand " << k << " index " << i;
}

// Operand 0 reads a [counts] array through `strides`; operand 1 writes the dense output.
Walk walk_of(std::vector<std::int64_t> counts, std::vector<std::int64_t> src_strides) {
  Walk w;
  w.rank = int(counts.size());
  std::int64_t dense = 1;
  for (int d = w.rank - 1; d >= 0; --d) {
    w.counts[d] = counts[std::size_t(d)];
    w.strides[0][d] = src_strides[std::size_t(d)];
    w.strides[1][d] = dense;
    dense *= counts[std::size_t(d)];
  }
  return w;
}

TEST(CudaWalk, DenseAndBroadcastWalksMergeToFewerAxes) {
  // Same shape, both dense: one axis.
  const Walk dense = walk_of({2, 320, 8, 8}, {20480, 64, 8, 1});
  EXPECT_EQ(coalesced(dense).rank, 1);
  expect_same_offsets(dense);
  // A per-channel bias [320, 1, 1] over [2, 320, 8, 8]: (2, 320, 64).
  const Walk bias = walk_of({2, 320, 8, 8}, {0, 1, 0, 0});
  const Walk cb = coalesced(bias);
  ASSERT_EQ(cb.rank, 3);
  EXPECT_EQ(cb.counts[0], 2);
  EXPECT_EQ(cb.counts[1], 320);
  EXPECT_EQ(cb.counts[2], 64);
  expect_same_offsets(bias);
  // Attention's head split [2, 64, 8, 40] -> [2, 8, 64, 40] reads across axes: nothing merges.
  const Walk transpose = walk_of({2, 8, 64, 40}, {64 * 320, 40, 320, 1});
  EXPECT_EQ(coalesced(transpose).rank, 4);
  expect_same_offsets(transpose);
  // Size-1 axes vanish; a walk of size-1 axes only is one element.
  const Walk ones = walk_of({1, 1, 1}, {5, 7, 9});
  EXPECT_EQ(coalesced(ones).rank, 1);
  EXPECT_EQ(coalesced(ones).counts[0], 1);
  expect_same_offsets(ones);
  // An empty walk stays empty.
  EXPECT_EQ(numel(coalesced(walk_of({3, 0, 2}, {0, 2, 1}))), 0);
}

TEST(CudaWalk, RandomWalksAddressTheSameElementsAfterMerging) {
  std::mt19937 rng(23);
  std::uniform_int_distribution<int> rank_of(1, 6), count_of(1, 4), stride_of(-6, 6), kind_of(0, 2);
  for (int trial = 0; trial < 2000; ++trial) {
    Walk w;
    w.rank = rank_of(rng);
    for (int d = 0; d < w.rank; ++d) w.counts[d] = count_of(rng);
    for (int k = 0; k < 4; ++k) {
      w.base[k] = stride_of(rng) * 50;
      const int kind = kind_of(rng);  // dense, broadcast some axes of dense, or arbitrary strides
      std::int64_t dense = 1;
      for (int d = w.rank - 1; d >= 0; --d) {
        w.strides[k][d] = kind == 2 ? stride_of(rng) : (kind == 1 && count_of(rng) == 1 ? 0 : dense);
        dense *= w.counts[d];
      }
    }
    SCOPED_TRACE("trial " + std::to_string(trial));
    expect_same_offsets(w);
  }
}

}  // namespace
}  // namespace qeval::kernels::cuda
