// The seeded initial noise: bit-identical to tools/tiny_sd_pipeline.py's seeded_noise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "datasets/npy.h"
#include "eval/pipelines/noise.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

TEST(SeededNoise, BitIdenticalToThePythonReference) {
  const std::vector<std::pair<std::uint64_t, Shape>> cases = {
      {0, {1, 4, 16, 16}}, {1, {1, 4, 16, 16}}, {42, {2, 3, 5}}, {9223372036854775813ull, {1, 4, 16, 16}}};
  for (const auto& [seed, shape] : cases) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Tensor want =
        datasets::read_npy(testing::data_dir() / "tiny_sd" / ("noise_seed" + std::to_string(seed) + ".npy"));
    const Tensor got = seeded_noise(seed, shape);
    ASSERT_EQ(got.shape(), want.shape());
    ASSERT_EQ(std::memcmp(got.raw(), want.raw(), got.nbytes()), 0);
  }
}

TEST(SeededNoise, LooksStandardNormalAndDependsOnTheSeed) {
  const Tensor a = seeded_noise(7, {1, 4, 64, 64});
  double sum = 0, sq = 0;
  for (float v : a.span<float>()) {
    sum += v;
    sq += double(v) * v;
  }
  const double n = double(a.numel());
  EXPECT_NEAR(sum / n, 0.0, 0.05);
  EXPECT_NEAR(sq / n, 1.0, 0.05);
  const Tensor b = seeded_noise(8, {1, 4, 64, 64});
  EXPECT_NE(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
  // A prefix of the stream does not depend on the total size (odd counts drop the last z1).
  const Tensor c = seeded_noise(7, {5});
  EXPECT_EQ(std::memcmp(a.raw(), c.raw(), c.nbytes()), 0);
}

}  // namespace
}  // namespace qeval::eval
