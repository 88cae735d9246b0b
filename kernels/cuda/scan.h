// Activation statistics of a float32 tensor in device memory (kernels/scan_totals.h): one pass,
// only the totals (~4 KB) come back to the host. Deterministic: sums combine in a fixed order
// (per thread, a shared-memory tree, then the blocks in order); the histogram's integer counts
// are added with atomics, which gives the same counts in any order. No CUDA header needed.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/scan_totals.h"

namespace qeval::kernels::cuda {

// Device scratch scan_values needs (bytes), whatever the tensor.
std::size_t scan_scratch_bytes();
// Scans x[0..n) (device memory), and against ref[0..n) when not null (device memory, every value
// finite): counts, max |x| bits, clipping (|x| > |clip_amax|; NaN clips nothing), moments in
// double, the error sums over finite x, the |x| histogram (sampled as metrics::ActivationStats::add
// samples). Runs on `stream` (a cudaStream_t) after the work already there; returns when `out`
// holds the totals.
void scan_values(const float* x, const float* ref, std::int64_t n, float clip_amax, void* scratch, ScanTotals& out,
                 void* stream);

}  // namespace qeval::kernels::cuda
