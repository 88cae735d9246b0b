// Statistics from the totals of a pass made elsewhere (a device: kernels/cuda/scan.h), added as
// ActivationStats::add / add_with_error add a host pass. Counts, clipping, absmax and the histogram
// are the same; the moments and error energies are sums in another order (double per element on
// the device, float lanes of 8 on the host): equal to ~1e-7 relative, not to the bit.
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/scan_totals.h"
#include "metrics/activation_stats.h"

namespace qeval::metrics {

// As act.add(x, n, clip): the totals of a pass without a reference. Returns the sum of x^2 when
// every value was finite and below 2^60, else nullopt.
std::optional<double> add_scan(ActivationStats& act, const kernels::ScanTotals& s);
// As add_with_error(act, err, test, ref, ref_sum_sq, n, clip) for a pass against the reference
// whose test values were all finite (s.nan == s.inf == 0; otherwise std::invalid_argument: the
// error of a diverged tensor needs both tensors, tensor_error).
TensorError add_scan_with_error(ActivationStats& act, ErrorStats& err, const kernels::ScanTotals& s,
                                double ref_sum_sq, std::int64_t n);
// As tensor_error(ref, test, n) from a pass against a reference whose values are all finite
// (ScanTotals::ref_sq, first_nonfinite): the same counts and divergence (a non-finite test value
// makes every statistic unbounded), the energies in another summation order, the cosine from them.
TensorError error_from_scan(const kernels::ScanTotals& s);

}  // namespace qeval::metrics
