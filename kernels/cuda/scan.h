// Activation statistics of a float32 tensor in device memory (kernels/scan_totals.h): one pass,
// only the totals (~4 KB) come back to the host. Deterministic: sums combine in a fixed order
// (per thread, a shared-memory tree, then the blocks in order, by the last block to finish); the histogram's integer counts
// are added with atomics, which gives the same counts in any order. No CUDA header needed.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/scan_totals.h"

namespace qeval::kernels::cuda {

// Device scratch scan_values needs (bytes), whatever the tensor: zeroed once when allocated (each
// scan leaves it zeroed). Scans that share one scratch must be ordered (one stream).
std::size_t scan_scratch_bytes();
// Bytes of one scan's result: memory the device writes and read_scan_result reads (pinned,
// device-mapped host memory: nothing else crosses to the host).
std::size_t scan_result_bytes();
// Queues on `stream` (a cudaStream_t), after the work already there, one launch that scans
// x[0..n) (device memory), and against ref[0..n) when not null (device memory, every value
// finite): counts, max |x| bits, clipping (|x| > |clip_amax|; NaN clips nothing), moments in
// double, the error sums over finite x, the |x| histogram (sampled as metrics::ActivationStats::add
// samples). With `channel_clip` (device memory, `channels` > 0 thresholds, x's last axis that
// long) element i clips beyond |channel_clip[i % channels]| instead of |clip_amax| (SmoothQuant's
// per-channel ranges; the host's ActivationStats::add_clipped with a span). Writes `result` when
// it runs: read it after the stream has synchronised.
void scan_values(const float* x, const float* ref, std::int64_t n, float clip_amax, const float* channel_clip,
                 std::int64_t channels, void* scratch, void* result, void* stream);
void read_scan_result(const void* result, ScanTotals& out);
// Queues on `stream`: folds the largest finite |x| of each channel c of x[rows][channels] (device
// memory, row-major) into amax[c] (float32 in device memory, >= 0: the larger of the two stays).
// Deterministic (a maximum, whatever the order); nothing crosses to the host.
void channel_abs_max(const float* x, std::int64_t rows, std::int64_t channels, void* amax, void* stream);

}  // namespace qeval::kernels::cuda
