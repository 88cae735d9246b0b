// Softmax, normalisation, pooling and resize ops on cases the ONNX node tests cover poorly:
// large logits, large-mean statistics, non-trivial images against naive references, ceil mode.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <optional>
#include <random>

#include "eval/exec/session.h"
#include "kernels/error.h"
#include "kernels/softmax.h"

namespace qeval::eval {
namespace {

// ---- one-node graphs -------------------------------------------------------------------------

Tensor make(const Shape& shape, const std::vector<float>& v) {
  Tensor t(DType::kFloat32, shape);
  EXPECT_EQ(static_cast<std::size_t>(t.numel()), v.size());
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}
Tensor make_i64(const std::vector<std::int64_t>& v) {
  Tensor t(DType::kInt64, {static_cast<std::int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<std::int64_t>());
  return t;
}

// Runs one node: input 0 is the graph input "x", the others are initializers (nullopt: omitted).
std::vector<Tensor> run_op(const std::string& op_type, int opset, const Tensor& x,
                           const std::vector<std::optional<Tensor>>& rest, std::map<std::string, Attribute> attrs,
                           int outputs = 1) {
  Graph g;
  g.source = "nn_ops_test";
  g.opsets[""] = opset;
  g.inputs.push_back(ValueInfo{"x", x.dtype(), {}, {}, false});
  Node n;
  n.name = "node";
  n.op_type = op_type;
  n.opset = opset;
  n.inputs.push_back("x");
  for (std::size_t i = 0; i < rest.size(); ++i) {
    if (!rest[i]) {
      n.inputs.push_back("");
      continue;
    }
    const std::string name = "in" + std::to_string(i + 1);
    g.initializers[name] = *rest[i];
    n.inputs.push_back(name);
  }
  for (int o = 0; o < outputs; ++o) {
    n.outputs.push_back("y" + std::to_string(o));
    g.outputs.push_back(ValueInfo{"y" + std::to_string(o), DType::kFloat32, {}, {}, false});
  }
  n.attributes = std::move(attrs);
  g.nodes.push_back(n);
  Session s(g);
  auto result = s.run({{"x", x}});
  std::vector<Tensor> out;
  for (int o = 0; o < outputs; ++o) out.push_back(result.at("y" + std::to_string(o)));
  return out;
}

std::vector<float> smooth_image(int c, int h, int w, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> noise(-0.1f, 0.1f);
  std::vector<float> v;
  for (int k = 0; k < c; ++k)
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        v.push_back(std::sin(0.7f * x + 0.3f * k) * std::cos(0.45f * y) + 0.02f * float(x * y) + noise(rng));
  return v;
}

double max_abs_diff(const Tensor& t, const std::vector<double>& ref) {
  EXPECT_EQ(static_cast<std::size_t>(t.numel()), ref.size());
  double worst = 0;
  for (std::size_t i = 0; i < ref.size() && i < static_cast<std::size_t>(t.numel()); ++i) {
    const double d = std::fabs(double(t.data<float>()[i]) - ref[i]);
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return worst;
}

// ---- Softmax -------------------------------------------------------------------------------

TEST(NnOps, SoftmaxOfLargeLogitsIsExactToFloatPrecision) {
  // exp(1000) overflows float and double: only a max-subtracting kernel gets these right.
  const std::vector<float> v = {1000, 1001, 1002, 999.5f, -1e4f, -1e4f + 1, -1e4f + 2, -1e4f - 50};
  const Tensor x = make({2, 4}, v);
  const Tensor y = run_op("Softmax", 13, x, {}, {})[0];
  const Tensor ly = run_op("LogSoftmax", 13, x, {}, {})[0];
  std::vector<double> ref, lref;
  for (int r = 0; r < 2; ++r) {
    double m = -INFINITY, s = 0;
    for (int i = 0; i < 4; ++i) m = std::max(m, double(v[std::size_t(r * 4 + i)]));
    for (int i = 0; i < 4; ++i) s += std::exp(double(v[std::size_t(r * 4 + i)]) - m);
    for (int i = 0; i < 4; ++i) ref.push_back(std::exp(double(v[std::size_t(r * 4 + i)]) - m) / s);
    for (int i = 0; i < 4; ++i) lref.push_back(double(v[std::size_t(r * 4 + i)]) - m - std::log(s));
  }
  EXPECT_LT(max_abs_diff(y, ref), 1e-7);
  EXPECT_LT(max_abs_diff(ly, lref), 1e-5);  // |log-softmax| reaches ~52: a few float ulps
  for (float f : y.span<float>()) EXPECT_TRUE(std::isfinite(f));
}

TEST(NnOps, SoftmaxAxisSemanticsDifferBeforeAndFromOpset13) {
  // [2, 3, 4], axis 1: opset 11 normalises each row of the [2, 12] view; 13 only along dim 1.
  std::vector<float> v(24);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(float(i)) * 3;
  const Tensor x = make({2, 3, 4}, v);
  const Tensor y11 = run_op("Softmax", 11, x, {}, {{"axis", Attribute::of_int(1)}})[0];
  const Tensor y13 = run_op("Softmax", 13, x, {}, {{"axis", Attribute::of_int(1)}})[0];
  std::vector<double> ref11(24), ref13(24);
  for (int n = 0; n < 2; ++n) {
    double s = 0;
    for (int i = 0; i < 12; ++i) s += std::exp(double(v[std::size_t(n * 12 + i)]));
    for (int i = 0; i < 12; ++i) ref11[std::size_t(n * 12 + i)] = std::exp(double(v[std::size_t(n * 12 + i)])) / s;
    for (int k = 0; k < 4; ++k) {
      double t = 0;
      for (int c = 0; c < 3; ++c) t += std::exp(double(v[std::size_t(n * 12 + c * 4 + k)]));
      for (int c = 0; c < 3; ++c)
        ref13[std::size_t(n * 12 + c * 4 + k)] = std::exp(double(v[std::size_t(n * 12 + c * 4 + k)])) / t;
    }
  }
  EXPECT_LT(max_abs_diff(y11, ref11), 1e-7);
  EXPECT_LT(max_abs_diff(y13, ref13), 1e-7);
}

TEST(NnOps, SoftmaxStridedAndContiguousPathsAgree) {
  // Softmax along dim 1 of [2, 5, 300] (strided path; 300 columns cross its 256-column tile)
  // must equal softmax along the last dim of the transposed [2, 300, 5] (contiguous path).
  const int outer = 2, n = 5, inner = 300;
  std::vector<float> v(std::size_t(outer * n * inner)), vt(v.size());
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0, 20);
  for (auto& f : v) f = d(rng);
  auto at = [&](int o, int k, int j) { return std::size_t((o * n + k) * inner + j); };
  auto at_t = [&](int o, int k, int j) { return std::size_t((o * inner + j) * n + k); };
  for (int o = 0; o < outer; ++o)
    for (int k = 0; k < n; ++k)
      for (int j = 0; j < inner; ++j) vt[at_t(o, k, j)] = v[at(o, k, j)];
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    const Tensor a = run_op(op, 13, make({outer, n, inner}, v), {}, {{"axis", Attribute::of_int(1)}})[0];
    const Tensor b = run_op(op, 13, make({outer, inner, n}, vt), {}, {{"axis", Attribute::of_int(-1)}})[0];
    for (int o = 0; o < outer; ++o)
      for (int k = 0; k < n; ++k)
        for (int j = 0; j < inner; ++j)
          ASSERT_EQ(a.data<float>()[at(o, k, j)], b.data<float>()[at_t(o, k, j)])
              << op << " " << o << "," << k << "," << j;
  }
}

TEST(NnOps, VectorisedExpIsWithinTwoUlpOfStdExp) {
  double worst = 0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -87.0f + 87.0f * float(i) / 200000.0f;
    const double e = std::exp(double(x));
    worst = std::max(worst, std::fabs(double(kernels::exp_vectorisable(x)) - e) / e);
  }
  EXPECT_LT(worst, 2.5e-7);  // 2 ulp of float is 2.4e-7 relative
  EXPECT_EQ(kernels::exp_vectorisable(-100.0f), 0.0f);
  EXPECT_EQ(kernels::exp_vectorisable(0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(kernels::exp_vectorisable(NAN)));
}

// ---- normalisation ---------------------------------------------------------------------------

// Inputs with mean 1e4 and spread ~0.05: float E[x^2] - mu^2 loses the variance entirely
// (ulp(1e8) = 8 > the variance), so only mean-subtracted moments pass.
std::vector<float> large_mean_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d(0, 0.05);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(1e4 + d(rng) + 0.001 * double(i % 7));
  return v;
}

// (x - mean) / sqrt(var + eps) over contiguous groups, in double.
std::vector<double> normalise_groups(const std::vector<float>& v, std::size_t group, double eps,
                                     std::vector<double>* means = nullptr, std::vector<double>* inv_stds = nullptr) {
  std::vector<double> out(v.size());
  for (std::size_t g0 = 0; g0 < v.size(); g0 += group) {
    double m = 0;
    for (std::size_t i = 0; i < group; ++i) m += v[g0 + i];
    m /= double(group);
    double q = 0;
    for (std::size_t i = 0; i < group; ++i) q += (v[g0 + i] - m) * (v[g0 + i] - m);
    const double inv = 1 / std::sqrt(q / double(group) + eps);
    for (std::size_t i = 0; i < group; ++i) out[g0 + i] = (v[g0 + i] - m) * inv;
    if (means) means->push_back(m);
    if (inv_stds) inv_stds->push_back(inv);
  }
  return out;
}

TEST(NnOps, LayerNormalizationOnLargeMeanInputsKeepsItsPrecision) {
  const int rows = 6, d = 512;
  const auto v = large_mean_values(std::size_t(rows * d), 11);
  std::vector<float> w(d), b(d);
  for (int i = 0; i < d; ++i) {
    w[std::size_t(i)] = 0.5f + 0.001f * float(i);
    b[std::size_t(i)] = -0.25f + 0.002f * float(i % 13);
  }
  auto out = run_op("LayerNormalization", 17, make({2, 3, d}, v), {make({d}, w), make({d}, b)},
                    {{"axis", Attribute::of_int(-1)}, {"epsilon", Attribute::of_float(1e-6f)}}, 3);
  std::vector<double> means, invs;
  auto ref = normalise_groups(v, d, double(1e-6f), &means, &invs);
  for (std::size_t i = 0; i < ref.size(); ++i) ref[i] = ref[i] * w[i % d] + b[i % d];
  EXPECT_LT(max_abs_diff(out[0], ref), 2e-6);  // outputs are O(1); float rounding is 6e-8
  EXPECT_EQ(out[1].shape(), (Shape{2, 3, 1}));
  for (int r = 0; r < rows; ++r) {
    EXPECT_NEAR(out[1].data<float>()[r], means[std::size_t(r)], 1e-3);
    EXPECT_NEAR(out[2].data<float>()[r], invs[std::size_t(r)], 1e-5 * invs[std::size_t(r)]);
  }
}

TEST(NnOps, LayerNormalizationBroadcastsScaleWithinTheNormalisedShape) {
  // axis 1 of [2, 3, 4]: Scale [1, 4] broadcasts over the normalised [3, 4]; no bias.
  std::vector<float> v(24);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i % 5) - 1.5f * float(i / 12);
  const std::vector<float> w = {1, 2, 3, 4};
  const Tensor y =
      run_op("LayerNormalization", 17, make({2, 3, 4}, v), {make({1, 4}, w)}, {{"axis", Attribute::of_int(1)}})[0];
  auto ref = normalise_groups(v, 12, double(1e-5f));
  for (std::size_t i = 0; i < ref.size(); ++i) ref[i] *= w[i % 4];
  EXPECT_LT(max_abs_diff(y, ref), 1e-6);
}

TEST(NnOps, GroupNormalizationOnLargeMeanInputsPerGroupAndPerChannelAffine) {
  const int n = 2, c = 6, groups = 3, hw = 5 * 7;
  const auto v = large_mean_values(std::size_t(n * c * hw), 5);
  const auto norm = normalise_groups(v, std::size_t(c / groups * hw), double(1e-5f));
  // Opset 18: scale/bias per group.
  const std::vector<float> gs = {0.5f, 2.0f, -1.0f}, gb = {0.1f, -0.2f, 0.3f};
  const Tensor y18 = run_op("GroupNormalization", 18, make({n, c, 5, 7}, v), {make({groups}, gs), make({groups}, gb)},
                            {{"num_groups", Attribute::of_int(groups)}})[0];
  std::vector<double> ref18(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::size_t g = (i / std::size_t(c / groups * hw)) % groups;
    ref18[i] = norm[i] * gs[g] + gb[g];
  }
  EXPECT_LT(max_abs_diff(y18, ref18), 5e-6);
  // Opset 21: scale/bias per channel; statistics still per group.
  const std::vector<float> cs = {1, 2, 3, -1, -2, 0.5f}, cb = {0, 1, 0, -1, 0, 2};
  const Tensor y21 = run_op("GroupNormalization", 21, make({n, c, 5, 7}, v), {make({c}, cs), make({c}, cb)},
                            {{"num_groups", Attribute::of_int(groups)}})[0];
  std::vector<double> ref21(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::size_t ch = (i / std::size_t(hw)) % c;
    ref21[i] = norm[i] * cs[ch] + cb[ch];
  }
  EXPECT_LT(max_abs_diff(y21, ref21), 5e-6);
  // A per-channel scale at opset 18 is a model error that names the opset-21 semantics.
  try {
    run_op("GroupNormalization", 18, make({n, c, 5, 7}, v), {make({c}, cs), make({c}, cb)},
           {{"num_groups", Attribute::of_int(groups)}});
    ADD_FAILURE() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("GroupNormalization-21"), std::string::npos) << e.what();
  }
}

TEST(NnOps, InstanceNormalizationOnLargeMeanInputs) {
  const int n = 2, c = 3, hw = 64;
  const auto v = large_mean_values(std::size_t(n * c * hw), 9);
  const std::vector<float> s = {1, -2, 0.5f}, b = {0.5f, 0, -1};
  const Tensor y = run_op("InstanceNormalization", 6, make({n, c, 8, 8}, v), {make({c}, s), make({c}, b)}, {})[0];
  auto ref = normalise_groups(v, hw, double(1e-5f));
  for (std::size_t i = 0; i < ref.size(); ++i) ref[i] = ref[i] * s[(i / hw) % c] + b[(i / hw) % c];
  EXPECT_LT(max_abs_diff(y, ref), 5e-6);
}

TEST(NnOps, BatchNormalizationTrainingModeIsUnsupportedNotWrong) {
  const Tensor x = make({1, 2, 1, 1}, {1, 2});
  const Tensor p = make({2}, {1, 1});
  EXPECT_THROW(run_op("BatchNormalization", 15, x, {p, p, p, p}, {{"training_mode", Attribute::of_int(1)}}),
               UnsupportedError);
  const Tensor y = run_op("BatchNormalization", 15, x,
                          {make({2}, {2, 3}), make({2}, {1, -1}), make({2}, {0.5f, 1}), make({2}, {4, 0.25f})},
                          {{"epsilon", Attribute::of_float(0)}})[0];
  EXPECT_FLOAT_EQ(y.data<float>()[0], (1 - 0.5f) / 2 * 2 + 1);
  EXPECT_FLOAT_EQ(y.data<float>()[1], (2 - 1) / 0.5f * 3 - 1);
}

// ---- pooling ----------------------------------------------------------------------------------

struct PoolCase {
  std::int64_t k, s, d, pb, pe;
};

// Naive pooling of one [H, W] plane with the same window on both axes; `oh`/`ow` given.
std::vector<double> naive_pool(const std::vector<float>& x, int h, int w, int oh, int ow, PoolCase c, bool max,
                               bool count_include_pad) {
  std::vector<double> out;
  for (int i = 0; i < oh; ++i)
    for (int j = 0; j < ow; ++j) {
      double best = -INFINITY, sum = 0;
      int inside = 0, padded = 0;
      for (int a = 0; a < c.k; ++a)
        for (int b = 0; b < c.k; ++b) {
          const std::int64_t y = i * c.s - c.pb + a * c.d, xx = j * c.s - c.pb + b * c.d;
          const bool in_y = y >= 0 && y < h, in_x = xx >= 0 && xx < w;
          const bool pad_y = y >= -c.pb && y < h + c.pe, pad_x = xx >= -c.pb && xx < w + c.pe;
          if (pad_y && pad_x) ++padded;
          if (!in_y || !in_x) continue;
          const double v = x[std::size_t(y * w + xx)];
          best = std::max(best, v);
          sum += v;
          ++inside;
        }
      out.push_back(max ? best : sum / (count_include_pad ? padded : inside));
    }
  return out;
}

TEST(NnOps, MaxPoolWithCeilModeAndDilationsMatchesANaiveWindow) {
  const int h = 9, w = 11;
  const auto v = smooth_image(1, h, w, 4);
  // kernel 3, stride 2, dilation 2, pads 1/1, ceil: (9 + 2 - 5) / 2 -> ceil 3 + 1 = 4 rows,
  // (11 + 2 - 5) / 2 = 4 + 1 = 5 columns.
  auto out = run_op("MaxPool", 12, make({1, 1, h, w}, v), {},
                    {{"kernel_shape", Attribute::of_ints({3, 3})},
                     {"strides", Attribute::of_ints({2, 2})},
                     {"dilations", Attribute::of_ints({2, 2})},
                     {"pads", Attribute::of_ints({1, 1, 1, 1})},
                     {"ceil_mode", Attribute::of_int(1)}},
                    2);
  ASSERT_EQ(out[0].shape(), (Shape{1, 1, 4, 5}));
  EXPECT_EQ(max_abs_diff(out[0], naive_pool(v, h, w, 4, 5, {3, 2, 2, 1, 1}, true, false)), 0.0);
  // Indices point at the maxima (row-major).
  for (std::int64_t i = 0; i < out[0].numel(); ++i)
    EXPECT_EQ(v[std::size_t(out[1].data<std::int64_t>()[i])], out[0].data<float>()[i]);
}

TEST(NnOps, CeilModeDropsAWindowThatWouldStartInTheTrailingPadding) {
  // in 5, kernel 2, stride 2, pads 1/1: ceil((5 + 2 - 2) / 2) + 1 = 4, but the 4th window would
  // start at padded index 6 = past the input; PyTorch and ONNX drop it: 3 outputs.
  const std::vector<float> v = {1, 2, 3, 4, 5};
  const Tensor y = run_op("MaxPool", 12, make({1, 1, 5}, v), {},
                          {{"kernel_shape", Attribute::of_ints({2})},
                           {"strides", Attribute::of_ints({2})},
                           {"pads", Attribute::of_ints({1, 1})},
                           {"ceil_mode", Attribute::of_int(1)}})[0];
  ASSERT_EQ(y.shape(), (Shape{1, 1, 3}));
  EXPECT_EQ(y.data<float>()[0], 1);
  EXPECT_EQ(y.data<float>()[1], 3);
  EXPECT_EQ(y.data<float>()[2], 5);
}

TEST(NnOps, AveragePoolCeilModeCountsPaddingButNotTheOverhang) {
  const int h = 8, w = 8;
  const auto v = smooth_image(1, h, w, 8);
  // kernel 3, stride 2, pads 1/1, ceil: (8 + 2 - 3) / 2 -> ceil 4 + 1 = 5; the last window
  // covers padded rows 8..10 of which only row 8 is declared padding.
  for (int include : {0, 1}) {
    const Tensor y = run_op("AveragePool", 19, make({1, 1, h, w}, v), {},
                            {{"kernel_shape", Attribute::of_ints({3, 3})},
                             {"strides", Attribute::of_ints({2, 2})},
                             {"pads", Attribute::of_ints({1, 1, 1, 1})},
                             {"ceil_mode", Attribute::of_int(1)},
                             {"count_include_pad", Attribute::of_int(include)}})[0];
    ASSERT_EQ(y.shape(), (Shape{1, 1, 5, 5}));
    EXPECT_LT(max_abs_diff(y, naive_pool(v, h, w, 5, 5, {3, 2, 1, 1, 1}, false, include == 1)), 1e-6) << include;
  }
  // Dilations (opset 19): kernel 2 dilated by 3 spans 4 positions.
  const Tensor yd = run_op("AveragePool", 19, make({1, 1, h, w}, v), {},
                           {{"kernel_shape", Attribute::of_ints({2, 2})},
                            {"dilations", Attribute::of_ints({3, 3})},
                            {"pads", Attribute::of_ints({2, 2, 2, 2})}})[0];
  ASSERT_EQ(yd.shape(), (Shape{1, 1, 9, 9}));
  EXPECT_LT(max_abs_diff(yd, naive_pool(v, h, w, 9, 9, {2, 1, 3, 2, 2}, false, false)), 1e-6);
}

TEST(NnOps, MaxPool3dColumnMajorIndices) {
  std::vector<float> v(2 * 3 * 4);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = float((i * 7) % 11);
  auto out = run_op("MaxPool", 12, make({1, 1, 2, 3, 4}, v), {},
                    {{"kernel_shape", Attribute::of_ints({2, 2, 2})}, {"storage_order", Attribute::of_int(1)}}, 2);
  ASSERT_EQ(out[0].shape(), (Shape{1, 1, 1, 2, 3}));
  for (std::int64_t o = 0; o < out[0].numel(); ++o) {
    const std::int64_t idx = out[1].data<std::int64_t>()[o];
    // column-major over (d, h, w) with d fastest: idx = d + h * 2 + w * 2 * 3
    const std::int64_t d = idx % 2, hh = (idx / 2) % 3, ww = idx / 6;
    EXPECT_EQ(v[std::size_t((d * 3 + hh) * 4 + ww)], out[0].data<float>()[o]);
  }
}

// ---- Resize: the ONNX reference algorithm, written naively in double ----------------------------

struct RefResize {
  std::string mode = "linear", coord = "half_pixel", nearest = "round_prefer_floor";
  double a = -0.75;
  bool exclude_outside = false, antialias = false;
  double extrapolation = 0;
};

std::vector<double> ref_coeffs(double ratio, double scale, const RefResize& o) {
  if (o.mode == "nearest") {
    if (ratio == 1) return {0, 1};
    if (o.nearest == "round_prefer_floor") return {double(ratio <= 0.5), double(ratio > 0.5)};
    if (o.nearest == "round_prefer_ceil") return {double(ratio < 0.5), double(ratio >= 0.5)};
    if (o.nearest == "floor") return {1, 0};
    return {0, 1};
  }
  const double A = o.a;
  if (o.mode == "linear") {
    if (!o.antialias || scale >= 1) return {1 - ratio, ratio};
    const int start = int(std::floor(-1 / scale)) + 1, footprint = 2 - 2 * start;
    std::vector<double> c;
    double sum = 0;
    for (int i = start; i < start + footprint; ++i) {
      c.push_back(std::clamp(1 - std::fabs((i - ratio) * scale), 0.0, 1.0));
      sum += c.back();
    }
    for (auto& x : c) x /= sum;
    return c;
  }
  if (!o.antialias || scale >= 1) {
    const double r = ratio;
    return {((A * (r + 1) - 5 * A) * (r + 1) + 8 * A) * (r + 1) - 4 * A, ((A + 2) * r - (A + 3)) * r * r + 1,
            ((A + 2) * (1 - r) - (A + 3)) * (1 - r) * (1 - r) + 1,
            ((A * ((1 - r) + 1) - 5 * A) * ((1 - r) + 1) + 8 * A) * ((1 - r) + 1) - 4 * A};
  }
  auto k = [&](double x) {
    x = std::fabs(x);
    if (x <= 1) return (A + 2) * x * x * x - (A + 3) * x * x + 1;
    if (x < 2) return A * x * x * x - 5 * A * x * x + 8 * A * x - 4 * A;
    return 0.0;
  };
  const int i_start = int(std::floor(-2 / scale)) + 1, i_end = 2 - i_start;
  std::vector<double> c;
  double sum = 0;
  for (int i = i_start; i < i_end; ++i) {
    c.push_back(k(scale * (i - ratio)));
    sum += c.back();
  }
  for (auto& x : c) x /= sum;
  return c;
}

// One output coordinate x along a 1-D signal: the reference's _interpolate_1d_with_x, including
// its edge padding and "n nearest neighbours, ties to the left" selection.
double ref_interp_1d(const std::vector<double>& data, double scale, std::int64_t out_size, double x, const RefResize& o,
                     double roi0 = 0, double roi1 = 1) {
  const double in = double(data.size());
  const double length = scale * in;
  double xo = 0;
  if (o.coord == "align_corners") xo = length == 1 ? 0 : x * (in - 1) / (length - 1);
  else if (o.coord == "asymmetric") xo = x / scale;
  else if (o.coord == "pytorch_half_pixel") xo = length == 1 ? -0.5 : (x + 0.5) / scale - 0.5;
  else if (o.coord == "half_pixel") xo = (x + 0.5) / scale - 0.5;
  else if (o.coord == "half_pixel_symmetric") {
    const double adj = double(out_size) / length;
    xo = in / 2 * (1 - adj) + (x + 0.5) / scale - 0.5;
  } else if (o.coord == "tf_crop_and_resize") {
    xo = (length == 1 ? (roi1 - roi0) * (in - 1) / 2 : x * (roi1 - roi0) * (in - 1) / (length - 1)) + roi0 * (in - 1);
    if (xo < 0 || xo > in - 1) return o.extrapolation;
  }
  const double xi = std::floor(xo);
  const double ratio = xo == xi ? 1 : xo - xi;
  auto c = ref_coeffs(ratio, scale, o);
  const int n = int(c.size());
  const int pad = (n + 1) / 2;
  const double xp = xo + pad;
  std::vector<int> idx(std::size_t(int(data.size()) + 2 * pad));
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = int(i);
  std::stable_sort(idx.begin(), idx.end(), [&](int p, int q) { return std::fabs(xp - p) < std::fabs(xp - q); });
  idx.resize(std::size_t(n));
  std::sort(idx.begin(), idx.end());
  if (o.exclude_outside) {
    double sum = 0;
    for (int t = 0; t < n; ++t) {
      const int orig = idx[std::size_t(t)] - pad;
      if (orig < 0 || orig >= int(data.size())) c[std::size_t(t)] = 0;
      sum += c[std::size_t(t)];
    }
    for (auto& v : c) v /= sum;
  }
  double r = 0;
  for (int t = 0; t < n; ++t) {
    const int orig = std::clamp(idx[std::size_t(t)] - pad, 0, int(data.size()) - 1);
    r += c[std::size_t(t)] * data[std::size_t(orig)];
  }
  return r;
}

// 2-D resize of each [H, W] plane: interpolate every input row at x, then the column at y.
std::vector<double> ref_resize_2d(const std::vector<float>& x, int planes, int h, int w, double sh, double sw, int oh,
                                  int ow, const RefResize& o, std::vector<double> roi = {0, 0, 1, 1}) {
  std::vector<double> out;
  for (int p = 0; p < planes; ++p)
    for (int i = 0; i < oh; ++i)
      for (int j = 0; j < ow; ++j) {
        std::vector<double> col;
        for (int r = 0; r < h; ++r) {
          std::vector<double> row(x.begin() + (p * h + r) * w, x.begin() + (p * h + r + 1) * w);
          col.push_back(ref_interp_1d(row, sw, ow, j, o, roi[1], roi[3]));
        }
        out.push_back(ref_interp_1d(col, sh, oh, i, o, roi[0], roi[2]));
      }
  return out;
}

struct ResizeCase {
  const char* name;
  RefResize ref;
  int opset;
  int oh, ow;             // output size (given as sizes when scales are empty)
  double sh = 0, sw = 0;  // scales, or 0 to give sizes
};

TEST(NnOps, ResizeMatchesTheReferenceAlgorithmOnANonTrivialImage) {
  const int c = 2, h = 13, w = 17;
  const auto v = smooth_image(c, h, w, 21);
  std::vector<ResizeCase> cases;
  auto add = [&](const char* name, RefResize r, int opset, int oh, int ow, double sh = 0, double sw = 0) {
    cases.push_back({name, r, opset, oh, ow, sh, sw});
  };
  RefResize lin;
  add("linear half_pixel up (sizes)", lin, 13, 29, 40);
  add("linear half_pixel down (scales)", lin, 13, 7, 10, 0.6, 0.6);
  RefResize lin_ac = lin;
  lin_ac.coord = "align_corners";
  add("linear align_corners down (scales, unrounded length)", lin_ac, 13, 7, 10, 0.6, 0.6);
  RefResize lin_pt = lin;
  lin_pt.coord = "pytorch_half_pixel";
  add("linear pytorch_half_pixel to one row", lin_pt, 13, 1, 9);
  RefResize cub;
  cub.mode = "cubic";
  add("cubic half_pixel up (scales)", cub, 13, 26, 42, 2.0, 2.5);
  RefResize cub_ex = cub;
  cub_ex.a = -0.5;
  cub_ex.exclude_outside = true;
  add("cubic A=-0.5 exclude_outside down", cub_ex, 13, 9, 11, 0.7, 0.65);
  RefResize cub_asym = cub;
  cub_asym.coord = "asymmetric";
  add("cubic asymmetric up", cub_asym, 13, 20, 30);
  RefResize sym = lin;
  sym.coord = "half_pixel_symmetric";
  add("linear half_pixel_symmetric (rounded size)", sym, 19, 8, 9, 0.65, 0.55);
  RefResize aa_lin = lin;
  aa_lin.antialias = true;
  add("linear antialias down", aa_lin, 18, 5, 6, 0.4, 0.36);
  RefResize aa_cub = cub;
  aa_cub.antialias = true;
  add("cubic antialias down", aa_cub, 18, 6, 7, 0.5, 0.45);
  RefResize nn;
  nn.mode = "nearest";
  add("nearest round_prefer_floor", nn, 13, 20, 23);
  RefResize nn_ceil = nn;
  nn_ceil.nearest = "round_prefer_ceil";
  nn_ceil.coord = "asymmetric";
  add("nearest round_prefer_ceil asymmetric", nn_ceil, 13, 9, 31);

  for (const auto& rc : cases) {
    std::map<std::string, Attribute> attrs{{"mode", Attribute::of_string(rc.ref.mode)},
                                           {"coordinate_transformation_mode", Attribute::of_string(rc.ref.coord)},
                                           {"nearest_mode", Attribute::of_string(rc.ref.nearest)},
                                           {"cubic_coeff_a", Attribute::of_float(float(rc.ref.a))},
                                           {"exclude_outside", Attribute::of_int(rc.ref.exclude_outside)}};
    if (rc.opset >= 18) attrs["antialias"] = Attribute::of_int(rc.ref.antialias);
    std::vector<std::optional<Tensor>> rest;
    double sh = rc.sh, sw = rc.sw;
    if (rc.sh > 0) {
      rest = {std::nullopt, make({4}, {1, 1, float(rc.sh), float(rc.sw)})};
      sh = double(float(rc.sh));  // the model's scales are float32
      sw = double(float(rc.sw));
    } else {
      rest = {std::nullopt, std::nullopt, make_i64({1, c, rc.oh, rc.ow})};
      sh = double(rc.oh) / h;
      sw = double(rc.ow) / w;
    }
    const Tensor y = run_op("Resize", rc.opset, make({1, c, h, w}, v), rest, attrs)[0];
    ASSERT_EQ(y.shape(), (Shape{1, c, rc.oh, rc.ow})) << rc.name;
    const auto ref = ref_resize_2d(v, c, h, w, sh, sw, rc.oh, rc.ow, rc.ref);
    EXPECT_LT(max_abs_diff(y, ref), 2e-6) << rc.name;
  }
}

TEST(NnOps, ResizeCropAndResizeExtrapolatesAndAxesSelectDimensions) {
  const int h = 10, w = 12;
  const auto v = smooth_image(1, h, w, 2);
  RefResize crop;
  crop.coord = "tf_crop_and_resize";
  crop.extrapolation = -7;
  // roi over (H, W) only via axes (opset 18): rows 0.2..1.3 (past the edge), cols -0.1..0.6.
  const std::vector<double> roi = {0.2, -0.1, 1.3, 0.6};
  const Tensor y = run_op("Resize", 18, make({1, 1, h, w}, v),
                          {make({4}, {0.2f, -0.1f, 1.3f, 0.6f}), std::nullopt, make_i64({9, 8})},
                          {{"mode", Attribute::of_string("linear")},
                           {"coordinate_transformation_mode", Attribute::of_string("tf_crop_and_resize")},
                           {"extrapolation_value", Attribute::of_float(-7)},
                           {"axes", Attribute::of_ints({2, 3})}})[0];
  ASSERT_EQ(y.shape(), (Shape{1, 1, 9, 8}));
  std::vector<double> roi_f;
  for (double r : roi) roi_f.push_back(double(float(r)));
  const auto ref = ref_resize_2d(v, 1, h, w, 9.0 / h, 8.0 / w, 9, 8, crop, roi_f);
  EXPECT_LT(max_abs_diff(y, ref), 2e-6);
  int extrapolated = 0;
  for (float f : y.span<float>()) extrapolated += f == -7.0f;
  EXPECT_GT(extrapolated, 0);
}

TEST(NnOps, ResizeKeepAspectRatioPolicy) {
  const auto v = smooth_image(1, 6, 9, 1);
  // sizes 12x12 for a 6x9 image: not_larger takes min(2, 1.333) -> 8x12; not_smaller -> 12x18.
  for (auto [policy, oh, ow, s] : {std::tuple{"not_larger", 8, 12, 12.0 / 9}, std::tuple{"not_smaller", 12, 18, 2.0}}) {
    const Tensor y = run_op("Resize", 18, make({1, 1, 6, 9}, v), {std::nullopt, std::nullopt, make_i64({12, 12})},
                            {{"mode", Attribute::of_string("linear")},
                             {"axes", Attribute::of_ints({2, 3})},
                             {"keep_aspect_ratio_policy", Attribute::of_string(policy)}})[0];
    ASSERT_EQ(y.shape(), (Shape{1, 1, oh, ow})) << policy;
    EXPECT_LT(max_abs_diff(y, ref_resize_2d(v, 1, 6, 9, s, s, oh, ow, RefResize{})), 2e-6) << policy;
  }
}

TEST(NnOps, LegacyUpsampleAndResize10NearestFloorUpCeilDown) {
  const std::vector<float> v = {1, 2, 3, 4, 5, 6, 7, 8};
  // Upsample-9, scales 1 x 2.5: x / 2.5 floored.
  const Tensor up = run_op("Upsample", 9, make({1, 1, 2, 4}, v), {make({4}, {1, 1, 1, 2.5f})},
                           {{"mode", Attribute::of_string("nearest")}})[0];
  ASSERT_EQ(up.shape(), (Shape{1, 1, 2, 10}));
  const float want_up[] = {1, 1, 1, 2, 2, 3, 3, 3, 4, 4};
  for (int j = 0; j < 10; ++j) EXPECT_EQ(up.data<float>()[j], want_up[j]) << j;
  // Resize-10 shrinking by 0.6: x / 0.6 rounded up (the ONNX opset-10 test's [[1, 3]]).
  const Tensor down = run_op("Resize", 10, make({1, 1, 2, 4}, v), {make({4}, {1, 1, 0.6f, 0.6f})},
                             {{"mode", Attribute::of_string("nearest")}})[0];
  ASSERT_EQ(down.shape(), (Shape{1, 1, 1, 2}));
  EXPECT_EQ(down.data<float>()[0], 1);
  EXPECT_EQ(down.data<float>()[1], 3);
  // Linear at opset 10 is asymmetric: x / 2 -> 0, 0.5, 1, 1.5, ... clamped at the edge.
  const Tensor lin = run_op("Resize", 10, make({1, 1, 1, 4}, {1, 2, 3, 4}), {make({4}, {1, 1, 1, 2})},
                            {{"mode", Attribute::of_string("linear")}})[0];
  const float want_lin[] = {1, 1.5f, 2, 2.5f, 3, 3.5f, 4, 4};
  for (int j = 0; j < 8; ++j) EXPECT_FLOAT_EQ(lin.data<float>()[j], want_lin[j]) << j;
}

TEST(NnOps, ResizeNearestGathersAnyTypeAndLinearOfIntegersIsUnsupported) {
  Tensor x(DType::kUInt8, {1, 1, 2, 2});
  const std::uint8_t px[] = {10, 200, 30, 255};
  std::copy(px, px + 4, x.data<std::uint8_t>());
  const Tensor y =
      run_op("Resize", 13, x, {std::nullopt, make({4}, {1, 1, 2, 2})}, {{"mode", Attribute::of_string("nearest")}})[0];
  ASSERT_EQ(y.dtype(), DType::kUInt8);
  ASSERT_EQ(y.shape(), (Shape{1, 1, 4, 4}));
  // half_pixel + round_prefer_floor at scale 2: output i reads input (i + 0.5) / 2 - 0.5 rounded.
  const std::uint8_t want[] = {10, 10, 200, 200, 10, 10, 200, 200, 30, 30, 255, 255, 30, 30, 255, 255};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(y.data<std::uint8_t>()[i], want[i]) << i;
  EXPECT_THROW(
      run_op("Resize", 13, x, {std::nullopt, make({4}, {1, 1, 2, 2})}, {{"mode", Attribute::of_string("linear")}}),
      UnsupportedError);
  // Upsample-7 takes its scales as an attribute.
  Attribute scales;
  scales.kind = Attribute::Kind::kFloats;
  scales.floats = {1, 1, 2, 1};
  const Tensor u = run_op("Upsample", 7, make({1, 1, 2, 2}, {1, 2, 3, 4}), {}, {{"scales", scales}})[0];
  ASSERT_EQ(u.shape(), (Shape{1, 1, 4, 2}));
  const float want_u[] = {1, 2, 1, 2, 3, 4, 3, 4};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(u.data<float>()[i], want_u[i]) << i;
}

}  // namespace
}  // namespace qeval::eval
