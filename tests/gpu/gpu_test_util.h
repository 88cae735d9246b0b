// What the GPU tests share: the CUDA backend of cuda:0 or the reason there is none (the tests skip,
// saying it), and float comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "eval/exec/cuda/cuda_backend.h"
#include "kernels/error.h"
#include "kernels/tensor.h"

namespace qeval::eval::gpu_test {

// The backend of cuda:0, or null with the reason there is none.
inline std::shared_ptr<Backend> cuda_or_reason(std::string& why) {
  try {
    return make_cuda_backend(0);
  } catch (const InputError& e) {
    why = e.what();
    return nullptr;
  }
}

// Relative L2 of `got` against `want` (float16/bfloat16 widened); NaN where the other is not: inf.
inline double rel_l2(const Tensor& want, const Tensor& got) {
  if (want.shape() != got.shape()) return INFINITY;
  const Tensor w = widened_to_float32(want), g = widened_to_float32(got);
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < w.numel(); ++i) {
    const double a = w.data<float>()[i], b = g.data<float>()[i];
    if (std::isnan(a) != std::isnan(b)) return INFINITY;
    if (std::isnan(a)) continue;
    num += (a - b) * (a - b);
    den += a * a;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Normally distributed float32 values (seeded).
inline Tensor normal(const Shape& shape, std::uint32_t seed, float scale = 1.0f) {
  Tensor t(DType::kFloat32, shape);
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  for (float& x : t.span<float>()) x = d(rng);
  return t;
}

}  // namespace qeval::eval::gpu_test

// Declares `var`, the backend of cuda:0, or skips the test saying why there is none.
#define QEVAL_CUDA_OR_SKIP(var)                                                  \
  std::string var##_why;                                                         \
  std::shared_ptr<Backend> var = ::qeval::eval::gpu_test::cuda_or_reason(var##_why); \
  if (!var) GTEST_SKIP() << "no CUDA device: " << var##_why;
