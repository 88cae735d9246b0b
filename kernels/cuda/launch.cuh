// What kernels/cuda's .cu files share to launch: the block size, grid-stride loops, launch checks.
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

}  // namespace qeval::kernels::cuda::launch

// Grid-stride loop over [0, n).
#define QEVAL_FOR(i, n) \
  for (i64 i = i64(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += i64(gridDim.x) * blockDim.x)
