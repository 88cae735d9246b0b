// Data-movement and reduce ops against naive references, beyond what the ONNX 1.12 node tests cover.
//
// Large and odd shapes in every element size, negative slice steps, the forms of opsets 18-19
// (Split num_outputs, Reduce axes inputs, Pad axes/wrap, Cast saturate), reduction precision, and
// the errors users see.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "eval/exec/session.h"
#include "kernels/error.h"
#include "kernels/numeric.h"

namespace qeval::eval {
namespace {

// A one-node graph: inputs named in0, in1, ... (runtime inputs, or initializers where given),
// outputs out0, out1, ...
struct OneNode {
  Graph graph;
  OneNode(const std::string& op, int opset, std::vector<std::optional<Tensor>> inputs,
          std::map<std::string, Attribute> attrs = {}, std::size_t outputs = 1) {
    graph.source = "test";
    graph.opsets[""] = opset;
    Node n;
    n.name = "n";
    n.op_type = op;
    n.opset = opset;
    n.attributes = std::move(attrs);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const std::string name = "in" + std::to_string(i);
      if (!inputs[i]) {
        n.inputs.push_back("");
        continue;
      }
      n.inputs.push_back(name);
      runtime_.emplace(name, *inputs[i]);
      graph.inputs.push_back(ValueInfo{name, inputs[i]->dtype(), {}, {}, false});
    }
    for (std::size_t o = 0; o < outputs; ++o) {
      n.outputs.push_back("out" + std::to_string(o));
      graph.outputs.push_back(ValueInfo{"out" + std::to_string(o), DType::kFloat32, {}, {}, false});
    }
    graph.nodes.push_back(std::move(n));
  }
  // Moves input i into the initializers (a constant at plan time).
  OneNode& constant(std::size_t i) {
    const std::string name = "in" + std::to_string(i);
    graph.initializers.emplace(name, runtime_.at(name));
    runtime_.erase(name);
    std::erase_if(graph.inputs, [&](const ValueInfo& v) { return v.name == name; });
    return *this;
  }
  std::vector<Tensor> run() {
    Session s(graph);
    auto out = s.run(runtime_);
    std::vector<Tensor> v;
    for (const auto& o : graph.outputs) v.push_back(out.at(o.name));
    return v;
  }
  Tensor run1() { return run().at(0); }

 private:
  std::map<std::string, Tensor> runtime_;
};

template <class T>
Tensor make(Shape shape, std::vector<T> values) {
  Tensor t(dtype_of<T>::value, std::move(shape));
  EXPECT_EQ(std::size_t(t.numel()), values.size());
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}
Tensor i64(std::vector<std::int64_t> v) { return make<std::int64_t>({std::int64_t(v.size())}, v); }

template <class T>
Tensor iota_tensor(Shape shape) {
  Tensor t(dtype_of<T>::value, std::move(shape));
  T* p = t.data<T>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<T>(i % 251 + (i / 251) * 3);
  return t;
}

Tensor random_floats(Shape shape, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  Tensor t(DType::kFloat32, std::move(shape));
  for (auto& v : t.span<float>()) v = u(rng);
  return t;
}

template <class T>
std::vector<T> values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

std::vector<std::int64_t> unravel(std::int64_t i, const Shape& s) {
  std::vector<std::int64_t> idx(s.size());
  for (std::size_t d = s.size(); d-- > 0;) {
    idx[d] = i % s[d];
    i /= s[d];
  }
  return idx;
}
std::int64_t ravel(const std::vector<std::int64_t>& idx, const Shape& s) {
  std::int64_t i = 0;
  for (std::size_t d = 0; d < s.size(); ++d) i = i * s[d] + idx[d];
  return i;
}

std::string error_of(OneNode& g) {
  try {
    g.run();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// ---- Transpose -------------------------------------------------------------------------------

template <class T>
void expect_transpose(const Shape& shape, const std::vector<std::int64_t>& perm) {
  Tensor x = iota_tensor<T>(shape);
  OneNode g("Transpose", 13, {x}, {{"perm", Attribute::of_ints(perm)}});
  Tensor y = g.run1();
  Shape os;
  for (auto p : perm) os.push_back(shape[std::size_t(p)]);
  ASSERT_EQ(y.shape(), os);
  const T* px = x.data<T>();
  const T* py = y.data<T>();
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    auto oi = unravel(i, os);
    std::vector<std::int64_t> ii(shape.size());
    for (std::size_t d = 0; d < perm.size(); ++d) ii[std::size_t(perm[d])] = oi[d];
    ASSERT_EQ(py[i], px[ravel(ii, shape)]) << "element " << i << " of " << shape_to_string(shape);
  }
}

TEST(TensorOps, TransposeMatchesNaiveReferenceForEveryPermutationAndElementSize) {
  std::vector<std::int64_t> perm = {0, 1, 2, 3};
  do {
    expect_transpose<float>({2, 3, 33, 70}, perm);
    expect_transpose<std::uint8_t>({3, 1, 17, 40}, perm);
  } while (std::next_permutation(perm.begin(), perm.end()));
  expect_transpose<std::int64_t>({37, 65}, {1, 0});
  expect_transpose<std::int16_t>({5, 129, 3}, {2, 0, 1});
  expect_transpose<double>({1, 1, 9}, {2, 1, 0});
}

TEST(TensorOps, TransposeOfLargeImageLikeTensorsMatchesReference) {
  // UNet/ViT shapes: [B, C, HW] -> [B, HW, C], [B, N, H, D] -> [B, H, N, D] (tiled and run paths,
  // in parallel).
  expect_transpose<float>({2, 320, 1024}, {0, 2, 1});
  expect_transpose<float>({2, 257, 8, 64}, {0, 2, 1, 3});
  expect_transpose<float>({1, 511, 1023}, {0, 2, 1});
}

// Attention's head split [B, N, H, D] -> [B, H, N, D] moves runs of D elements: every run length
// from 1 to 20 elements of 1, 2, 4 and 8 bytes (runs of 1 to 160 bytes: the fixed-size moves of
// 16 to 64 bytes, overlapping or not, and the memcpy on either side).
TEST(TensorOps, TransposeMovesShortContiguousRunsExactly) {
  for (std::int64_t d = 1; d <= 20; ++d) {
    expect_transpose<float>({2, 7, 3, d}, {0, 2, 1, 3});
    expect_transpose<std::uint8_t>({2, 5, 4, d * 3}, {0, 2, 1, 3});
    expect_transpose<std::int16_t>({1, 6, 3, d}, {0, 2, 1, 3});
    expect_transpose<double>({2, 3, 5, d}, {0, 2, 1, 3});
    if (HasFatalFailure()) return;
  }
}

TEST(TensorOps, TransposeDefaultReversesAndBadPermIsAnInputError) {
  OneNode g("Transpose", 13, {iota_tensor<float>({2, 3, 4})});
  EXPECT_EQ(g.run1().shape(), (Shape{4, 3, 2}));
  OneNode bad("Transpose", 13, {iota_tensor<float>({2, 3})}, {{"perm", Attribute::of_ints({0, 0})}});
  EXPECT_NE(error_of(bad).find("node 'n' (Transpose): perm [0, 0] is not a permutation"), std::string::npos);
}

// ---- Concat, Split ---------------------------------------------------------------------------

TEST(TensorOps, ConcatMatchesReferenceOnLargeTensorsAndEmptyParts) {
  for (std::int64_t axis = 0; axis < 3; ++axis) {
    Shape sa = {4, 96, 130}, sb = sa, sc = sa;
    sb[std::size_t(axis)] = 7;
    sc[std::size_t(axis)] = 0;  // an empty part contributes nothing
    Tensor a = iota_tensor<float>(sa), b = random_floats(sb, 3), c(DType::kFloat32, sc);
    OneNode g("Concat", 13, {a, b, c}, {{"axis", Attribute::of_int(axis - 3)}});
    Tensor y = g.run1();
    Shape so = sa;
    so[std::size_t(axis)] += 7;
    ASSERT_EQ(y.shape(), so);
    for (std::int64_t i = 0; i < y.numel(); ++i) {
      auto idx = unravel(i, so);
      float want;
      if (idx[std::size_t(axis)] < sa[std::size_t(axis)]) {
        want = a.data<float>()[ravel(idx, sa)];
      } else {
        idx[std::size_t(axis)] -= sa[std::size_t(axis)];
        want = b.data<float>()[ravel(idx, sb)];
      }
      ASSERT_EQ(y.data<float>()[i], want) << "axis " << axis << " element " << i;
    }
  }
  OneNode bad("Concat", 13, {iota_tensor<float>({2, 3}), iota_tensor<float>({3, 3})}, {{"axis", Attribute::of_int(1)}});
  EXPECT_NE(error_of(bad).find("has shape [3, 3], which does not match [2, 3] outside axis 1"), std::string::npos);
}

TEST(TensorOps, SplitUndoesConcatAndFollowsEachOpsetsForm) {
  Tensor x = iota_tensor<std::int64_t>({3, 10, 5});
  // opset 11: sizes as an attribute.
  OneNode a("Split", 11, {x}, {{"axis", Attribute::of_int(1)}, {"split", Attribute::of_ints({2, 3, 5})}}, 3);
  auto parts = a.run();
  ASSERT_EQ(parts[2].shape(), (Shape{3, 5, 5}));
  OneNode cat("Concat", 13, {parts[0], parts[1], parts[2]}, {{"axis", Attribute::of_int(1)}});
  EXPECT_EQ(values<std::int64_t>(cat.run1()), values<std::int64_t>(x));
  // opset 13: sizes as an input; equal parts without it.
  OneNode b("Split", 13, {x, i64({4, 6})}, {{"axis", Attribute::of_int(1)}}, 2);
  EXPECT_EQ(b.run()[1].shape(), (Shape{3, 6, 5}));
  OneNode c("Split", 13, {x}, {{"axis", Attribute::of_int(-1)}}, 5);
  EXPECT_EQ(c.run()[4].shape(), (Shape{3, 10, 1}));
  // opset 18: num_outputs, the last part smaller (ceil(10 / 4) = 3: 3, 3, 3, 1).
  OneNode d("Split", 18, {x}, {{"axis", Attribute::of_int(1)}, {"num_outputs", Attribute::of_int(4)}}, 4);
  auto q = d.run();
  EXPECT_EQ(q[0].shape(), (Shape{3, 3, 5}));
  EXPECT_EQ(q[3].shape(), (Shape{3, 1, 5}));
  EXPECT_EQ(q[3].data<std::int64_t>()[0], x.data<std::int64_t>()[9 * 5]);
  // Unequal split without sizes is an error naming the sizes.
  OneNode e("Split", 13, {x}, {{"axis", Attribute::of_int(1)}}, 3);
  EXPECT_NE(error_of(e).find("cannot split an axis of size 10 into 3 equal parts"), std::string::npos);
  OneNode f("Split", 13, {x, i64({4, 5})}, {{"axis", Attribute::of_int(1)}}, 2);
  EXPECT_NE(error_of(f).find("split sizes add up to 9, but the axis has size 10"), std::string::npos);
}

// ---- Slice -----------------------------------------------------------------------------------

// Python-style slice along one axis, the ONNX clamping rules.
std::vector<std::int64_t> slice_indices(std::int64_t dim, std::int64_t b, std::int64_t e, std::int64_t step) {
  std::vector<std::int64_t> out;
  if (b < 0) b += dim;
  if (e < 0) e += dim;
  if (step > 0) {
    b = std::clamp<std::int64_t>(b, 0, dim);
    e = std::clamp<std::int64_t>(e, 0, dim);
    for (std::int64_t i = b; i < e; i += step) out.push_back(i);
  } else {
    b = std::clamp<std::int64_t>(b, 0, dim - 1);
    e = std::clamp<std::int64_t>(e, -1, dim - 1);
    for (std::int64_t i = b; i > e; i += step) out.push_back(i);
  }
  return out;
}

TEST(TensorOps, SliceWithNegativeStepsAndClampingMatchesReference) {
  const Shape s = {6, 70, 9};
  Tensor x = iota_tensor<std::int32_t>(s);
  const std::int64_t big = std::numeric_limits<std::int64_t>::max(), small = std::numeric_limits<std::int64_t>::min();
  struct Case {
    std::vector<std::int64_t> starts, ends, axes, steps;
  };
  std::vector<Case> cases = {
      {{-1, big}, {small, -100}, {1, 2}, {-1, -2}},  // full reverse, clamped both ends
      {{5, 60, 1}, {0, 3, 8}, {0, 1, 2}, {-2, -7, 3}},
      {{0}, {big}, {-2}, {4}},
      {{2}, {2}, {0}, {1}},        // empty
      {{-3}, {-1}, {2}, {-1}},     // start before end with a negative step: empty
      {{100}, {-100}, {1}, {-1}},  // start clamped to dim - 1
  };
  for (const auto& c : cases) {
    OneNode g("Slice", 13, {x, i64(c.starts), i64(c.ends), i64(c.axes), i64(c.steps)});
    Tensor y = g.run1();
    std::vector<std::vector<std::int64_t>> pick(s.size());
    for (std::size_t d = 0; d < s.size(); ++d) pick[d] = slice_indices(s[d], 0, s[d], 1);
    for (std::size_t i = 0; i < c.axes.size(); ++i) {
      const std::size_t a = std::size_t(c.axes[i] < 0 ? c.axes[i] + 3 : c.axes[i]);
      pick[a] = slice_indices(s[a], c.starts[i], c.ends[i], c.steps[i]);
    }
    Shape os;
    for (auto& p : pick) os.push_back(std::int64_t(p.size()));
    ASSERT_EQ(y.shape(), os);
    for (std::int64_t i = 0; i < y.numel(); ++i) {
      auto idx = unravel(i, os);
      for (std::size_t d = 0; d < s.size(); ++d) idx[d] = pick[d][std::size_t(idx[d])];
      ASSERT_EQ(y.data<std::int32_t>()[i], x.data<std::int32_t>()[ravel(idx, s)]) << "element " << i;
    }
  }
}

TEST(TensorOps, SliceBeforeOpset10TakesAttributes) {
  OneNode g("Slice", 9, {iota_tensor<float>({4, 5})},
            {{"starts", Attribute::of_ints({1, -2})},
             {"ends", Attribute::of_ints({3, 1000})},
             {"axes", Attribute::of_ints({0, 1})}});
  Tensor y = g.run1();
  ASSERT_EQ(y.shape(), (Shape{2, 2}));
  EXPECT_EQ(values<float>(y), (std::vector<float>{8, 9, 13, 14}));
  OneNode zero("Slice", 13, {iota_tensor<float>({4}), i64({0}), i64({4}), i64({0}), i64({0})});
  EXPECT_NE(error_of(zero).find("step for axis 0 is 0"), std::string::npos);
}

// ---- Gather, Expand, Tile, Pad ---------------------------------------------------------------

TEST(TensorOps, GatherTakesNegativeIndicesAndRejectsOutOfRange) {
  Tensor x = iota_tensor<float>({3, 4});
  OneNode g("Gather", 13, {x, make<std::int64_t>({2}, {-1, 0})}, {{"axis", Attribute::of_int(1)}});
  EXPECT_EQ(values<float>(g.run1()), (std::vector<float>{3, 0, 7, 4, 11, 8}));
  OneNode bad("Gather", 13, {x, make<std::int64_t>({1}, {4})}, {{"axis", Attribute::of_int(1)}});
  EXPECT_NE(error_of(bad).find("index 4 is out of range [-4, 3] for axis 1"), std::string::npos);
}

TEST(TensorOps, ExpandAndTileMatchBroadcastReference) {
  Tensor x = iota_tensor<float>({3, 1, 5});
  OneNode e("Expand", 13, {x, i64({2, 1, 4, 1})});
  Tensor y = e.run1();
  ASSERT_EQ(y.shape(), (Shape{2, 3, 4, 5}));
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    auto idx = unravel(i, y.shape());
    ASSERT_EQ(y.data<float>()[i], x.data<float>()[idx[1] * 5 + idx[3]]);
  }
  Tensor t = iota_tensor<std::uint8_t>({2, 3});
  OneNode tile("Tile", 13, {t, i64({3, 2})});
  Tensor z = tile.run1();
  ASSERT_EQ(z.shape(), (Shape{6, 6}));
  for (std::int64_t i = 0; i < z.numel(); ++i) {
    auto idx = unravel(i, z.shape());
    ASSERT_EQ(z.data<std::uint8_t>()[i], t.data<std::uint8_t>()[(idx[0] % 2) * 3 + idx[1] % 3]);
  }
}

TEST(TensorOps, PadModesMatchNumpy) {
  Tensor x = make<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  auto pad = [&](const std::string& mode, int opset) {
    OneNode g("Pad", opset, {x, i64({1, 2, 0, 2})}, {{"mode", Attribute::of_string(mode)}});
    return values<float>(g.run1());
  };
  // numpy.pad(x, ((1, 0), (2, 2)), mode)
  EXPECT_EQ(pad("reflect", 13), (std::vector<float>{6, 5, 4, 5, 6, 5, 4,  //
                                                    3, 2, 1, 2, 3, 2, 1,  //
                                                    6, 5, 4, 5, 6, 5, 4}));
  EXPECT_EQ(pad("edge", 13), (std::vector<float>{1, 1, 1, 2, 3, 3, 3,  //
                                                 1, 1, 1, 2, 3, 3, 3,  //
                                                 4, 4, 4, 5, 6, 6, 6}));
  EXPECT_EQ(pad("wrap", 19), (std::vector<float>{5, 6, 4, 5, 6, 4, 5,  //
                                                 2, 3, 1, 2, 3, 1, 2,  //
                                                 5, 6, 4, 5, 6, 4, 5}));
  OneNode wrap_early("Pad", 18, {x, i64({0, 0, 0, 0})}, {{"mode", Attribute::of_string("wrap")}});
  EXPECT_NE(error_of(wrap_early).find("mode must be"), std::string::npos);
  // Constant with a value input, negative pads crop, axes input (opset 18).
  OneNode c("Pad", 18, {x, i64({2, -1}), make<float>({}, {9.5f}), i64({1})});
  EXPECT_EQ(values<float>(c.run1()), (std::vector<float>{9.5f, 9.5f, 1, 2, 9.5f, 9.5f, 4, 5}));
  // opset 2: pads and value as attributes.
  OneNode old("Pad", 2, {x}, {{"pads", Attribute::of_ints({0, 1, 0, 0})}, {"value", Attribute::of_float(-1)}});
  EXPECT_EQ(values<float>(old.run1()), (std::vector<float>{-1, 1, 2, 3, -1, 4, 5, 6}));
  OneNode wide("Pad", 13, {x, i64({0, 3, 0, 0})}, {{"mode", Attribute::of_string("reflect")}});
  EXPECT_THROW(wide.run(), UnsupportedError);
  OneNode bad("Pad", 13, {x, i64({1, 1})});
  EXPECT_NE(error_of(bad).find("pads has 2 values; expected 4"), std::string::npos);
}

TEST(TensorOps, SqueezeUnsqueezeTakeAxesAsAttributeBefore13AndAsInputAfter) {
  Tensor x = iota_tensor<float>({3, 1, 4});
  OneNode a("Unsqueeze", 11, {x}, {{"axes", Attribute::of_ints({0, -1})}});
  EXPECT_EQ(a.run1().shape(), (Shape{1, 3, 1, 4, 1}));
  OneNode b("Unsqueeze", 13, {x, i64({1})});
  EXPECT_EQ(b.run1().shape(), (Shape{3, 1, 1, 4}));
  OneNode c("Squeeze", 13, {x});
  EXPECT_EQ(c.run1().shape(), (Shape{3, 4}));
  OneNode d("Squeeze", 13, {x, i64({0})});
  EXPECT_NE(error_of(d).find("cannot squeeze axis 0 of shape [3, 1, 4]: its size is 3, not 1"), std::string::npos);
  OneNode attr13("Unsqueeze", 13, {x}, {{"axes", Attribute::of_ints({0})}});
  EXPECT_NE(error_of(attr13).find("takes 'axes' as input 1 from opset 13, not as an attribute"), std::string::npos);
  OneNode input11("Squeeze", 11, {x, i64({1})});
  EXPECT_NE(error_of(input11).find("takes 'axes' as an attribute before opset 13"), std::string::npos);
  OneNode f("Flatten", 13, {x}, {{"axis", Attribute::of_int(-1)}});
  EXPECT_EQ(f.run1().shape(), (Shape{3, 4}));
}

// ---- Cast --------------------------------------------------------------------------------------

TEST(TensorOps, CastToFloat8SaturatesOnlyWhenAsked) {
  Tensor x = make<float>({5}, {1000.0f, -1000.0f, 0.3f, std::numeric_limits<float>::infinity(), 464.0f});
  OneNode sat("Cast", 19, {x}, {{"to", Attribute::of_int(17)}});  // FLOAT8E4M3FN
  Tensor y = sat.run1();
  ASSERT_EQ(y.dtype(), DType::kFloat8E4M3FN);
  auto code = [&](std::int64_t i) { return reinterpret_cast<const std::uint8_t*>(y.raw())[i]; };
  EXPECT_EQ(to_float(float8_e4m3fn{code(0)}), 448.0f);
  EXPECT_EQ(to_float(float8_e4m3fn{code(1)}), -448.0f);
  EXPECT_EQ(code(2), to_float8_e4m3fn(0.3f).bits);
  EXPECT_EQ(to_float(float8_e4m3fn{code(3)}), 448.0f);
  EXPECT_EQ(to_float(float8_e4m3fn{code(4)}), 448.0f);  // the tie 464 rounds to 448
  OneNode nosat("Cast", 19, {x}, {{"to", Attribute::of_int(17)}, {"saturate", Attribute::of_int(0)}});
  Tensor z = nosat.run1();
  EXPECT_TRUE(std::isnan(to_float(float8_e4m3fn{reinterpret_cast<const std::uint8_t*>(z.raw())[0]})));
  // E5M2 without saturation keeps inf; read back through a second Cast to float, as a consumer in
  // the graph sees it.
  Graph g;
  g.source = "test";
  g.opsets[""] = 19;
  g.inputs.push_back(ValueInfo{"x", DType::kFloat32, {}, {}, false});
  g.outputs.push_back(ValueInfo{"back", DType::kFloat32, {}, {}, false});
  Node to8, back;
  to8.name = "to8";
  back.name = "back";
  to8.op_type = back.op_type = "Cast";
  to8.opset = back.opset = 19;
  to8.inputs = {"x"};
  to8.outputs = back.inputs = {"f8"};
  back.outputs = {"back"};
  to8.attributes = {{"to", Attribute::of_int(19)}, {"saturate", Attribute::of_int(0)}};  // FLOAT8E5M2
  back.attributes = {{"to", Attribute::of_int(1)}};
  g.nodes = {to8, back};
  Session s(g);
  auto w = values<float>(s.run({{"x", x}}).at("back"));
  EXPECT_EQ(w[0], 1024.0f);
  EXPECT_EQ(w[2], to_float(to_float8_e5m2(0.3f)));
  EXPECT_TRUE(std::isinf(w[3]) && w[3] > 0);
}

TEST(TensorOps, CastRoundsDoubleToFloat16Once) {
  // 1 + 2^-11 is the tie between fp16's 1 and 1 + 2^-10; a hair above it must round up. Going
  // through float32 first would land exactly on the tie and round to even (1).
  const double above_tie = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  OneNode g("Cast", 13, {make<double>({2}, {above_tie, 1.0 + std::ldexp(1.0, -11)})}, {{"to", Attribute::of_int(10)}});
  Tensor y = g.run1();
  ASSERT_EQ(y.dtype(), DType::kFloat16);
  std::uint16_t bits[2];
  std::memcpy(bits, y.raw(), 4);
  EXPECT_EQ(to_float(float16{bits[0]}), 1.0f + std::ldexp(1.0f, -10));
  EXPECT_EQ(to_float(float16{bits[1]}), 1.0f);
}

TEST(TensorOps, CastBetweenIntegersFloatsAndBool) {
  Tensor x = make<float>({6}, {-2.7f, 2.7f, std::nanf(""), 0.0f, 3e9f, -0.5f});
  OneNode to_int("Cast", 13, {x}, {{"to", Attribute::of_int(6)}});  // INT32: truncation, NaN -> 0, saturation
  EXPECT_EQ(values<std::int32_t>(to_int.run1()),
            (std::vector<std::int32_t>{-2, 2, 0, 0, std::numeric_limits<std::int32_t>::max(), 0}));
  OneNode to_bool("Cast", 13, {x}, {{"to", Attribute::of_int(9)}});
  EXPECT_EQ(values<bool>(to_bool.run1()), (std::vector<bool>{true, true, true, false, true, true}));
  OneNode wrap("Cast", 13, {make<std::int64_t>({3}, {300, -129, 1LL << 40})}, {{"to", Attribute::of_int(3)}});  // INT8
  EXPECT_EQ(values<std::int8_t>(wrap.run1()), (std::vector<std::int8_t>{44, 127, 0}));
  OneNode like("CastLike", 15, {make<std::int32_t>({2}, {7, -1}), make<double>({1}, {0.0})});
  EXPECT_EQ(values<double>(like.run1()), (std::vector<double>{7, -1}));
  OneNode str("Cast", 13, {x}, {{"to", Attribute::of_int(8)}});
  EXPECT_THROW(str.run(), UnsupportedError);
}

// ---- Range, ConstantOfShape, Trilu, CumSum, TopK ---------------------------------------------

TEST(TensorOps, RangeConstantOfShapeTriluCumSumTopK) {
  OneNode r("Range", 11, {make<float>({}, {1.0f}), make<float>({}, {2.0f}), make<float>({}, {0.25f})});
  EXPECT_EQ(values<float>(r.run1()), (std::vector<float>{1.0f, 1.25f, 1.5f, 1.75f}));
  OneNode ri("Range", 11, {make<std::int64_t>({}, {10}), make<std::int64_t>({}, {1}), make<std::int64_t>({}, {-4})});
  EXPECT_EQ(values<std::int64_t>(ri.run1()), (std::vector<std::int64_t>{10, 6, 2}));

  Attribute v;
  v.kind = Attribute::Kind::kTensor;
  v.t = make<std::int32_t>({1}, {7});
  OneNode c("ConstantOfShape", 9, {i64({2, 3})}, {{"value", v}});
  Tensor y = c.run1();
  EXPECT_EQ(y.dtype(), DType::kInt32);
  EXPECT_EQ(values<std::int32_t>(y), std::vector<std::int32_t>(6, 7));

  OneNode t("Trilu", 14, {iota_tensor<float>({2, 3, 4}), make<std::int64_t>({}, {-1})},
            {{"upper", Attribute::of_int(0)}});
  Tensor l = t.run1();
  for (std::int64_t i = 0; i < l.numel(); ++i) {
    auto idx = unravel(i, l.shape());
    EXPECT_EQ(l.data<float>()[i], idx[2] <= idx[1] - 1 ? float(i) : 0.0f) << i;
  }

  OneNode cs("CumSum", 14, {make<float>({2, 3}, {1, 2, 3, 4, 5, 6}), make<std::int64_t>({}, {1})},
             {{"exclusive", Attribute::of_int(1)}, {"reverse", Attribute::of_int(1)}});
  EXPECT_EQ(values<float>(cs.run1()), (std::vector<float>{5, 3, 0, 11, 6, 0}));

  // Ties keep the lower index first; NaN is the largest.
  OneNode k("TopK", 11, {make<float>({1, 5}, {3, std::nanf(""), 3, 5, 1}), i64({3})}, {}, 2);
  auto out = k.run();
  EXPECT_TRUE(std::isnan(out[0].data<float>()[0]));
  EXPECT_EQ(values<std::int64_t>(out[1]), (std::vector<std::int64_t>{1, 3, 0}));
  OneNode ks("TopK", 11, {make<float>({1, 5}, {3, std::nanf(""), 3, 5, 1}), i64({3})},
             {{"largest", Attribute::of_int(0)}}, 2);
  EXPECT_EQ(values<std::int64_t>(ks.run()[1]), (std::vector<std::int64_t>{4, 0, 2}));
}

TEST(TensorOps, ShapeInputsThatOnlyExistAtRunTimeAreUnsupported) {
  // Expand's shape computed from runtime float data: valid ONNX, but shapes are planned first.
  Graph g;
  g.source = "test";
  g.opsets[""] = 13;
  g.inputs.push_back(ValueInfo{"x", DType::kFloat32, {}, {}, false});
  g.inputs.push_back(ValueInfo{"s", DType::kFloat32, {}, {}, false});
  Node cast;
  cast.name = "cast";
  cast.op_type = "Cast";
  cast.opset = 13;
  cast.inputs = {"s"};
  cast.outputs = {"si"};
  cast.attributes["to"] = Attribute::of_int(7);
  Node expand;
  expand.name = "expand";
  expand.op_type = "Expand";
  expand.opset = 13;
  expand.inputs = {"x", "si"};
  expand.outputs = {"y"};
  g.nodes = {cast, expand};
  g.outputs.push_back(ValueInfo{"y", DType::kFloat32, {}, {}, false});
  Session s(g);
  try {
    s.run({{"x", make<float>({1}, {1})}, {"s", make<float>({1}, {3})}});
    FAIL() << "expected UnsupportedError";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("node 'expand' (Expand): input 1 ('si', shape) depends on runtime data"),
              std::string::npos)
        << e.what();
  }
}

// ---- Reduce ------------------------------------------------------------------------------------

TEST(TensorOps, ReduceOverManyElementsKeepsPrecision) {
  // 2^24 + 8 ones: a float accumulator stops at 2^24.
  const std::int64_t n = (1 << 24) + 8;
  Tensor ones(DType::kFloat32, {n});
  std::fill_n(ones.data<float>(), ones.numel(), 1.0f);
  OneNode sum("ReduceSum", 13, {ones}, {{"keepdims", Attribute::of_int(0)}});
  EXPECT_EQ(sum.run1().data<float>()[0], float(n));
  // 0.1f repeated: the exact (double) sum, rounded once to float.
  Tensor tenths(DType::kFloat32, {3, 1 << 20});
  std::fill_n(tenths.data<float>(), tenths.numel(), 0.1f);
  OneNode mean("ReduceMean", 13, {tenths}, {{"axes", Attribute::of_ints({1})}});
  Tensor m = mean.run1();
  ASSERT_EQ(m.shape(), (Shape{3, 1}));
  for (float v : m.span<float>()) EXPECT_EQ(v, 0.1f);
  OneNode l2("ReduceL2", 18, {tenths, i64({0, 1})}, {{"keepdims", Attribute::of_int(0)}});
  EXPECT_FLOAT_EQ(l2.run1().data<float>()[0], float(std::sqrt(double(0.1f) * double(0.1f) * 3 * (1 << 20))));
}

// Naive reference: for each output element, reduce the selected input elements in double.
std::vector<double> naive_reduce(const Tensor& x, const std::vector<bool>& mask, const std::string& op) {
  const Shape& s = x.shape();
  Shape os;
  for (std::size_t d = 0; d < s.size(); ++d) os.push_back(mask[d] ? 1 : s[d]);
  std::vector<std::vector<double>> groups(std::size_t(shape_numel(os)));
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    auto idx = unravel(i, s);
    for (std::size_t d = 0; d < s.size(); ++d)
      if (mask[d]) idx[d] = 0;
    groups[std::size_t(ravel(idx, os))].push_back(x.data<float>()[i]);
  }
  std::vector<double> out;
  for (const auto& g : groups) {
    double r = 0;
    if (op == "ReduceSum")
      for (double v : g) r += v;
    if (op == "ReduceMean") {
      for (double v : g) r += v;
      r /= double(g.size());
    }
    if (op == "ReduceMax") r = *std::max_element(g.begin(), g.end());
    if (op == "ReduceMin") r = *std::min_element(g.begin(), g.end());
    if (op == "ReduceProd") {
      r = 1;
      for (double v : g) r *= v;
    }
    if (op == "ReduceL1")
      for (double v : g) r += std::fabs(v);
    if (op == "ReduceSumSquare")
      for (double v : g) r += v * v;
    if (op == "ReduceLogSumExp") {
      for (double v : g) r += std::exp(v);
      r = std::log(r);
    }
    out.push_back(r);
  }
  return out;
}

TEST(TensorOps, ReduceOverAnyAxesMatchesNaiveReference) {
  Tensor x = random_floats({3, 4, 5, 6}, 11);
  for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                         "ReduceSumSquare", "ReduceLogSumExp"}) {
    for (unsigned bits = 1; bits < 16; ++bits) {
      std::vector<std::int64_t> axes;
      std::vector<bool> mask(4);
      for (int d = 0; d < 4; ++d)
        if (bits & (1u << d)) {
          axes.push_back(d - (d % 2 ? 4 : 0));  // mix negative and positive axes
          mask[std::size_t(d)] = true;
        }
      // Opset 17 (axes attribute) and 18 (axes input) give the same result.
      const bool sum = std::string(op) == "ReduceSum";
      OneNode a(op, sum ? 11 : 17, {x}, {{"axes", Attribute::of_ints(axes)}});
      OneNode b(op, sum ? 13 : 18, {x, i64(axes)});
      Tensor ya = a.run1(), yb = b.run1();
      auto want = naive_reduce(x, mask, op);
      ASSERT_EQ(std::size_t(ya.numel()), want.size());
      for (std::size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(ya.data<float>()[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << op << " axes bits " << bits;
        ASSERT_EQ(ya.data<float>()[i], yb.data<float>()[i]) << op;
      }
    }
  }
}

TEST(TensorOps, ReduceAxesEdgeCases) {
  Tensor x = make<float>({2, 2}, {1, 1000, 1000, std::nanf("")});
  // No axes: everything, unless noop_with_empty_axes (axes-input opsets only).
  OneNode all("ReduceMax", 18, {x}, {{"keepdims", Attribute::of_int(0)}});
  Tensor m = all.run1();
  EXPECT_EQ(m.shape(), Shape{});
  EXPECT_TRUE(std::isnan(m.data<float>()[0]));  // NaN propagates
  OneNode noop("ReduceSum", 13, {x, i64({})}, {{"noop_with_empty_axes", Attribute::of_int(1)}});
  EXPECT_EQ(noop.run1().shape(), (Shape{2, 2}));
  // LogSumExp of large values does not overflow.
  OneNode lse("ReduceLogSumExp", 18, {x, i64({1})}, {{"keepdims", Attribute::of_int(0)}});
  EXPECT_FLOAT_EQ(lse.run1().data<float>()[0], 1000.0f);
  OneNode lse2("ReduceLogSumExp", 13, {make<float>({2}, {1000, 1000})}, {});
  EXPECT_FLOAT_EQ(lse2.run1().data<float>()[0], 1000.0f + std::log(2.0f));
  // Reducing an empty axis gives the operation's identity.
  Tensor empty(DType::kFloat32, {3, 0});
  OneNode esum("ReduceSum", 13, {empty, i64({1})});
  EXPECT_EQ(values<float>(esum.run1()), (std::vector<float>{0, 0, 0}));
  OneNode emax("ReduceMax", 18, {empty, i64({1})}, {{"keepdims", Attribute::of_int(0)}});
  EXPECT_EQ(emax.run1().data<float>()[0], -std::numeric_limits<float>::infinity());
  OneNode eprod("ReduceProd", 13, {empty}, {{"axes", Attribute::of_ints({1})}});
  EXPECT_EQ(eprod.run1().data<float>()[2], 1.0f);
  // Integer sums are exact.
  OneNode isum("ReduceSum", 13, {make<std::int64_t>({3}, {(1LL << 60), 1, -(1LL << 60)})});
  EXPECT_EQ(isum.run1().data<std::int64_t>()[0], 1);
  OneNode dup("ReduceMean", 13, {x}, {{"axes", Attribute::of_ints({1, -1})}});
  EXPECT_NE(error_of(dup).find("axes has axis -1 more than once"), std::string::npos);
  OneNode attr_at_18("ReduceMean", 18, {x}, {{"axes", Attribute::of_ints({1})}});
  EXPECT_NE(error_of(attr_at_18).find("takes axes as an input at opset 18, not as an attribute"), std::string::npos);
  OneNode range("ReduceMean", 13, {x}, {{"axes", Attribute::of_ints({2})}});
  EXPECT_NE(error_of(range).find("axis 2 is out of range for input shape [2, 2]"), std::string::npos);
}

TEST(TensorOps, ArgMaxArgMinSelectFirstOrLastIndex) {
  Tensor x = make<float>({2, 4}, {1, 5, 5, 0, 2, 2, 1, 1});
  OneNode first("ArgMax", 13, {x}, {{"axis", Attribute::of_int(1)}, {"keepdims", Attribute::of_int(0)}});
  EXPECT_EQ(values<std::int64_t>(first.run1()), (std::vector<std::int64_t>{1, 0}));
  OneNode last("ArgMax", 13, {x}, {{"axis", Attribute::of_int(1)}, {"select_last_index", Attribute::of_int(1)}});
  Tensor l = last.run1();
  EXPECT_EQ(l.shape(), (Shape{2, 1}));
  EXPECT_EQ(values<std::int64_t>(l), (std::vector<std::int64_t>{2, 1}));
  OneNode min_last("ArgMin", 13, {x}, {{"axis", Attribute::of_int(-1)}, {"select_last_index", Attribute::of_int(1)}});
  EXPECT_EQ(values<std::int64_t>(min_last.run1()), (std::vector<std::int64_t>{3, 3}));
  // Large, along a middle axis, against a naive scan.
  Tensor big = random_floats({7, 300, 129}, 5);
  OneNode g("ArgMin", 13, {big}, {{"axis", Attribute::of_int(1)}, {"keepdims", Attribute::of_int(0)}});
  Tensor y = g.run1();
  for (std::int64_t o = 0; o < 7; ++o)
    for (std::int64_t j = 0; j < 129; ++j) {
      std::int64_t best = 0;
      for (std::int64_t k = 1; k < 300; ++k)
        if (big.data<float>()[(o * 300 + k) * 129 + j] < big.data<float>()[(o * 300 + best) * 129 + j]) best = k;
      ASSERT_EQ(y.data<std::int64_t>()[o * 129 + j], best);
    }
}

}  // namespace
}  // namespace qeval::eval
