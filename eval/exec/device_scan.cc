#include "eval/exec/device_scan.h"

#include <atomic>

namespace qeval::eval {

namespace {
std::atomic<DeviceScan> g_scan{nullptr};
}

void register_device_scan(DeviceScan scan) { g_scan.store(scan); }

bool scan_on_device(const Tensor& t, const Tensor* ref, float clip_amax, kernels::ScanTotals& out) {
  const DeviceScan scan = g_scan.load();
  if (!scan || !t.on_device() || t.dtype() != DType::kFloat32) return false;
  if (ref && (!ref->on_device() || ref->device() != t.device() || ref->dtype() != DType::kFloat32 ||
              ref->numel() != t.numel()))
    return false;
  return scan(t, ref, clip_amax, out);
}

}  // namespace qeval::eval
