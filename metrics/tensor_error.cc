// Tensor error metrics with double accumulation in independent lanes (vectorisable, order-fixed).
#include "metrics/tensor_error.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace qeval::metrics {

namespace {
constexpr int kLanes = 8;
}

double sum_squared_difference(const float* a, const float* b, std::int64_t n) {
  double acc[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      double d = double(a[i + l]) - double(b[i + l]);
      acc[l] += d * d;
    }
  }
  double total = 0;
  for (; i < n; ++i) {
    double d = double(a[i]) - double(b[i]);
    total += d * d;
  }
  for (double v : acc) total += v;
  return total;
}

// Eight lanes as GCC vectors (AVX-512 here): element i of a chunk goes to lane i % 8, as in the
// scalar tail, so results do not depend on the vector width.
typedef float F8 __attribute__((vector_size(32)));
typedef std::uint32_t U8 __attribute__((vector_size(32)));
typedef double D8 __attribute__((vector_size(64)));

TensorError tensor_error(const float* ref, const float* test, std::int64_t n) {
  TensorError e;
  // Moments in double lanes; a chunk is processed without branches when it is all finite.
  D8 see = {}, srr = {}, stt = {}, srt = {}, mx = {};
  auto add = [&](int l, double r, double t) {
    double d = r - t;
    see[l] += d * d;
    srr[l] += r * r;
    stt[l] += t * t;
    srt[l] += r * t;
    mx[l] = std::max(mx[l], std::abs(d));
  };
  auto add_checked = [&](int l, std::int64_t i) {
    bool rf = std::isfinite(ref[i]), tf = std::isfinite(test[i]);
    if (rf && tf) {
      add(l, ref[i], test[i]);
      ++e.count;
      return;
    }
    e.nonfinite_ref += !rf;
    e.nonfinite_test += !tf;
    if (e.first_nonfinite < 0) e.first_nonfinite = i;
  };
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    F8 a, b;
    std::memcpy(&a, ref + i, sizeof a);
    std::memcpy(&b, test + i, sizeof b);
    U8 ua, ub;
    std::memcpy(&ua, &a, sizeof ua);
    std::memcpy(&ub, &b, sizeof ub);
    const U8 nonfinite = ((ua & 0x7fffffffu) >= 0x7f800000u) | ((ub & 0x7fffffffu) >= 0x7f800000u);
    std::uint64_t any[4];
    std::memcpy(any, &nonfinite, sizeof any);
    if (any[0] | any[1] | any[2] | any[3]) {
      for (int l = 0; l < kLanes; ++l) add_checked(l, i + l);
      continue;
    }
    const D8 r = __builtin_convertvector(a, D8), t = __builtin_convertvector(b, D8);
    const D8 d = r - t;
    see += d * d;
    srr += r * r;
    stt += t * t;
    srt += r * t;
    const D8 ad = d < 0 ? -d : d;
    mx = mx > ad ? mx : ad;
    e.count += kLanes;
  }
  for (; i < n; ++i) add_checked(0, i);

  double sum_ee = 0, sum_rr = 0, sum_tt = 0, sum_rt = 0;
  for (int l = 0; l < kLanes; ++l) {
    sum_ee += see[l];
    sum_rr += srr[l];
    sum_tt += stt[l];
    sum_rt += srt[l];
    e.max_abs = std::max(e.max_abs, mx[l]);
  }
  e.sum_ref_sq = sum_rr;
  e.sum_err_sq = sum_ee;
  if (e.count == 0) return e;
  e.mse = sum_ee / double(e.count);
  if (sum_ee > 0 && sum_rr > 0) e.sqnr_db = 10.0 * std::log10(sum_rr / sum_ee);
  if (sum_rr > 0) e.rel_l2 = std::sqrt(sum_ee / sum_rr);
  if (sum_rr > 0 && sum_tt > 0)
    e.cosine = sum_rt / (std::sqrt(sum_rr) * std::sqrt(sum_tt));
  else if (sum_rr == 0 && sum_tt == 0)
    e.cosine = 1.0;
  return e;
}

TensorError tensor_error(const Tensor& ref, const Tensor& test) {
  if (ref.shape() != test.shape())
    throw std::invalid_argument("tensor_error: shapes differ: reference " +
                                shape_to_string(ref.shape()) + " vs test " +
                                shape_to_string(test.shape()));
  return tensor_error(ref.data<float>(), test.data<float>(), ref.numel());
}

}  // namespace qeval::metrics
