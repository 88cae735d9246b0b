#include "kernels/index_map.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <numeric>
#include <vector>

namespace qeval::kernels {
namespace {

using Map = std::vector<std::int64_t>;
using Shape = std::vector<std::int64_t>;

// map[i] = f(coordinates of i) over a row-major `shape`.
Map make_map(const Shape& shape, const std::function<std::int64_t(const Shape&)>& f) {
  const std::int64_t total = std::accumulate(shape.begin(), shape.end(), std::int64_t(1), std::multiplies<>());
  Map m(static_cast<std::size_t>(total));
  Shape c(shape.size());
  for (std::int64_t i = 0; i < total; ++i) {
    std::int64_t rem = i;
    for (std::size_t d = shape.size(); d-- > 0;) {
      c[d] = rem % shape[d];
      rem /= shape[d];
    }
    m[std::size_t(i)] = f(c);
  }
  return m;
}

// The map a SeparableMap stands for, element by element.
Map expand(const SeparableMap& s, const Shape& shape) {
  return make_map(shape, [&](const Shape& c) {
    std::int64_t off = s.base;
    for (std::size_t d = 0; d < c.size(); ++d) {
      const std::int64_t t = s.tables[d][std::size_t(c[d])];
      if (t == SeparableMap::kFill) return std::int64_t(-1);
      off += t;
    }
    return off;
  });
}

TEST(IndexMap, ATransposeIsAStridedCopy) {
  // Transpose perm (2, 0, 1) of a [2, 3, 4] input (strides 12, 4, 1): output [4, 2, 3].
  const Shape out{4, 2, 3};
  const Map m = make_map(out, [](const Shape& c) { return c[1] * 12 + c[2] * 4 + c[0]; });
  const auto s = separable_map(m.data(), out);
  ASSERT_TRUE(s);
  EXPECT_FALSE(s->has_fill);
  EXPECT_EQ(s->base, 0);
  ASSERT_TRUE(s->strides());
  EXPECT_EQ(*s->strides(), (Shape{1, 12, 4}));
  EXPECT_EQ(expand(*s, out), m);
}

TEST(IndexMap, AReversedSliceHasNegativeStrides) {
  // x[5:0:-2, 1:] of a [6, 4] input: rows 5, 3, 1, columns 1..3.
  const Shape out{3, 3};
  const Map m = make_map(out, [](const Shape& c) { return (5 - 2 * c[0]) * 4 + 1 + c[1]; });
  const auto s = separable_map(m.data(), out);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->base, 21);
  ASSERT_TRUE(s->strides());
  EXPECT_EQ(*s->strides(), (Shape{-8, 1}));
}

TEST(IndexMap, NearestUpsamplingIsSeparableButNotStrided) {
  // [1, 2, 3, 5] -> [1, 2, 6, 10]: each pixel twice along both spatial axes.
  const Shape out{1, 2, 6, 10};
  const Map m = make_map(out, [](const Shape& c) { return c[1] * 15 + (c[2] / 2) * 5 + c[3] / 2; });
  const auto s = separable_map(m.data(), out);
  ASSERT_TRUE(s);
  EXPECT_FALSE(s->has_fill);
  EXPECT_FALSE(s->strides());
  EXPECT_EQ(s->tables[3], (Shape{0, 0, 1, 1, 2, 2, 3, 3, 4, 4}));
  EXPECT_EQ(expand(*s, out), m);
}

TEST(IndexMap, PaddingGivesFillPositionsPerAxis) {
  // Constant Pad of a [3, 4] input by one row above, two columns left and one right: [4, 7].
  const Shape out{4, 7};
  const Map m = make_map(out, [](const Shape& c) {
    return c[0] < 1 || c[1] < 2 || c[1] > 5 ? std::int64_t(-1) : (c[0] - 1) * 4 + c[1] - 2;
  });
  const auto s = separable_map(m.data(), out);
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->has_fill);
  EXPECT_FALSE(s->strides());  // fill positions need the gather
  EXPECT_EQ(expand(*s, out), m);
  EXPECT_EQ(s->tables[0][0], SeparableMap::kFill);
}

TEST(IndexMap, AMapThatMixesAxesIsNotSeparable) {
  // DepthToSpace-like: the source depends on a product of coordinates, which no sum of tables gives.
  const Shape out{4, 4};
  Map m = make_map(out, [](const Shape& c) { return c[0] * c[1]; });
  EXPECT_FALSE(separable_map(m.data(), out));
  // One element off in an otherwise strided map: every element is checked.
  m = make_map(out, [](const Shape& c) { return c[0] * 4 + c[1]; });
  m[13] = 0;
  EXPECT_FALSE(separable_map(m.data(), out));
  // A fill element inside the valid box (not a whole row or column of fill).
  m = make_map(out, [](const Shape& c) { return c[0] * 4 + c[1]; });
  m[5] = -1;
  EXPECT_FALSE(separable_map(m.data(), out));
}

TEST(IndexMap, AllFillOrEmptyIsNotAMap) {
  const Shape out{2, 3};
  const Map fill(6, -1);
  EXPECT_FALSE(separable_map(fill.data(), out));
  const Shape empty{2, 0};
  EXPECT_FALSE(separable_map(fill.data(), empty));
}

TEST(IndexMap, AScalarAndLongRowsAreChecked) {
  const Map one{7};
  const auto s = separable_map(one.data(), Shape{});
  ASSERT_TRUE(s);
  EXPECT_EQ(s->base, 7);
  ASSERT_TRUE(s->strides());
  // Many rows (the check runs in parallel): a broadcast (Expand) of a [1, 300] row to [2000, 300].
  const Shape out{2000, 300};
  Map m = make_map(out, [](const Shape& c) { return c[1]; });
  const auto e = separable_map(m.data(), out);
  ASSERT_TRUE(e);
  EXPECT_EQ(*e->strides(), (Shape{0, 1}));
  m[1999 * 300 + 299] = 0;  // the very last element
  EXPECT_FALSE(separable_map(m.data(), out));
}

}  // namespace
}  // namespace qeval::kernels
