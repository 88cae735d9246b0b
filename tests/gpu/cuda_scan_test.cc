// Activation statistics of device values (eval/exec/device_scan.h, kernels/cuda/scan.h) against
// the host's pass over the same values: counts, clipping, absmax and the (sampled) histogram
// exactly, moments and error energies to ~1e-7 (another summation order); the same totals on
// every run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "eval/exec/device_scan.h"
#include "gpu_test_util.h"
#include "metrics/scan_totals.h"
#include "metrics/tensor_error.h"

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
      EXPECT_EQ(t.first_nonfinite, odd && n > 100 ? 3 : -1);
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
  EXPECT_NEAR(t.ref_sq, energy, 1e-6 * energy);

  // A test tensor gone non-finite: error_from_scan gives what tensor_error gives over both tensors.
  test.data<float>()[1000] = std::numeric_limits<float>::quiet_NaN();
  test.data<float>()[n - 1] = std::numeric_limits<float>::infinity();
  test.data<float>()[77] = -std::numeric_limits<float>::infinity();
  ASSERT_TRUE(scan_on_device(test.to_device(memory), &dref, 1.0f, t));
  const metrics::TensorError hd = metrics::tensor_error(ref.data<float>(), test.data<float>(), n);
  const metrics::TensorError dd = metrics::error_from_scan(t);
  EXPECT_EQ(hd.diverged, 3);
  EXPECT_EQ(dd.diverged, hd.diverged);
  EXPECT_EQ(dd.count, hd.count);
  EXPECT_EQ(dd.nonfinite_ref, hd.nonfinite_ref);
  EXPECT_EQ(dd.nonfinite_test, hd.nonfinite_test);
  EXPECT_EQ(dd.first_nonfinite, 77);
  EXPECT_EQ(dd.first_nonfinite, hd.first_nonfinite);
  EXPECT_EQ(dd.sqnr_db, hd.sqnr_db);  // -inf
  EXPECT_EQ(dd.max_abs, hd.max_abs);  // inf
  EXPECT_EQ(dd.cosine.has_value(), hd.cosine.has_value());
  EXPECT_NEAR(dd.sum_ref_sq, hd.sum_ref_sq, 1e-6 * hd.sum_ref_sq);
  EXPECT_NEAR(dd.sum_err_sq, hd.sum_err_sq, 1e-5 * hd.sum_err_sq);
}

// SmoothQuant's per-channel clip thresholds (the observer's clip rate behind a pre-scale Mul):
// counted by the device scan, element by element against its channel's threshold, exactly the
// host's ActivationStats::add_clipped; the other totals as without thresholds. Thresholds of the
// wrong length or in host memory are refused.
TEST(CudaScan, PerChannelClippingCountsWhatTheHostCounts) {
  QEVAL_CUDA_OR_SKIP(cuda);
  const auto memory = cuda->memory();
  for (const auto& [rows, channels] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {37, 7}, {4096, 320},
                                       {2, 1280}}) {
    SCOPED_TRACE(testing::Message() << rows << " x " << channels);
    Tensor x = gpu_test::normal({rows, channels}, std::uint32_t(rows + channels), 2.0f);
    if (x.numel() > 100) {
      x.data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
      x.data<float>()[50] = std::numeric_limits<float>::infinity();
    }
    std::vector<float> thresholds(static_cast<std::size_t>(channels));
    for (std::size_t c = 0; c < thresholds.size(); ++c)
      thresholds[c] = c % 5 == 4 ? std::numeric_limits<float>::infinity() : 0.5f + 0.25f * float(c % 9);
    Tensor th(DType::kFloat32, {channels});
    std::copy(thresholds.begin(), thresholds.end(), th.data<float>());
    const Tensor dx = x.to_device(memory), dth = th.to_device(memory);
    kernels::ScanTotals per, plain;
    ASSERT_TRUE(scan_on_device(dx, nullptr, 1.0f, per, &dth));
    ASSERT_TRUE(scan_on_device(dx, nullptr, std::numeric_limits<float>::infinity(), plain));
    metrics::ActivationStats host;
    host.add_clipped(x.data<float>(), x.numel(), std::span<const float>(thresholds));
    EXPECT_EQ(per.clipped, host.clipped);
    EXPECT_GT(per.clipped, 0u);
    const std::unique_ptr<ScanQueue> queue = make_scan_queue(memory);
    ASSERT_TRUE(queue->add(dx, nullptr, 1.0f, &dth));
    std::vector<kernels::ScanTotals> queued;
    queue->take(queued);
    ASSERT_EQ(queued.size(), 1u);
    EXPECT_EQ(std::memcmp(&queued[0], &per, sizeof per), 0) << "queued, not the scan made alone";
    plain.clipped = per.clipped;
    EXPECT_EQ(std::memcmp(&per, &plain, sizeof per), 0) << "the other totals changed";
    const Tensor longer = Tensor(DType::kFloat32, {channels + 1}).to_device(memory);
    EXPECT_FALSE(scan_on_device(dx, nullptr, 1.0f, per, &longer));
    EXPECT_FALSE(scan_on_device(dx, nullptr, 1.0f, per, &th)) << "host thresholds";
  }
}

// Scans queued and read back together (ScanQueue, what local error uses): each the totals of the
// same scan made alone, in the order queued, over more scans than one pinned chunk holds; values
// reused by later device work once queued are scanned as they were.
TEST(CudaScan, QueuedScansGiveTheTotalsOfScansMadeAlone) {
  QEVAL_CUDA_OR_SKIP(cuda);
  const auto memory = cuda->memory();
  std::unique_ptr<ScanQueue> queue = make_scan_queue(memory);
  ASSERT_NE(queue, nullptr);
  EXPECT_FALSE(queue->add(values(10, 1, false), nullptr, 1.0f, nullptr)) << "a host tensor";
  const std::int64_t sizes[] = {1, 300, 8192, 100003};
  std::vector<kernels::ScanTotals> alone;
  Tensor buffer(DType::kFloat32, {100003}, memory);  // overwritten (asynchronously) after each scan queued
  const Tensor junk = values(100003, 12345, false).to_device(memory);
  const Tensor ref = values(100003, 99, false).to_device(memory);
  for (int k = 0; k < 300; ++k) {
    const std::int64_t n = sizes[k % 4];
    const bool odd = k % 3 == 0;
    Tensor x = values(n, std::uint32_t(k), odd);
    Tensor dx = x.to_device(memory);
    const Tensor* against = n == 100003 && !odd ? &ref : nullptr;
    kernels::ScanTotals t;
    ASSERT_TRUE(scan_on_device(dx, against, 2.0f, t));
    alone.push_back(t);
    if (n == 100003) {  // queued on a buffer the next upload overwrites
      memory->copy(buffer.device_data(), dx.device_data(), dx.nbytes());
      ASSERT_TRUE(queue->add(buffer, against, 2.0f, nullptr));
      memory->copy(buffer.device_data(), junk.device_data(), junk.nbytes());
    } else {
      ASSERT_TRUE(queue->add(dx, against, 2.0f, nullptr));
    }
  }
  EXPECT_EQ(queue->size(), 300u);
  std::vector<kernels::ScanTotals> got;
  queue->take(got);
  EXPECT_EQ(queue->size(), 0u);
  ASSERT_EQ(got.size(), alone.size());
  for (std::size_t k = 0; k < got.size(); ++k)
    EXPECT_EQ(std::memcmp(&got[k], &alone[k], sizeof got[k]), 0) << "scan " << k;
}

// Calibration's per-channel ranges (eval/quant/calibrate.cc on a device): the largest finite |x|
// of each channel folded into a device buffer over several tensors, exactly the host's maxima.
TEST(CudaScan, ChannelAmaxFoldsEachChannelsLargestFiniteMagnitude) {
  QEVAL_CUDA_OR_SKIP(cuda);
  const auto memory = cuda->memory();
  for (const auto& [rows, channels] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {7, 333}, {9000, 320},
                                       {70000, 40}, {4096, 1280}}) {
    SCOPED_TRACE(testing::Message() << rows << " x " << channels);
    std::vector<float> want(std::size_t(channels), 0.0f);
    Tensor amax = Tensor(DType::kFloat32, {channels}).to_device(memory);
    for (std::uint32_t call = 0; call < 3; ++call) {
      Tensor x = gpu_test::normal({rows, channels}, std::uint32_t(rows * 31 + channels + call), 1.0f + float(call));
      float* v = x.data<float>();
      if (x.numel() > 100) {
        v[5] = std::numeric_limits<float>::quiet_NaN();
        v[17] = -std::numeric_limits<float>::infinity();
      }
      for (std::int64_t k = 0; k < x.numel(); ++k) {
        const float a = std::fabs(v[k]);
        float& m = want[std::size_t(k % channels)];
        if (std::isfinite(a) && a > m) m = a;
      }
      const Tensor dx = x.to_device(memory);
      ASSERT_TRUE(channel_amax_on_device(dx, amax));
    }
    const Tensor got = amax.to_host();
    for (std::int64_t c = 0; c < channels; ++c) ASSERT_EQ(got.data<float>()[c], want[std::size_t(c)]) << c;
    Tensor wrong = Tensor(DType::kFloat32, {channels + 1}).to_device(memory);
    EXPECT_FALSE(channel_amax_on_device(Tensor(DType::kFloat32, {rows, channels}).to_device(memory), wrong));
  }
}

}  // namespace
}  // namespace qeval::eval
