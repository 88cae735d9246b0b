// The metric registry: every metric key qeval reports, with its identity (metric_def.h). Code outside
// metrics/ names a metric through these constants or a lookup, never by spelling it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "metrics/metric_def.h"

namespace qeval::metrics {

// Keys that code outside metrics/ must name (what a driver computes itself, what a table orders
// by). A metric only reports and gates read needs no constant: registering it is enough.
namespace keys {
inline constexpr char kPsnrDb[] = "psnr_db";
inline constexpr char kPsnrYDb[] = "psnr_y_db";
inline constexpr char kMse[] = "mse";
inline constexpr char kSsim[] = "ssim";
inline constexpr char kMsSsim[] = "ms_ssim";
inline constexpr char kMaxAbsDiff[] = "max_abs_diff";
inline constexpr char kSqnrDb[] = "sqnr_db";
inline constexpr char kCosine[] = "cosine";
inline constexpr char kRelL2[] = "rel_l2";
inline constexpr char kMaxAbs[] = "max_abs";
inline constexpr char kMaskIou[] = "mask_iou";
inline constexpr char kBoundaryF[] = "boundary_f";
inline constexpr char kFlippedFraction[] = "flipped_fraction";
inline constexpr char kNonfinite[] = "nonfinite";
}  // namespace keys

// Every registered key, in report order: the image metrics' (image_metrics() order), then
// max_abs_diff, the tensor-pair, mask and count metrics.
const std::vector<MetricDef>& metric_defs();

// The metric a key names: the key itself, or a qualified key "<prefix>_<key>" / "<prefix>.<key>"
// (the longest registered key it ends with). nullptr when none.
const MetricDef* find_metric(std::string_view key);

// As find_metric for a key the code itself names; throws std::logic_error when unregistered.
const MetricDef& metric_def(std::string_view key);

// The registered keys of one scope, in report order.
std::vector<std::string> metric_keys(MetricScope scope);

// The value gates and summaries count for one sample (the one rule, docs/gate.md "Rules"): the value
// when there is one; +inf when there is none, the sample is identical to the reference and the
// metric is unbounded on identical inputs (PSNR, SQNR); otherwise none ("not applicable").
// `def` may be null (an unregistered key): its missing values are not applicable.
std::optional<double> counted_value(const MetricDef* def, const std::optional<double>& value, bool identical);

}  // namespace qeval::metrics
