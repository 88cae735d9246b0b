// Tensor error metrics with double accumulation in independent lanes (vectorisable, order-fixed).
#include "metrics/tensor_error.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace qeval::metrics {

double sum_squared_difference(const float* a, const float* b, std::int64_t n) {
  constexpr int kLanes = 8;
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

// Sixteen double lanes as GCC vectors (two of eight): element i of a 16-element chunk goes to lane
// i % 16, as in the scalar path, so results do not depend on the vector width. The lanes are local
// variables the compiler keeps in registers (a lambda capturing them would keep them in memory).
typedef float F8 __attribute__((vector_size(32)));
typedef std::uint32_t U8 __attribute__((vector_size(32)));
typedef double D8 __attribute__((vector_size(64)));

namespace {

constexpr int kLanes = 16;

struct Moments {
  double ee[kLanes] = {}, rr[kLanes] = {}, tt[kLanes] = {}, rt[kLanes] = {}, mx[kLanes] = {};
};

// Elements [i0, i0 + m) one by one (a chunk with a NaN/Inf, or the tail), lane l = element i0 + l.
void add_checked(const float* ref, const float* test, std::int64_t i0, int m, Moments& s, TensorError& e) {
  for (int l = 0; l < m; ++l) {
    const std::int64_t i = i0 + l;
    const bool rf = std::isfinite(ref[i]), tf = std::isfinite(test[i]);
    if (rf && tf) {
      const double r = ref[i], t = test[i], d = r - t;
      s.ee[l] += d * d;
      s.rr[l] += r * r;
      s.tt[l] += t * t;
      s.rt[l] += r * t;
      s.mx[l] = std::max(s.mx[l], std::abs(d));
      ++e.count;
      continue;
    }
    e.nonfinite_ref += !rf;
    e.nonfinite_test += !tf;
    e.diverged += rf && !tf;
    if (e.first_nonfinite < 0) e.first_nonfinite = i;
  }
}

bool all_finite(const float* ref, const float* test) {
  U8 a0, a1, b0, b1;
  std::memcpy(&a0, ref, sizeof a0);
  std::memcpy(&a1, ref + 8, sizeof a1);
  std::memcpy(&b0, test, sizeof b0);
  std::memcpy(&b1, test + 8, sizeof b1);
  constexpr std::uint32_t kAbs = 0x7fffffffu, kInf = 0x7f800000u;
  const U8 bad = ((a0 & kAbs) >= kInf) | ((a1 & kAbs) >= kInf) | ((b0 & kAbs) >= kInf) | ((b1 & kAbs) >= kInf);
  std::uint64_t w[4];
  std::memcpy(w, &bad, sizeof w);
  return !(w[0] | w[1] | w[2] | w[3]);
}

inline void add8(const float* ref, const float* test, D8& ee, D8& rr, D8& tt, D8& rt, D8& mx) {
  F8 a, b;
  std::memcpy(&a, ref, sizeof a);
  std::memcpy(&b, test, sizeof b);
  const D8 r = __builtin_convertvector(a, D8), t = __builtin_convertvector(b, D8);
  const D8 d = r - t;
  ee += d * d;
  rr += r * r;
  tt += t * t;
  rt += r * t;
  const D8 ad = d < 0 ? -d : d;
  mx = mx > ad ? mx : ad;
}

void store(Moments& s, int k, const D8& lo, const D8& hi) {
  double* dst[] = {s.ee, s.rr, s.tt, s.rt, s.mx};
  std::memcpy(dst[k], &lo, sizeof lo);
  std::memcpy(dst[k] + 8, &hi, sizeof hi);
}

void load(const Moments& s, int k, D8& lo, D8& hi) {
  const double* src[] = {s.ee, s.rr, s.tt, s.rt, s.mx};
  std::memcpy(&lo, src[k], sizeof lo);
  std::memcpy(&hi, src[k] + 8, sizeof hi);
}

}  // namespace

TensorError tensor_error(const float* ref, const float* test, std::int64_t n) {
  TensorError e;
  Moments s;
  D8 ee0 = {}, ee1 = {}, rr0 = {}, rr1 = {}, tt0 = {}, tt1 = {}, rt0 = {}, rt1 = {}, mx0 = {}, mx1 = {};
  std::int64_t i = 0, clean = 0;
  for (; i + kLanes <= n; i += kLanes) {
    if (all_finite(ref + i, test + i)) [[likely]] {
      add8(ref + i, test + i, ee0, rr0, tt0, rt0, mx0);
      add8(ref + i + 8, test + i + 8, ee1, rr1, tt1, rt1, mx1);
      clean += kLanes;
      continue;
    }
    // A chunk with a NaN/Inf (rare): through memory, element by element.
    store(s, 0, ee0, ee1), store(s, 1, rr0, rr1), store(s, 2, tt0, tt1), store(s, 3, rt0, rt1), store(s, 4, mx0, mx1);
    add_checked(ref, test, i, kLanes, s, e);
    load(s, 0, ee0, ee1), load(s, 1, rr0, rr1), load(s, 2, tt0, tt1), load(s, 3, rt0, rt1), load(s, 4, mx0, mx1);
  }
  store(s, 0, ee0, ee1), store(s, 1, rr0, rr1), store(s, 2, tt0, tt1), store(s, 3, rt0, rt1), store(s, 4, mx0, mx1);
  if (i < n) add_checked(ref, test, i, int(n - i), s, e);
  e.count += clean;
  double sum_ee = 0, sum_rr = 0, sum_tt = 0, sum_rt = 0;
  for (int l = 0; l < kLanes; ++l) {
    sum_ee += s.ee[l];
    sum_rr += s.rr[l];
    sum_tt += s.tt[l];
    sum_rt += s.rt[l];
    e.max_abs = std::max(e.max_abs, s.mx[l]);
  }
  // The ratios from the energies; the cosine from the dot product (exact in each lane here).
  TensorError r = error_from_energies(e.count, sum_rr, sum_tt, sum_ee, e.max_abs);
  r.nonfinite_ref = e.nonfinite_ref;
  r.nonfinite_test = e.nonfinite_test;
  r.first_nonfinite = e.first_nonfinite;
  if (r.count > 0 && sum_rr > 0 && sum_tt > 0) r.cosine = sum_rt / (std::sqrt(sum_rr) * std::sqrt(sum_tt));
  if (e.diverged) set_diverged(r, e.diverged);
  return r;
}

void set_diverged(TensorError& e, std::int64_t elements) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  e.diverged = elements;
  e.mse = e.max_abs = kInf;
  e.sqnr_db = -kInf;
  e.rel_l2 = kInf;
  e.cosine.reset();
}

TensorError error_from_energies(std::int64_t count, double ref_sq, double test_sq, double err_sq, double max_abs) {
  TensorError e;
  e.count = count;
  e.max_abs = max_abs;
  e.sum_ref_sq = ref_sq;
  e.sum_err_sq = err_sq;
  if (count == 0) return e;
  e.mse = err_sq / double(count);
  if (err_sq > 0 && ref_sq > 0) e.sqnr_db = 10.0 * std::log10(ref_sq / err_sq);
  if (ref_sq > 0) e.rel_l2 = std::sqrt(err_sq / ref_sq);
  if (ref_sq > 0 && test_sq > 0)
    e.cosine = std::clamp((ref_sq + test_sq - err_sq) / (2.0 * std::sqrt(ref_sq) * std::sqrt(test_sq)), -1.0, 1.0);
  else if (ref_sq == 0 && test_sq == 0) e.cosine = 1.0;
  return e;
}

TensorError tensor_error(const Tensor& ref, const Tensor& test) {
  if (ref.shape() != test.shape())
    throw std::invalid_argument("tensor_error: shapes differ: reference " + shape_to_string(ref.shape()) + " vs test " +
                                shape_to_string(test.shape()));
  return tensor_error(ref.data<float>(), test.data<float>(), ref.numel());
}

}  // namespace qeval::metrics
