// Convolution kernels: fast paths (im2col + GEMM, depthwise, col2im) against the naive references
// on odd shapes with groups, strides, dilations and asymmetric pads; thread-count independence.
#include <gtest/gtest.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "kernels/conv.h"
#include "kernels/numeric.h"
#include "kernels/scratch.h"

namespace qeval::kernels {
namespace {

std::string describe(const ConvParams& p) {
  auto list = [](const std::vector<std::int64_t>& v) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) s += ",";  // not (i ? "," : "") + ...: GCC 12 -Wrestrict false positive
      s += std::to_string(v[i]);
    }
    return s + "]";
  };
  return "batch " + std::to_string(p.batch) + ", channels " + std::to_string(p.in_channels) + "->" +
         std::to_string(p.out_channels) + ", groups " + std::to_string(p.groups) + ", in " + list(p.in_spatial) +
         ", kernel " + list(p.kernel) + ", strides " + list(p.strides) + ", dilations " + list(p.dilations) +
         ", pads " + list(p.pads_begin) + "/" + list(p.pads_end) + ", out " + list(p.out_spatial);
}

ConvParams make(std::int64_t batch, std::int64_t cin, std::int64_t cout, std::int64_t groups,
                std::vector<std::int64_t> in, std::vector<std::int64_t> kernel, std::vector<std::int64_t> strides,
                std::vector<std::int64_t> dilations, std::vector<std::int64_t> pb, std::vector<std::int64_t> pe) {
  ConvParams p;
  p.batch = batch;
  p.in_channels = cin;
  p.out_channels = cout;
  p.groups = groups;
  p.in_spatial = std::move(in);
  p.kernel = std::move(kernel);
  p.strides = std::move(strides);
  p.dilations = std::move(dilations);
  p.pads_begin = std::move(pb);
  p.pads_end = std::move(pe);
  return p;
}

std::vector<float> random_floats(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

std::vector<float> abs_of(std::vector<float> v) {
  for (auto& x : v) x = std::abs(x);
  return v;
}

using ConvFn = void (*)(const ConvParams&, const float*, const float*, const float*, float*);

// fast vs reference, element by element, within the float rounding bound of a sum of `terms`
// products: (terms + 2) * eps * (the same convolution of |x|, |w|, |b|).
void expect_close(const ConvParams& p, ConvFn fast, ConvFn reference, std::int64_t w_size, std::int64_t terms,
                  bool with_bias, std::mt19937& rng) {
  const auto x = random_floats(std::size_t(conv_input_size(p)), rng);
  const auto w = random_floats(std::size_t(w_size), rng);
  const auto b = random_floats(std::size_t(p.out_channels), rng);
  const float* bias = with_bias ? b.data() : nullptr;
  const std::size_t n = std::size_t(conv_output_size(p));
  std::vector<float> got(n, std::numeric_limits<float>::quiet_NaN()), want(n), mag(n);
  fast(p, x.data(), w.data(), bias, got.data());
  reference(p, x.data(), w.data(), bias, want.data());
  const auto ax = abs_of(x), aw = abs_of(w), ab = abs_of(b);
  reference(p, ax.data(), aw.data(), with_bias ? ab.data() : nullptr, mag.data());
  const double eps = std::numeric_limits<float>::epsilon();
  int reported = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double tol = double(terms + 2) * eps * mag[i] * 2 + 1e-30;
    if (!(std::abs(double(got[i]) - want[i]) <= tol) && reported++ < 3)
      ADD_FAILURE() << describe(p) << (with_bias ? ", bias" : "") << ": element " << i << " is " << got[i]
                    << ", reference " << want[i] << ", tolerance " << tol;
  }
}

std::int64_t kernel_terms(const ConvParams& p) {
  std::int64_t t = p.in_channels / p.groups;
  for (auto k : p.kernel) t *= k;
  return t;
}

std::vector<ConvParams> conv_cases() {
  std::vector<ConvParams> v;
  // 2-D: plain, strided, dilated, asymmetric pads, odd sizes, groups, batch > 1.
  v.push_back(make(1, 3, 5, 1, {7, 9}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}));
  v.push_back(make(2, 4, 6, 2, {11, 6}, {3, 2}, {2, 1}, {1, 2}, {0, 1}, {2, 0}));
  v.push_back(make(1, 6, 9, 3, {13, 17}, {5, 3}, {3, 2}, {2, 1}, {4, 0}, {1, 3}));
  v.push_back(make(2, 40, 19, 1, {9, 10}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}));  // k = 360: two k blocks
  v.push_back(make(1, 16, 130, 1, {8, 8}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}));  // rows past one MC block
  v.push_back(make(1, 300, 20, 1, {5, 7}, {1, 1}, {1, 1}, {1, 1}, {0, 0}, {0, 0}));  // pointwise, k > 256
  v.push_back(make(1, 8, 8, 1, {37, 41}, {1, 1}, {2, 2}, {1, 1}, {0, 0}, {0, 0}));   // strided pointwise
  v.push_back(make(1, 5, 7, 1, {3, 3}, {3, 3}, {1, 1}, {1, 1}, {0, 0}, {0, 0}));     // 1x1 output
  v.push_back(make(1, 2, 3, 1, {4, 5}, {1, 4}, {1, 3}, {1, 1}, {2, 2}, {2, 2}));     // padding wider than kernel
  v.push_back(make(1, 4, 4, 2, {70, 3}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}));    // columns across rows of tiles
  // Depthwise (one input channel per group), with channel multipliers and a 1-channel input.
  v.push_back(make(2, 6, 6, 6, {10, 13}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}));
  v.push_back(make(1, 4, 8, 4, {9, 11}, {5, 3}, {2, 3}, {1, 2}, {2, 0}, {1, 2}));
  v.push_back(make(1, 1, 5, 1, {12, 7}, {3, 3}, {1, 1}, {3, 1}, {0, 2}, {3, 1}));
  v.push_back(make(1, 1, 20, 1, {17, 19}, {5, 5}, {2, 2}, {1, 1}, {2, 2}, {2, 2}));  // 1 channel, many filters: GEMM
  v.push_back(make(1, 2, 34, 2, {9, 8}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}));    // depthwise x17: GEMM
  // Rows wide enough for the 16-column register path: exact chunks, an overlapping last chunk,
  // dilation, asymmetric pads, 1-D and 3-D.
  v.push_back(make(1, 8, 8, 8, {5, 50}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}));
  v.push_back(make(2, 4, 4, 4, {6, 45}, {3, 5}, {1, 1}, {1, 2}, {0, 3}, {2, 0}));
  v.push_back(make(1, 3, 6, 3, {70}, {7}, {1}, {3}, {5}, {2}));
  v.push_back(make(1, 2, 2, 2, {3, 4, 37}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}));
  // 1-D and 3-D.
  v.push_back(make(2, 6, 4, 2, {31}, {5}, {2}, {3}, {4}, {1}));
  v.push_back(make(1, 3, 4, 1, {5, 6, 7}, {3, 2, 3}, {1, 2, 1}, {1, 1, 2}, {1, 0, 1}, {0, 1, 2}));
  v.push_back(make(1, 3, 3, 3, {4, 5, 6}, {2, 3, 3}, {1, 1, 2}, {1, 1, 1}, {0, 1, 1}, {1, 1, 0}));
  // Random 2-D configurations.
  std::mt19937 rng(9);
  auto r = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  while (v.size() < 40) {
    const std::int64_t groups = r(1, 3), cin = groups * r(1, 5), cout = groups * r(1, 6);
    const std::int64_t kh = r(1, 4), kw = r(1, 4), dh = r(1, 2), dw = r(1, 2);
    const std::int64_t ih = r(1, 12) + (kh - 1) * dh, iw = r(1, 12) + (kw - 1) * dw;
    v.push_back(make(r(1, 2), cin, cout, groups, {ih, iw}, {kh, kw}, {r(1, 3), r(1, 3)}, {dh, dw}, {r(0, 2), r(0, 2)},
                     {r(0, 2), r(0, 2)}));
  }
  for (auto& p : v) p.out_spatial = conv_output_spatial(p);
  return v;
}

void conv_unpacked(const ConvParams& p, const float* x, const float* w, const float* b, float* y) {
  conv(p, x, w, b, y);
}
void conv_transpose_unpacked(const ConvParams& p, const float* x, const float* w, const float* b, float* y) {
  conv_transpose(p, x, w, b, y);
}

TEST(Conv, FastPathsMatchReference) {
  std::mt19937 rng(1);
  for (const ConvParams& p : conv_cases()) {
    expect_close(p, conv_unpacked, conv_reference, conv_weight_size(p), kernel_terms(p), true, rng);
    expect_close(p, conv_unpacked, conv_reference, conv_weight_size(p), kernel_terms(p), false, rng);
  }
}

TEST(Conv, PrepackedWeightsGiveTheSameBits) {
  std::mt19937 rng(11);
  std::vector<ConvParams> cases = conv_cases();
  cases.push_back(make(2, 64, 48, 1, {20, 20}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}));  // k > one KC block
  cases.back().out_spatial = conv_output_spatial(cases.back());
  for (const ConvParams& p : cases) {
    const auto x = random_floats(std::size_t(conv_input_size(p)), rng);
    const auto w = random_floats(std::size_t(conv_weight_size(p)), rng);
    const auto b = random_floats(std::size_t(p.out_channels), rng);
    std::vector<float> plain(std::size_t(conv_output_size(p))), packed(plain.size());
    conv(p, x.data(), w.data(), b.data(), plain.data());
    const PackedConvWeights pw = pack_conv_weights(p, w.data());
    conv(p, x.data(), w.data(), b.data(), packed.data(), &pw);
    EXPECT_EQ(0, std::memcmp(plain.data(), packed.data(), plain.size() * sizeof(float))) << describe(p);
    // Weights exact in float16 packed as float16 panels: the bits of float panels.
    std::vector<float> w16 = w;
    round_to_float16(w16.data(), w16.size());
    const PackedConvWeights pf = pack_conv_weights(p, w16.data()),
                            ph = pack_conv_weights(p, w16.data(), PanelStorage::kFloat16IfExact);
    if (!ph.groups.empty()) EXPECT_TRUE(ph.groups[0].half()) << describe(p);
    std::vector<float> from_float(plain.size()), from_half(plain.size());
    conv(p, x.data(), w16.data(), b.data(), from_float.data(), &pf);
    conv(p, x.data(), w16.data(), b.data(), from_half.data(), &ph);
    EXPECT_EQ(0, std::memcmp(from_float.data(), from_half.data(), plain.size() * sizeof(float))) << describe(p);
  }
  // ConvTranspose at a size where its GEMM takes the packed path.
  ConvParams t = make(1, 8, 6, 2, {16, 16}, {4, 4}, {2, 2}, {1, 1}, {1, 1}, {1, 1});
  t.out_spatial = conv_transpose_output_spatial(t);
  const auto x = random_floats(std::size_t(conv_input_size(t)), rng);
  const auto w = random_floats(std::size_t(conv_transpose_weight_size(t)), rng);
  std::vector<float> plain(std::size_t(conv_output_size(t))), packed(plain.size());
  conv_transpose(t, x.data(), w.data(), nullptr, plain.data());
  const PackedConvWeights pw = pack_conv_transpose_weights(t, w.data());
  conv_transpose(t, x.data(), w.data(), nullptr, packed.data(), &pw);
  EXPECT_EQ(0, std::memcmp(plain.data(), packed.data(), plain.size() * sizeof(float)));
  // Weights packed for another geometry are refused.
  ConvParams a = make(1, 8, 4, 1, {5, 5}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}), c = a;
  c.out_channels = 6;
  a.out_spatial = c.out_spatial = conv_output_spatial(a);
  const auto wa = random_floats(std::size_t(conv_weight_size(c)), rng);
  const PackedConvWeights for_a = pack_conv_weights(a, wa.data());
  std::vector<float> xa(std::size_t(conv_input_size(c))), ya(std::size_t(conv_output_size(c)));
  EXPECT_THROW(conv(c, xa.data(), wa.data(), nullptr, ya.data(), &for_a), std::invalid_argument);
}

std::vector<ConvParams> transpose_cases() {
  std::vector<ConvParams> v;
  v.push_back(make(1, 1, 2, 1, {3, 3}, {3, 3}, {1, 1}, {1, 1}, {0, 0}, {0, 0}));
  v.push_back(make(1, 1, 2, 1, {3, 3}, {3, 3}, {3, 2}, {1, 1}, {1, 2}, {1, 2}));
  v.push_back(make(2, 4, 6, 2, {5, 4}, {3, 2}, {2, 3}, {2, 1}, {1, 0}, {0, 2}));
  v.push_back(make(1, 6, 6, 6, {7, 8}, {4, 4}, {2, 2}, {1, 1}, {1, 1}, {1, 1}));
  v.push_back(make(1, 20, 9, 1, {6, 5}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}));
  v.push_back(make(1, 3, 4, 1, {9}, {5}, {3}, {2}, {2}, {1}));
  v.push_back(make(1, 2, 2, 1, {3, 4, 5}, {3, 3, 3}, {1, 2, 1}, {1, 1, 2}, {0, 1, 1}, {1, 0, 0}));
  for (auto& p : v) p.out_spatial = conv_transpose_output_spatial(p);
  // output_padding: one extra trailing position that only the bias reaches.
  ConvParams extra = make(1, 2, 3, 1, {4, 4}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1});
  extra.out_spatial = conv_transpose_output_spatial(extra);
  for (auto& o : extra.out_spatial) ++o;
  v.push_back(extra);
  return v;
}

TEST(ConvTranspose, MatchesReference) {
  std::mt19937 rng(2);
  for (const ConvParams& p : transpose_cases()) {
    // Each output gathers at most in_channels/group * prod(kernel) products.
    std::int64_t terms = p.in_channels / p.groups;
    for (auto k : p.kernel) terms *= k;
    expect_close(p, conv_transpose_unpacked, conv_transpose_reference, conv_transpose_weight_size(p), terms, true, rng);
    expect_close(p, conv_transpose_unpacked, conv_transpose_reference, conv_transpose_weight_size(p), terms, false,
                 rng);
  }
}

TEST(Conv, KnownValues) {
  // The ONNX Conv example: 5x5 ramp, 3x3 ones, pad 1.
  ConvParams p = make(1, 1, 1, 1, {5, 5}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1});
  p.out_spatial = conv_output_spatial(p);
  std::vector<float> x(25), w(9, 1.0f), y(25);
  for (int i = 0; i < 25; ++i) x[std::size_t(i)] = float(i);
  conv(p, x.data(), w.data(), nullptr, y.data());
  const float want[] = {12,  21, 27, 33,  24,  33,  54,  63, 72,  51,  63,  99, 108,
                        117, 81, 93, 144, 153, 162, 111, 72, 111, 117, 123, 84};
  for (int i = 0; i < 25; ++i) EXPECT_EQ(y[std::size_t(i)], want[i]) << i;
}

TEST(Conv, RejectsInconsistentParameters) {
  std::vector<float> buf(1000);
  ConvParams p = make(1, 3, 4, 2, {5, 5}, {3, 3}, {1, 1}, {1, 1}, {0, 0}, {0, 0});  // 3 channels, 2 groups
  p.out_spatial = {3, 3};
  EXPECT_THROW(conv(p, buf.data(), buf.data(), nullptr, buf.data()), std::invalid_argument);
  p = make(1, 2, 2, 1, {5, 5}, {3, 3}, {1, 1}, {1, 1}, {0, 0}, {0, 0});
  p.out_spatial = {4, 4};  // should be 3x3
  EXPECT_THROW(conv(p, buf.data(), buf.data(), nullptr, buf.data()), std::invalid_argument);
}

// Same bits with one thread, the default pool, and arenas that split the work differently.
template <class F>
void expect_thread_independent(const char* name, std::size_t n, F&& run) {
  std::vector<float> def(n), one(n), other(n);
  run(def.data());
  {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 1);
    run(one.data());
  }
  EXPECT_EQ(0, std::memcmp(def.data(), one.data(), n * sizeof(float))) << name << ": 1 thread vs default";
  tbb::task_arena(1).execute([&] { run(other.data()); });
  EXPECT_EQ(0, std::memcmp(def.data(), other.data(), n * sizeof(float))) << name << ": arena of 1";
  tbb::task_arena(3).execute([&] { run(other.data()); });
  EXPECT_EQ(0, std::memcmp(def.data(), other.data(), n * sizeof(float))) << name << ": arena of 3";
}

TEST(Conv, ResultsDoNotDependOnThreadCount) {
  std::mt19937 rng(4);
  for (ConvParams p : {make(2, 40, 150, 1, {23, 29}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}),
                       make(1, 12, 12, 12, {40, 33}, {3, 3}, {2, 1}, {1, 1}, {1, 1}, {1, 1})}) {
    p.out_spatial = conv_output_spatial(p);
    const auto x = random_floats(std::size_t(conv_input_size(p)), rng);
    const auto w = random_floats(std::size_t(conv_weight_size(p)), rng);
    const auto b = random_floats(std::size_t(p.out_channels), rng);
    expect_thread_independent(p.groups == 1 ? "conv" : "depthwise conv", std::size_t(conv_output_size(p)),
                              [&](float* y) { conv(p, x.data(), w.data(), b.data(), y); });
  }
  ConvParams t = make(1, 30, 20, 2, {17, 19}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1});
  t.out_spatial = conv_transpose_output_spatial(t);
  const auto x = random_floats(std::size_t(conv_input_size(t)), rng);
  const auto w = random_floats(std::size_t(conv_transpose_weight_size(t)), rng);
  expect_thread_independent("conv_transpose", std::size_t(conv_output_size(t)),
                            [&](float* y) { conv_transpose(t, x.data(), w.data(), nullptr, y); });
}

// A padded input past kConvPaddedBandBytes is padded a band of output rows at a time: the same bits
// as the conv of the same input padded beforehand (no padding: read in place, one GEMM over every
// position), strided and dilated too, and the lent padded buffer stays within the band size (it
// held the whole padded input: 135 MB for ISNet's first convs at 1024x1024).
TEST(Conv, LargePaddedInputsArePaddedABandOfRowsAtATime) {
  std::thread([] {  // a fresh thread: nothing lent yet
    std::mt19937 rng(9);
    for (ConvParams p : {make(1, 48, 24, 1, {300, 301}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}),
                         make(1, 32, 8, 1, {401, 400}, {3, 3}, {2, 2}, {2, 2}, {2, 1}, {1, 2})}) {
      p.out_spatial = conv_output_spatial(p);
      const std::int64_t ph = p.in_spatial[0] + p.pads_begin[0] + p.pads_end[0];
      const std::int64_t pw = p.in_spatial[1] + p.pads_begin[1] + p.pads_end[1];
      ASSERT_GT(p.in_channels * ph * pw * std::int64_t(sizeof(float)), 2 * kConvPaddedBandBytes);
      const auto x = random_floats(std::size_t(conv_input_size(p)), rng);
      const auto w = random_floats(std::size_t(conv_weight_size(p)), rng);
      const auto b = random_floats(std::size_t(p.out_channels), rng);
      std::vector<float> y(std::size_t(conv_output_size(p)), -7.0f);
      conv(p, x.data(), w.data(), b.data(), y.data());
      // The same conv on the input padded by hand.
      ConvParams q = p;
      q.in_spatial = {ph, pw};
      q.pads_begin = q.pads_end = {0, 0};
      std::vector<float> xp(std::size_t(p.in_channels * ph * pw), 0.0f);
      for (std::int64_t c = 0; c < p.in_channels; ++c)
        for (std::int64_t h = 0; h < p.in_spatial[0]; ++h)
          std::memcpy(&xp[std::size_t((c * ph + h + p.pads_begin[0]) * pw + p.pads_begin[1])],
                      &x[std::size_t((c * p.in_spatial[0] + h) * p.in_spatial[1])],
                      sizeof(float) * std::size_t(p.in_spatial[1]));
      q.out_spatial = conv_output_spatial(q);
      ASSERT_EQ(q.out_spatial, p.out_spatial);
      std::vector<float> want(y.size(), 7.0f);
      conv(q, xp.data(), w.data(), b.data(), want.data());
      ASSERT_EQ(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)), 0) << p.in_channels;
      EXPECT_LE(thread_lent_bytes(), std::size_t(kConvPaddedBandBytes)) << p.in_channels;
    }
  })
      .join();
}

}  // namespace
}  // namespace qeval::kernels
