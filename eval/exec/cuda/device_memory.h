// CudaMemory: a CUDA device's memory for tensors (kernels/tensor.h DeviceMemory) and the one
// stream every copy and kernel of a backend is ordered on.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/scan_totals.h"
#include "kernels/tensor.h"

namespace qeval::eval {

// InputError unless CUDA device `device` exists ("cuda:N: no CUDA device (cudaGetDeviceCount:
// <driver's reason>)", "cuda:N: out of range: 1 CUDA device (cuda:0)").
void check_cuda_device(int device);

class CudaMemory final : public DeviceMemory, public std::enable_shared_from_this<CudaMemory> {
 public:
  explicit CudaMemory(int device);  // creates the stream; the device must exist
  ~CudaMemory() override;
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;

  std::string name() const override { return "cuda:" + std::to_string(device_); }
  void* allocate(std::size_t bytes) override;  // cudaMalloc + zeroing; std::bad_alloc when full
  void release(void* p) noexcept override;
  void to_device(void* dst, const void* host_src, std::size_t bytes) override;
  void to_host(void* host_dst, const void* src, std::size_t bytes) override;  // synchronises
  void copy(void* dst, const void* src, std::size_t bytes) override;

  // Serialises the backend's work across threads (evaluator workers share one backend: its
  // stream and cuBLAS handle) and makes this device current on the calling thread (CUDA's current
  // device is per thread). Re-entrant. Every memory call and kernel takes it.
  [[nodiscard]] std::unique_lock<std::recursive_mutex> lock();

  int device() const { return device_; }
  void* stream() const { return stream_; }  // a cudaStream_t
  void synchronize() override;
  std::shared_ptr<DeviceMemory> shared() { return shared_from_this(); }
  // Activation statistics of a float32 tensor in this memory (eval/exec/device_scan.h; scratch of
  // its own, made on first use); false for a tensor in another memory.
  bool scan(const Tensor& t, const Tensor* ref, float clip_amax, kernels::ScanTotals& out);

 private:
  int device_;
  void* stream_ = nullptr;
  std::recursive_mutex mu_;
  void* scan_scratch_ = nullptr;
};

}  // namespace qeval::eval
