// Nearest-neighbour resize (kernels::resize_nearest, a gather) against a naive gather over the
// same per-axis filters: upsampling by 2, 4 and 8 (each element repeated), rows that repeat the
// row above, other scales, shrinking, crop-and-resize with extrapolation; 1- and 4-byte elements,
// 1 to 4 dimensions, 1 and 2 threads.
#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/resize.h"

namespace qeval::kernels {
namespace {

template <class U>
std::vector<U> naive(const std::vector<U>& x, const std::vector<ResizeAxis>& axes, const ResizeOptions& o, U fill) {
  std::vector<AxisFilter> f;
  std::int64_t n = 1;
  for (const auto& a : axes) f.push_back(resize_filter(a, o)), n *= a.out;
  std::vector<U> y(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t rem = i, src = 0, stride = 1;
    bool outside = false;
    for (int d = int(axes.size()) - 1; d >= 0; --d) {
      const std::int64_t od = rem % axes[std::size_t(d)].out;
      rem /= axes[std::size_t(d)].out;
      outside |= f[std::size_t(d)].extrapolate[std::size_t(od)] != 0;
      src += f[std::size_t(d)].index[std::size_t(od)] * stride;
      stride *= axes[std::size_t(d)].in;
    }
    y[std::size_t(i)] = outside ? fill : x[std::size_t(src)];
  }
  return y;
}

template <class U>
void check(const std::vector<ResizeAxis>& axes, const ResizeOptions& o, unsigned seed) {
  std::int64_t in = 1, out = 1;
  for (const auto& a : axes) in *= a.in, out *= a.out;
  std::mt19937 rng(seed);
  std::vector<U> x(static_cast<std::size_t>(in));
  for (auto& v : x) v = U(rng());
  const U fill = U(0x5a);
  const std::vector<U> want = naive(x, axes, o, fill);
  for (int threads : {1, 2}) {
    std::vector<U> got(static_cast<std::size_t>(out), U(0x33));
    tbb::task_arena(threads).execute([&] {
      resize_nearest(reinterpret_cast<const std::byte*>(x.data()), reinterpret_cast<std::byte*>(got.data()), sizeof(U),
                     axes, o, reinterpret_cast<const std::byte*>(&fill));
    });
    ASSERT_EQ(got, want) << sizeof(U) << "-byte elements, " << threads << " threads";
  }
}

ResizeAxis axis(std::int64_t in, std::int64_t out) {
  ResizeAxis a;
  a.in = in;
  a.out = out;
  a.scale = double(out) / double(in);
  return a;
}

TEST(ResizeNearest, FastPathsGiveTheNaiveGather) {
  ResizeOptions asym;
  asym.coordinates = ResizeCoordinates::kAsymmetric;
  asym.nearest = NearestRounding::kFloor;  // PP-OCR's upsampling: each element repeated
  ResizeOptions half;                      // half pixel, round prefer floor: 2x repeats as well
  ResizeOptions crop;
  crop.coordinates = ResizeCoordinates::kTfCropAndResize;
  crop.extrapolation_value = 90;
  unsigned seed = 1;
  for (const ResizeOptions& o : {asym, half}) {
    for (std::int64_t f : {2, 4, 8, 3})
      for (std::int64_t w : {1, 5, 40}) {
        check<float>({axis(2, 2), axis(3, 3 * f), axis(w, w * f)}, o, seed);
        check<std::uint8_t>({axis(3, 3 * f), axis(w, w * f)}, o, seed++);
      }
    check<float>({axis(2, 3), axis(7, 20), axis(9, 13)}, o, seed++);               // non-integer scales
    check<float>({axis(1, 1), axis(4, 4), axis(30, 11), axis(25, 8)}, o, seed++);  // shrinking
    check<std::uint8_t>({axis(17, 17)}, o, seed++);
  }
  std::vector<ResizeAxis> cropped = {axis(3, 7), axis(6, 12)};
  cropped[0].roi_start = -0.2, cropped[0].roi_end = 1.3;  // rows outside the input: extrapolated
  cropped[1].roi_start = 0.1, cropped[1].roi_end = 1.4;   // columns outside too
  check<float>(cropped, crop, seed++);
  check<std::uint8_t>(cropped, crop, seed++);
}

}  // namespace
}  // namespace qeval::kernels
