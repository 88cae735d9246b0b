// CudaMemory: a CUDA device's memory for tensors (kernels/tensor.h DeviceMemory) and the one
// stream every copy and kernel of a backend is ordered on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "eval/exec/device_scan.h"
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
  // Host memory the device writes (page-locked, mapped: cudaHostAlloc); std::bad_alloc when none.
  void* allocate_pinned(std::size_t bytes);
  void release_pinned(void* p) noexcept;
  // Activation statistics of a float32 tensor in this memory (eval/exec/device_scan.h; scratch of
  // its own, made on first use); false for a tensor in another memory. Waits for the device.
  bool scan(const Tensor& t, const Tensor* ref, float clip_amax, const Tensor* channel_clip, kernels::ScanTotals& out);
  // The same scan queued on the stream: writes `result` (pinned, kernels::cuda::scan_result_bytes)
  // when it runs; read it (kernels::cuda::read_scan_result) after synchronize().
  bool queue_scan(const Tensor& t, const Tensor* ref, float clip_amax, const Tensor* channel_clip, void* result);
  // Queues kernels::cuda::channel_abs_max of float32 `t` (its last axis the channels) into
  // float32 `amax` [channels], both in this memory; false otherwise. No wait.
  bool channel_amax(const Tensor& t, Tensor& amax);

 private:
  int device_;
  void* stream_ = nullptr;
  std::recursive_mutex mu_;
  void* scan_scratch_ = nullptr;
  void* scan_result_ = nullptr;  // scan()'s (pinned)
  // QEVAL_PROFILE_STEPS: calls, bytes and host time of each kind of memory call, printed to
  // stderr when this memory goes.
  struct Traffic {
    std::uint64_t calls = 0, bytes = 0;
    double ms = 0;
  };
  enum TrafficKind { kAllocate, kRelease, kToDevice, kToHost, kScanWait, kTrafficKinds };
  Traffic traffic_[kTrafficKinds];
  class Timed;
};

// eval/exec/device_scan.h's ScanQueue for values in `memory`.
std::unique_ptr<ScanQueue> make_cuda_scan_queue(std::shared_ptr<CudaMemory> memory);

}  // namespace qeval::eval
