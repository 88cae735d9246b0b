// Block pooling used for thumbnails and heatmaps.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/pooling.h"

namespace qeval::kernels {
namespace {

TEST(Pooling, AverageAndMaxWithPartialBlocks) {
  // 3 x 3 plane, f = 2 -> 2 x 2 with partial right/bottom blocks.
  std::vector<float> p = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  int h = 0, w = 0;
  auto avg = pool_plane(p.data(), 3, 3, 2, PoolMode::kAverage, &h, &w);
  ASSERT_EQ(h, 2);
  ASSERT_EQ(w, 2);
  EXPECT_FLOAT_EQ(avg[0], 3.0f);  // (1 + 2 + 4 + 5) / 4
  EXPECT_FLOAT_EQ(avg[1], 4.5f);  // (3 + 6) / 2
  EXPECT_FLOAT_EQ(avg[2], 7.5f);  // (7 + 8) / 2
  EXPECT_FLOAT_EQ(avg[3], 9.0f);
  auto mx = pool_plane(p.data(), 3, 3, 2, PoolMode::kMax, &h, &w);
  EXPECT_FLOAT_EQ(mx[0], 5.0f);
  EXPECT_FLOAT_EQ(mx[3], 9.0f);
}

TEST(Pooling, MaxKeepsNaNVisible) {
  std::vector<float> p = {1, NAN, 3, 4};
  int h = 0, w = 0;
  auto mx = pool_plane(p.data(), 2, 2, 2, PoolMode::kMax, &h, &w);
  EXPECT_TRUE(std::isnan(mx[0]));
  EXPECT_THROW(pool_plane(p.data(), 2, 2, 0, PoolMode::kMax, &h, &w), std::invalid_argument);
}

}  // namespace
}  // namespace qeval::kernels
