// int8 conv: the im2col + int8 GEMM path (both kernels) and the depthwise path against the naive
// definition, over strides, dilations, pads, groups, 1 to 3 spatial dimensions and a nonzero pad
// value; window sums against their definition.
#include <gtest/gtest.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "kernels/int8_conv.h"
#include "kernels/int8_depthwise.h"
#include "kernels/scratch.h"

namespace qeval::kernels {
namespace {

std::vector<std::int8_t> random_int8(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-128, 127);
  std::vector<std::int8_t> v(n);
  for (auto& x : v) x = std::int8_t(d(rng));
  return v;
}

ConvParams params(std::int64_t batch, std::int64_t cin, std::int64_t cout, std::int64_t groups,
                  std::vector<std::int64_t> in, std::vector<std::int64_t> kernel, std::int64_t stride,
                  std::int64_t dilation, std::int64_t pad) {
  ConvParams p;
  p.batch = batch;
  p.in_channels = cin;
  p.out_channels = cout;
  p.groups = groups;
  p.in_spatial = in;
  p.kernel = kernel;
  p.strides.assign(in.size(), stride);
  p.dilations.assign(in.size(), dilation);
  p.pads_begin.assign(in.size(), pad);
  p.pads_end.assign(in.size(), pad + 1);  // asymmetric
  p.out_spatial = conv_output_spatial(p);
  return p;
}

// One scratch for every check: reused across geometries (larger, then smaller, stale contents).
PackedInt8B& shared_scratch() {
  static PackedInt8B scratch(0, 0);
  return scratch;
}

void check(const ConvParams& p, unsigned seed, std::int8_t pad_value) {
  auto x = random_int8(std::size_t(conv_input_size(p)), seed);
  auto w = random_int8(std::size_t(conv_weight_size(p)), seed + 1);
  std::vector<std::int32_t> want(std::size_t(conv_output_size(p)));
  int8_conv_reference(p, x.data(), pad_value, w.data(), want.data());
  const PackedInt8ConvWeights packed(p, w.data());
  std::vector<Int8GemmPath> paths{Int8GemmPath::kPortable};
  if (int8_gemm_path_available(Int8GemmPath::kAvx512Vnni)) paths.push_back(Int8GemmPath::kAvx512Vnni);
  std::int64_t out_size = 1;
  for (auto o : p.out_spatial) out_size *= o;
  for (auto path : paths)
    for (PackedInt8B* scratch : {static_cast<PackedInt8B*>(nullptr), &shared_scratch()}) {
      std::vector<std::int32_t> got(want.size(), 12345);
      std::vector<std::int32_t> sums(std::size_t(p.batch * p.groups * out_size), 12345);
      int8_conv(p, x.data(), pad_value, packed, got.data(), sums.data(), path, scratch);
      for (std::size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(got[i], want[i]) << int8_gemm_path_name(path) << (scratch ? " (scratch)" : "") << " groups "
                                   << p.groups << " element " << i << " of " << want.size();
      // Window sums = the same conv with one all-ones filter per group.
      ConvParams ones = p;
      ones.out_channels = p.groups;
      std::vector<std::int8_t> w1(std::size_t(conv_weight_size(ones)), 1);
      std::vector<std::int32_t> want_sums(std::size_t(conv_output_size(ones)));
      int8_conv_reference(ones, x.data(), pad_value, w1.data(), want_sums.data());
      ASSERT_EQ(sums, want_sums) << int8_gemm_path_name(path);
    }
}

TEST(Int8Conv, MatchesTheDefinitionOverGeometries) {
  unsigned seed = 100;
  check(params(2, 6, 10, 1, {9, 11}, {3, 3}, 1, 1, 1), seed++, 0);
  check(params(1, 6, 8, 2, {12, 7}, {3, 2}, 2, 1, 0), seed++, -3);
  check(params(1, 5, 7, 1, {10, 10}, {3, 3}, 1, 2, 2), seed++, 17);
  check(params(1, 9, 9, 1, {8, 8}, {1, 1}, 1, 1, 0), seed++, 3);  // 1x1, padded at the end
  ConvParams direct = params(1, 9, 9, 1, {8, 8}, {1, 1}, 1, 1, 0);
  direct.pads_end = {0, 0};
  direct.out_spatial = conv_output_spatial(direct);
  check(direct, seed++, 0);  // 1x1 stride 1 unpadded: x read in place, no im2col
  check(params(2, 8, 8, 8, {9, 9}, {3, 3}, 1, 1, 1), seed++, -128);     // depthwise
  check(params(1, 4, 6, 2, {15}, {4}, 2, 1, 1), seed++, 5);             // 1-D
  check(params(1, 3, 4, 1, {4, 5, 6}, {2, 3, 3}, 1, 1, 1), seed++, 0);  // 3-D
  check(params(1, 64, 40, 1, {16, 16}, {3, 3}, 1, 1, 1), seed++, 0);    // k = 576, several GEMM blocks
  check(params(2, 6, 10, 1, {9, 11}, {3, 3}, 1, 1, 1), seed++, -7);     // the scratch smaller again
}

// Short output rows, where im2col gathers up to 64 columns from within 128 bytes of the padded
// plane with one byte permutation (several output rows at once): tiny-sd's 16x16 and 8x8 3x3
// convs and its stride-2 downsampler, widths around the 64-column and 128-byte limits, strides 2
// and 3, dilation, 1-D and 3-D, unpadded inputs (the input read in place), and blocks of columns
// that start inside an output row (a 448 KB block of k = 36 * 9 is not a whole number of rows).
TEST(Int8Conv, ShortOutputRowsGatheredByPermutationMatchTheDefinition) {
  unsigned seed = 500;
  check(params(2, 16, 24, 1, {16, 16}, {3, 3}, 1, 1, 1), seed++, 0);
  check(params(2, 12, 20, 1, {8, 8}, {3, 3}, 1, 1, 1), seed++, -5);
  check(params(2, 16, 16, 1, {16, 16}, {3, 3}, 2, 1, 1), seed++, 9);
  check(params(1, 4, 6, 1, {7, 5}, {3, 3}, 1, 1, 1), seed++, 0);
  check(params(1, 4, 6, 1, {9, 31}, {3, 3}, 1, 1, 1), seed++, 2);
  check(params(1, 3, 5, 1, {5, 62}, {3, 3}, 1, 1, 1), seed++, -1);
  check(params(1, 3, 5, 1, {4, 63}, {2, 2}, 1, 1, 0), seed++, 0);
  check(params(1, 3, 5, 1, {4, 64}, {3, 3}, 1, 1, 1), seed++, 0);
  check(params(1, 3, 5, 1, {6, 90}, {3, 3}, 3, 1, 1), seed++, 4);
  check(params(1, 3, 5, 1, {12, 40}, {3, 3}, 2, 1, 1), seed++, 0);
  check(params(1, 5, 7, 1, {11, 13}, {3, 3}, 1, 2, 2), seed++, -9);
  check(params(1, 4, 6, 1, {50}, {5}, 1, 1, 2), seed++, 1);
  check(params(1, 3, 4, 1, {4, 6, 6}, {2, 3, 3}, 1, 1, 1), seed++, 0);
  ConvParams unpadded = params(1, 6, 8, 1, {10, 12}, {3, 3}, 1, 1, 0);
  unpadded.pads_end = {0, 0};
  unpadded.out_spatial = conv_output_spatial(unpadded);
  check(unpadded, seed++, 0);
  check(params(1, 36, 8, 1, {70, 21}, {3, 3}, 1, 1, 1), seed++, 3);
}

// Short rows packed by windows (VBMI): each k group of 4 taps over 16 columns is one or two byte
// permutations of 128-byte windows of the padded input, written straight into the packed B with
// its column sums. Groups whose taps cross into the next channel's plane (two windows), k not a
// multiple of 4 (the last group's taps past k are 0), 16-column chunks past the block's last
// column (zero bytes and sums), kernels whose tap period is 1 (2x2), 3 (1x3), 9, 25 and 27 groups,
// strides, dilations, 1-D and 3-D, nonzero pad values, a dilation whose taps do not fit two
// windows (the run copies instead), and random geometries.
TEST(Int8Conv, ShortRowsPackedByWindowsMatchTheDefinition) {
  unsigned seed = 900;
  check(params(2, 64, 20, 1, {16, 16}, {3, 3}, 1, 1, 1), seed++, 0);    // tiny-sd's 16x16, planes crossed
  check(params(2, 96, 14, 1, {8, 8}, {3, 3}, 1, 1, 1), seed++, -2);     // tiny-sd's 8x8
  check(params(1, 64, 16, 1, {16, 16}, {3, 3}, 2, 1, 1), seed++, 3);    // its stride-2 downsampler
  check(params(1, 1, 5, 1, {9, 9}, {3, 3}, 1, 1, 1), seed++, 7);        // k = 9: a partial last group
  check(params(1, 3, 5, 1, {7, 5}, {3, 3}, 1, 1, 1), seed++, -1);       // k = 27, 35 columns
  check(params(1, 5, 3, 1, {6, 6}, {2, 2}, 1, 1, 0), seed++, 0);        // period 1
  check(params(1, 7, 3, 1, {5, 11}, {1, 3}, 1, 1, 1), seed++, 2);       // period 3, k = 21
  check(params(1, 3, 4, 1, {12, 12}, {5, 5}, 1, 1, 2), seed++, -4);     // period 25
  check(params(1, 2, 4, 1, {5, 5, 5}, {3, 3, 3}, 1, 1, 1), seed++, 1);  // period 27
  check(params(1, 4, 6, 1, {40}, {5}, 2, 2, 3), seed++, 0);             // 1-D, stride and dilation
  check(params(1, 4, 6, 1, {14, 14}, {3, 3}, 1, 2, 2), seed++, 5);      // dilation 2
  check(params(1, 3, 4, 1, {30, 16}, {3, 1}, 1, 6, 6), seed++, -6);     // 3 rows a group: too far apart
  check(params(1, 6, 4, 2, {9, 9}, {3, 3}, 1, 1, 1), seed++, 0);        // groups
  std::mt19937 rng(77);
  for (int i = 0; i < 40; ++i) {
    const std::int64_t groups = 1 + rng() % 2, kh = 1 + rng() % 4, kw = 1 + rng() % 4;
    const std::int64_t h = kh + rng() % 14, w = kw + rng() % 30;
    check(params(1 + rng() % 2, groups * (1 + rng() % 9), groups * (1 + rng() % 17), groups, {h, w}, {kh, kw},
                 1 + rng() % 2, 1, rng() % 2),
          seed++, std::int8_t(int(rng() % 256) - 128));
  }
}

// Depthwise (and channel-multiplier) convolutions over random geometries: both kernels against the
// definition, bit for bit, with window sums. Widths run past several 16-output vectors with odd
// tails; strides and dilations include ones the vector kernel cannot take (it then runs the
// portable one), and the kernel widths include 4-tap groups with 1 to 3 taps left over.
TEST(Int8Conv, DepthwiseMatchesTheDefinitionOnRandomGeometries) {
  std::mt19937 rng(2024);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int vector_shapes = 0;
  for (int trial = 0; trial < 150; ++trial) {
    ConvParams p;
    p.batch = uniform(1, 2);
    p.groups = p.in_channels = uniform(1, 5);
    p.out_channels = p.groups * (trial % 4 == 3 ? uniform(2, 3) : 1);
    const int rank = trial % 10 == 9 ? 3 : trial % 10 == 8 ? 1 : 2;
    for (int d = 0; d < rank; ++d) {
      const bool wide = d == rank - 1;
      const std::int64_t kernel = trial % 3 == 0 ? 3 : trial % 3 == 1 ? 5 : uniform(1, 7);
      p.kernel.push_back(rank == 3 && !wide ? uniform(1, 3) : kernel);
      p.strides.push_back(uniform(0, 3) == 0 ? uniform(3, 5) : uniform(1, 2));
      p.dilations.push_back(uniform(0, 4) == 0 ? uniform(2, 3) : 1);
      p.pads_begin.push_back(uniform(0, 3));
      p.pads_end.push_back(uniform(0, 3));
      p.in_spatial.push_back(wide ? uniform(1, 90) : uniform(1, rank == 3 ? 6 : 20));
    }
    p.out_spatial = conv_output_spatial(p);
    if (conv_output_size(p) == 0) continue;
    ASSERT_TRUE(int8_conv_is_depthwise(p));
    ASSERT_TRUE(PackedInt8ConvWeights(p, random_int8(std::size_t(conv_weight_size(p)), 1).data()).depthwise());
    const std::int64_t s = p.strides.back(), d = p.dilations.back(), taps = std::min<std::int64_t>(p.kernel.back(), 4);
    vector_shapes += 15 * s + (taps - 1) * d < 64;
    SCOPED_TRACE("trial " + std::to_string(trial));
    check(p, 1000 + unsigned(trial), std::int8_t(uniform(-128, 127)));
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(vector_shapes, 100);  // most shapes exercise the vector kernel where it exists
}

// Grouped and dense convolutions (im2col + int8 GEMM) over random geometries: runs split by the
// input's edges at every stride, widths past the 32-column panels, k not a multiple of 4, and one
// shape wide enough for several parallel packing tasks.
TEST(Int8Conv, GroupedMatchesTheDefinitionOnRandomGeometries) {
  std::mt19937 rng(77);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 60; ++trial) {
    const std::int64_t groups = uniform(1, 4), cg = uniform(2, 5), og = uniform(1, 6);
    ConvParams p;
    p.batch = uniform(1, 2);
    p.groups = groups;
    p.in_channels = groups * cg;
    p.out_channels = groups * og;
    const int rank = trial % 8 == 7 ? 1 : 2;
    for (int d = 0; d < rank; ++d) {
      p.kernel.push_back(uniform(1, 5));
      p.strides.push_back(uniform(1, 3));
      p.dilations.push_back(uniform(0, 3) == 0 ? 2 : 1);
      p.pads_begin.push_back(uniform(0, 3));
      p.pads_end.push_back(uniform(0, 3));
      p.in_spatial.push_back(uniform(1, 45));
    }
    if (trial == 0) p.in_spatial = {75, 70};  // > 4096 columns: several packing tasks
    p.out_spatial = conv_output_spatial(p);
    if (conv_output_size(p) == 0) continue;
    ASSERT_FALSE(int8_conv_is_depthwise(p));
    SCOPED_TRACE("trial " + std::to_string(trial));
    check(p, 5000 + unsigned(trial), std::int8_t(uniform(-128, 127)));
    if (HasFatalFailure()) return;
  }
}

// The extremes of both operands (and of the +128 code the vector kernel multiplies) with padding.
TEST(Int8Conv, DepthwiseExtremesAreExact) {
  for (std::int8_t v : {std::int8_t(-128), std::int8_t(127)})
    for (std::int8_t wv : {std::int8_t(-128), std::int8_t(127)}) {
      ConvParams p = params(1, 4, 4, 4, {7, 37}, {5, 5}, 1, 1, 2);
      std::vector<std::int8_t> x(std::size_t(conv_input_size(p)), v), w(std::size_t(conv_weight_size(p)), wv);
      std::vector<std::int32_t> want(std::size_t(conv_output_size(p))), got(want.size());
      int8_conv_reference(p, x.data(), v, w.data(), want.data());
      int8_conv(p, x.data(), v, PackedInt8ConvWeights(p, w.data()), got.data());
      EXPECT_EQ(got, want);
      EXPECT_EQ(got[0], 25 * std::int32_t(v) * wv);
    }
}

TEST(Int8Conv, ExtremeValuesStayExactInInt32) {
  ConvParams p = params(1, 128, 3, 1, {6, 6}, {3, 3}, 1, 1, 1);
  std::vector<std::int8_t> x(std::size_t(conv_input_size(p)), -128), w(std::size_t(conv_weight_size(p)), -128);
  std::vector<std::int32_t> want(std::size_t(conv_output_size(p))), got(want.size());
  int8_conv_reference(p, x.data(), -128, w.data(), want.data());
  int8_conv(p, x.data(), -128, PackedInt8ConvWeights(p, w.data()), got.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(got[0], 128 * 9 * 16384);
}

// Large convs build im2col (or the packed x of a 1x1 conv) a block of output positions at a time:
// the same sums and epilogue floats as the definition, and the B matrix this thread lends stays
// within kInt8ConvBlockBytes however large the image (it held the whole im2col before: 302 MB for
// one conv of a 1024x1024 model).
TEST(Int8Conv, LargeConvsPackBlocksOfBoundedSizeWithTheSameResults) {
  std::thread([] {  // a fresh thread: nothing lent yet
    ConvParams im2col = params(1, 16, 8, 1, {256, 256}, {3, 3}, 1, 1, 1);
    ConvParams direct = params(1, 128, 8, 1, {256, 256}, {1, 1}, 1, 1, 0);
    direct.pads_end = {0, 0};
    direct.out_spatial = conv_output_spatial(direct);
    for (const ConvParams& p : {im2col, direct}) {
      const std::int64_t kprod = p.kernel[0] * p.kernel[1], k = p.in_channels * kprod;
      const std::int64_t out_size = p.out_spatial[0] * p.out_spatial[1];
      ASSERT_GE(k * out_size, 2 * kInt8ConvBlockBytes);  // several blocks
      const std::int64_t block = int8_conv_block_columns(k, out_size);
      EXPECT_EQ(block % 256, 0);
      EXPECT_LE(k * block, kInt8ConvBlockBytes);
      auto x = random_int8(std::size_t(conv_input_size(p)), 7);
      auto w = random_int8(std::size_t(conv_weight_size(p)), 8);
      std::vector<std::int32_t> want(std::size_t(conv_output_size(p))), got(want.size(), 12345);
      std::vector<std::int32_t> sums(std::size_t(out_size), 12345);
      int8_conv_reference(p, x.data(), 3, w.data(), want.data());
      const PackedInt8ConvWeights packed(p, w.data());
      int8_conv(p, x.data(), 3, packed, got.data(), sums.data());
      ASSERT_EQ(got, want) << k;
      ConvParams ones = p;
      ones.out_channels = 1;
      std::vector<std::int8_t> w1(std::size_t(conv_weight_size(ones)), 1);
      std::vector<std::int32_t> want_sums(static_cast<std::size_t>(out_size));
      int8_conv_reference(ones, x.data(), 3, w1.data(), want_sums.data());
      EXPECT_EQ(sums, want_sums) << k;
      // The epilogue over blocks: the same floats as a pass over the whole sums.
      std::vector<float> scale(std::size_t(p.out_channels)), bias(scale.size());
      std::vector<std::int32_t> add(scale.size());
      for (std::size_t c = 0; c < scale.size(); ++c) {
        scale[c] = 0.001f * float(c + 1);
        bias[c] = 0.5f - float(c);
        add[c] = -3 * packed.channel_sum(std::int64_t(c));
      }
      Int8Epilogue e;
      e.row_add = add.data();
      e.row_scale = scale.data();
      e.row_bias = bias.data();
      std::vector<std::int32_t> want_floats = want;
      int8_epilogue(want_floats.data(), p.out_channels, out_size, out_size, e);
      std::vector<float> got_floats(want.size(), -1.0f);
      int8_conv(p, x.data(), 3, packed, got_floats.data(), e);
      ASSERT_EQ(std::memcmp(got_floats.data(), want_floats.data(), want.size() * sizeof(float)), 0) << k;
      // Lent: one block of B with its column sums, and the padded input of the im2col conv (its
      // pads end one further: 259 x 259).
      const std::size_t padded = std::size_t(im2col.in_channels * 259 * 259);
      EXPECT_LE(thread_lent_bytes(), std::size_t(kInt8ConvBlockBytes) + std::size_t(block) * 4 + padded + 64 * 1024)
          << k;
    }
  })
      .join();
}

// Dense convs are packed and multiplied a block of columns at a time: on one thread (or with blocks
// enough for every thread) in L2-sized blocks, each packed and multiplied by one task; otherwise in
// larger blocks packed by parallel tasks. Every way gives the definition's sums, window sums and
// epilogue floats, on 1, 2 and 4 threads: 1x1 convs read in place with k not a multiple of 4 and a
// partial last panel, stride-2 rows long enough for several 32-byte vectors and a tail, a k large
// enough for many small blocks. On one thread the lent B is one L2-sized block.
TEST(Int8Conv, DenseConvsGiveTheDefinitionWhateverTheThreadsAndBlocks) {
  ConvParams direct = params(1, 7, 5, 1, {31, 33}, {1, 1}, 1, 1, 0);
  direct.pads_end = {0, 0};
  direct.out_spatial = conv_output_spatial(direct);
  const std::vector<ConvParams> shapes = {
      direct,
      params(2, 3, 16, 1, {41, 150}, {3, 3}, 2, 1, 1),   // stride 2: runs of 75 bytes every other byte
      params(1, 5, 6, 1, {9, 131}, {3, 2}, 2, 2, 2),     // stride 2, dilation 2
      params(1, 300, 20, 1, {24, 40}, {3, 3}, 1, 1, 1),  // k = 2700: blocks of 160 columns
      params(1, 8, 30, 2, {50, 60}, {3, 3}, 1, 1, 1),    // two groups
      params(1, 600, 7, 1, {12, 16}, {3, 3}, 1, 1, 1),   // k = 5400: 3 blocks of 64 columns, fewer than threads
  };
  for (std::size_t si = 0; si < shapes.size(); ++si) {
    const ConvParams& p = shapes[si];
    SCOPED_TRACE("shape " + std::to_string(si));
    const std::int64_t out_size = p.out_spatial[0] * p.out_spatial[1];
    auto x = random_int8(std::size_t(conv_input_size(p)), 40 + unsigned(si));
    auto w = random_int8(std::size_t(conv_weight_size(p)), 50 + unsigned(si));
    std::vector<std::int32_t> want(std::size_t(conv_output_size(p)));
    int8_conv_reference(p, x.data(), -5, w.data(), want.data());
    ConvParams ones = p;
    ones.out_channels = p.groups;
    std::vector<std::int8_t> w1(std::size_t(conv_weight_size(ones)), 1);
    std::vector<std::int32_t> want_sums(std::size_t(conv_output_size(ones)));
    int8_conv_reference(ones, x.data(), -5, w1.data(), want_sums.data());
    const PackedInt8ConvWeights packed(p, w.data());
    std::vector<float> scale(std::size_t(p.out_channels)), bias(scale.size());
    for (std::size_t c = 0; c < scale.size(); ++c) scale[c] = 0.01f / float(c + 3), bias[c] = float(c) - 2.5f;
    Int8Epilogue e;
    e.row_scale = scale.data();
    e.row_bias = bias.data();
    std::vector<std::int32_t> want_floats = want;
    for (std::int64_t b = 0; b < p.batch; ++b)
      int8_epilogue(want_floats.data() + b * p.out_channels * out_size, p.out_channels, out_size, out_size, e);
    // threads 0: one thread through a global_control limit (what --threads 1 sets) in a 4-thread arena.
    for (int threads : {1, 2, 4, 0}) {
      SCOPED_TRACE(std::to_string(threads) + " threads");
      std::vector<std::int32_t> got(want.size(), 12345), sums(want_sums.size(), 12345);
      std::vector<float> got_floats(want.size(), -1.0f);
      std::size_t lent = 0;
      std::thread([&] {  // a fresh thread: nothing lent yet
        std::optional<tbb::global_control> limit;
        if (threads == 0) limit.emplace(tbb::global_control::max_allowed_parallelism, 1);
        tbb::task_arena(threads == 0 ? 4 : threads).execute([&] {
          int8_conv(p, x.data(), -5, packed, got.data(), sums.data());
          int8_conv(p, x.data(), -5, packed, got_floats.data(), e);
          lent = thread_lent_bytes();
        });
      })
          .join();
      ASSERT_EQ(got, want);
      ASSERT_EQ(sums, want_sums);
      ASSERT_EQ(std::memcmp(got_floats.data(), want_floats.data(), want.size() * sizeof(float)), 0);
      if (threads <= 1) {
        // One block of B (and its column sums) and the padded group of the im2col convs.
        const std::int64_t k = conv_weight_size(p) / p.out_channels;
        const std::int64_t block = int8_conv_cache_block_columns(k, out_size);
        EXPECT_EQ(block % kInt8NR == 0 || block == out_size, true);
        EXPECT_LE((k + 3) / 4 * 4 * block, std::max<std::int64_t>(kInt8ConvCacheBlockBytes, (k + 3) / 4 * 4 * kInt8NR));
        const std::size_t padded = std::size_t(conv_input_size(p) / p.batch / p.groups * 2);
        EXPECT_LE(lent, std::size_t(kInt8ConvCacheBlockBytes) + std::size_t(block + kInt8NR) * 4 + padded + 8192);
      }
    }
  }
}

// Depthwise convs finish each output row into floats while in L1 (the epilogue was a second pass
// over the whole int32 output): the same floats as that pass, with row and column terms, batch 2,
// on the vector kernel's geometries and one it cannot take (stride 5), on 1 and 2 threads.
TEST(Int8Conv, DepthwiseEpilogueGivesTheFloatsOfASecondPass) {
  const std::vector<ConvParams> shapes = {params(2, 6, 6, 6, {13, 37}, {3, 3}, 1, 1, 1),
                                          params(1, 4, 8, 4, {20, 21}, {5, 5}, 2, 1, 2),
                                          params(1, 3, 3, 3, {11, 90}, {3, 3}, 5, 1, 1)};
  for (std::size_t si = 0; si < shapes.size(); ++si) {
    const ConvParams& p = shapes[si];
    SCOPED_TRACE("shape " + std::to_string(si));
    ASSERT_TRUE(int8_conv_is_depthwise(p));
    const std::int64_t out_size = p.out_spatial[0] * p.out_spatial[1];
    auto x = random_int8(std::size_t(conv_input_size(p)), 70 + unsigned(si));
    auto w = random_int8(std::size_t(conv_weight_size(p)), 80 + unsigned(si));
    std::vector<std::int32_t> want(std::size_t(conv_output_size(p)));
    int8_conv_reference(p, x.data(), 9, w.data(), want.data());
    std::vector<std::int32_t> row_add(static_cast<std::size_t>(p.out_channels)),
        col_add(static_cast<std::size_t>(out_size));
    std::vector<float> row_scale(row_add.size()), col_scale(col_add.size()), row_bias(row_add.size()),
        col_bias(col_add.size());
    for (std::size_t c = 0; c < row_add.size(); ++c)
      row_add[c] = int(c) * 7 - 20, row_scale[c] = 0.013f * float(c + 1), row_bias[c] = 1.5f - float(c);
    for (std::size_t j = 0; j < col_add.size(); ++j)
      col_add[j] = int(j % 11) - 5, col_scale[j] = 1.0f + 0.001f * float(j % 7), col_bias[j] = 0.01f * float(j % 5);
    Int8Epilogue e{row_add.data(),   col_add.data(),  row_scale.data(),
                   col_scale.data(), row_bias.data(), col_bias.data()};
    std::vector<std::int32_t> want_floats = want;
    for (std::int64_t b = 0; b < p.batch; ++b)
      int8_epilogue(want_floats.data() + b * p.out_channels * out_size, p.out_channels, out_size, out_size, e);
    const PackedInt8ConvWeights packed(p, w.data());
    std::vector<Int8GemmPath> paths{Int8GemmPath::kPortable};
    if (int8_gemm_path_available(Int8GemmPath::kAvx512Vnni)) paths.push_back(Int8GemmPath::kAvx512Vnni);
    for (auto path : paths)
      for (int threads : {1, 2}) {
        std::vector<float> got(want.size(), -1.0f);
        tbb::task_arena(threads).execute([&] { int8_conv(p, x.data(), 9, packed, got.data(), e, path); });
        ASSERT_EQ(std::memcmp(got.data(), want_floats.data(), want.size() * sizeof(float)), 0)
            << int8_gemm_path_name(path) << ", " << threads << " threads";
      }
  }
}

}  // namespace
}  // namespace qeval::kernels
