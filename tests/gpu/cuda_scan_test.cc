// Activation statistics of device values (eval/exec/device_scan.h, kernels/cuda/scan.h) against
// the host's pass over the same values: counts, clipping, absmax and the (sampled) histogram
// exactly, moments and error energies to ~1e-7 (another summation order); the same totals on
// every run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "eval/exec/device_scan.h"
#include "gpu_test_util.h"
#include "metrics/scan_totals.h"

namespace qeval::eval {
namespace {

Tensor values(std::int64_t n, std::uint32_t seed, bool odd) {
  Tensor t = gpu_test::normal({n}, seed, 2.0f);
  float* x = t.data<float>();
  if (odd && n > 100) {
    x[3] = std::numeric_limits<float>::quiet_NaN();
    x[50] = std::numeric_limits<float>::infinity();
    x[51] = -std::numeric_limits<float>::infinity();
    x[77] = 3e19f;   // beyond 2^60: not plain
    x[78] = 1e-40f;  // denormal
  }
  return t;
}

void expect_same(const metrics::ActivationStats& dev, const metrics::ActivationStats& host) {
  EXPECT_EQ(dev.count, host.count);
  EXPECT_EQ(dev.nan, host.nan);
  EXPECT_EQ(dev.inf, host.inf);
  EXPECT_EQ(dev.clipped, host.clipped);
  EXPECT_EQ(dev.absmax, host.absmax);
  EXPECT_TRUE(dev.abs_hist == host.abs_hist);
  EXPECT_NEAR(dev.sum.value(), host.sum.value(), 1e-6 * std::max(1.0, host.sum_sq.value()));
  EXPECT_NEAR(dev.sum_sq.value(), host.sum_sq.value(), 1e-6 * host.sum_sq.value());
}

TEST(CudaScan, StatisticsOfDeviceValuesAreTheHostPasses) {
  QEVAL_CUDA_OR_SKIP(cuda);
  const auto memory = cuda->memory();
  for (const std::int64_t n : {std::int64_t(1), std::int64_t(300), std::int64_t(8191), std::int64_t(8192),
                               std::int64_t(100003), std::int64_t(3) << 20}) {
    for (const bool odd : {false, true}) {
      SCOPED_TRACE(testing::Message() << n << (odd ? " with NaN/Inf/huge" : ""));
      const Tensor x = values(n, std::uint32_t(n), odd);
      const Tensor dx = x.to_device(memory);
      kernels::ScanTotals t, again;
      ASSERT_TRUE(scan_on_device(dx, nullptr, 2.5f, t));
      ASSERT_TRUE(scan_on_device(dx, nullptr, 2.5f, again));
      EXPECT_EQ(std::memcmp(&t, &again, sizeof t), 0) << "not deterministic";
      metrics::ActivationStats host, dev;
      const std::optional<double> e1 = host.add(x.data<float>(), n, 2.5f);
      const std::optional<double> e2 = metrics::add_scan(dev, t);
      expect_same(dev, host);
      ASSERT_EQ(e1.has_value(), e2.has_value());
      if (e1) {
        EXPECT_NEAR(*e2, *e1, 1e-6 * *e1);
      }
    }
  }
  // A host tensor is not the device's to scan.
  kernels::ScanTotals t;
  EXPECT_FALSE(scan_on_device(values(10, 1, false), nullptr, 1.0f, t));
}

TEST(CudaScan, ErrorOfDeviceValuesAgainstTheReferenceIsTheHostPasses) {
  QEVAL_CUDA_OR_SKIP(cuda);
  const auto memory = cuda->memory();
  const std::int64_t n = (std::int64_t(1) << 20) + 77;
  const Tensor ref = values(n, 5, false);
  Tensor test = ref;
  const Tensor noise = gpu_test::normal({n}, 6, 0.01f);
  for (std::int64_t i = 0; i < n; ++i) test.data<float>()[i] += noise.data<float>()[i];
  metrics::ActivationStats ra, ha, da;
  const double energy = *ra.add(ref.data<float>(), n);
  metrics::ErrorStats he, de;
  const metrics::TensorError h =
      metrics::add_with_error(ha, he, test.data<float>(), ref.data<float>(), energy, n, 1.0f);
  kernels::ScanTotals t;
  const Tensor dtest = test.to_device(memory), dref = ref.to_device(memory);
  ASSERT_TRUE(scan_on_device(dtest, &dref, 1.0f, t));
  const metrics::TensorError d = metrics::add_scan_with_error(da, de, t, energy, n);
  expect_same(da, ha);
  EXPECT_EQ(d.count, h.count);
  EXPECT_NEAR(d.sum_err_sq, h.sum_err_sq, 1e-5 * h.sum_err_sq);
  EXPECT_NEAR(*d.sqnr_db, *h.sqnr_db, 1e-4);
  EXPECT_NEAR(d.max_abs, h.max_abs, 1e-6 * h.max_abs);
}

}  // namespace
}  // namespace qeval::eval
