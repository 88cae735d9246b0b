// What one pass over float32 values found, for activation statistics: counts, extremes, moments,
// the error against a reference, and counts per |x| bin. A device computes it (kernels/cuda:
// scan_values) and only this crosses to the host; metrics::add_scan (metrics/scan_totals.h) adds
// it to the statistics as a host pass over the same values would.
#pragma once

#include <array>
#include <cstdint>

namespace qeval::kernels {

struct ScanTotals {
  // The bins of metrics::LogAbsHistogram (kSubBins = 8 per octave, 2^-32 .. 2^32, one bin each
  // below and above): bin = clamp((|x| bits >> 20) - ((127 - 32) << 3) + 1, 0, kBins - 1).
  static constexpr int kBins = 514;
  // Sampling of the histogram, as metrics::ActivationStats::add: tensors of kSampleFrom elements
  // or more put one chunk (kChunk elements) of every kBlock chunks in it, the chunk at
  // (block * kHashMultiplier) >> 29 in its block.
  static constexpr std::int64_t kSampleFrom = 8192, kChunk = 16, kBlock = 8;
  static constexpr std::uint32_t kHashMultiplier = 0x9E3779B1u;

  std::uint64_t finite = 0, nan = 0, inf = 0;
  std::uint64_t clipped = 0;         // finite, |x| > the clip threshold
  std::uint32_t max_bits = 0;        // of the largest finite |x|
  bool plain = true;                 // every value finite and below 2^60
  double sum = 0, sum_sq = 0;        // over the finite values
  double err_sq = 0, err_max = 0;    // against a reference: over values finite on both sides
  double ref_sq = 0;                 // the reference's sum of squares over the same values
  std::int64_t first_nonfinite = -1; // index of the first NaN/Inf value; -1 when none
  std::array<std::uint64_t, kBins> hist{};
};

}  // namespace qeval::kernels
