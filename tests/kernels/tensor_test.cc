// Tensor basics: shapes, typed access, copies, reshape.
#include <gtest/gtest.h>

#include <cstdint>

#include "kernels/tensor.h"

namespace qeval {
namespace {

TEST(Tensor, ZeroInitialisedAndAligned) {
  Tensor t(DType::kFloat32, {2, 3, 5});
  EXPECT_EQ(t.numel(), 30);
  EXPECT_EQ(t.nbytes(), 120u);
  EXPECT_EQ(t.rank(), 3);
  EXPECT_EQ(t.dim(-1), 5);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.raw()) % 64, 0u);
  for (float v : t.span<float>()) EXPECT_EQ(v, 0.0f);
}

TEST(Tensor, TypedAccessIsChecked) {
  Tensor t(DType::kUInt8, {4});
  EXPECT_NO_THROW(t.data<std::uint8_t>());
  EXPECT_THROW(t.data<float>(), std::logic_error);
}

TEST(Tensor, CopyIsDeep) {
  Tensor a(DType::kFloat32, {3});
  a.data<float>()[0] = 1.0f;
  Tensor b = a;
  b.data<float>()[0] = 2.0f;
  EXPECT_EQ(a.data<float>()[0], 1.0f);
}

TEST(Tensor, ReshapeInfersOneDimension) {
  Tensor a(DType::kInt32, {2, 6});
  EXPECT_EQ(a.reshaped({3, -1}).shape(), (Shape{3, 4}));
  EXPECT_THROW(a.reshaped({5, -1}), std::invalid_argument);
  EXPECT_THROW(a.reshaped({-1, -1}), std::invalid_argument);
  EXPECT_THROW(a.reshaped({2, 2}), std::invalid_argument);
}

TEST(Tensor, BadShapesAreRejected) {
  EXPECT_THROW(Tensor(DType::kFloat32, {2, -1}), std::invalid_argument);
  EXPECT_EQ(Tensor(DType::kFloat32, {0, 7}).numel(), 0);
  EXPECT_EQ(shape_to_string({1, 3, 64}), "[1, 3, 64]");
}

}  // namespace
}  // namespace qeval
