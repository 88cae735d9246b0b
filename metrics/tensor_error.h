// Tensor error metrics between a reference and a test tensor: MSE, SQNR, cosine, max-abs, relative L2.
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/tensor.h"

namespace qeval::metrics {

// Sum of (a[i] - b[i])^2 in double (each difference is exact in double for float inputs).
double sum_squared_difference(const float* a, const float* b, std::int64_t n);

struct TensorError {
  std::int64_t count = 0;             // elements compared (all, when both are finite everywhere)
  std::int64_t nonfinite_ref = 0;     // NaN/Inf elements in the reference
  std::int64_t nonfinite_test = 0;    // NaN/Inf elements in the test tensor
  std::int64_t first_nonfinite = -1;  // flat index of the first element where either is not finite
  // Elements where the reference is finite and the test is not: the test diverged. Then the error
  // is unbounded and every statistic says so: mse, max_abs and rel_l2 +inf, sqnr_db -inf, cosine
  // nullopt (undefined), never a score over the elements that happened to stay finite.
  std::int64_t diverged = 0;
  double mse = 0;
  double max_abs = 0;
  // The energies behind the ratios (over compared elements), for pooling over many tensors.
  double sum_ref_sq = 0, sum_err_sq = 0;
  // 10 log10(sum ref^2 / sum (ref - test)^2); nullopt when the error is zero (identical) or the
  // reference is all zeros with a non-zero error (reported as -inf is meaningless there).
  std::optional<double> sqnr_db;
  // <ref, test> / (|ref| |test|); 1 when both are all zeros, nullopt when exactly one is.
  std::optional<double> cosine;
  // |ref - test| / |ref|; nullopt when ref is all zeros.
  std::optional<double> rel_l2;
  bool identical() const { return count > 0 && mse == 0 && nonfinite_ref == 0 && nonfinite_test == 0; }
};

// Elements where either side is NaN/Inf are counted and excluded from the moments, so one NaN is
// located (first_nonfinite) instead of turning every statistic into NaN; where only the test is
// non-finite (`diverged`) the statistics are then made unbounded (see TensorError::diverged).
TensorError tensor_error(const float* ref, const float* test, std::int64_t n);
// The error of `count` compared pairs from their energies: sum ref^2, sum test^2, sum (ref - test)^2
// (cosine = (ref_sq + test_sq - err_sq) / (2 |ref| |test|), clamped to [-1, 1]).
TensorError error_from_energies(std::int64_t count, double ref_sq, double test_sq, double err_sq, double max_abs);
// Marks `e` as diverged on `elements` values (see TensorError::diverged).
void set_diverged(TensorError& e, std::int64_t elements);
// Same for two float32 tensors of the same shape; throws std::invalid_argument otherwise.
TensorError tensor_error(const Tensor& ref, const Tensor& test);

}  // namespace qeval::metrics
