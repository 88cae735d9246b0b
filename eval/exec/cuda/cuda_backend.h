// The executor's CUDA backend (issue 23): values in a CUDA device's memory, nodes compiled to
// qeval's CUDA kernels (kernels/cuda/) and cuBLAS; what it does not compile runs on the CPU.
#pragma once

#include <memory>

#include "eval/exec/backend.h"

namespace qeval::eval {

// The backend of CUDA device `device` (one stream, one cuBLAS handle). InputError when there is no
// CUDA device or `device` is out of range ("cuda:0: no CUDA device (cudaGetDeviceCount: ...)").
std::shared_ptr<Backend> make_cuda_backend(int device);

}  // namespace qeval::eval
