// CudaMemory: cudaMalloc'd tensor storage and copies on the backend's stream.
#include "eval/exec/cuda/device_memory.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>

#include <cstddef>
#include <new>
#include <stdexcept>
#include <vector>

#include "eval/exec/session.h"
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

// Times one memory call into traffic_ when profiling (eval/exec/session.h profiling_steps).
class CudaMemory::Timed {
 public:
  Timed(CudaMemory& m, TrafficKind kind, std::size_t bytes)
      : t_(profiling_steps() ? &m.traffic_[kind] : nullptr), bytes_(bytes) {
    if (t_) since_ = std::chrono::steady_clock::now();
  }
  ~Timed() {
    if (!t_) return;
    ++t_->calls;
    t_->bytes += bytes_;
    t_->ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since_).count();
  }

 private:
  Traffic* t_;
  std::size_t bytes_;
  std::chrono::steady_clock::time_point since_;
};

CudaMemory::~CudaMemory() {
  if (profiling_steps()) {
    static const char* const kNames[kTrafficKinds] = {"allocate", "release", "to device", "to host", "scan wait"};
    std::fprintf(stderr, "QEVAL_PROFILE_STEPS %s memory calls (host time):\n", name().c_str());
    for (int k = 0; k < kTrafficKinds; ++k)
      std::fprintf(stderr, "  %-12s %10llu calls %10.3f GB %10.1f ms\n", kNames[k],
                   static_cast<unsigned long long>(traffic_[k].calls), double(traffic_[k].bytes) / 1e9, traffic_[k].ms);
  }
  if (scan_scratch_) release(scan_scratch_);
  if (scan_result_) release_pinned(scan_result_);
  if (stream_) {
    cudaStreamSynchronize(as_stream(stream_));
    cudaStreamDestroy(as_stream(stream_));
  }
}

void* CudaMemory::allocate_pinned(std::size_t bytes) {
  const auto held = lock();
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocMapped) != cudaSuccess) {
    cudaGetLastError();
    throw std::bad_alloc();
  }
  return p;
}

void CudaMemory::release_pinned(void* p) noexcept {
  std::lock_guard<std::recursive_mutex> held(mu_);
  cudaFreeHost(p);
}

bool CudaMemory::queue_scan(const Tensor& t, const Tensor* ref, float clip_amax, const Tensor* channel_clip,
                            void* result) {
  if (t.device().get() != this || (ref && ref->device().get() != this) ||
      (channel_clip && channel_clip->device().get() != this))
    return false;
  const auto held = lock();
  if (!scan_scratch_) scan_scratch_ = allocate(kernels::cuda::scan_scratch_bytes());  // zeroed
  kernels::cuda::scan_values(static_cast<const float*>(t.device_data()),
                             ref ? static_cast<const float*>(ref->device_data()) : nullptr, t.numel(), clip_amax,
                             channel_clip ? static_cast<const float*>(channel_clip->device_data()) : nullptr,
                             channel_clip ? channel_clip->numel() : 0, scan_scratch_, result, stream_);
  return true;
}

bool CudaMemory::channel_amax(const Tensor& t, Tensor& amax) {
  if (t.device().get() != this || amax.device().get() != this || t.dtype() != DType::kFloat32 ||
      amax.dtype() != DType::kFloat32 || t.rank() == 0 || amax.numel() != t.shape().back())
    return false;
  const auto held = lock();
  const std::int64_t channels = t.shape().back();
  kernels::cuda::channel_abs_max(static_cast<const float*>(t.device_data()), channels ? t.numel() / channels : 0,
                                 channels, amax.device_data(), stream_);
  return true;
}

bool CudaMemory::scan(const Tensor& t, const Tensor* ref, float clip_amax, const Tensor* channel_clip,
                      kernels::ScanTotals& out) {
  const auto held = lock();
  if (!scan_result_) scan_result_ = allocate_pinned(kernels::cuda::scan_result_bytes());
  if (!queue_scan(t, ref, clip_amax, channel_clip, scan_result_)) return false;
  const Timed timed(*this, kScanWait, 0);
  synchronize();
  kernels::cuda::read_scan_result(scan_result_, out);
  return true;
}

namespace {

// Results in pinned chunks of kPerChunk, kept for the queue's next scans.
class CudaScanQueue final : public ScanQueue {
 public:
  explicit CudaScanQueue(std::shared_ptr<CudaMemory> memory) : memory_(std::move(memory)) {}
  ~CudaScanQueue() override {
    try {
      memory_->synchronize();  // no scan writes a chunk after it is freed
    } catch (const std::exception&) {
      return;  // the device failed: its chunks leak rather than be written after they are freed
    }
    for (void* c : chunks_) memory_->release_pinned(c);
  }
  bool add(const Tensor& t, const Tensor* ref, float clip_amax, const Tensor* channel_clip) override {
    if (!scannable(t, ref, channel_clip) || t.device().get() != memory_.get()) return false;
    if (queued_ == chunks_.size() * kPerChunk) chunks_.push_back(memory_->allocate_pinned(kPerChunk * bytes_));
    if (!memory_->queue_scan(t, ref, clip_amax, channel_clip, slot(queued_))) return false;
    ++queued_;
    return true;
  }
  std::size_t size() const override { return queued_; }
  void take(std::vector<kernels::ScanTotals>& out) override {
    out.resize(queued_);
    if (queued_) memory_->synchronize();
    for (std::size_t k = 0; k < queued_; ++k) kernels::cuda::read_scan_result(slot(k), out[k]);
    queued_ = 0;
  }

 private:
  static constexpr std::size_t kPerChunk = 256;
  void* slot(std::size_t k) const { return static_cast<std::byte*>(chunks_[k / kPerChunk]) + (k % kPerChunk) * bytes_; }
  std::shared_ptr<CudaMemory> memory_;
  std::size_t bytes_ = (kernels::cuda::scan_result_bytes() + 63) / 64 * 64;
  std::vector<void*> chunks_;
  std::size_t queued_ = 0;
};

}  // namespace

std::unique_ptr<ScanQueue> make_cuda_scan_queue(std::shared_ptr<CudaMemory> memory) {
  return std::make_unique<CudaScanQueue>(std::move(memory));
}

std::unique_lock<std::recursive_mutex> CudaMemory::lock() {
  std::unique_lock<std::recursive_mutex> held(mu_);
  make_current(device_);
  return held;
}

void* CudaMemory::allocate(std::size_t bytes) {
  const auto held = lock();
  const Timed timed(*this, kAllocate, bytes);
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
  const Timed timed(*this, kRelease, 0);
  cudaFree(p);
}

void CudaMemory::to_device(void* dst, const void* host_src, std::size_t bytes) {
  if (!bytes) return;
  const auto held = lock();
  const Timed timed(*this, kToDevice, bytes);
  check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, as_stream(stream_)), "cudaMemcpy to device");
  // The host buffer may go away when this returns.
  synchronize();
}

void CudaMemory::to_host(void* host_dst, const void* src, std::size_t bytes) {
  if (!bytes) return;
  const auto held = lock();
  const Timed timed(*this, kToHost, bytes);
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
