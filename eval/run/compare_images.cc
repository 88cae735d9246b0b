// compare-images: pairing, per-pair comparison in parallel, gate evaluation, worst-pair strips.
#include "eval/run/compare_images.h"

#include <fmt/format.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "base/progress.h"
#include "datasets/image_io.h"
#include "eval/run/outputs.h"
#include "kernels/error.h"
#include "kernels/pooling.h"
#include "metrics/metric_registry.h"
#include "metrics/stats.h"
#include "qeval/version.h"
#include "reports/heatmap.h"
#include "reports/metric_format.h"

namespace qeval::eval {

namespace {

// Keeps the first `channels` planes of a [C, H, W] image.
Tensor first_planes(Tensor&& planes, int channels) {
  if (channels == planes.dim(0)) return std::move(planes);
  Tensor out(DType::kFloat32, {channels, planes.dim(1), planes.dim(2)});
  std::copy_n(planes.data<float>(), out.numel(), out.data<float>());
  return out;
}

struct PreparedPair {
  Tensor ref, test;
  double peak;
};

// Loads both sides and makes them comparable, or sets row.error and returns nullopt.
std::optional<PreparedPair> prepare(const datasets::ImagePairEntry& entry, const CompareImagesOptions& options,
                                    reports::PairRow& row) {
  auto fail = [&](const char* kind, std::string message) {
    row.error_kind = kind;
    row.error = std::move(message);
    return std::nullopt;
  };
  if (!entry.ref) return fail("missing_ref", "no reference image with this name in " + options.ref_dir.string());
  if (!entry.test) return fail("missing_test", "no test image with this name in " + options.test_dir.string());
  datasets::Image ref, test;
  try {
    ref = datasets::load_image(*entry.ref);
    test = datasets::load_image(*entry.test);
  } catch (const InputError& e) {
    return fail("unreadable", e.what());
  }
  row.width = ref.width();
  row.height = ref.height();
  row.bit_depth = ref.bit_depth;
  row.color_type = ref.color_type();
  if (ref.width() != test.width() || ref.height() != test.height())
    return fail("size_mismatch", fmt::format("reference is {}x{}, test is {}x{}", ref.width(), ref.height(),
                                             test.width(), test.height()));
  if (ref.bit_depth != test.bit_depth)
    return fail("bit_depth_mismatch",
                fmt::format("reference is {}-bit, test is {}-bit", ref.bit_depth, test.bit_depth));
  if (ref.color_channels() != test.color_channels())
    return fail("channel_mismatch", "reference is " + ref.color_type() + ", test is " + test.color_type());
  int channels = ref.color_channels();
  if (ref.has_alpha || test.has_alpha) {
    if (options.alpha == AlphaMode::kIgnore) {
      row.notes.push_back("alpha channel ignored (--alpha compare includes it)");
    } else if (ref.has_alpha != test.has_alpha) {
      return fail("channel_mismatch", "reference is " + ref.color_type() + ", test is " + test.color_type() +
                                          ": only one side has alpha (--alpha ignore drops it)");
    } else {
      channels += 1;
      row.notes.push_back("alpha channel compared as a channel");
    }
  }
  row.channels = channels;
  const double peak = options.peak.value_or(ref.peak());
  return PreparedPair{first_planes(std::move(ref.planes), channels), first_planes(std::move(test.planes), channels),
                      peak};
}

double max_abs_difference(const Tensor& a, const Tensor& b) {
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  float m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

}  // namespace

reports::PairRow compare_pair(const datasets::ImagePairEntry& entry, const CompareImagesOptions& options) {
  reports::PairRow row;
  row.name = entry.name;
  if (entry.ref) row.ref_path = entry.ref->string();
  if (entry.test) row.test_path = entry.test->string();
  try {
    auto pair = prepare(entry, options, row);
    if (!pair) return row;
    const metrics::ImageMetricOptions metric_options{pair->peak, options.ssim_convention};
    for (const auto& metric : metrics::image_metrics())
      metric->compute(pair->ref, pair->test, metric_options, row.metrics);
    row.max_abs_diff = max_abs_difference(pair->ref, pair->test);
    row.identical = row.max_abs_diff == 0;
  } catch (const std::exception& e) {
    row.error_kind = "internal";
    row.error = std::string("internal error while comparing: ") + e.what();
  }
  return row;
}

std::vector<reports::PairRow> compare_pairs(const std::vector<datasets::ImagePairEntry>& entries,
                                            const CompareImagesOptions& options, const std::function<void()>& on_done) {
  std::vector<reports::PairRow> rows(entries.size());
  tbb::parallel_for(std::size_t(0), entries.size(), [&](std::size_t i) {
    // Isolated: a thread waiting inside this pair's parallel metric kernels must not start another
    // pair (and hold a second set of image buffers) from the outer loop.
    tbb::this_task_arena::isolate([&] { rows[i] = compare_pair(entries[i], options); });
    if (on_done) on_done();
  });
  return rows;
}

std::vector<GateSample> gate_samples(const std::vector<reports::PairRow>& rows) {
  std::vector<GateSample> samples;
  samples.reserve(rows.size());
  for (const auto& row : rows) {
    GateSample s;
    s.name = row.name;
    s.error = !row.ok();
    s.error_text = row.error;
    if (row.ok()) {
      for (const auto& m : row.metrics)
        s.values[m.key] = metrics::counted_value(metrics::find_metric(m.key), m.value, row.identical);
      s.values[metrics::keys::kMaxAbsDiff] = row.max_abs_diff;
    }
    samples.push_back(std::move(s));
  }
  return samples;
}

std::vector<reports::SummaryRow> summarize_rows(const std::vector<reports::PairRow>& rows) {
  std::vector<reports::SummaryRow> out;
  auto samples = gate_samples(rows);
  for (const metrics::MetricDef& def : metrics::metric_defs()) {
    if (def.scope != metrics::MetricScope::kImagePair || !def.summarized) continue;
    const std::string key(def.key);
    std::vector<std::optional<double>> values;
    for (const auto& sample : samples) {
      if (sample.error) continue;
      auto it = sample.values.find(key);
      values.push_back(it == sample.values.end() ? std::nullopt : it->second);
    }
    out.push_back(reports::summarize_metric(key, values));
  }
  return out;
}

namespace {

// "PSNR dB 31.20  SSIM 0.98765  MS-SSIM 0.99012": the headline metrics that have a value.
std::string headline_caption(const reports::PairRow& row) {
  std::string out;
  for (const metrics::MetricDef& def : metrics::metric_defs()) {
    if (def.scope != metrics::MetricScope::kImagePair || !def.headline) continue;
    const auto* m = row.metric(std::string(def.key));
    if (!m || !m->value) continue;
    out += (out.empty() ? "" : "  ") + std::string(def.label) + " " + reports::format_metric(def, *m->value);
  }
  return out;
}

}  // namespace

datasets::Rgb8 image_thumbnail(const Tensor& planes, double peak, int f) {
  const int c = static_cast<int>(planes.dim(0)), h = static_cast<int>(planes.dim(1)),
            w = static_cast<int>(planes.dim(2));
  datasets::Rgb8 out;
  out.channels = c >= 3 ? 3 : 1;
  for (int k = 0; k < out.channels; ++k) {
    auto pooled = kernels::pool_plane(planes.data<float>() + std::size_t(k) * h * w, h, w, f,
                                      kernels::PoolMode::kAverage, &out.height, &out.width);
    if (k == 0) out.pixels.resize(pooled.size() * out.channels);
    for (std::size_t p = 0; p < pooled.size(); ++p)
      out.pixels[p * out.channels + k] =
          static_cast<std::uint8_t>(std::clamp(std::lround(pooled[p] / peak * 255.0), 0L, 255L));
  }
  return out;
}

DifferenceHeatmap difference_heatmap(const Tensor& ref, const Tensor& test, double peak, int f) {
  const int c = static_cast<int>(ref.dim(0)), h = static_cast<int>(ref.dim(1)), w = static_cast<int>(ref.dim(2));
  // Difference: max over channels at full resolution, then max-pooled so that a small defect
  // survives the thumbnail.
  std::vector<float> diff(std::size_t(h) * w, 0.0f);
  const float* a = ref.data<float>();
  const float* b = test.data<float>();
  for (int k = 0; k < c; ++k)
    for (std::size_t p = 0; p < diff.size(); ++p)
      diff[p] = std::max(diff[p], std::abs(a[k * diff.size() + p] - b[k * diff.size() + p]));
  std::vector<double> sample(diff.begin(), diff.end());
  const double level = peak / 255.0;
  DifferenceHeatmap out;
  out.scale = std::max(metrics::percentile(sample, 99.9).value_or(0.0), level);
  int th = 0, tw = 0;
  auto pooled = kernels::pool_plane(diff.data(), h, w, f, kernels::PoolMode::kMax, &th, &tw);
  out.image = datasets::Rgb8{tw, th, 3, reports::heatmap_rgb(pooled, static_cast<float>(out.scale))};
  return out;
}

std::vector<reports::ImageStrip> worst_strips(const std::vector<reports::PairRow>& rows,
                                              const CompareImagesOptions& options) {
  std::vector<const reports::PairRow*> candidates;
  for (const auto& r : rows)
    if (r.ok() && !r.identical) candidates.push_back(&r);
  auto key = [](const reports::PairRow* r) {
    const auto* s = r->metric(metrics::keys::kSsim);
    const auto* p = r->metric(metrics::keys::kPsnrDb);
    return std::pair(s && s->value ? *s->value : 2.0, p && p->value ? *p->value : 1e9);
  };
  std::stable_sort(candidates.begin(), candidates.end(), [&](auto* a, auto* b) { return key(a) < key(b); });
  candidates.resize(std::min(candidates.size(), static_cast<std::size_t>(std::max(0, options.worst))));

  std::vector<std::optional<reports::ImageStrip>> strips(candidates.size());
  tbb::parallel_for(std::size_t(0), candidates.size(), [&](std::size_t idx) {
    const reports::PairRow* row = candidates[idx];
    datasets::ImagePairEntry entry{row->name, row->ref_path, row->test_path};
    reports::PairRow scratch;
    auto pair = prepare(entry, options, scratch);
    if (!pair) return;  // the file changed since it was compared; nothing to show
    const int h = static_cast<int>(pair->ref.dim(1)), w = static_cast<int>(pair->ref.dim(2));
    const int f = std::max(1, (std::max(h, w) + options.thumbnail_px - 1) / options.thumbnail_px);
    // The run report's one fixed scale (8-bit levels, also for 16-bit pairs) and its amplified view.
    const FixedScaleHeatmaps heat = fixed_scale_heatmaps(pair->ref, pair->test, pair->peak, f);

    reports::ImageStrip strip;
    strip.name = row->name;
    strip.caption = headline_caption(*row);
    strip.ref_png = datasets::encode_png(image_thumbnail(pair->ref, pair->peak, f));
    strip.test_png = datasets::encode_png(image_thumbnail(pair->test, pair->peak, f));
    strip.heatmap_png = datasets::encode_png(heat.fixed);
    strip.heatmap_x8_png = datasets::encode_png(heat.amplified);
    strip.heatmap_legend = fixed_scale_legend(heat.max_diff_255);
    strip.heatmap_x8_legend = amplified_legend(heat.max_diff_255);
    strips[idx] = std::move(strip);
  });
  std::vector<reports::ImageStrip> out;
  for (auto& s : strips)
    if (s) out.push_back(std::move(*s));
  return out;
}

reports::CompareImagesReport run_compare_images(const CompareImagesOptions& options, const Gate& gate,
                                                bool show_progress) {
  const auto start = std::chrono::steady_clock::now();
  auto entries = datasets::pair_image_sets(options.ref_dir, options.test_dir);
  if (entries.empty())
    throw InputError("no images (.png, .jpg, .jpeg) found in " + options.ref_dir.string() + " or " +
                     options.test_dir.string());

  reports::CompareImagesReport report;
  report.tool_version = QEVAL_VERSION;
  {
    base::Progress progress("compare-images", entries.size(), show_progress, {"pairs"});
    report.pairs = compare_pairs(entries, options, [&] { progress.tick(); });
  }
  GateOutcome outcome = evaluate_gate(gate, gate_samples(report.pairs));
  for (std::size_t i = 0; i < report.pairs.size(); ++i) report.pairs[i].failed_checks = outcome.failed_checks[i];
  report.gate = std::move(outcome.section);
  report.summary = summarize_rows(report.pairs);
  report.worst = worst_strips(report.pairs, options);

  const auto convention = options.ssim_convention;
  report.config = {
      {"ref", options.ref_dir.string()},
      {"test", options.test_dir.string()},
      {"ssim_convention", std::string(metrics::ssim_convention_name(convention))},
      {"alpha", options.alpha == AlphaMode::kIgnore ? "ignore" : "compare"},
      {"peak", options.peak ? fmt::format("{:g}", *options.peak) : "from bit depth (255 or 65535)"},
  };
  const metrics::ImageMetricOptions metric_options{options.peak.value_or(255.0), convention};
  for (const auto& metric : metrics::image_metrics())
    for (auto& c : metric->conventions(metric_options)) report.conventions.push_back(std::move(c));
  report.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace qeval::eval
