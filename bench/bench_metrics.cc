// Image-metric benchmarks: qeval SSIM (fast and reference), the OpenCV SSIM peer, PSNR, MS-SSIM.
#include <benchmark/benchmark.h>
#include <opencv2/core.hpp>

#include <limits>
#include <map>
#include <random>
#include <vector>

#include "bench/opencv_ssim.h"
#include "metrics/activation_stats.h"
#include "metrics/ms_ssim.h"
#include "metrics/psnr.h"
#include "metrics/ssim.h"

namespace {

using namespace qeval;

// A photo-like 8-bit pair: smooth structure plus texture, and a mildly distorted copy.
struct Pair {
  Tensor ref, test;     // planar float [3, H, W]
  cv::Mat ref8, test8;  // interleaved 8-bit HWC, the same pixels
};

const Pair& pair_1024() {
  static const Pair pair = [] {
    const int h = 1024, w = 1024, c = 3;
    Pair p{Tensor(DType::kFloat32, {c, h, w}), Tensor(DType::kFloat32, {c, h, w}), cv::Mat(h, w, CV_8UC3),
           cv::Mat(h, w, CV_8UC3)};
    std::mt19937 rng(42);
    std::normal_distribution<float> n(0, 1);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int k = 0; k < c; ++k) {
          float base = 128 + 80 * std::sin(0.013f * x * (k + 1)) * std::cos(0.009f * y) + 8 * n(rng);
          float v = std::clamp(std::round(base), 0.0f, 255.0f);
          float t = std::clamp(std::round(v + 3 * n(rng)), 0.0f, 255.0f);
          p.ref.data<float>()[(std::size_t(k) * h + y) * w + x] = v;
          p.test.data<float>()[(std::size_t(k) * h + y) * w + x] = t;
          p.ref8.at<cv::Vec3b>(y, x)[k] = static_cast<uint8_t>(v);
          p.test8.at<cv::Vec3b>(y, x)[k] = static_cast<uint8_t>(t);
        }
    return p;
  }();
  return pair;
}

void BM_SsimWang_1024_rgb(benchmark::State& state) {
  const auto& p = pair_1024();
  for (auto _ : state) benchmark::DoNotOptimize(metrics::ssim(p.ref, p.test, metrics::SsimConvention::kWang, 255));
}
BENCHMARK(BM_SsimWang_1024_rgb)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_SsimWangReference_1024_rgb(benchmark::State& state) {
  const auto& p = pair_1024();
  for (auto _ : state)
    benchmark::DoNotOptimize(metrics::ssim_reference(p.ref, p.test, metrics::SsimConvention::kWang, 255));
}
BENCHMARK(BM_SsimWangReference_1024_rgb)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_OpenCvSsim_1024_rgb(benchmark::State& state) {
  const auto& p = pair_1024();
  for (auto _ : state) benchmark::DoNotOptimize(bench::opencv_ssim(p.ref8, p.test8));
}
BENCHMARK(BM_OpenCvSsim_1024_rgb)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_MsSsim_1024_rgb(benchmark::State& state) {
  const auto& p = pair_1024();
  for (auto _ : state) benchmark::DoNotOptimize(metrics::ms_ssim(p.ref, p.test, 255));
}
BENCHMARK(BM_MsSsim_1024_rgb)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Psnr_1024_rgb(benchmark::State& state) {
  const auto& p = pair_1024();
  for (auto _ : state) benchmark::DoNotOptimize(metrics::psnr(p.ref, p.test, 255));
  state.SetBytesProcessed(std::int64_t(state.iterations()) * 2 * p.ref.nbytes());
}
BENCHMARK(BM_Psnr_1024_rgb)->Unit(benchmark::kMillisecond)->UseRealTime();

// Memory-speed yardstick for PSNR: reading both planes once.
void BM_ReadBothBuffers_1024_rgb(benchmark::State& state) {
  const auto& p = pair_1024();
  for (auto _ : state) {
    const float* a = p.ref.data<float>();
    const float* b = p.test.data<float>();
    float acc[16] = {};
    for (std::int64_t i = 0; i + 16 <= p.ref.numel(); i += 16)
      for (int l = 0; l < 16; ++l) acc[l] += a[i + l] + b[i + l];
    benchmark::DoNotOptimize(acc);
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * 2 * p.ref.nbytes());
}
BENCHMARK(BM_ReadBothBuffers_1024_rgb)->Unit(benchmark::kMillisecond)->UseRealTime();

// The per-layer statistics `qeval run` takes of every node output: one activation tensor of
// range(0) elements (fp16-rounded values, as a variant's), its statistics alone (the reference's
// pass) and with its error against a nearby reference (a variant's pass), with a clip threshold or
// none (range(1)). Element rate in ns/elem
// = 1e9 / items_per_second; the yardstick reads both buffers once.
struct ActivationPair {
  std::vector<float> ref, test;
  double ref_sum_sq = 0;
};

const ActivationPair& activation_pair(std::int64_t n) {
  static std::map<std::int64_t, ActivationPair> pairs;
  auto [it, fresh] = pairs.try_emplace(n);
  if (fresh) {
    std::mt19937 rng(7);
    std::normal_distribution<float> g(0, 1);
    it->second.ref.resize(std::size_t(n));
    it->second.test.resize(std::size_t(n));
    for (std::int64_t i = 0; i < n; ++i) {
      const float r = g(rng) * (1 + float(i % 64) / 16);  // channels of different ranges
      it->second.ref[std::size_t(i)] = r;
      it->second.test[std::size_t(i)] = r + 0.01f * g(rng);
    }
    metrics::ActivationStats a;
    it->second.ref_sum_sq = *a.add(it->second.ref.data(), n);
  }
  return it->second;
}

// range(1): 1 = a clip threshold to count against (a quantized node's output), 0 = none.
float clip_of(const benchmark::State& state) { return state.range(1) ? 4.0f : std::numeric_limits<float>::infinity(); }

void BM_ActivationStats(benchmark::State& state) {
  const auto& p = activation_pair(state.range(0));
  metrics::ActivationStats a;
  for (auto _ : state) {
    a.clear();
    benchmark::DoNotOptimize(a.add(p.ref.data(), state.range(0), clip_of(state)));
  }
  state.SetItemsProcessed(std::int64_t(state.iterations()) * state.range(0));
}
BENCHMARK(BM_ActivationStats)->ArgsProduct({{4096, 16384, 65536, 262144}, {0, 1}});

void BM_ActivationStatsWithError(benchmark::State& state) {
  const auto& p = activation_pair(state.range(0));
  metrics::ActivationStats a;
  metrics::ErrorStats e;
  for (auto _ : state) {
    a.clear();
    e.clear();
    benchmark::DoNotOptimize(
        metrics::add_with_error(a, e, p.test.data(), p.ref.data(), p.ref_sum_sq, state.range(0), clip_of(state)));
  }
  state.SetItemsProcessed(std::int64_t(state.iterations()) * state.range(0));
}
BENCHMARK(BM_ActivationStatsWithError)->ArgsProduct({{4096, 16384, 65536, 262144}, {0, 1}});

void BM_ReadActivationPair(benchmark::State& state) {
  const auto& p = activation_pair(state.range(0));
  for (auto _ : state) {
    float acc[16] = {};
    for (std::int64_t i = 0; i + 16 <= state.range(0); i += 16)
      for (int l = 0; l < 16; ++l) acc[l] += p.ref[std::size_t(i + l)] + p.test[std::size_t(i + l)];
    benchmark::DoNotOptimize(acc);
  }
  state.SetItemsProcessed(std::int64_t(state.iterations()) * state.range(0));
}
BENCHMARK(BM_ReadActivationPair)->Arg(65536);

}  // namespace

BENCHMARK_MAIN();
