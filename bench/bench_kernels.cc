// Compute-kernel benchmarks: SGEMM (packed, few-rows, batched, reference), int8 GEMM (VNNI and
// portable, same shapes as SGEMM), convolutions (3x3, 1x1, depthwise, transpose) and an FMA-loop
// peak that gives the other figures a scale.
#include <benchmark/benchmark.h>
#include <tbb/task_arena.h>

#include <ctime>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/conv.h"
#include "kernels/gemm.h"
#include "kernels/int8_conv.h"
#include "kernels/int8_gemm.h"

namespace {

using namespace qeval::kernels;

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// Threads: 0 = TBB's default (all cores), else an arena of that many.
template <class F>
void in_arena(int threads, F&& f) {
  if (threads == 0) return f();
  tbb::task_arena arena(threads);
  arena.execute(f);
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// GFLOP/s is wall-clock throughput. The machine is shared, so GFLOP/cpu-s (flops over the CPU time
// of all this process's threads) is reported too: per-core throughput, insensitive to how many
// cores other processes took during the run.
void set_flops(benchmark::State& state, double flops_per_iteration, double cpu_seconds) {
  const double flops = flops_per_iteration * double(state.iterations());
  state.counters["GFLOP/s"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/cpu-s"] = flops / 1e9 / cpu_seconds;
}

// ---- FMA peak: 16 independent vector FMA chains (enough to cover latency x issue width). Without
// -ffast-math the compiler may not reassociate the chains, so the loop stays as written. ------------

typedef float V __attribute__((vector_size(64)));

V fma_chains(std::int64_t iterations, V seed) {
  V acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = seed + float(i);
  const V mul = seed * 0.0f + 0.999999f, add = seed * 0.0f + 1e-7f;
  for (std::int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = acc[i] * mul + add;
  }
  V sum = acc[0];
  for (int i = 1; i < 16; ++i) sum += acc[i];
  return sum;
}

constexpr std::int64_t kFmaIterations = 1 << 22;
constexpr double kFmaFlops = double(kFmaIterations) * 16 * 16 * 2;

void BM_FmaPeak_1thread(benchmark::State& state) {
  V seed = V{} + 1.0f;
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) {
    benchmark::DoNotOptimize(seed);  // an opaque input: the call cannot be hoisted
    benchmark::DoNotOptimize(fma_chains(kFmaIterations, seed));
  }
  set_flops(state, kFmaFlops, process_cpu_seconds() - cpu0);
}
BENCHMARK(BM_FmaPeak_1thread)->Unit(benchmark::kMillisecond)->UseRealTime();

// One std::thread per core: TBB may run both loops on one thread before its worker wakes up.
void BM_FmaPeak_allthreads(benchmark::State& state) {
  const int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<V> out(static_cast<std::size_t>(threads));
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&out, t] { out[std::size_t(t)] = fma_chains(kFmaIterations, V{} + float(t)); });
    for (auto& th : pool) th.join();
    benchmark::DoNotOptimize(out.data());
  }
  set_flops(state, kFmaFlops * threads, process_cpu_seconds() - cpu0);
  state.counters["threads"] = threads;
}
BENCHMARK(BM_FmaPeak_allthreads)->Unit(benchmark::kMillisecond)->UseRealTime();

// ---- SGEMM ------------------------------------------------------------------------------------

void run_sgemm(benchmark::State& state, std::int64_t m, std::int64_t n, std::int64_t k, int threads, bool reference) {
  const auto a = random_floats(std::size_t(m * k), 1), b = random_floats(std::size_t(k * n), 2);
  std::vector<float> c(std::size_t(m * n));
  GemmShape s{false, false, m, n, k, k, n, n};
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) {
    in_arena(threads, [&] {
      if (reference) sgemm_reference(s, 1.0f, a.data(), b.data(), 0.0f, c.data());
      else sgemm(s, 1.0f, a.data(), b.data(), 0.0f, c.data());
    });
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, 2.0 * double(m) * double(n) * double(k), process_cpu_seconds() - cpu0);
}

void BM_Sgemm(benchmark::State& state) {
  run_sgemm(state, state.range(0), state.range(1), state.range(2), int(state.range(3)), false);
}
// Args: m, n, k, threads (0 = all).
BENCHMARK(BM_Sgemm)
    ->ArgNames({"m", "n", "k", "threads"})
    ->Args({512, 512, 512, 0})
    ->Args({1024, 1024, 1024, 0})
    ->Args({4096, 320, 320, 0})
    ->Args({512, 512, 512, 1})
    ->Args({1024, 1024, 1024, 1})
    ->Args({4096, 320, 320, 1})
    ->Args({2, 1280, 1280, 0})  // a time-embedding Linear at batch 2 (the few-rows path)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// ---- int8 GEMM: int8 x int8 -> int32, as the fused Q/DQ MatMul runs it: B (the weights) packed
// once, A (the activations) packed every call (counted). "GFLOP" = 2 m n k integer ops, so the
// figures compare directly with BM_Sgemm's. ------------------------------------------------------

std::vector<std::int8_t> random_int8s(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> u(-128, 127);
  std::vector<std::int8_t> v(n);
  for (auto& x : v) x = std::int8_t(u(rng));
  return v;
}

void run_int8_gemm(benchmark::State& state, Int8GemmPath path) {
  const std::int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const int threads = int(state.range(3));
  const auto a = random_int8s(std::size_t(m * k), 1), b = random_int8s(std::size_t(k * n), 2);
  const PackedInt8B pb(k, n, b.data(), n);
  std::vector<std::int32_t> c(std::size_t(m * n));
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) {
    in_arena(threads, [&] {
      const PackedInt8A pa(m, k, a.data(), k);
      int8_gemm(pa, pb, c.data(), n, path);
    });
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, 2.0 * double(m) * double(n) * double(k), process_cpu_seconds() - cpu0);
}

void BM_Int8Gemm(benchmark::State& state) {
  if (!int8_gemm_path_available(Int8GemmPath::kAvx512Vnni)) return state.SkipWithError("no AVX-512 VNNI in this build");
  run_int8_gemm(state, Int8GemmPath::kAvx512Vnni);
}
void BM_Int8GemmPortable(benchmark::State& state) { run_int8_gemm(state, Int8GemmPath::kPortable); }
BENCHMARK(BM_Int8Gemm)
    ->ArgNames({"m", "n", "k", "threads"})
    ->Args({512, 512, 512, 0})
    ->Args({1024, 1024, 1024, 0})
    ->Args({4096, 320, 320, 0})
    ->Args({512, 512, 512, 1})
    ->Args({1024, 1024, 1024, 1})
    ->Args({4096, 320, 320, 1})
    // tiny-sd's linear layers (tokens x channels): 64-768 columns, k 64-384
    ->Args({512, 64, 64, 1})
    ->Args({512, 512, 64, 1})
    ->Args({512, 64, 256, 1})
    ->Args({128, 96, 96, 1})
    ->Args({128, 768, 96, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Int8GemmPortable)
    ->ArgNames({"m", "n", "k", "threads"})
    ->Args({512, 512, 512, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Attention scores as exporters write them: 16 heads of [77 x 64] x [64 x 77]^T.
void BM_SgemmBatched_attention(benchmark::State& state) {
  const std::int64_t heads = 16, s = 77, d = 64;
  const auto q = random_floats(std::size_t(heads * s * d), 1), k = random_floats(std::size_t(heads * s * d), 2);
  std::vector<float> c(std::size_t(heads * s * s));
  std::vector<const float*> qs, ks;
  std::vector<float*> cs;
  for (std::int64_t h = 0; h < heads; ++h) {
    qs.push_back(q.data() + h * s * d);
    ks.push_back(k.data() + h * s * d);
    cs.push_back(c.data() + h * s * s);
  }
  const GemmShape shape{false, true, s, s, d, d, d, s};
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) {
    sgemm_batched(shape, heads, 1.0f, qs.data(), ks.data(), 0.0f, cs.data());
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, 2.0 * double(heads * s * s * d), process_cpu_seconds() - cpu0);
}
BENCHMARK(BM_SgemmBatched_attention)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_SgemmReference(benchmark::State& state) {
  run_sgemm(state, state.range(0), state.range(1), state.range(2), 1, true);
}
BENCHMARK(BM_SgemmReference)
    ->ArgNames({"m", "n", "k"})
    ->Args({512, 512, 512})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// ---- conv ---------------------------------------------------------------------------------------

ConvParams conv_params(std::int64_t channels_in, std::int64_t channels_out, std::int64_t groups, std::int64_t size,
                       std::int64_t kernel, std::int64_t stride, std::int64_t pad, bool transpose = false) {
  ConvParams p;
  p.batch = 1;
  p.in_channels = channels_in;
  p.out_channels = channels_out;
  p.groups = groups;
  p.in_spatial = {size, size};
  p.kernel = {kernel, kernel};
  p.strides = {stride, stride};
  p.dilations = {1, 1};
  p.pads_begin = {pad, pad};
  p.pads_end = {pad, pad};
  p.out_spatial = transpose ? conv_transpose_output_spatial(p) : conv_output_spatial(p);
  return p;
}

// A UNet-ish 3x3 conv: 1x320x64x64 -> 320 channels, pad 1.
ConvParams unet_conv_3x3() { return conv_params(320, 320, 1, 64, 3, 1, 1); }

void run_conv(benchmark::State& state, const ConvParams& p, int threads, bool reference, bool transpose = false) {
  const auto x = random_floats(std::size_t(conv_input_size(p)), 1);
  const auto w = random_floats(std::size_t(transpose ? conv_transpose_weight_size(p) : conv_weight_size(p)), 2);
  const auto bias = random_floats(std::size_t(p.out_channels), 3);
  std::vector<float> y(std::size_t(conv_output_size(p)));
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) {
    in_arena(threads, [&] {
      if (transpose) conv_transpose(p, x.data(), w.data(), bias.data(), y.data());
      else if (reference) conv_reference(p, x.data(), w.data(), bias.data(), y.data());
      else conv(p, x.data(), w.data(), bias.data(), y.data());
    });
    benchmark::DoNotOptimize(y.data());
  }
  // ConvTranspose: every input element meets out_channels/groups * kernel weights.
  const double flops = transpose ? 2.0 * double(conv_input_size(p)) * double(p.out_channels / p.groups) *
                                       double(p.kernel[0] * p.kernel[1])
                                 : conv_flops(p);
  set_flops(state, flops, process_cpu_seconds() - cpu0);
}

void BM_Conv3x3_320x64x64(benchmark::State& state) { run_conv(state, unet_conv_3x3(), int(state.range(0)), false); }
BENCHMARK(BM_Conv3x3_320x64x64)->ArgName("threads")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// The same UNet 3x3 conv in int8 (im2col + int8 GEMM, weights packed once): compare with
// BM_Conv3x3_320x64x64 in the same run.
void BM_Int8Conv3x3_320x64x64(benchmark::State& state) {
  const ConvParams p = unet_conv_3x3();
  const auto x = random_int8s(std::size_t(conv_input_size(p)), 1);
  const auto w = random_int8s(std::size_t(conv_weight_size(p)), 2);
  const PackedInt8ConvWeights packed(p, w.data());
  std::vector<std::int32_t> y(std::size_t(conv_output_size(p)));
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) {
    in_arena(int(state.range(0)), [&] { int8_conv(p, x.data(), 0, packed, y.data()); });
    benchmark::DoNotOptimize(y.data());
  }
  set_flops(state, conv_flops(p), process_cpu_seconds() - cpu0);
}
BENCHMARK(BM_Int8Conv3x3_320x64x64)->ArgName("threads")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Conv1x1_320x64x64(benchmark::State& state) { run_conv(state, conv_params(320, 320, 1, 64, 1, 1, 0), 0, false); }
BENCHMARK(BM_Conv1x1_320x64x64)->Unit(benchmark::kMillisecond)->UseRealTime();

// Depthwise 3x3 as in EfficientViT blocks: memory-bound, so GFLOP/s is low by nature.
void BM_ConvDepthwise3x3_256x64x64(benchmark::State& state) {
  run_conv(state, conv_params(256, 256, 256, 64, 3, 1, 1), 0, false);
}
BENCHMARK(BM_ConvDepthwise3x3_256x64x64)->Unit(benchmark::kMillisecond)->UseRealTime();

// A 2x upsampling ConvTranspose (kernel 4, stride 2, pad 1): 256x32x32 -> 128x64x64.
void BM_ConvTranspose4x4s2_256x32x32(benchmark::State& state) {
  run_conv(state, conv_params(256, 128, 1, 32, 4, 2, 1, true), 0, false, true);
}
BENCHMARK(BM_ConvTranspose4x4s2_256x32x32)->Unit(benchmark::kMillisecond)->UseRealTime();

// ---- INT8 against FP32 per conv shape (issue 20: INT8 never slower than FP32 on any conv shape),
// 1 thread: depthwise 3x3 / 5x5 at stride 1 and 2 and a channel multiplier of 2 (PP-OCRv4,
// MobileNetV3 sizes), grouped convs (ResNeXt / ShuffleNet-like). Each shape runs as FP32 (`conv`
// with bias, weights prepacked as the executor does), int8 (`int8_conv`, best path, int32 out,
// weights packed once) and int8 with the portable kernels. Compare cpu_ms within one run.
// Shapes 14-19: dense convs of PP-OCRv4 det at 640x640 (its neck's 3x3 96->24 convs are ~46% of its
// MACs; 1x1 convs read x in place) and a tiny-sd UNet 3x3 (batch 1 of its 2, 16x16 latents).

struct ConvShape {
  const char* name;
  std::int64_t cin, cout, groups, size, kernel, stride;
};
constexpr ConvShape kConvShapes[] = {
    {"dw3x3s1 16x160x160", 16, 16, 16, 160, 3, 1},        {"dw3x3s1 96x80x80", 96, 96, 96, 80, 3, 1},
    {"dw3x3s1 256x64x64", 256, 256, 256, 64, 3, 1},       {"dw3x3s2 32x160x160", 32, 32, 32, 160, 3, 2},
    {"dw3x3s2 96x80x80", 96, 96, 96, 80, 3, 2},           {"dw5x5s1 192x40x40", 192, 192, 192, 40, 5, 1},
    {"dw5x5s1 480x40x40", 480, 480, 480, 40, 5, 1},       {"dw5x5s2 192x80x80", 192, 192, 192, 80, 5, 2},
    {"dw3x3s1 x2 16->32x160x160", 16, 32, 16, 160, 3, 1}, {"g2 1x1 96x80x80", 96, 96, 2, 80, 1, 1},
    {"g4 3x3s1 64x80x80", 64, 64, 4, 80, 3, 1},           {"g8 3x3s1 128x40x40", 128, 128, 8, 40, 3, 1},
    {"g32 3x3s1 256x40x40", 256, 256, 32, 40, 3, 1},      {"g16 3x3s2 256x40x40", 256, 256, 16, 40, 3, 2},
    {"3x3s1 96->24x160x160", 96, 24, 1, 160, 3, 1},       {"3x3s2 3->16x640x640", 3, 16, 1, 640, 3, 2},
    {"1x1 16->32x320x320", 16, 32, 1, 320, 1, 1},         {"1x1 48->48x160x160", 48, 48, 1, 160, 1, 1},
    {"1x1 384->384x20x20", 384, 384, 1, 20, 1, 1},        {"3x3s1 192->96x16x16", 192, 96, 1, 16, 3, 1},
};

void BM_ConvShape(benchmark::State& state) {
  const ConvShape& c = kConvShapes[state.range(0)];
  const int precision = int(state.range(1));  // 0 FP32, 1 int8 (best path), 2 int8 portable
  const ConvParams p = conv_params(c.cin, c.cout, c.groups, c.size, c.kernel, c.stride, c.kernel / 2);
  std::vector<float> y(std::size_t(conv_output_size(p)));
  std::vector<std::int32_t> yi(y.size());
  const auto xf = random_floats(std::size_t(conv_input_size(p)), 1);
  const auto wf = random_floats(std::size_t(conv_weight_size(p)), 2);
  const auto bias = random_floats(std::size_t(p.out_channels), 3);
  const auto xi = random_int8s(xf.size(), 1), wi = random_int8s(wf.size(), 2);
  const PackedConvWeights packed_f = pack_conv_weights(p, wf.data());
  const PackedInt8ConvWeights packed_i(p, wi.data());
  ConvScratch scratch_f;
  PackedInt8B scratch_i(0, 0);
  const Int8GemmPath path = precision == 2 ? Int8GemmPath::kPortable : int8_gemm_best_path();
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) {
    in_arena(1, [&] {
      if (precision == 0) conv(p, xf.data(), wf.data(), bias.data(), y.data(), &packed_f, &scratch_f);
      else int8_conv(p, xi.data(), 0, packed_i, yi.data(), nullptr, path, &scratch_i);
    });
    benchmark::DoNotOptimize(y.data());
    benchmark::DoNotOptimize(yi.data());
  }
  const double cpu = process_cpu_seconds() - cpu0;
  set_flops(state, conv_flops(p), cpu);
  state.counters["cpu_ms"] = 1e3 * cpu / double(state.iterations());
  state.SetLabel(std::string(c.name) + (precision == 0 ? " fp32" : precision == 1 ? " int8" : " int8-portable"));
}
void conv_shape_args(benchmark::internal::Benchmark* b) {
  for (int i = 0; i < int(std::size(kConvShapes)); ++i)
    for (int precision : {0, 1, 2}) b->Args({i, precision});
}
BENCHMARK(BM_ConvShape)
    ->ArgNames({"shape", "precision"})
    ->Apply(conv_shape_args)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
