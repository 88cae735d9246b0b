#include "eval/exec/device_scan.h"

#include <atomic>

namespace qeval::eval {

namespace {
std::atomic<DeviceScan> g_scan{nullptr};
std::atomic<MakeScanQueue> g_make_queue{nullptr};
std::atomic<ChannelAmax> g_channel_amax{nullptr};
}  // namespace

void register_device_scan(DeviceScan scan, MakeScanQueue make_queue, ChannelAmax channel_amax) {
  g_scan.store(scan);
  g_make_queue.store(make_queue);
  g_channel_amax.store(channel_amax);
}

bool channel_amax_on_device(const Tensor& t, Tensor& amax) {
  const ChannelAmax f = g_channel_amax.load();
  return f && t.on_device() && amax.on_device() && t.device() == amax.device() && f(t, amax);
}

bool scannable(const Tensor& t, const Tensor* ref, const Tensor* channel_clip) {
  if (!t.on_device() || t.dtype() != DType::kFloat32) return false;
  if (channel_clip && (!channel_clip->on_device() || channel_clip->device() != t.device() ||
                       channel_clip->dtype() != DType::kFloat32 || t.rank() == 0 ||
                       channel_clip->numel() != t.shape().back()))
    return false;
  return !ref || (ref->on_device() && ref->device() == t.device() && ref->dtype() == DType::kFloat32 &&
                  ref->numel() == t.numel());
}

bool scan_on_device(const Tensor& t, const Tensor* ref, float clip_amax, kernels::ScanTotals& out,
                    const Tensor* channel_clip) {
  const DeviceScan scan = g_scan.load();
  return scan && scannable(t, ref, channel_clip) && scan(t, ref, clip_amax, channel_clip, out);
}

std::unique_ptr<ScanQueue> make_scan_queue(const std::shared_ptr<DeviceMemory>& device) {
  const MakeScanQueue make = g_make_queue.load();
  return make && device ? make(device) : nullptr;
}

}  // namespace qeval::eval
