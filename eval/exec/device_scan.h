// Activation statistics of values that live in a device's memory, without copying them to the
// host (kernels/scan_totals.h): what observers use on a device backend. A device backend
// registers its scans when it is made (the CUDA backend: kernels/cuda/scan.h); without one, or for
// a tensor it does not own, observers copy the values to the host instead.
#pragma once

#include <memory>
#include <vector>

#include "kernels/scan_totals.h"
#include "kernels/tensor.h"

namespace qeval::eval {

// Scans float32 `t` in device memory, against `ref` (null, or a float32 tensor of t's size in the
// same device's memory with every value finite): fills `out` and returns true; false (nothing
// done) when no registered scan takes this tensor. Waits for the device. With `channel_clip`
// (float32 [channels] in t's memory, channels = t's last axis) the clip count is per channel, each
// element against its channel's threshold, and clip_amax is not used.
bool scan_on_device(const Tensor& t, const Tensor* ref, float clip_amax, kernels::ScanTotals& out,
                    const Tensor* channel_clip = nullptr);

// Scans queued behind a device's work and read back together: one wait for many, where nothing
// needs an answer before then (a local-error run's comparison). Not thread-safe: one per thread.
class ScanQueue {
 public:
  virtual ~ScanQueue() = default;
  // Queues the scan scan_on_device would make: false (nothing queued) where it would be false,
  // or `t` is in another device's memory than the scans queued so far. The tensors may be freed
  // or reused by later device work once this returns (the scan runs before it).
  virtual bool add(const Tensor& t, const Tensor* ref, float clip_amax, const Tensor* channel_clip) = 0;
  virtual std::size_t size() const = 0;
  // Waits for the device; `out` (replaced) holds every queued scan's totals in the order added,
  // and the queue is empty.
  virtual void take(std::vector<kernels::ScanTotals>& out) = 0;
};

// A queue for scans of values in `device`'s memory; null when no registered scan serves it.
std::unique_ptr<ScanQueue> make_scan_queue(const std::shared_ptr<DeviceMemory>& device);

// Folds the largest finite |x| of each channel (the last axis) of float32 `t` in device memory
// into `amax` (float32 [channels] in the same memory, >= 0: the larger stays), queued behind the
// device's work: no wait, nothing crosses to the host (calibration's per-channel ranges). False
// (nothing done) when no registered scan serves `t` and `amax`.
bool channel_amax_on_device(const Tensor& t, Tensor& amax);

using DeviceScan = bool (*)(const Tensor& t, const Tensor* ref, float clip_amax, const Tensor* channel_clip,
                            kernels::ScanTotals& out);
using MakeScanQueue = std::unique_ptr<ScanQueue> (*)(const std::shared_ptr<DeviceMemory>& device);
using ChannelAmax = bool (*)(const Tensor& t, Tensor& amax);
void register_device_scan(DeviceScan scan, MakeScanQueue make_queue, ChannelAmax channel_amax);

// Whether scan_on_device / ScanQueue::add take these tensors' types, sizes and places (the
// registered scan still decides on the device).
bool scannable(const Tensor& t, const Tensor* ref, const Tensor* channel_clip = nullptr);

// Scans queued with what each one is for (`Item`), read back together in the order queued: the
// ScanQueue of the first tensor's device, made on the first add. Not thread-safe.
template <class Item>
class QueuedScans {
 public:
  // Queues t's scan (ScanQueue::add) with `item`; false (nothing queued) where it would not go.
  bool add(const Tensor& t, const Tensor* ref, float clip_amax, const Tensor* channel_clip, Item item) {
    if (!scannable(t, ref, channel_clip)) return false;
    if (!queue_) queue_ = make_scan_queue(t.device());
    if (!queue_ || !queue_->add(t, ref, clip_amax, channel_clip)) return false;
    items_.push_back(std::move(item));
    return true;
  }
  std::size_t size() const { return items_.size(); }
  // Waits for the device once, then each(item, totals) for every queued scan, in order; empty after.
  template <class Each>
  void take(Each&& each) {
    if (items_.empty()) return;
    queue_->take(totals_);
    for (std::size_t k = 0; k < items_.size(); ++k) each(items_[k], totals_[k]);
    items_.clear();
  }

 private:
  std::unique_ptr<ScanQueue> queue_;
  std::vector<Item> items_;
  std::vector<kernels::ScanTotals> totals_;
};

}  // namespace qeval::eval
