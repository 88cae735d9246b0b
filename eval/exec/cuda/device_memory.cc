// CudaMemory: cudaMalloc'd tensor storage and copies on the backend's stream.
#include "eval/exec/cuda/device_memory.h"

#include <cuda_runtime.h>

#include <new>
#include <stdexcept>

#include "kernels/cuda/scan.h"
#include "kernels/error.h"

namespace qeval::eval {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// cudaSetDevice on this thread unless qeval made `device` current here already: every kernel
// takes the lock, and cudaSetDevice each time was host time per node. (Only this file sets the
// current device.)
void make_current(int device) {
  thread_local int current = -1;
  if (current == device) return;
  check(cudaSetDevice(device), "cudaSetDevice");
  current = device;
}

}  // namespace

void check_cuda_device(int device) {
  const std::string name = "cuda:" + std::to_string(device);
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clears the sticky error state where there is one
    throw InputError(name + ": no CUDA device (cudaGetDeviceCount: " + cudaGetErrorString(e) + ")");
  }
  if (count == 0) throw InputError(name + ": no CUDA device (cudaGetDeviceCount found none)");
  if (device < 0 || device >= count)
    throw InputError(name + ": out of range: " + std::to_string(count) + " CUDA device" + (count == 1 ? "" : "s") +
                     " (cuda:0" + (count > 1 ? " to cuda:" + std::to_string(count - 1) : std::string()) + ")");
}

CudaMemory::CudaMemory(int device) : device_(device) {
  make_current(device);
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = s;
}

CudaMemory::~CudaMemory() {
  if (scan_scratch_) release(scan_scratch_);
  if (stream_) {
    cudaStreamSynchronize(as_stream(stream_));
    cudaStreamDestroy(as_stream(stream_));
  }
}

bool CudaMemory::scan(const Tensor& t, const Tensor* ref, float clip_amax, kernels::ScanTotals& out) {
  if (t.device().get() != this || (ref && ref->device().get() != this)) return false;
  const auto held = lock();
  if (!scan_scratch_) scan_scratch_ = allocate(kernels::cuda::scan_scratch_bytes());
  kernels::cuda::scan_values(static_cast<const float*>(t.device_data()),
                             ref ? static_cast<const float*>(ref->device_data()) : nullptr, t.numel(), clip_amax,
                             scan_scratch_, out, stream_);
  return true;
}

std::unique_lock<std::recursive_mutex> CudaMemory::lock() {
  std::unique_lock<std::recursive_mutex> held(mu_);
  make_current(device_);
  return held;
}

void* CudaMemory::allocate(std::size_t bytes) {
  const auto held = lock();
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw std::bad_alloc();
  }
  check(e, "cudaMalloc");
  check(cudaMemsetAsync(p, 0, bytes, as_stream(stream_)), "cudaMemsetAsync");
  return p;
}

void CudaMemory::release(void* p) noexcept {
  if (!p) return;
  // Work queued on the stream may still read p: cudaFree waits for the device, so nothing is freed
  // under a running kernel.
  std::lock_guard<std::recursive_mutex> held(mu_);
  try {
    make_current(device_);
  } catch (const std::exception&) {
    return;  // no device to free it on
  }
  cudaFree(p);
}

void CudaMemory::to_device(void* dst, const void* host_src, std::size_t bytes) {
  if (!bytes) return;
  const auto held = lock();
  check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, as_stream(stream_)), "cudaMemcpy to device");
  // The host buffer may go away when this returns.
  synchronize();
}

void CudaMemory::to_host(void* host_dst, const void* src, std::size_t bytes) {
  if (!bytes) return;
  const auto held = lock();
  check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, as_stream(stream_)), "cudaMemcpy to host");
  synchronize();
}

void CudaMemory::copy(void* dst, const void* src, std::size_t bytes) {
  if (!bytes) return;
  const auto held = lock();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream_)), "cudaMemcpy on device");
}

void CudaMemory::synchronize() { check(cudaStreamSynchronize(as_stream(stream_)), "cudaStreamSynchronize"); }

}  // namespace qeval::eval
