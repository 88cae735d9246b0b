// What kernels/cuda's .cu files share: the block size, grid-stride loops, launch checks, the
// device form of the CPU's int8/uint8 quantizer.
// Included by .cu files only (CUDA headers).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/kernels.h"

namespace qeval::kernels::cuda::launch {

using i64 = std::int64_t;

inline constexpr int kThreads = 256;

inline cudaStream_t stream_of(Stream s) { return static_cast<cudaStream_t>(s); }

inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA kernel ") + what + ": " + cudaGetErrorString(e));
}

// Blocks of kThreads for n elements of a grid-stride loop (at least 1, at most 65535 * 64).
inline unsigned blocks_for(i64 n) {
  const i64 b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 64 ? (b < 1 ? 1 : b) : 65535 * 64);
}

// kernels/numeric.h quantize_to on the device, as a float in the target's range:
// saturate(round_half_even(x / scale) + zero_point) for int8 (s8) or uint8, NaN -> the zero point.
// A division (not a reciprocal's product) and every step rounded, as the CPU's.
__device__ inline float quantize_to(float x, float scale, float zero_point, bool s8) {
  float v = __fadd_rn(rintf(__fdiv_rn(x, scale)), zero_point);
  v = v == v ? v : zero_point;
  const float hi = s8 ? 127.0f : 255.0f, lo = s8 ? -128.0f : 0.0f;
  v = v > hi ? hi : v;
  return v < lo ? lo : v;
}

}  // namespace qeval::kernels::cuda::launch

// Grid-stride loop over [0, n).
#define QEVAL_FOR(i, n) \
  for (i64 i = i64(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += i64(gridDim.x) * blockDim.x)
