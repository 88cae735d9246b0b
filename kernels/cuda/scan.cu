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
  double sum, sum_sq, err_sq, err_max, ref_sq;
  u64 finite, nan, inf, clipped;
  i64 first_bad;  // the first non-finite element's index; n when none
  unsigned max_bits, not_plain;
};

__device__ Part combine(const Part& a, const Part& b) {
  return {a.sum + b.sum,
          a.sum_sq + b.sum_sq,
          a.err_sq + b.err_sq,
          fmax(a.err_max, b.err_max),
          a.ref_sq + b.ref_sq,
          a.finite + b.finite,
          a.nan + b.nan,
          a.inf + b.inf,
          a.clipped + b.clipped,
          a.first_bad < b.first_bad ? a.first_bad : b.first_bad,
          max(a.max_bits, b.max_bits),
          a.not_plain | b.not_plain};
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

// Between scans the scratch is zero: the last block to finish leaves it so.
struct Scratch {
  Part parts[kMaxBlocks];
  u64 hist[Totals::kBins];
  unsigned done;  // blocks finished
};

// What a scan leaves for the host (ScanResult).
struct Result {
  Part total;
  u64 hist[Totals::kBins];
};

// Written by other blocks of this grid: read from L2, not a stale L1 line.
__device__ Part load_part(const Part* p) {
  Part q;
  q.sum = __ldcg(&p->sum), q.sum_sq = __ldcg(&p->sum_sq), q.err_sq = __ldcg(&p->err_sq), q.err_max = __ldcg(&p->err_max);
  q.ref_sq = __ldcg(&p->ref_sq);
  q.finite = __ldcg(&p->finite), q.nan = __ldcg(&p->nan), q.inf = __ldcg(&p->inf), q.clipped = __ldcg(&p->clipped);
  q.first_bad = __ldcg(&p->first_bad);
  q.max_bits = __ldcg(&p->max_bits), q.not_plain = __ldcg(&p->not_plain);
  return q;
}

// Each block: a strided share of the elements; its histogram in shared memory, then added to the
// tensor's (integer counts: the same totals in any order). The last block to finish combines the
// blocks' sums in block order (deterministic), writes the result and zeroes the scratch.
__global__ void scan_kernel(const float* x, const float* ref, i64 n, unsigned clip_bits, const float* channel_clip,
                            i64 channels, bool sample, Scratch* s, Result* out) {
  __shared__ unsigned bins[Totals::kBins];
  __shared__ Part shared[kThreads];
  __shared__ bool last;
  for (int b = threadIdx.x; b < Totals::kBins; b += blockDim.x) bins[b] = 0;
  __syncthreads();
  Part p{};
  p.first_bad = n;
  const i64 stride = i64(gridDim.x) * blockDim.x;
  for (i64 i = i64(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = x[i];
    const unsigned u = __float_as_uint(v) & kAbs;
    p.not_plain |= u >= kBigBits;
    if (u >= kInfBits) {
      (u == kInfBits ? p.inf : p.nan) += 1;
      if (i < p.first_bad) p.first_bad = i;
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
    // Per channel (the last axis): clipped beyond its own |threshold| (a NaN one clips nothing).
    p.clipped += u > (channel_clip ? __float_as_uint(channel_clip[i % channels]) & kAbs : clip_bits);
    const double d = v;
    p.sum += d;
    p.sum_sq += d * d;
    if (ref) {  // the reference is finite (the caller's condition)
      const double r = ref[i];
      const double e = d - r;
      p.ref_sq += r * r;
      p.err_sq += e * e;
      p.err_max = fmax(p.err_max, fabs(e));
    }
  }
  const Part total = block_combine(p, shared);
  if (threadIdx.x == 0) s->parts[blockIdx.x] = total;
  __syncthreads();
  for (int b = threadIdx.x; b < Totals::kBins; b += blockDim.x)
    if (bins[b]) atomicAdd(&s->hist[b], u64(bins[b]));
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&s->done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  Part q{};
  q.first_bad = n;
  for (unsigned k = threadIdx.x; k < gridDim.x; k += blockDim.x) q = combine(q, load_part(&s->parts[k]));
  const Part all = block_combine(q, shared);
  if (threadIdx.x == 0) {
    out->total = all;
    s->done = 0;
  }
  for (int b = threadIdx.x; b < Totals::kBins; b += blockDim.x) {
    out->hist[b] = __ldcg(&s->hist[b]);
    s->hist[b] = 0;
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

int blocks_for(i64 n) {
  const i64 b = (n + i64(kThreads) * Totals::kChunk - 1) / (i64(kThreads) * Totals::kChunk);
  return int(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

// Each thread the largest finite |x| of one channel over a slice of rows; the slice maxima meet by
// atomicMax on the bits (non-negative floats order as their bits: any order gives the same bits).
__global__ void channel_abs_max_kernel(const float* x, i64 rows, i64 channels, i64 rows_per_block,
                                       unsigned* amax_bits) {
  const i64 c = i64(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const i64 r0 = i64(blockIdx.y) * rows_per_block, r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;
  unsigned m = 0;
  for (i64 r = r0; r < r1; ++r) {
    const unsigned b = __float_as_uint(x[r * channels + c]) & kAbs;
    if (b < kInfBits && b > m) m = b;
  }
  if (m) atomicMax(&amax_bits[c], m);
}

}  // namespace

void channel_abs_max(const float* x, std::int64_t rows, std::int64_t channels, void* amax, void* stream) {
  if (rows <= 0 || channels <= 0) return;
  const int threads = channels < kThreads ? int((channels + 31) / 32 * 32) : kThreads;
  const i64 column_blocks = (channels + threads - 1) / threads;
  // About 64 rows a thread, at most 65535 row slices.
  i64 slices = (rows + 63) / 64;
  if (slices > 65535) slices = 65535;
  const i64 rows_per_block = (rows + slices - 1) / slices;
  slices = (rows + rows_per_block - 1) / rows_per_block;
  const dim3 grid{unsigned(column_blocks), unsigned(slices), 1u};
  channel_abs_max_kernel<<<grid, threads, 0, static_cast<cudaStream_t>(stream)>>>(x, rows, channels, rows_per_block,
                                                                                static_cast<unsigned*>(amax));
  check(cudaGetLastError(), "channel abs max kernel");
}

std::size_t scan_scratch_bytes() { return sizeof(Scratch); }
std::size_t scan_result_bytes() { return sizeof(Result); }

void scan_values(const float* x, const float* ref, std::int64_t n, float clip_amax, const float* channel_clip,
                 std::int64_t channels, void* scratch, void* result, void* stream) {
  unsigned clip_bits = kInfBits;
  if (clip_amax == clip_amax) {
    std::memcpy(&clip_bits, &clip_amax, sizeof clip_bits);
    clip_bits &= kAbs;
  }
  // n == 0: one block that reads nothing and writes zero totals.
  const int blocks = blocks_for(n);
  scan_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, ref, n < 0 ? 0 : n, clip_bits, channels > 0 ? channel_clip : nullptr, channels, n >= Totals::kSampleFrom,
      static_cast<Scratch*>(scratch),
      static_cast<Result*>(result));
  check(cudaGetLastError(), "scan kernel");
}

void read_scan_result(const void* result, ScanTotals& out) {
  const Result& r = *static_cast<const Result*>(result);
  const Part& total = r.total;
  out = ScanTotals{};
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
  out.ref_sq = total.ref_sq;
  out.first_nonfinite = total.nan + total.inf ? total.first_bad : -1;
  std::memcpy(out.hist.data(), r.hist, sizeof r.hist);
}

}  // namespace qeval::kernels::cuda
