// report.html of `qeval run`: verdict, gate, variants, samples, ranked layers, the timestep x layer
// heatmap (canvas, drawn from embedded data), per-step error curves and histograms (inline SVG).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "reports/heatmap.h"
#include "reports/html.h"
#include "reports/json_text.h"
#include "reports/run_report.h"

namespace qeval::reports {

namespace {

using html::esc;
using html::fmt_value;
using html::sort_value;

constexpr std::size_t kRankedRowsShown = 30;  // more behind a "show all" button
constexpr std::size_t kImageRows = 24;        // samples shown as image rows (worst first)
constexpr std::size_t kHistogramLayers = 8;
constexpr std::size_t kSampleColumnsInOneTable = 12;
constexpr std::size_t kMetricColumnsInVariants =
    6;  // more metrics: one stacked cell  // (variant, metric) columns; more: a tab per variant
// Columns of the ranked-layer tables (all of them are in report.json).
constexpr std::string_view kRankedColumns[] = {"local_sqnr_db", "local_cosine", "local_rel_l2", "local_max_abs",
                                               "acc_sqnr_db",   "acc_rel_l2",   "absmax",       "p99_9",
                                               "clip_rate",     "nonfinite"};

constexpr const char* kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#b07aa1",
                                    "#edc948", "#76b7b2", "#ff9da7", "#9c755f", "#bab0ac"};

std::string variant_color(const RunReport& r, std::string_view name) {
  std::size_t k = 0;
  for (const auto& v : r.variants) {
    if (v.name == name) return v.reference ? "#555" : kPalette[k % std::size(kPalette)];
    k += !v.reference;
  }
  return "#999";
}

std::optional<double> opt(float v) {
  if (std::isnan(v)) return std::nullopt;
  return double(v);
}

std::string num_td(std::string_view metric, std::optional<double> v) {
  return "<td class=\"num\" data-v=\"" + sort_value(v) + "\">" + fmt_value(metric, v) + "</td>";
}

std::string share_text(std::optional<double> share) {
  return share ? fmt::format("{:.0f}%", 100.0 * *share) : "&ndash;";
}

// What a variant quantizes, per model: the share of MACs, then parameters and compute nodes (the
// one definition compare-recipes uses); node counts for a report without per-model shares.
std::string quantized_cell(const Variant& v) {
  if (v.quantization.empty())
    return fmt::format("<td class=\"num\" data-v=\"{}\">{} <span class=\"sub\">of nodes ({} of {})</span></td>",
                       sort_value(v.quantized_share()), share_text(v.quantized_share()), v.quantized_nodes,
                       v.total_nodes);
  double macs = 0, quantized = 0;
  bool known = true;
  std::string lines, untouched;
  for (const auto& q : v.quantization) {
    if (q.compute_nodes == 0) continue;
    if (q.macs && q.quantized_macs) macs += *q.macs, quantized += *q.quantized_macs;
    else known = false;
    if (q.quantized_nodes == 0 && q.quantized_params == 0) {
      untouched += (untouched.empty() ? "" : ", ") + esc(q.model);
      continue;
    }
    // No shapes recorded (--no-layers, or every unit reused from a saved state): no MAC share.
    const std::string macs_text = q.mac_share() ? share_text(q.mac_share()) + " <span class=\"sub\">of MACs"
                                                : "<span class=\"sub\">MACs not measured";
    lines += fmt::format("<div><b>{}</b> {} &middot; {} of params &middot; {}/{} nodes</span></div>", esc(q.model),
                         macs_text, share_text(q.param_share()), q.quantized_nodes, q.compute_nodes);
  }
  if (lines.empty()) lines = "0% <span class=\"sub\">(nothing quantized)</span>";
  else if (!untouched.empty()) lines += "<div class=\"sub\">0% of " + untouched + "</div>";
  return fmt::format("<td data-v=\"{}\">{}</td>", known && macs > 0 ? sort_value(quantized / macs) : "", lines);
}

// A named timing ("ms_per_sample", "calibration_s_cached", ...) as a reader says it.
std::string timing_text(std::string_view name, double value) {
  if (name == "ms_per_sample") return fmt::format("{:.0f} ms <span class=\"sub\">per sample</span>", value);
  if (name == "ms_per_step") return fmt::format("{:.1f} ms <span class=\"sub\">per step</span>", value);
  if (name == "wall_s") return fmt::format("{:.1f} s <span class=\"sub\">wall</span>", value);
  if (name == "calibration_s") return fmt::format("{:.1f} s <span class=\"sub\">calibration</span>", value);
  if (name == "calibration_s_cached")
    return fmt::format("{:.1f} s <span class=\"sub\">calibration (cached)</span>", value);
  return esc(name) + " " + fmt::format("{:.4g}", value);
}

std::string artifact_text(const Artifact& a) {
  std::string s = "<b>" + esc(a.name) + "</b>";
  if (!a.path.empty()) s += " <code>" + esc(a.path) + "</code>";
  if (!a.fingerprint.empty()) s += " <span class=\"sub\">" + esc(a.fingerprint) + "</span>";
  return s;
}

std::string variant_description(const Variant& v) {
  switch (v.kind) {
    case VariantKind::kRecipe:
      return "recipe " + (v.recipe ? artifact_text(*v.recipe) : std::string("?")) + " over " + esc(v.precision);
    case VariantKind::kOnnx: return "ONNX " + (v.onnx ? artifact_text(*v.onnx) : std::string("?"));
    case VariantKind::kPrecision: break;
  }
  return esc(v.precision);
}

// Layers of one table, worst first: lowest local SQNR, else lowest accumulated SQNR, else highest
// local relative L2. Unmeasured rows last.
std::vector<std::size_t> rank_layers(const LayerTable& t, std::size_t n_layers) {
  const std::vector<float>* key = nullptr;
  bool higher_is_worse = false;
  for (auto [col, worse_high] : {std::pair{&t.stats.local_sqnr_db, false}, std::pair{&t.stats.acc_sqnr_db, false},
                                 std::pair{&t.stats.local_rel_l2, true}, std::pair{&t.stats.acc_rel_l2, true}})
    if (!col->empty()) {
      key = col;
      higher_is_worse = worse_high;
      break;
    }
  std::vector<std::size_t> order(n_layers);
  for (std::size_t i = 0; i < n_layers; ++i) order[i] = i;
  if (!key) return order;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    float x = cell(*key, a), y = cell(*key, b);
    if (std::isnan(x) || std::isnan(y)) return !std::isnan(x) && std::isnan(y);
    return higher_is_worse ? x > y : x < y;
  });
  return order;
}

// The checks of one variant that failed, for the verdict lines.
std::vector<const GateCheckRow*> failed_checks(const GateSection& g, std::string_view variant) {
  std::vector<const GateCheckRow*> out;
  for (const auto& c : g.checks)
    if (!c.passed && c.variant == variant) out.push_back(&c);
  return out;
}

std::string section(const char* id, const char* title, std::string_view sub = {}) {
  std::string h = fmt::format("<section id=\"{}\"><h2>{}</h2>", id, title);
  if (!sub.empty()) h += "<div class=\"sub\">" + std::string(sub) + "</div>";
  return h;
}

// ------------------------------------------------------------------------------- sections

std::string render_verdict(const RunReport& r) {
  const std::size_t unmeasured = r.gate.not_measured();
  const Variant* ref = r.reference();
  std::string details =
      fmt::format("{} of {} gate checks passed{} &middot; {} variant(s) against {} &middot; {} sample(s)",
                  r.gate.passed_count(), r.gate.checks.size() - unmeasured,
                  unmeasured ? fmt::format(", {} not measured (neither pass nor fail)", unmeasured) : std::string(),
                  r.variants.size() - (ref ? 1 : 0), ref ? esc(ref->name) : "?", r.samples.size());
  if (r.config.steps > 0) details += fmt::format(" &middot; {} steps", r.config.steps);
  std::string h = section("verdict", "Verdict");
  h += html::verdict_banner(r.gate.passed, details);
  h += "<ul class=\"verdicts\">";
  for (const auto& v : r.variants) {
    if (v.reference) continue;
    auto failed_v = failed_checks(r.gate, v.name);
    std::size_t checks = 0, skipped = 0;
    for (const auto& c : r.gate.checks)
      if (c.variant == v.name) ++checks, skipped += !c.measured;
    h += "<li><b style=\"color:" + variant_color(r, v.name) + "\">" + esc(v.name) + "</b>: ";
    const std::string not_measured =
        skipped ? fmt::format("; <span class=\"nmv\">{} not measured</span>", skipped) : std::string();
    if (checks == 0) {
      h += "no gate check";
    } else if (failed_v.empty()) {
      h += fmt::format("<span class=\"ok\">pass</span> ({} checks{})", checks - skipped, not_measured);
    } else {
      h += fmt::format("<span class=\"no\">FAIL</span> ({} of {} checks failed{}: ", failed_v.size(), checks - skipped,
                       not_measured);
      for (std::size_t i = 0; i < failed_v.size(); ++i)
        h += (i ? "; " : "") + esc(failed_v[i]->name) + " &mdash; value " +
             fmt_value(failed_v[i]->metric, failed_v[i]->value);
      h += ")";
    }
    for (const auto& e : r.nonfinite)
      if (e.variant == v.name) h += " &middot; <span class=\"no\">first NaN/Inf at " + esc(e.node) + "</span>";
    h += "</li>";
  }
  std::size_t whole = 0;
  for (const auto& c : r.gate.checks) whole += c.variant.empty() && !c.passed;
  if (whole) h += fmt::format("<li><span class=\"no\">{} run-wide check(s) failed</span></li>", whole);
  return h + "</ul></section>";
}

std::string render_variants(const RunReport& r) {
  std::string h = section("variants", "Variants", "image metrics against the reference over all samples: mean (p5)");
  h += "<div class=\"scroll\"><table class=\"sortable\"><thead><tr><th>variant</th><th>kind</th><th>what runs</th>"
       "<th title=\"per model: the share of multiply-accumulates run quantized, then of parameters and compute "
       "nodes (Conv, MatMul, Gemm)\">quantized</th><th>samples</th><th>errors</th>";
  // Many metrics (a single model judged per output): one stacked cell instead of a column each.
  const bool stacked = r.metrics.size() > kMetricColumnsInVariants;
  if (stacked) h += "<th>metrics: mean (p5)</th>";
  else
    for (const auto& m : r.metrics) h += "<th>" + esc(m.label) + "</th>";
  h += "<th>timing</th>";
  h += "<th>gate</th></tr></thead><tbody>";
  for (const auto& v : r.variants) {
    auto failed_v = failed_checks(r.gate, v.name);
    h += fmt::format("<tr class=\"{}\"><td><b style=\"color:{}\">{}</b>{}</td><td>{}</td><td>{}</td>",
                     failed_v.empty() ? "" : "bad", variant_color(r, v.name), esc(v.name),
                     v.reference ? " (reference)" : "", variant_kind_name(v.kind), variant_description(v));
    h += quantized_cell(v);
    h += fmt::format("<td class=\"num\">{}</td><td class=\"num\">{}</td>", v.summary.samples, v.summary.errors);
    if (stacked) {
      std::string lines;
      for (const auto& m : r.metrics) {
        const SummaryRow* s = nullptr;
        for (const auto& row : v.summary.metrics)
          if (row.metric == m.key) s = &row;
        if (!s || s->count == 0) continue;
        lines += fmt::format("<div><span class=\"sub\">{}</span> {} <span class=\"sub\">({})</span></div>",
                             esc(m.label), fmt_value(m.key, s->mean), fmt_value(m.key, s->p5));
      }
      h += "<td class=\"name\">" + (lines.empty() ? std::string("&ndash;") : lines) + "</td>";
    }
    for (const auto& m : r.metrics) {
      if (stacked) break;
      const SummaryRow* s = nullptr;
      for (const auto& row : v.summary.metrics)
        if (row.metric == m.key) s = &row;
      if (!s || s->count == 0) {
        std::string why = v.reference ? "" : s && s->unbounded ? "identical" : "n/a";
        h += "<td class=\"num\" data-v=\"\">" + (why.empty() ? "&ndash;" : why) + "</td>";
      } else {
        h += fmt::format("<td class=\"num\" data-v=\"{}\">{} <span class=\"sub\">({})</span></td>", sort_value(s->mean),
                         fmt_value(m.key, s->mean), fmt_value(m.key, s->p5));
      }
    }
    std::string timing;
    for (const auto& [name, value] : v.summary.timings)
      timing += (timing.empty() ? "" : "<br>") + timing_text(name, value);
    h += "<td class=\"num\">" + timing + "</td>";
    std::size_t checks = 0;
    for (const auto& c : r.gate.checks) checks += c.variant == v.name;
    h += checks == 0        ? std::string("<td>&ndash;</td>")
         : failed_v.empty() ? "<td class=\"ok\">pass</td>"
                            : fmt::format("<td class=\"no\">FAIL ({})</td>", failed_v.size());
    h += "</tr>";
  }
  return h + "</tbody></table></div></section>";
}

std::string image_src(const ImageRef& img) { return img.png.empty() ? esc(img.path) : html::png_data_uri(img.png); }

std::string render_samples(const RunReport& r) {
  std::string h = section("samples", "Samples", "per-sample metrics against the reference; click a column to sort");
  std::vector<const Variant*> tested;
  for (const auto& v : r.variants)
    if (!v.reference) tested.push_back(&v);
  // Only metrics that have a value somewhere get a column.
  std::vector<const MetricInfo*> shown;
  for (const auto& m : r.metrics) {
    bool any = false;
    for (const auto& s : r.samples)
      for (const auto& res : s.results)
        if (const auto* mv = res.metric(m.key); mv && (mv->value || res.identical)) any = true;
    if (any) shown.push_back(&m);
  }
  // One table with a column per (variant, metric) while that fits a screen; else one tab per
  // variant (a single model judged per output has a dozen metrics).
  const bool per_variant = tested.size() > 1 && tested.size() * shown.size() > kSampleColumnsInOneTable;
  auto table = [&](const std::vector<const Variant*>& variants, const std::string& id) {
    std::string t = "<table class=\"sortable\"" + (id.empty() ? std::string() : " id=\"" + id + "\"") +
                    "><thead><tr><th>sample</th><th>prompt</th><th>seed</th>";
    for (const auto* v : variants)
      for (const auto* m : shown)
        t += "<th class=\"name\">" + (variants.size() > 1 ? esc(v->name) + " " : std::string()) + esc(m->label) +
             "</th>";
    t += "<th>notes</th></tr></thead><tbody>";
    for (const auto& s : r.samples) {
      std::string notes;
      bool bad = false, err = false;
      for (const auto& res : s.results) {
        const bool in_table =
            std::any_of(variants.begin(), variants.end(), [&](const Variant* v) { return v->name == res.variant; });
        if (!in_table && (variants.size() < tested.size() || res.ok())) continue;  // the reference's errors: always
        if (!res.ok()) {
          notes += (notes.empty() ? "" : "; ") + esc(res.variant + ": " + res.error);
          err = true;
        }
        for (const auto& f : res.failed_checks) {
          notes += (notes.empty() ? "" : "; ") + esc(res.variant + ": " + f);
          bad = true;
        }
      }
      t += fmt::format("<tr class=\"{}\"><td>{}</td><td>{}</td><td class=\"num\">{}</td>",
                       err   ? "err"
                       : bad ? "bad"
                             : "",
                       esc(s.id), esc(s.prompt), s.seed ? std::to_string(*s.seed) : "");
      for (const auto* v : variants) {
        const SampleResult* res = s.result(v->name);
        for (const auto* m : shown) {
          std::optional<double> value;
          if (res && res->ok())
            if (const auto* mv = res->metric(m->key)) {
              value = mv->value;
              if (!value && res->identical) value = std::numeric_limits<double>::infinity();
            }
          t += num_td(m->key, value);
        }
      }
      t += "<td>" + notes + "</td></tr>";
    }
    return t + "</tbody></table>";
  };
  if (!per_variant) {
    h += table(tested, "");
  } else {
    std::string tabs = "<div class=\"tabs\">", panes;
    for (std::size_t k = 0; k < tested.size(); ++k) {
      const std::string id = "samples-" + std::to_string(k);
      tabs +=
          fmt::format("<button data-tab=\"{}\"{}>{}</button>", id, k == 0 ? " class=\"on\"" : "", esc(tested[k]->name));
      panes += fmt::format("<div class=\"tab\" id=\"{}\"{}>", id, k == 0 ? "" : " hidden") +
               table({tested[k]}, id + "-table") + "</div>";
    }
    h += "<div class=\"tabbed\">" + tabs + "</div>" + panes + "</div>";
  }

  // Image rows: the samples whose worst variant scores lowest on the first metric come first.
  std::vector<std::pair<double, const SampleRow*>> rows;
  for (const auto& s : r.samples) {
    bool any = false;
    for (const auto& res : s.results) any = any || !res.image.empty();
    if (!any) continue;
    double worst = std::numeric_limits<double>::infinity();
    if (!r.metrics.empty())
      for (const auto& res : s.results)
        if (const auto* mv = res.metric(r.metrics[0].key); mv && mv->value)
          worst = std::min(worst, r.metrics[0].higher_is_better ? *mv->value : -*mv->value);
    rows.emplace_back(worst, &s);
  }
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  if (rows.size() > kImageRows) rows.resize(kImageRows);
  if (!rows.empty()) {
    h += "<h3>Images</h3><div class=\"sub\">reference | each variant | |reference &minus; variant|";
    if (r.config.pipeline == "segmentation") h += ": bright where the variant's mask differs from the reference's";
    else
      h += ", max over RGB, on one fixed scale for every image of this report: <span id=\"diff-legend\">" +
           html::difference_scale_legend() + "</span>";
    if (rows.size() < r.samples.size())
      h += fmt::format("; {} of {} samples shown, worst {} first", rows.size(), r.samples.size(),
                       r.metrics.empty() ? "" : esc(r.metrics[0].label));
    h += "</div>";
  }
  for (const auto& [worst, s] : rows) {
    h += "<div class=\"strip\"><b>" + esc(s->id) + "</b> &middot; " + esc(s->prompt);
    if (s->seed) h += fmt::format(" &middot; seed {}", *s->seed);
    h += "<div class=\"imgs\">";
    for (const auto& res : s->results) {
      const Variant* v = r.variant(res.variant);
      std::string caption = esc(res.variant);
      if (!res.ok()) caption += " &middot; <span class=\"no\">error</span>";
      if (!r.metrics.empty())
        if (const auto* mv = res.metric(r.metrics[0].key); mv && mv->value)
          caption += " &middot; " + esc(r.metrics[0].label) + " " + fmt_value(mv->key, mv->value);
      if (!res.image.empty())
        h += "<figure><img loading=\"lazy\" alt=\"" + esc(res.variant) + "\" src=\"" + image_src(res.image) +
             "\"><figcaption>" + caption + (v && v->reference ? " (reference)" : "") + "</figcaption></figure>";
      if (!res.heatmap.empty()) {
        const std::string caption_x1 = esc(res.variant) + " diff &middot; " + esc(res.heatmap_legend);
        const std::string caption_x8 =
            esc(res.variant) + fmt::format(" diff x{:g} &middot; bright &ge; {:g} of 255", kAmplifiedGain,
                                           kDifferenceScale255 / kAmplifiedGain);
        h += "<figure>" +
             html::difference_img("difference " + res.variant, image_src(res.heatmap),
                                  res.heatmap_amplified.empty() ? std::string() : image_src(res.heatmap_amplified)) +
             html::difference_caption(caption_x1, caption_x8) + "</figure>";
      }
    }
    h += "</div></div>";
  }
  return h + "</section>";
}

std::string render_layers(const RunReport& r) {
  std::string h = section("layers", "Layers ranked by local error",
                          "worst first (lowest local SQNR: the layer's own error with the "
                          "reference's inputs); pooled over samples and steps; click a column to sort");
  if (r.layers.empty() || r.layer_tables.empty()) return h + "<p>No per-layer observation in this run.</p></section>";
  std::string tabs = "<div class=\"tabs\">", panes;
  bool first = true;
  for (const auto& t : r.layer_tables) {
    const Variant* v = r.variant(t.variant);
    if (v && v->reference) continue;
    const std::string id = "layers-" + std::to_string(&t - r.layer_tables.data());
    tabs += fmt::format("<button data-tab=\"{}\"{}>{}</button>", id, first ? " class=\"on\"" : "", esc(t.variant));
    const LayerTable* ref_table = r.reference() ? r.layer_table(r.reference()->name) : nullptr;
    auto order = rank_layers(t, r.layers.size());
    std::vector<const LayerColumnInfo*> cols;
    for (const auto& c : kLayerColumns)
      if (!(t.stats.*c.column).empty() && std::find(std::begin(kRankedColumns), std::end(kRankedColumns),
                                                    std::string_view(c.key)) != std::end(kRankedColumns))
        cols.push_back(&c);
    panes += fmt::format("<div class=\"tab\" id=\"{}\"{}>", id, first ? "" : " hidden");
    panes += fmt::format(
        "<div class=\"scroll\"><table class=\"sortable{}\" id=\"{}-table\"><thead><tr><th>rank</th><th>node</th>"
        "<th>op</th><th>format</th>",
        order.size() > kRankedRowsShown ? " collapsed" : "", id);
    for (const auto* c : cols) panes += std::string("<th>") + c->label + "</th>";
    if (!t.calib_amax.empty()) panes += "<th>calib amax</th>";
    if (!t.out_of_range_steps.empty()) panes += "<th>steps out of range</th>";
    if (ref_table && !ref_table->stats.absmax.empty()) panes += "<th>ref absmax</th>";
    panes += "</tr></thead><tbody>";
    for (std::size_t rank = 0; rank < order.size(); ++rank) {
      const std::size_t l = order[rank];
      panes += fmt::format("<tr{}><td class=\"num\">{}</td><td class=\"name\">{}</td><td>{}</td><td>{}</td>",
                           rank >= kRankedRowsShown ? " class=\"more\"" : "", rank + 1, esc(r.layers[l].name),
                           esc(r.layers[l].op), l < t.format.size() ? esc(t.format[l]) : "");
      for (const auto* c : cols) panes += num_td(c->key, opt(cell(t.stats.*c->column, l)));
      if (!t.calib_amax.empty()) panes += num_td("amax", opt(cell(t.calib_amax, l)));
      if (!t.out_of_range_steps.empty()) panes += num_td("steps", opt(cell(t.out_of_range_steps, l)));
      if (ref_table && !ref_table->stats.absmax.empty())
        panes += num_td("absmax", opt(cell(ref_table->stats.absmax, l)));
      panes += "</tr>";
    }
    panes += "</tbody></table></div>";
    if (order.size() > kRankedRowsShown)
      panes +=
          fmt::format("<button class=\"show-all\" data-for=\"{}-table\">show all {} layers</button>", id, order.size());
    panes += "</div>";
    first = false;
  }
  if (first) return h + "<p>Only the reference was observed.</p></section>";
  return h + tabs + "</div>" + panes + "</section>";
}

// Numbers for the canvas heatmap: 3 significant digits keep hundreds of layers x steps small.
void append_cells(std::string& out, const std::vector<float>& col) {
  out += '[';
  for (std::size_t i = 0; i < col.size(); ++i) {
    if (i) out += ',';
    float v = col[i];
    if (std::isnan(v)) out += "null";
    else if (std::isinf(v)) out += v > 0 ? "3e38" : "-3e38";
    else out += fmt::format("{:.3g}", v);
  }
  out += ']';
}

std::string json_string(std::string_view s) {
  std::string out = dump_json_utf8_safe(nlohmann::json(std::string(s)));
  // Inside <script>: never let a name close the element.
  std::string safe;
  for (char c : out) safe += c == '<' ? std::string("\\u003c") : std::string(1, c);
  return safe;
}

std::string render_step_heatmap(const RunReport& r) {
  const Timesteps& ts = r.timesteps;
  std::string h = section("timestep-heatmap", "Timestep &times; layer",
                          ("rows: layers in graph order; columns: denoising steps" +
                           (ts.mode.empty() ? std::string() : " (" + esc(ts.mode) + ")") +
                           "; hover a cell for its values. Drift compares a layer's range at each "
                           "step with its calibrated range (or with its own largest range)")
                              .c_str());
  if (ts.steps() == 0 || ts.layers.empty() || ts.tables.empty())
    return h + "<p>No per-timestep observation in this run.</p></section>";
  std::string data = "{\"t\":[";
  for (std::size_t s = 0; s < ts.steps(); ++s) data += (s ? "," : "") + fmt::format("{:g}", ts.t[s]);
  data += "],\"names\":[";
  for (std::size_t i = 0; i < ts.layers.size(); ++i) data += (i ? "," : "") + json_string(r.layers[ts.layers[i]].name);
  data += "],\"ops\":[";
  for (std::size_t i = 0; i < ts.layers.size(); ++i) data += (i ? "," : "") + json_string(r.layers[ts.layers[i]].op);
  data += "],\"variants\":[";
  bool first = true;
  for (const auto& t : ts.tables) {
    data += (first ? "{" : ",{") + std::string("\"name\":") + json_string(t.variant);
    first = false;
    const Variant* v = r.variant(t.variant);
    data += fmt::format(",\"reference\":{}", v && v->reference ? "true" : "false");
    if (const LayerTable* lt = r.layer_table(t.variant); lt && !lt->calib_amax.empty()) {
      std::vector<float> calib;
      for (auto l : ts.layers) calib.push_back(cell(lt->calib_amax, l));
      data += ",\"calib\":";
      append_cells(data, calib);
    }
    data += ",\"cols\":{";
    bool first_col = true;
    for (const auto* key : {"local_rel_l2", "acc_rel_l2", "absmax", "clip_rate", "local_sqnr_db"}) {
      const LayerColumnInfo* info = nullptr;
      for (const auto& c : kLayerColumns)
        if (std::string_view(c.key) == key) info = &c;
      const auto& col = t.stats.*info->column;
      if (col.empty()) continue;
      data += (first_col ? "\"" : ",\"") + std::string(key) + "\":";
      first_col = false;
      append_cells(data, col);
    }
    data += "}}";
  }
  data += "]}";
  h += "<div class=\"controls\"><label>variant <select id=\"step-variant\"></select></label> "
       "<label>show <select id=\"step-quantity\"></select></label> "
       "<span id=\"step-legend\"></span></div>"
       "<div id=\"step-tip\" class=\"sub\">&nbsp;</div>"
       "<div class=\"canvas-wrap\"><canvas id=\"step-canvas\" width=\"10\" height=\"10\"></canvas></div>"
       "<script type=\"application/json\" id=\"step-data\">";
  h += data;
  h += "</script></section>";
  return h;
}

// A small SVG line chart: one polyline per series over x = 0..n-1; NaN breaks the line.
struct Series {
  std::string name, color;
  const std::vector<double>* values;
};

std::string line_chart(const std::string& title, const std::vector<Series>& series, const std::vector<double>& t,
                       std::string_view metric) {
  constexpr double W = 560, H = 240, left = 52, right = 12, top = 26, bottom = 34;
  std::size_t n = 0;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& s : series) {
    n = std::max(n, s.values->size());
    for (double v : *s.values)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  }
  std::string svg = fmt::format(
      "<figure class=\"chart\"><svg width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "role=\"img\"><text x=\"{}\" y=\"16\" class=\"ct\">{}</text>",
      W, H, W, H, left, esc(title));
  if (n == 0 || !std::isfinite(lo)) return svg + "</svg></figure>";
  if (hi - lo < 1e-12) lo -= 1, hi += 1;
  const double pad = 0.05 * (hi - lo);
  lo -= pad, hi += pad;
  auto X = [&](double i) { return left + (W - left - right) * (n > 1 ? i / double(n - 1) : 0.5); };
  auto Y = [&](double v) { return top + (H - top - bottom) * (1.0 - (v - lo) / (hi - lo)); };
  // Axes and ticks.
  svg += fmt::format(
      "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" class=\"ax\"/>"
      "<line x1=\"{0}\" y1=\"{2}\" x2=\"{3}\" y2=\"{2}\" class=\"ax\"/>",
      left, top, H - bottom, W - right);
  for (int k = 0; k <= 4; ++k) {
    double v = lo + (hi - lo) * k / 4.0;
    svg += fmt::format(
        "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" class=\"grid\"/>"
        "<text x=\"{}\" y=\"{:.1f}\" class=\"tk\" text-anchor=\"end\">{:.3g}</text>",
        left, Y(v), W - right, Y(v), left - 4, Y(v) + 4, v);
  }
  const std::size_t every = std::max<std::size_t>(1, n / 10);
  for (std::size_t i = 0; i < n; i += every)
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" class=\"tk\" text-anchor=\"middle\">{}</text>", X(double(i)),
                       H - bottom + 14, i < t.size() ? fmt::format("{:g}", t[i]) : std::to_string(i));
  svg += fmt::format(
      "<text x=\"{}\" y=\"{}\" class=\"tk\" text-anchor=\"middle\">step (scheduler t)"
      "</text>",
      left + (W - left - right) / 2, H - 4);
  for (const auto& s : series) {
    std::string pts;
    auto flush = [&] {
      if (!pts.empty())
        svg += "<polyline fill=\"none\" stroke-width=\"2\" stroke=\"" + s.color + "\" points=\"" + pts + "\"/>";
      pts.clear();
    };
    for (std::size_t i = 0; i < s.values->size(); ++i) {
      double v = (*s.values)[i];
      if (!std::isfinite(v)) {
        flush();
        continue;
      }
      pts += fmt::format("{}{:.1f},{:.1f}", pts.empty() ? "" : " ", X(double(i)), Y(v));
      svg += fmt::format(
          "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.2\" fill=\"{}\"><title>{} step {}: {}"
          "</title></circle>",
          X(double(i)), Y(v), s.color, esc(s.name), i, fmt_value(metric, v));
    }
    flush();
  }
  svg += "</svg><figcaption>";
  for (const auto& s : series)
    svg += "<span class=\"key\" style=\"background:" + s.color + "\"></span>" + esc(s.name) + " ";
  return svg + "</figcaption></figure>";
}

std::string render_step_curves(const RunReport& r) {
  std::string h = section("step-curves", "Error per timestep",
                          "teacher-forced: both variants start each step from the reference's "
                          "latent (that step's own error); free-running: each variant runs end to "
                          "end (errors compound)");
  if (r.step_curves.empty()) return h + "<p>No per-step error curves in this run.</p></section>";
  // One chart per (quantity, metric, mode), in first-seen order.
  std::vector<std::tuple<std::string, std::string, std::string>> keys;
  for (const auto& c : r.step_curves) {
    auto key = std::make_tuple(c.quantity, c.metric, c.mode);
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
  }
  h += "<div class=\"charts\">";
  for (const auto& [quantity, metric, mode] : keys) {
    std::vector<Series> series;
    for (const auto& c : r.step_curves)
      if (c.quantity == quantity && c.metric == metric && c.mode == mode)
        series.push_back({c.variant, variant_color(r, c.variant), &c.values});
    h += line_chart(quantity + " " + metric + " (" + mode + ")", series, r.timesteps.t, metric);
  }
  return h + "</div></section>";
}

std::string histogram_chart(const RunReport& r, std::uint32_t layer, const std::vector<const Histogram*>& hists) {
  constexpr double W = 360, H = 170, left = 8, right = 8, top = 8, bottom = 22;
  double lo = hists[0]->lo, hi = hists[0]->hi, peak = 1;
  for (const auto* hist : hists) {
    lo = std::min(lo, hist->lo), hi = std::max(hi, hist->hi);
    for (auto c : hist->counts) peak = std::max(peak, std::log10(1.0 + double(c)));
  }
  if (!(hi > lo)) hi = lo + 1;
  auto X = [&](double v) { return left + (W - left - right) * (v - lo) / (hi - lo); };
  auto Y = [&](double logc) { return H - bottom - (H - top - bottom) * logc / peak; };
  std::string svg = fmt::format(
      "<figure class=\"chart\"><svg width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "role=\"img\">",
      W, H, W, H);
  for (const auto* hist : hists) {
    const Variant* v = r.variant(hist->variant);
    const bool ref = v && v->reference;
    const std::string color = variant_color(r, hist->variant);
    const double bw = (hist->hi - hist->lo) / double(hist->counts.size());
    std::string path = fmt::format("M{:.1f},{:.1f}", X(hist->lo), Y(0));
    for (std::size_t b = 0; b < hist->counts.size(); ++b) {
      double y = Y(std::log10(1.0 + double(hist->counts[b])));
      path += fmt::format(" L{:.1f},{:.1f} L{:.1f},{:.1f}", X(hist->lo + bw * double(b)), y,
                          X(hist->lo + bw * double(b + 1)), y);
    }
    path += fmt::format(" L{:.1f},{:.1f}", X(hist->hi), Y(0));
    svg += "<path d=\"" + path + "\" stroke=\"" + color + "\" fill=\"" +
           (ref ? color + "\" fill-opacity=\"0.25" : std::string("none")) + "\" stroke-width=\"1.5\"/>";
    if (const LayerTable* t = r.layer_table(hist->variant))
      if (float amax = cell(t->calib_amax, layer); std::isfinite(amax))
        for (double edge : {-double(amax), double(amax)})
          if (edge >= lo && edge <= hi)
            svg += fmt::format(
                "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" stroke=\"{3}\" "
                "stroke-dasharray=\"4 3\"><title>{4} calibrated amax {5:g}</title></line>",
                X(edge), top, H - bottom, color, esc(hist->variant), amax);
  }
  svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"ax\"/>", left, H - bottom, W - right,
                     H - bottom);
  svg += fmt::format(
      "<text x=\"{}\" y=\"{}\" class=\"tk\">{:.3g}</text><text x=\"{}\" y=\"{}\" "
      "class=\"tk\" text-anchor=\"end\">{:.3g}</text>",
      left, H - 6, lo, W - right, H - 6, hi);
  svg += "</svg><figcaption><b>" + esc(r.layers[layer].name) + "</b> (" + esc(r.layers[layer].op) + ")<br>";
  for (const auto* hist : hists) {
    svg +=
        "<span class=\"key\" style=\"background:" + variant_color(r, hist->variant) + "\"></span>" + esc(hist->variant);
    if (hist->step >= 0) svg += fmt::format(" step {}", hist->step);
    if (hist->below + hist->above)
      svg += fmt::format(" <span class=\"sub\">({} below, {} above the range)</span>", hist->below, hist->above);
    svg += " ";
  }
  return svg + "</figcaption></figure>";
}

std::string render_histograms(const RunReport& r) {
  std::string h = section("histograms", "Activation histograms of the worst layers",
                          "log count per bin; filled: reference; dashed lines: calibrated range "
                          "(&plusmn;amax)");
  if (r.histograms.empty()) return h + "<p>No histograms in this run.</p></section>";
  // Layers with histograms, worst (lowest local SQNR over any variant) first.
  std::map<std::uint32_t, std::vector<const Histogram*>> by_layer;
  for (const auto& hist : r.histograms)
    if (hist.layer < r.layers.size() && !hist.counts.empty()) by_layer[hist.layer].push_back(&hist);
  std::vector<std::pair<float, std::uint32_t>> order;
  for (const auto& [layer, list] : by_layer) {
    float worst = std::numeric_limits<float>::infinity();
    for (const auto& t : r.layer_tables)
      if (float v = cell(t.stats.local_sqnr_db, layer); !std::isnan(v)) worst = std::min(worst, v);
    order.emplace_back(worst, layer);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  if (order.size() > kHistogramLayers) order.resize(kHistogramLayers);
  h += "<div class=\"charts\">";
  for (const auto& [worst, layer] : order) h += histogram_chart(r, layer, by_layer[layer]);
  return h + "</div></section>";
}

std::string render_nonfinite(const RunReport& r) {
  std::string h = section("nonfinite", "First NaN / Inf",
                          "per variant, the first node output holding a non-finite value, in "
                          "(sample, step, graph order): never averaged away");
  if (r.nonfinite.empty()) return h + "<p class=\"ok\">No NaN or Inf in any observed output.</p></section>";
  h += "<table><thead><tr><th>variant</th><th>sample</th><th>model</th><th>step</th><th>node</th><th>op</th>"
       "<th>NaN</th><th>Inf</th></tr></thead><tbody>";
  for (const auto& e : r.nonfinite) {
    std::string step = e.step < 0 ? "&ndash;" : std::to_string(e.step);
    if (e.step >= 0 && std::size_t(e.step) < r.timesteps.t.size())
      step += fmt::format(" (t={:g})", r.timesteps.t[std::size_t(e.step)]);
    h += fmt::format(
        "<tr class=\"bad\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
        esc(e.variant), esc(e.sample), esc(e.model), step, esc(e.node), esc(e.op), e.nan_count, e.inf_count);
  }
  return h + "</tbody></table></section>";
}

std::string render_unmatched(const RunReport& r) {
  std::string h = section("unmatched", "Node matching of separate ONNX variants",
                          "nodes are matched by name, then by output tensor name, then by structure, "
                          "once Q/DQ nodes are set aside; unmatched nodes have no per-layer error");
  bool any = false;
  for (const auto& v : r.variants) {
    if (v.kind != VariantKind::kOnnx) continue;
    any = true;
    h += fmt::format("<p><b>{}</b>: {} matched by name, {} by output tensor, {} by structure, {} unmatched</p>",
                     esc(v.name), v.matched_by_name, v.matched_by_output, v.matched_by_structure, v.unmatched.size());
    if (v.unmatched.empty()) continue;
    h += "<table class=\"sortable\"><thead><tr><th>graph</th><th>node</th><th>op</th><th>why</th></tr>"
         "</thead><tbody>";
    for (const auto& u : v.unmatched)
      h += "<tr><td>" + esc(u.side) + "</td><td>" + esc(u.name) + "</td><td>" + esc(u.op) + "</td><td>" +
           esc(u.reason) + "</td></tr>";
    h += "</tbody></table>";
  }
  if (!any) h += "<p>No variant is a separate ONNX file.</p>";
  return h + "</section>";
}

std::string render_unquantized(const RunReport& r) {
  std::string h = section("unquantized", "Nodes each recipe left in float",
                          "quantizable nodes (by structure: convs, linears, attention matmuls) that a recipe "
                          "variant did not quantize, and why");
  bool any = false;
  for (const auto& v : r.variants) {
    if (v.kind != VariantKind::kRecipe) continue;
    any = true;
    h += fmt::format("<p><b>{}</b>: {} node(s) left in float</p>", esc(v.name), v.unquantized.size());
    if (v.unquantized.empty()) continue;
    h += "<table class=\"sortable\"><thead><tr><th>model</th><th>node</th><th>op</th><th>why</th></tr>"
         "</thead><tbody>";
    for (const auto& u : v.unquantized)
      h += "<tr><td>" + esc(u.model) + "</td><td>" + esc(u.name) + "</td><td>" + esc(u.op) + "</td><td>" +
           esc(u.reason) + "</td></tr>";
    h += "</tbody></table>";
  }
  if (!any) h += "<p>No variant is a recipe.</p>";
  return h + "</section>";
}

std::string render_config(const RunReport& r) {
  std::string h = section("config", "Configuration and fingerprints");
  const RunConfig& c = r.config;
  auto row = [&](std::string_view k, const std::string& v_html) {
    h += "<tr><th>" + esc(k) + "</th><td>" + v_html + "</td></tr>";
  };
  h += "<table><tbody>";
  row("pipeline", esc(c.pipeline));
  row("model", artifact_text(c.model));
  row("inputs", artifact_text(c.inputs));
  row("calibration", c.calibration ? artifact_text(*c.calibration) : "&ndash;");
  row("reference variant", esc(c.reference_variant));
  if (!c.scheduler.empty() || c.steps > 0)
    row("scheduler", fmt::format("{} &middot; {} steps", esc(c.scheduler), c.steps));
  std::string seeds;
  for (auto s : c.seeds) seeds += (seeds.empty() ? "" : ", ") + std::to_string(s);
  row("seeds", seeds);
  row("threads", std::to_string(c.threads));
  row("device", esc(c.device));
  if (!c.shard.empty()) row("shard", esc(c.shard));
  for (const auto& [k, v] : c.settings) row(k, esc(v));
  for (const auto& v : r.variants)
    if (v.recipe || v.onnx) row("variant " + v.name, variant_description(v));
  row("qeval", esc(r.tool_version));
  row("command line", "<code>" + esc(r.command_line) + "</code>");
  row("created", esc(r.created_utc));
  row("elapsed",
      fmt::format("{:.1f} s", r.elapsed_s) +
          (r.reused_units ? fmt::format(" (resumed: {} unit(s) read back from a saved state, {:.1f} s of that "
                                        "before)",
                                        r.reused_units, r.elapsed_before_s)
                          : std::string()));
  return h + "</tbody></table></section>";
}

constexpr std::string_view kRunCss = R"(
section{margin-top:8px} .scroll{overflow-x:auto}
.strip figure{width:min-content;min-width:120px} .strip img{min-width:128px;height:auto} .strip figcaption{overflow-wrap:anywhere} h3{font-size:15px;margin:18px 0 6px}
ul.verdicts{margin:0 0 8px;padding-left:20px} ul.verdicts li{margin:2px 0}
.tabs{margin:6px 0} .tabs button,.show-all{border:1px solid #ccd;background:#fff;padding:4px 10px;border-radius:4px;cursor:pointer;margin-right:4px}
.tabs button.on{background:#1d2330;color:#fff}
table.collapsed tr.more{display:none} .show-all{margin-top:6px}
.controls{margin:6px 0} .controls select{margin-right:12px}
.canvas-wrap{overflow:auto;max-height:960px;background:#fff;border:1px solid #dde1e7}
#step-canvas{display:block;image-rendering:pixelated}
.charts{display:flex;flex-wrap:wrap;gap:12px} figure.chart{margin:0;background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:6px}
figure.chart figcaption{font-size:12px;color:#1d2330;max-width:540px}
svg .ax{stroke:#889} svg .grid{stroke:#eef1f5} svg .tk{font-size:10px;fill:#5b6475} svg .ct{font-size:12px;font-weight:600;fill:#1d2330}
.key{display:inline-block;width:10px;height:10px;margin:0 4px 0 8px;border-radius:2px}
)";

// Tabs, "show all" buttons and the canvas heatmap. RAMP is substituted with html::ramp_js_array().
constexpr std::string_view kRunJs = R"(
document.querySelectorAll('.tabs').forEach(bar=>bar.addEventListener('click',e=>{
 const b=e.target.closest('button');if(!b)return;
 bar.querySelectorAll('button').forEach(x=>x.classList.toggle('on',x===b));
 bar.parentElement.querySelectorAll(':scope > .tab').forEach(p=>{p.hidden=p.id!==b.dataset.tab;});}));
document.querySelectorAll('.show-all').forEach(b=>b.addEventListener('click',()=>{
 const t=document.getElementById(b.dataset.for);if(t)t.classList.remove('collapsed');b.remove();}));
document.querySelectorAll('table.collapsed th').forEach(th=>th.addEventListener('click',()=>{
 const t=th.closest('table');t.classList.remove('collapsed');
 const b=document.querySelector('.show-all[data-for="'+t.id+'"]');if(b)b.remove();}));
(function(){
 const el=document.getElementById('step-data');if(!el)return;
 const D=JSON.parse(el.textContent),R=RAMP,S=D.t.length,N=D.names.length;
 const cv=document.getElementById('step-canvas'),ctx=cv.getContext('2d');
 const selV=document.getElementById('step-variant'),selQ=document.getElementById('step-quantity');
 const tip=document.getElementById('step-tip'),leg=document.getElementById('step-legend');
 const Q={local_rel_l2:['local error (rel L2)',true],acc_rel_l2:['accumulated error (rel L2)',true],
  local_sqnr_db:['local SQNR dB (dark = low)',false],drift_calib:['drift: absmax / calibrated amax',false],
  drift_row:['drift: absmax / largest absmax over steps',false],clip_rate:['clip rate at the calibrated scale',true]};
 function rgb(t){if(!(t>=0))t=0;if(t>1)t=1;const x=t*(R.length-1),i=Math.min(Math.floor(x),R.length-2),f=x-i,a=R[i],b=R[i+1];
  return 'rgb('+Math.round(a[0]+(b[0]-a[0])*f)+','+Math.round(a[1]+(b[1]-a[1])*f)+','+Math.round(a[2]+(b[2]-a[2])*f)+')';}
 function values(v,q){const c=v.cols;
  if(q==='drift_calib'||q==='drift_row'){if(!c.absmax||(q==='drift_calib'&&!v.calib))return null;
   const out=new Array(N*S).fill(null);
   for(let r=0;r<N;r++){let d=0;
    if(q==='drift_calib')d=v.calib[r];else for(let s=0;s<S;s++){const x=c.absmax[r*S+s];if(x!==null&&x>d)d=x;}
    if(!(d>0))continue;for(let s=0;s<S;s++){const x=c.absmax[r*S+s];out[r*S+s]=x===null?null:x/d;}}
   return out;}
  return c[q]||null;}
 D.variants.forEach((v,i)=>{const o=document.createElement('option');o.value=i;o.textContent=v.name+(v.reference?' (reference)':'');selV.appendChild(o);});
 const firstTest=D.variants.findIndex(v=>!v.reference);if(firstTest>=0)selV.value=firstTest;
 function fillQ(){const v=D.variants[+selV.value],prev=selQ.value;selQ.innerHTML='';
  for(const q in Q){if(values(v,q)){const o=document.createElement('option');o.value=q;o.textContent=Q[q][0];selQ.appendChild(o);}}
  if([...selQ.options].some(o=>o.value===prev))selQ.value=prev;}
 // Blocks of rows: consecutive layers sharing the first part of their name ("/down_blocks.0/..."); names
 // without a '/' path are top-level nodes.
 const block=n=>{const p=n.split('/').filter(x=>x);return p.length>1?p[0]:'(top level)';};
 const G=[];for(let r=0;r<N;r++){const b=block(D.names[r]);if(G.length&&G[G.length-1].name===b)G[G.length-1].end=r+1;else G.push({name:b,start:r,end:r+1});}
 const groupOf=r=>{for(const g of G)if(r>=g.start&&r<g.end)return g.name;return '';};
 cv.setAttribute('aria-label',N+' layer rows in '+G.length+' blocks: '+G.map(g=>g.name+' ('+(g.end-g.start)+')').join(', '));
 let cur=null,cw=8,ch=4,lm=230,tm=14;
 function label(t,w){if(ctx.measureText(t).width<=w)return t;while(t.length>4&&ctx.measureText('\u2026'+t).width>w)t=t.slice(1);return '\u2026'+t;}
 function draw(){const v=D.variants[+selV.value],q=selQ.value,vals=q?values(v,q):null;
  cw=Math.max(8,Math.floor(720/Math.max(1,S)));ch=Math.max(2,Math.min(14,Math.floor(900/Math.max(1,N))));lm=230;
  cv.width=lm+S*cw;cv.height=tm+N*ch;ctx.fillStyle='#fff';ctx.fillRect(0,0,cv.width,cv.height);
  ctx.fillStyle='#ccc';ctx.fillRect(lm,tm,S*cw,N*ch);ctx.font='9px sans-serif';ctx.fillStyle='#5b6475';ctx.textBaseline='middle';
  const every=Math.max(1,Math.ceil(30/cw));ctx.textAlign='center';
  for(let s=0;s<S;s+=every)ctx.fillText(String(D.t[s]),lm+s*cw+cw/2,tm/2);
  ctx.textAlign='right';
  if(ch>=9){for(let r=0;r<N;r++)ctx.fillText(label(D.names[r],lm-6),lm-4,tm+r*ch+ch/2);}
  else{ctx.strokeStyle='#889';for(const g of G){const y0=tm+g.start*ch,y1=tm+g.end*ch;
   ctx.beginPath();ctx.moveTo(lm-3,y0+0.5);ctx.lineTo(lm-3,y1-0.5);ctx.stroke();
   if(y1-y0>=9)ctx.fillText(label(g.name+' ('+(g.end-g.start)+')',lm-10),lm-6,(y0+y1)/2);}}
  cur=vals;if(!vals){leg.textContent='';return;}
  const log=Q[q][1],fin=vals.filter(x=>x!==null&&isFinite(x)&&(!log||x>0)).sort((a,b)=>a-b);
  let lo=fin.length?fin[Math.floor(0.02*(fin.length-1))]:0,hi=fin.length?fin[fin.length-1]:1;
  if(!log&&q!=='local_sqnr_db')lo=0;if(!(hi>lo))hi=lo+(log?lo*9+1e-30:1);
  const f=log?(x=>(Math.log(x)-Math.log(lo))/(Math.log(hi)-Math.log(lo))):(x=>(x-lo)/(hi-lo));
  for(let r=0;r<N;r++)for(let s=0;s<S;s++){const x=vals[r*S+s];if(x===null)continue;
   ctx.fillStyle=(log&&!(x>0))?rgb(0):rgb(f(x));ctx.fillRect(lm+s*cw,tm+r*ch,cw,ch);}
  if(ch<9){ctx.fillStyle='#fff';for(const g of G)if(g.start>0)ctx.fillRect(lm,tm+g.start*ch,S*cw,1);}
  leg.innerHTML='';const sw=document.createElement('span');sw.className='legend';sw.style.background=LEGEND;
  leg.append(lo.toPrecision(3)+(log?' (log) ':' '),sw,' '+hi.toPrecision(3)+(q==='drift_calib'?' (>1: beyond the calibrated range)':'')+'; grey: not measured');}
 cv.addEventListener('mousemove',e=>{if(!cur)return;const b=cv.getBoundingClientRect();
  const s=Math.floor((e.clientX-b.left-lm)/cw),r=Math.floor((e.clientY-b.top-tm)/ch);if(s<0||s>=S||r<0||r>=N)return;
  const x=cur[r*S+s];tip.textContent=groupOf(r)+' \u00b7 '+D.names[r]+' ('+D.ops[r]+') \u00b7 step '+s+' (t='+D.t[s]+') \u00b7 '+(x===null?'not measured':x.toPrecision(4));});
 selV.addEventListener('change',()=>{fillQ();draw();});selQ.addEventListener('change',draw);
 fillQ();draw();
})();
)";

}  // namespace

std::string render_html(const RunReport& r) {
  std::string h;
  h.reserve(1 << 20);
  h += html::page_begin(std::string("qeval run: ") + (r.gate.passed ? "PASS" : "FAIL"), kRunCss);
  h +=
      "<h1>qeval run</h1><div class=\"sub\">" + esc(r.config.model.name) + " &middot; " + header_subtitle(r) + "</div>";
  h += render_verdict(r);
  h += section("gate", "Gate", esc(r.gate.source)) + html::gate_table(r.gate, true) + "</section>";
  h += render_variants(r);
  h += render_samples(r);
  h += render_layers(r);
  h += render_step_heatmap(r);
  h += render_step_curves(r);
  h += render_histograms(r);
  h += render_nonfinite(r);
  h += render_unmatched(r);
  h += render_unquantized(r);
  h += render_config(r);
  std::string js(kRunJs);
  auto replace = [&](std::string_view what, const std::string& with) { js.replace(js.find(what), what.size(), with); };
  replace("RAMP", html::ramp_js_array());
  replace("LEGEND", "'" + html::legend_gradient().substr(std::string_view("background:").size()) + "'");
  h += html::page_end(js + std::string(html::kGainToggleJs));
  return h;
}

}  // namespace qeval::reports
