// The metric registry: adding an image metric is one file plus one line in QEVAL_IMAGE_METRICS.
#include <limits>
#include <stdexcept>

#include "metrics/image_metric.h"
#include "metrics/metric_registry.h"

// The image metrics, in report order: one line each; X(name) calls `make_<name>_metric()`, which
// metrics/<name>.cc defines (a metric needs no header: nothing outside finds it but by name).
#define QEVAL_IMAGE_METRICS(X) \
  X(psnr)                      \
  X(ssim)                      \
  X(ms_ssim)                   \
  X(gmsd)                      \
  /* end of the list */

namespace qeval::metrics {

#define QEVAL_DECLARE_IMAGE_METRIC(name) std::unique_ptr<ImageMetric> make_##name##_metric();
QEVAL_IMAGE_METRICS(QEVAL_DECLARE_IMAGE_METRIC)
#undef QEVAL_DECLARE_IMAGE_METRIC

const std::vector<std::unique_ptr<ImageMetric>>& image_metrics() {
  static const std::vector<std::unique_ptr<ImageMetric>> metrics = [] {
    std::vector<std::unique_ptr<ImageMetric>> m;
#define QEVAL_MAKE_IMAGE_METRIC(name) m.push_back(make_##name##_metric());
    QEVAL_IMAGE_METRICS(QEVAL_MAKE_IMAGE_METRIC)
#undef QEVAL_MAKE_IMAGE_METRIC
    return m;
  }();
  return metrics;
}

const ImageMetric* find_image_metric(std::string_view name) {
  for (const auto& m : image_metrics())
    if (m->name() == name) return m.get();
  return nullptr;
}

std::vector<std::pair<std::string, std::string>> ImageMetric::conventions(const ImageMetricOptions&) const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const MetricDef& d : defs())
    if (!d.definition.empty()) out.emplace_back(d.key, d.definition);
  return out;
}

void check_image_pair(const Tensor& ref, const Tensor& test) {
  if (ref.dtype() != DType::kFloat32 || test.dtype() != DType::kFloat32 || ref.rank() != 3)
    throw std::invalid_argument("image metrics need float32 [C, H, W] tensors, got " +
                                std::string(dtype_name(ref.dtype())) + " " + shape_to_string(ref.shape()));
  if (ref.shape() != test.shape())
    throw std::invalid_argument("image shapes differ: reference " + shape_to_string(ref.shape()) + " vs test " +
                                shape_to_string(test.shape()));
}

namespace {

// The metrics that are not image metrics (computed by tensor_error, segmentation, the drivers).
constexpr MetricDef kOtherMetrics[] = {
    {.key = keys::kMaxAbsDiff,
     .label = "max |diff|",
     .unit = "sample levels",
     .higher_is_better = false,
     .scope = MetricScope::kImagePair,
     .summarized = true},
    {.key = keys::kSqnrDb,
     .label = "SQNR dB",
     .unit = "dB",
     .scope = MetricScope::kTensorPair,
     .decimals = 2,
     .unbounded_when_identical = true},
    {.key = keys::kCosine, .label = "cosine", .scope = MetricScope::kTensorPair, .decimals = 5},
    {.key = keys::kRelL2, .label = "rel L2", .higher_is_better = false, .scope = MetricScope::kTensorPair},
    {.key = keys::kMaxAbs, .label = "max |err|", .higher_is_better = false, .scope = MetricScope::kTensorPair},
    {.key = keys::kMaskIou, .label = "mask IoU", .scope = MetricScope::kMask},
    {.key = keys::kBoundaryF, .label = "boundary F", .scope = MetricScope::kMask},
    {.key = keys::kFlippedFraction, .label = "flipped pixels", .higher_is_better = false, .scope = MetricScope::kMask},
    {.key = keys::kNonfinite,
     .label = "NaN/Inf",
     .unit = "values",
     .higher_is_better = false,
     .scope = MetricScope::kCount},
};

}  // namespace

const std::vector<MetricDef>& metric_defs() {
  static const std::vector<MetricDef> defs = [] {
    std::vector<MetricDef> d;
    for (const auto& m : image_metrics())
      for (const MetricDef& def : m->defs()) d.push_back(def);
    for (const MetricDef& def : kOtherMetrics) d.push_back(def);
    for (std::size_t i = 0; i < d.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        if (d[i].key == d[j].key) throw std::logic_error("metric key registered twice: " + std::string(d[i].key));
    return d;
  }();
  return defs;
}

const MetricDef* find_metric(std::string_view key) {
  const MetricDef* best = nullptr;
  for (const MetricDef& d : metric_defs()) {
    if (d.key == key) return &d;
    if (key.size() > d.key.size() && key.ends_with(d.key)) {
      const char sep = key[key.size() - d.key.size() - 1];
      if ((sep == '_' || sep == '.') && (!best || d.key.size() > best->key.size())) best = &d;
    }
  }
  return best;
}

const MetricDef& metric_def(std::string_view key) {
  const MetricDef* d = find_metric(key);
  if (!d) throw std::logic_error("metric '" + std::string(key) + "' is not registered (metrics/registry.cc)");
  return *d;
}

std::vector<std::string> metric_keys(MetricScope scope) {
  std::vector<std::string> out;
  for (const MetricDef& d : metric_defs())
    if (d.scope == scope) out.emplace_back(d.key);
  return out;
}

std::optional<double> counted_value(const MetricDef* def, const std::optional<double>& value, bool identical) {
  if (value) return value;
  if (identical && def && def->unbounded_when_identical) return std::numeric_limits<double>::infinity();
  return std::nullopt;
}

}  // namespace qeval::metrics
