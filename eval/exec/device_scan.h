// Activation statistics of values that live in a device's memory, without copying them to the
// host (kernels/scan_totals.h): what observers use on a device backend. A device backend
// registers its scan when it is made (the CUDA backend: kernels/cuda/scan.h); without one, or for
// a tensor it does not own, observers copy the values to the host instead.
#pragma once

#include "kernels/scan_totals.h"
#include "kernels/tensor.h"

namespace qeval::eval {

// Scans float32 `t` in device memory, against `ref` (null, or a float32 tensor of t's size in the
// same device's memory with every value finite): fills `out` and returns true; false (nothing
// done) when no registered scan takes this tensor.
bool scan_on_device(const Tensor& t, const Tensor* ref, float clip_amax, kernels::ScanTotals& out);

using DeviceScan = bool (*)(const Tensor& t, const Tensor* ref, float clip_amax, kernels::ScanTotals& out);
void register_device_scan(DeviceScan scan);

}  // namespace qeval::eval
