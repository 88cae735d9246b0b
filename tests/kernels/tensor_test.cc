// Tensor basics: shapes, typed access, copies, reshape.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

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

// Memory a test lends tensors: 64-byte aligned floats, and how often its pages were let go.
class LentFloats final : public BorrowedMemory {
 public:
  explicit LentFloats(std::vector<float> values) : bytes_(values.size() * sizeof(float) + 64) {
    data_ = reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(bytes_.data()) + 63) / 64 * 64);
    std::memcpy(data_, values.data(), values.size() * sizeof(float));
  }
  const std::byte* data() const { return reinterpret_cast<const std::byte*>(data_); }
  void release_pages(const std::byte* p, std::size_t bytes) const noexcept override {
    ++released;
    released_bytes += p == data() ? bytes : 0;
  }
  mutable int released = 0;
  mutable std::size_t released_bytes = 0;

 private:
  std::vector<std::byte> bytes_;
  float* data_;
};

TEST(Tensor, ABorrowedTensorSharesItsMemoryUntilWrittenThenOwnsACopy) {
  auto lent = std::make_shared<LentFloats>(std::vector<float>{1, 2, 3, 4, 5, 6});
  const Tensor a = Tensor::borrowed(DType::kFloat32, {2, 3}, lent->data(), lent);
  EXPECT_TRUE(a.is_borrowed());
  EXPECT_EQ(a.capacity(), 0u);
  EXPECT_EQ(a.raw(), lent->data());  // no copy: the lent bytes themselves
  EXPECT_EQ(a.data<float>()[4], 5.0f);
  Tensor b = a;  // copies share the memory too
  EXPECT_EQ(std::as_const(b).raw(), lent->data());
  EXPECT_FALSE(b.reuse_as(DType::kFloat32, {3}));  // never a pool's buffer
  const Tensor r = a.reshaped({3, 2});
  EXPECT_EQ(r.raw(), lent->data());
  // Writing goes to a copy of its own; the lent memory and the other tensors keep their values.
  b.data<float>()[4] = 50.0f;
  EXPECT_FALSE(b.is_borrowed());
  EXPECT_NE(std::as_const(b).raw(), lent->data());
  EXPECT_EQ(b.capacity(), b.nbytes());
  EXPECT_EQ(b.data<float>()[0], 1.0f);
  EXPECT_EQ(b.data<float>()[4], 50.0f);
  EXPECT_EQ(a.data<float>()[4], 5.0f);
  EXPECT_EQ(reinterpret_cast<const float*>(lent->data())[4], 5.0f);
  // Moves carry the borrow; the lender lives as long as a tensor reads it.
  Tensor moved = std::move(b = a);
  EXPECT_TRUE(moved.is_borrowed());
  EXPECT_EQ(std::as_const(moved).raw(), lent->data());
  std::weak_ptr<LentFloats> alive = lent;
  lent.reset();
  EXPECT_FALSE(alive.expired());
}

TEST(Tensor, ReleasingPagesReachesTheLenderOnlyForABorrowedTensor) {
  auto lent = std::make_shared<LentFloats>(std::vector<float>(32, 1.0f));
  const Tensor a = Tensor::borrowed(DType::kFloat32, {32}, lent->data(), lent);
  a.release_pages();
  EXPECT_EQ(lent->released, 1);
  EXPECT_EQ(lent->released_bytes, 128u);
  Tensor own(DType::kFloat32, {32});
  own.release_pages();  // nothing to give back
  Tensor copy = a;
  copy.raw();  // now its own
  copy.release_pages();
  EXPECT_EQ(lent->released, 1);
  EXPECT_THROW(Tensor::borrowed(DType::kFloat32, {1}, lent->data() + 4, lent), std::invalid_argument);  // unaligned
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
