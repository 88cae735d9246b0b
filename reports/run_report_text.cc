// The one-screen stdout summary and junit.xml of `qeval run`.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "metrics/metric_registry.h"
#include "reports/junit.h"
#include "reports/metric_format.h"
#include "reports/run_report.h"
#include "reports/text_table.h"

namespace qeval::reports {

namespace {

constexpr std::size_t kMaxFailedLines = 5;
constexpr std::size_t kMaxVariantsListed = 8;

std::string num(std::string_view metric, std::optional<double> v) {
  if (!v || std::isnan(*v)) return "-";
  if (std::isinf(*v)) return *v > 0 ? "inf" : "-inf";
  return format_metric(metric, *v);
}

// Index of the lowest local SQNR (then accumulated) in a table; nullopt when none is measured.
// `out` gets the three worst, "name value" each.
std::optional<std::size_t> worst_layers(const RunReport& r, const LayerTable& t, std::vector<std::string>& out) {
  const std::vector<float>& key = !t.stats.local_sqnr_db.empty() ? t.stats.local_sqnr_db : t.stats.acc_sqnr_db;
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < key.size() && i < r.layers.size(); ++i)
    if (!std::isnan(key[i])) order.push_back(i);
  if (order.empty()) return std::nullopt;
  const std::size_t n = std::min<std::size_t>(3, order.size());
  std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(n), order.end(),
                    [&](std::size_t a, std::size_t b) { return key[a] < key[b]; });
  for (std::size_t k = 0; k < n; ++k)
    out.push_back(fmt::format("{} {}", r.layers[order[k]].name, num(metrics::keys::kSqnrDb, key[order[k]])));
  return order[0];
}

// "quantized": the share of MACs per model the variant quantizes ("unet 84%"); "0%" when it
// quantizes none; the share of nodes, as before, for a report without per-model shares (a merge).
std::string quantized_text(const Variant& v) {
  if (v.quantization.empty()) {
    auto share = v.quantized_share();
    return share ? fmt::format("{:.0f}%", 100 * *share) : "-";
  }
  std::string out;
  for (const auto& q : v.quantization) {
    if (q.quantized_nodes == 0) continue;
    const auto share = q.mac_share();
    // No shapes recorded (--no-layers, or every unit reused from a saved state): the MAC share is
    // not measured; the parameter share still is.
    const auto params = q.param_share();
    out += (out.empty() ? "" : ", ") + q.model + " " +
           (share    ? fmt::format("{:.0f}%", 100 * *share)
            : params ? fmt::format("{:.0f}% of params (MACs not measured)", 100 * *params)
                     : std::string("MACs not measured"));
  }
  return out.empty() ? "0%" : out;
}

}  // namespace

std::string render_summary_text(const RunReport& r, const std::filesystem::path& out_dir, std::size_t width) {
  std::vector<std::string> lines;
  // Lines are wrapped, never cut, at the end; the table is sized here (a block per variant when its
  // columns would pass `width`).
  const std::size_t failed = r.gate.failed(), unmeasured = r.gate.not_measured();
  lines.push_back(fmt::format("qeval run: {} - {} of {} gate checks passed{} ({})", r.gate.passed ? "PASS" : "FAIL",
                              r.gate.passed_count(), r.gate.checks.size() - unmeasured,
                              unmeasured ? fmt::format(", {} not measured", unmeasured) : "", r.gate.source));
  const Variant* ref = r.reference();
  std::string what = fmt::format("{} | {} sample(s)", r.config.model.name, r.samples.size());
  if (r.config.steps > 0) what += fmt::format(" | {} steps", r.config.steps);
  what += fmt::format(" | {} variant(s) vs {} | {:.1f} s", r.variants.size() - (ref ? 1 : 0), ref ? ref->name : "?",
                      r.elapsed_s);
  if (!r.config.shard.empty()) what += " | shard " + r.config.shard;
  lines.push_back(what);
  lines.emplace_back();

  // Variant table: the first two metrics that have values, and ms per sample when known.
  std::vector<const MetricInfo*> shown;
  for (const auto& m : r.metrics) {
    bool any = false;
    for (const auto& v : r.variants)
      for (const auto& s : v.summary.metrics) any = any || (s.metric == m.key && s.count > 0);
    if (any && shown.size() < 2) shown.push_back(&m);
  }
  std::size_t name_w = 8;
  for (const auto& v : r.variants) name_w = std::max(name_w, v.name.size());
  TextTable table;
  table.columns = {{"variant", false, 8}, {"kind", false, 9}, {"quantized", true, 9}};
  for (const auto* m : shown) table.columns.push_back({m->label + " mean (p5)", false, 17});
  table.columns.push_back({"ms/sample", true, 9});
  table.columns.push_back({"gate", false, 0});
  std::size_t listed = 0;
  std::string more;
  for (const auto& v : r.variants) {
    if (listed++ == kMaxVariantsListed) {
      more = fmt::format("... and {} more variants (see report.html)", r.variants.size() - kMaxVariantsListed);
      break;
    }
    std::vector<std::string> row = {v.name, v.reference ? "reference" : std::string(variant_kind_name(v.kind)),
                                    quantized_text(v)};
    for (const auto* m : shown) {
      std::string cell = "-";
      for (const auto& s : v.summary.metrics)
        if (s.metric == m->key && s.count > 0) cell = num(m->key, s.mean) + " (" + num(m->key, s.p5) + ")";
      row.push_back(cell);
    }
    std::optional<double> ms;
    for (const auto& [name, value] : v.summary.timings)
      if (name == "ms_per_sample") ms = value;
    row.push_back(ms ? fmt::format("{:.0f}", *ms) : "-");
    std::size_t checks = 0, bad = 0, skipped = 0;
    for (const auto& c : r.gate.checks)
      if (c.variant == v.name) ++checks, bad += !c.passed, skipped += !c.measured;
    std::string gate = checks == 0 ? "-" : bad == 0 ? "pass" : fmt::format("FAIL {}/{}", bad, checks - skipped);
    if (skipped) gate += fmt::format(" ({} not measured)", skipped);
    if (v.summary.errors) gate += fmt::format(", {} failed", v.summary.errors);
    row.push_back(gate);
    table.rows.push_back(std::move(row));
  }
  std::string rendered = render_text_table(table, width);
  for (std::size_t at = 0, end; at < rendered.size(); at = end + 1) {
    end = rendered.find('\n', at);
    lines.push_back(rendered.substr(at, end - at));
  }
  if (!more.empty()) lines.push_back(more);
  // Names below are aligned to the table's variant column only while they fit it. A line that
  // would pass the width puts the variant on a line of its own and the rest under it, so that a
  // check's or a node's name is broken only when it alone is wider than the output.
  if (name_w > 24) name_w = 8;
  const auto labelled = [&](const std::string& variant, const std::string& text) {
    const std::string line = fmt::format("  {:<{}}  {}", variant, name_w, text);
    if (line.size() <= width) {
      lines.push_back(line);
    } else {
      lines.push_back("  " + variant);
      lines.push_back("    " + text);
    }
  };

  if (failed) {
    lines.emplace_back();
    lines.push_back("failed checks:");
    std::size_t shown_failed = 0;
    for (const auto& c : r.gate.checks) {
      if (c.passed) continue;
      if (shown_failed++ == kMaxFailedLines) {
        lines.push_back(fmt::format("  ... and {} more", failed - kMaxFailedLines));
        break;
      }
      labelled(c.variant.empty() ? "(run)" : c.variant, fmt::format("{}: value {}", c.name, num(c.metric, c.value)));
    }
  }

  if (unmeasured) {
    lines.emplace_back();
    lines.push_back("not measured (neither pass nor fail):");
    std::size_t shown_skipped = 0;
    for (const auto& c : r.gate.checks) {
      if (c.measured) continue;
      if (shown_skipped++ == kMaxFailedLines) {
        lines.push_back(fmt::format("  ... and {} more", unmeasured - kMaxFailedLines));
        break;
      }
      labelled(c.variant.empty() ? "(run)" : c.variant, c.name);
    }
    // Why, once: the checks of one kind share it.
    for (const auto& c : r.gate.checks)
      if (!c.measured) {
        lines.push_back("  (" + c.detail + ")");
        break;
      }
  }

  std::vector<std::pair<std::string, std::vector<std::string>>> worst;  // variant, its worst layers
  std::size_t by_local = 0;  // of them, ranked by local SQNR (else accumulated: no local error)
  for (const auto& t : r.layer_tables) {
    const Variant* v = r.variant(t.variant);
    if (!v || v->reference) continue;
    std::vector<std::string> items;
    if (!worst_layers(r, t, items)) continue;
    worst.emplace_back(t.variant, std::move(items));
    by_local += !t.stats.local_sqnr_db.empty();
  }
  if (!worst.empty()) {
    lines.emplace_back();
    lines.push_back(by_local == worst.size() ? "worst layers (local SQNR dB):"
                    : by_local == 0          ? "worst layers (accumulated SQNR dB: no local error):"
                                             : "worst layers (local SQNR dB; accumulated where a variant has none):");
    // Layers joined by " | ", wrapped between layers under the first one.
    for (std::size_t i = 0; i < worst.size() && i < 4; ++i) {
      const auto& [variant, items] = worst[i];
      std::string line = fmt::format("  {:<{}}  ", variant, name_w);
      if (line.size() + items[0].size() > width) {
        lines.push_back("  " + variant);
        line = "    ";
      }
      const std::string indent(line.size(), ' ');
      for (std::size_t k = 0; k < items.size(); ++k) {
        const std::string piece = (k ? " | " : "") + items[k];
        if (k && line.size() + piece.size() > width) {
          lines.push_back(line + " |");
          line = indent + items[k];
        } else {
          line += piece;
        }
      }
      lines.push_back(line);
    }
  }

  lines.emplace_back();
  if (r.nonfinite.empty()) {
    lines.push_back("first NaN/Inf: none");
  } else {
    lines.push_back("first NaN/Inf:");
    for (std::size_t i = 0; i < r.nonfinite.size() && i < 3; ++i) {
      const auto& e = r.nonfinite[i];
      labelled(e.variant,
               fmt::format("{}{} ({}){}, sample {}: {} NaN, {} Inf", e.model.empty() ? "" : e.model + " ", e.node, e.op,
                           e.step >= 0 ? fmt::format(" step {}", e.step) : "", e.sample, e.nan_count, e.inf_count));
    }
  }
  if (!out_dir.empty()) lines.push_back("report: " + (out_dir / "report.html").string());

  std::string out;
  for (const auto& l : lines) out += wrap_line(l, width);
  return out;
}

std::string render_junit(const RunReport& r) { return render_gate_junit(r.gate, "qeval run", r.elapsed_s); }

}  // namespace qeval::reports
