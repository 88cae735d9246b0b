// Summary statistics and statistic names.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "metrics/stats.h"

namespace qeval::metrics {
namespace {

TEST(Stats, PercentileIsNumpyLinear) {
  std::vector<double> v = {3, 1, 4, 1, 5, 9, 2, 6};
  // numpy.percentile([3,1,4,1,5,9,2,6], q): 5 -> 1.0, 25 -> 1.75, 50 -> 3.5, 90 -> 6.9, 100 -> 9
  EXPECT_DOUBLE_EQ(*percentile(v, 5), 1.0);
  EXPECT_DOUBLE_EQ(*percentile(v, 25), 1.75);
  EXPECT_DOUBLE_EQ(*percentile(v, 50), 3.5);
  EXPECT_NEAR(*percentile(v, 90), 6.9, 1e-12);
  EXPECT_DOUBLE_EQ(*percentile(v, 100), 9);
  EXPECT_FALSE(percentile(std::vector<double>{}, 50).has_value());
  EXPECT_THROW(percentile(v, 101), std::invalid_argument);
}

TEST(Stats, InfinitySamplesDoNotTurnIntoNaN) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> v = {30, inf, inf};
  EXPECT_EQ(*percentile(v, 90), inf);
  EXPECT_EQ(*percentile(v, 0), 30);
  EXPECT_EQ(summarize(v)->min, 30);
}

TEST(Stats, Summary) {
  std::vector<double> v = {1, 2, 3, 4};
  auto s = summarize(v);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->count, 4u);
  EXPECT_DOUBLE_EQ(s->mean, 2.5);
  EXPECT_DOUBLE_EQ(s->median, 2.5);
  EXPECT_DOUBLE_EQ(s->stddev, std::sqrt(1.25));
  EXPECT_DOUBLE_EQ(s->p5, 1.15);
}

TEST(Stats, ParseStat) {
  EXPECT_EQ(parse_stat("mean").kind, StatSpec::Kind::kMean);
  EXPECT_EQ(parse_stat("min").kind, StatSpec::Kind::kMin);
  auto p = parse_stat("p99.9");
  EXPECT_EQ(p.kind, StatSpec::Kind::kPercentile);
  EXPECT_DOUBLE_EQ(p.q, 99.9);
  EXPECT_THROW(parse_stat("p101"), std::invalid_argument);
  EXPECT_THROW(parse_stat("average"), std::invalid_argument);
  EXPECT_THROW(parse_stat("p"), std::invalid_argument);
  std::vector<double> v = {1, 2, 3};
  EXPECT_DOUBLE_EQ(*compute_stat(parse_stat("max"), v), 3);
  EXPECT_DOUBLE_EQ(*compute_stat(parse_stat("p50"), v), 2);
}

}  // namespace
}  // namespace qeval::metrics
