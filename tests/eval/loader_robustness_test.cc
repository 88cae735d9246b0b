// Mutated ONNX files (bit flips, truncation, splices) must load or fail with an InputError: the
// in-suite companion of the libFuzzer target in tests/fuzz/.
#include <gtest/gtest.h>

#include <random>

#include "eval/onnx_import.h"
#include "eval/session.h"
#include "kernels/error.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

TEST(LoaderRobustness, MutatedModelsLoadOrFailCleanly) {
  const std::filesystem::path root = "/usr/share/libonnx-testdata/data/node";
  if (!std::filesystem::exists(root)) GTEST_SKIP() << "libonnx-testdata not installed";
  std::vector<std::vector<std::uint8_t>> seeds;
  for (const char* t : {"test_conv_with_strides_padding", "test_reshape_reduced_dims", "test_add_bcast",
                        "test_gemm_default_single_elem_vector_bias", "test_softmax_axis_0"})
    if (std::filesystem::exists(root / t / "model.onnx")) seeds.push_back(testing::read_bytes(root / t / "model.onnx"));
  ASSERT_FALSE(seeds.empty());
  std::mt19937 rng(12345);
  int loaded = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<std::uint8_t> m = seeds[std::size_t(iter) % seeds.size()];
    const int kind = iter % 4;
    std::uniform_int_distribution<std::size_t> pos(0, m.size() - 1);
    if (kind == 0) {
      for (int k = 0; k < 3; ++k) m[pos(rng)] ^= std::uint8_t(1u << (rng() % 8));
    } else if (kind == 1) {
      m.resize(pos(rng));
    } else if (kind == 2) {
      m[pos(rng)] = std::uint8_t(rng());
      m[pos(rng)] = 0xFF;
    } else {
      const auto& other = seeds[rng() % seeds.size()];
      std::size_t at = pos(rng), from = rng() % other.size();
      m.insert(m.begin() + std::ptrdiff_t(at), other.begin() + std::ptrdiff_t(from),
               other.begin() + std::ptrdiff_t(std::min(other.size(), from + 16)));
    }
    try {
      Graph g = parse_onnx(m, "mutated.onnx", "/nonexistent");
      Session s(g);
      ++loaded;
    } catch (const InputError&) {
      ++rejected;
    }
  }
  EXPECT_EQ(loaded + rejected, 3000);
  EXPECT_GT(rejected, 100);  // the mutations did reach the error paths
}

}  // namespace
}  // namespace qeval::eval
