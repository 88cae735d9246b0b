// Activation statistics on the device (kernels/cuda/scan.h): one pass over a float32 tensor (and,
// for the error, its reference) whose totals alone go to the host.
#include "kernels/cuda/scan.h"

#include <cuda_runtime.h>

#include <cstring>
#include <stdexcept>
#include <string>

namespace qeval::kernels::cuda {
namespace {

using i64 = std::int64_t;
using u64 = unsigned long long;
using Totals = kernels::ScanTotals;

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;
constexpr unsigned kAbs = 0x7fffffffu, kInfBits = 0x7f800000u;
constexpr unsigned kBigBits = unsigned(60 + 127) << 23;  // 2^60: beyond it a value is not "plain"
constexpr unsigned kKeyShift = 23 - 3;
constexpr int kMinKey = (-32 + 127) << 3;

// One thread's, then one block's, then the tensor's sums: combined in a fixed order.
struct Part {
  double sum, sum_sq, err_sq, err_max;
  u64 finite, nan, inf, clipped;
  unsigned max_bits, not_plain;
};

__device__ Part combine(const Part& a, const Part& b) {
  return {a.sum + b.sum,         a.sum_sq + b.sum_sq,   a.err_sq + b.err_sq, fmax(a.err_max, b.err_max),
          a.finite + b.finite,   a.nan + b.nan,         a.inf + b.inf,       a.clipped + b.clipped,
          max(a.max_bits, b.max_bits), a.not_plain | b.not_plain};
}

__device__ Part block_combine(Part p, Part* shared) {
  shared[threadIdx.x] = p;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] = combine(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  return shared[0];
}

// Each block: a strided share of the elements; its histogram in shared memory, then added to the
// tensor's (integer counts: the same totals in any order).
__global__ void scan_kernel(const float* x, const float* ref, i64 n, unsigned clip_bits, bool sample, Part* parts,
                            u64* hist) {
  __shared__ unsigned bins[Totals::kBins];
  __shared__ Part shared[kThreads];
  for (int b = threadIdx.x; b < Totals::kBins; b += blockDim.x) bins[b] = 0;
  __syncthreads();
  Part p{};
  const i64 stride = i64(gridDim.x) * blockDim.x;
  for (i64 i = i64(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = x[i];
    const unsigned u = __float_as_uint(v) & kAbs;
    p.not_plain |= u >= kBigBits;
    if (u >= kInfBits) {
      (u == kInfBits ? p.inf : p.nan) += 1;
      continue;
    }
    ++p.finite;
    const i64 chunk = i / Totals::kChunk;
    if (!sample ||
        ((unsigned(chunk / Totals::kBlock) * Totals::kHashMultiplier) >> 29) == unsigned(chunk % Totals::kBlock)) {
      int b = int(u >> kKeyShift) - kMinKey + 1;
      b = b < 0 ? 0 : (b > Totals::kBins - 1 ? Totals::kBins - 1 : b);
      atomicAdd(&bins[b], 1u);
    }
    p.max_bits = max(p.max_bits, u);
    p.clipped += u > clip_bits;
    const double d = v;
    p.sum += d;
    p.sum_sq += d * d;
    if (ref) {  // the reference is finite (the caller's condition)
      const double e = d - double(ref[i]);
      p.err_sq += e * e;
      p.err_max = fmax(p.err_max, fabs(e));
    }
  }
  const Part total = block_combine(p, shared);
  if (threadIdx.x == 0) parts[blockIdx.x] = total;
  __syncthreads();
  for (int b = threadIdx.x; b < Totals::kBins; b += blockDim.x)
    if (bins[b]) atomicAdd(&hist[b], u64(bins[b]));
}

// One block: the blocks' parts in a fixed order.
__global__ void combine_kernel(Part* parts, int count) {
  __shared__ Part shared[kThreads];
  Part p{};
  for (int k = threadIdx.x; k < count; k += blockDim.x) p = combine(p, parts[k]);
  const Part total = block_combine(p, shared);
  if (threadIdx.x == 0) parts[0] = total;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

int blocks_for(i64 n) {
  const i64 b = (n + i64(kThreads) * Totals::kChunk - 1) / (i64(kThreads) * Totals::kChunk);
  return int(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

}  // namespace

std::size_t scan_scratch_bytes() { return sizeof(Part) * kMaxBlocks + sizeof(u64) * Totals::kBins; }

void scan_values(const float* x, const float* ref, std::int64_t n, float clip_amax, void* scratch, ScanTotals& out,
                 void* stream) {
  out = ScanTotals{};
  if (n <= 0) return;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  Part* parts = static_cast<Part*>(scratch);
  u64* hist = reinterpret_cast<u64*>(parts + kMaxBlocks);
  check(cudaMemsetAsync(hist, 0, sizeof(u64) * Totals::kBins, st), "scan: memset");
  unsigned clip_bits = kInfBits;
  if (clip_amax == clip_amax) {
    std::memcpy(&clip_bits, &clip_amax, sizeof clip_bits);
    clip_bits &= kAbs;
  }
  const int blocks = blocks_for(n);
  scan_kernel<<<blocks, kThreads, 0, st>>>(x, ref, n, clip_bits, n >= Totals::kSampleFrom, parts, hist);
  check(cudaGetLastError(), "scan kernel");
  combine_kernel<<<1, kThreads, 0, st>>>(parts, blocks);
  check(cudaGetLastError(), "scan combine kernel");
  Part total;
  check(cudaMemcpyAsync(&total, parts, sizeof total, cudaMemcpyDeviceToHost, st), "scan: copy totals");
  check(cudaMemcpyAsync(out.hist.data(), hist, sizeof(u64) * Totals::kBins, cudaMemcpyDeviceToHost, st),
        "scan: copy histogram");
  check(cudaStreamSynchronize(st), "scan: synchronize");
  out.finite = total.finite;
  out.nan = total.nan;
  out.inf = total.inf;
  out.clipped = total.clipped;
  out.max_bits = total.max_bits;
  out.plain = total.not_plain == 0;
  out.sum = total.sum;
  out.sum_sq = total.sum_sq;
  out.err_sq = total.err_sq;
  out.err_max = total.err_max;
}

}  // namespace qeval::kernels::cuda
