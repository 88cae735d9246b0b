// Rendering of the compare-images report to JSON, HTML and JUnit XML.
#include "reports/compare_report.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <string_view>

#include "base/files.h"
#include "kernels/error.h"
#include "metrics/metric_registry.h"
#include "reports/html.h"
#include "reports/json_text.h"
#include "reports/junit.h"

namespace qeval::reports {

using nlohmann::json;

json json_number(std::optional<double> v) {
  if (v && std::isfinite(*v)) return *v;
  return nullptr;
}

namespace {

json metric_json(const metrics::MetricValue& m) {
  json j = json_number(m.value);
  return j;
}

// The image-pair metrics a pair row shows (registry order): the headline ones, or the summarized ones.
std::vector<std::string> pair_metric_keys(bool headline) {
  std::vector<std::string> out;
  for (const metrics::MetricDef& d : metrics::metric_defs())
    if (d.scope == metrics::MetricScope::kImagePair && (headline ? d.headline : d.summarized) &&
        d.key != metrics::keys::kMaxAbsDiff)
      out.emplace_back(d.key);
  return out;
}

bool is_headline(const std::string& key) {
  const metrics::MetricDef* d = metrics::find_metric(key);
  return d && d->key == key && d->headline;
}

json pair_json(const PairRow& p) {
  json j;
  j["name"] = p.name;
  j["status"] = p.ok() ? "ok" : "error";
  j["ref"] = p.ref_path.empty() ? json(nullptr) : json(p.ref_path);
  j["test"] = p.test_path.empty() ? json(nullptr) : json(p.test_path);
  if (!p.ok()) {
    j["error"] = p.error;
    j["error_kind"] = p.error_kind;
  }
  for (const std::string& key : pair_metric_keys(true)) {
    const auto* m = p.metric(key);
    j[key] = m ? metric_json(*m) : json(nullptr);
  }
  if (p.ok()) {
    j["identical"] = p.identical;
    j["width"] = p.width;
    j["height"] = p.height;
    j["channels"] = p.channels;
    j["bit_depth"] = p.bit_depth;
    j["color_type"] = p.color_type;
    j[metrics::keys::kMaxAbsDiff] = p.max_abs_diff;
    json extra = json::object();
    json per_channel = json::object();
    json notes = json::object();
    for (const auto& m : p.metrics) {
      if (!is_headline(m.key)) extra[m.key] = metric_json(m);
      if (!m.per_channel.empty()) {
        json arr = json::array();
        for (const auto& v : m.per_channel) arr.push_back(json_number(v));
        per_channel[m.key] = arr;
      }
      if (!m.note.empty()) notes[m.key] = m.note;
    }
    j["metrics"] = extra;
    j["per_channel"] = per_channel;
    j["metric_notes"] = notes;
  }
  j["notes"] = p.notes;
  j["failed_checks"] = p.failed_checks;
  j["passed"] = p.ok() && p.failed_checks.empty();
  return j;
}

}  // namespace

json to_json(const CompareImagesReport& r) {
  json j;
  write_header(j, kCompareImagesSchemaVersion, "compare-images", r);
  json config = json::object();
  for (const auto& [k, v] : r.config) config[k] = v;
  j["config"] = config;
  json conventions = json::object();
  for (const auto& [k, v] : r.conventions) conventions[k] = v;
  j["conventions"] = conventions;
  std::size_t identical = 0;
  for (const auto& p : r.pairs) identical += p.ok() && p.identical;
  json summary = {{"pairs", r.pairs.size()},
                  {"compared", r.pairs.size() - r.count_errors()},
                  {"errors", r.count_errors()},
                  {"identical", identical},
                  {"elapsed_s", r.elapsed_s}};
  json stats = json::object();
  for (const auto& s : r.summary) {
    stats[s.metric] = {{"count", s.count}, {"unbounded", s.unbounded}, {"not_applicable", s.not_applicable}};
    if (s.count > 0)
      stats[s.metric].update(
          {{"mean", s.mean}, {"min", s.min}, {"p5", s.p5}, {"median", s.median}, {"p95", s.p95}, {"max", s.max}});
  }
  summary["metrics"] = stats;
  j["summary"] = summary;
  json checks = json::array();
  for (const auto& c : r.gate.checks) {
    json cj = {{"name", c.name},     {"metric", c.metric},       {"stat", c.stat},
               {"op", c.op},         {"threshold", c.threshold}, {"value", json_number(c.value)},
               {"passed", c.passed}, {"detail", c.detail}};
    if (c.value && std::isinf(*c.value)) cj["value_unbounded"] = true;
    checks.push_back(cj);
  }
  j["gate"] = {{"passed", r.gate.passed}, {"source", r.gate.source}, {"checks", checks}};
  json pairs = json::array();
  for (const auto& p : r.pairs) pairs.push_back(pair_json(p));
  j["pairs"] = pairs;
  return j;
}

namespace {

using html::esc;
using html::fmt_value;
using html::sort_value;

}  // namespace

std::string render_html(const CompareImagesReport& r) {
  std::string h;
  h.reserve(1 << 16);
  const std::size_t errors = r.count_errors();
  std::size_t failed_checks = 0;
  for (const auto& c : r.gate.checks) failed_checks += !c.passed;

  h += html::page_begin(std::string("qeval compare-images: ") + (r.gate.passed ? "PASS" : "FAIL"));
  h += "<h1>qeval compare-images</h1><div class=\"sub\">" + header_subtitle(r) + "</div>";

  h += html::verdict_banner(r.gate.passed, fmt::format("{} of {} gate checks passed &middot; {} pairs, {} compared, {} "
                                                       "could not be compared",
                                                       r.gate.checks.size() - failed_checks, r.gate.checks.size(),
                                                       r.pairs.size(), r.pairs.size() - errors, errors));

  h += "<h2 id=\"gate\">Gate</h2><div class=\"sub\">" + esc(r.gate.source) + "</div>";
  h += html::gate_table(r.gate, false);

  h += "<h2 id=\"summary\">Summary</h2><table><thead><tr><th>metric</th><th>pairs</th><th>mean</th><th>min</th>"
       "<th>p5</th><th>median</th><th>p95</th><th>max</th><th>note</th></tr></thead><tbody>";
  for (const auto& s : r.summary) {
    std::string note;
    if (s.unbounded) note += fmt::format("{} identical (unbounded, excluded) ", s.unbounded);
    if (s.not_applicable) note += fmt::format("{} not applicable", s.not_applicable);
    if (s.count == 0) {
      h += fmt::format("<tr><td>{}</td><td class=\"num\">0</td><td colspan=\"6\"></td><td>{}</td></tr>", esc(s.metric),
                       esc(note));
      continue;
    }
    h += fmt::format("<tr><td>{}</td><td class=\"num\">{}</td>", esc(s.metric), s.count);
    for (double v : {s.mean, s.min, s.p5, s.median, s.p95, s.max})
      h += "<td class=\"num\">" + fmt_value(s.metric, v) + "</td>";
    h += "<td>" + esc(note) + "</td></tr>";
  }
  h += "</tbody></table>";

  if (!r.worst.empty()) {
    h += "<h2 id=\"worst\">Worst pairs</h2><div class=\"sub\">reference | test | |reference &minus; test| "
         "(max over channels, in 8-bit levels of the peak), on one fixed scale for every pair: <span "
         "id=\"diff-legend\">" +
         html::difference_scale_legend() + "</span></div>";
    for (const auto& s : r.worst) {
      h += "<div class=\"strip\"><b>" + esc(s.name) + "</b> &middot; " + esc(s.caption) + "<div class=\"imgs\">";
      h += "<figure><img alt=\"reference\" src=\"" + html::png_data_uri(s.ref_png) +
           "\"><figcaption>reference</figcaption></figure>";
      h += "<figure><img alt=\"test\" src=\"" + html::png_data_uri(s.test_png) +
           "\"><figcaption>test</figcaption></figure>";
      h += "<figure>" +
           html::difference_img("difference", html::png_data_uri(s.heatmap_png),
                                s.heatmap_x8_png.empty() ? std::string() : html::png_data_uri(s.heatmap_x8_png)) +
           html::difference_caption(esc(s.heatmap_legend), esc(s.heatmap_x8_legend)) + "</figure>";
      h += "</div></div>";
    }
  }

  h += "<h2 id=\"pairs\">Pairs</h2><div class=\"sub\">click a column to sort</div>"
       "<table class=\"sortable\"><thead><tr><th>name</th><th>status</th><th>size</th>";
  const std::vector<std::string> columns = pair_metric_keys(false);
  for (const auto& key : columns) h += "<th>" + esc(std::string(metrics::metric_def(key).label)) + "</th>";
  h += "<th>" + esc(std::string(metrics::metric_def(metrics::keys::kMaxAbsDiff).label)) +
       "</th><th>notes</th></tr></thead><tbody>";
  for (const auto& p : r.pairs) {
    auto value = [&](const std::string& key) -> std::optional<double> {
      const auto* m = p.metric(key);
      if (!m) return std::nullopt;
      return metrics::counted_value(metrics::find_metric(key), m->value, p.identical);
    };
    std::string status = !p.ok()                   ? "<span class=\"no\">error</span>"
                         : p.failed_checks.empty() ? "<span class=\"ok\">ok</span>"
                                                   : "<span class=\"no\">below threshold</span>";
    std::string notes = p.ok() ? "" : esc(p.error);
    for (const auto& c : p.failed_checks) notes += (notes.empty() ? "" : "; ") + esc(c);
    for (const auto& n : p.notes) notes += (notes.empty() ? "" : "; ") + esc(n);
    for (const auto& m : p.metrics)
      if (!m.value && !p.identical && !m.note.empty())
        notes += (notes.empty() ? "" : "; ") + esc(m.key + ": " + m.note);
    h += fmt::format(
        "<tr class=\"{}\"><td>{}</td><td>{}</td><td>{}</td>", !p.ok() ? "err" : (p.failed_checks.empty() ? "" : "bad"),
        esc(p.name), status,
        p.ok() ? fmt::format("{}&times;{} {} {}-bit", p.width, p.height, esc(p.color_type), p.bit_depth) : "");
    for (const auto& key : columns)
      h += "<td class=\"num\" data-v=\"" + sort_value(value(key)) + "\">" + fmt_value(key, value(key)) + "</td>";
    h += fmt::format("<td class=\"num\" data-v=\"{}\">{}</td><td>{}</td></tr>",
                     p.ok() ? fmt::format("{}", p.max_abs_diff) : "",
                     p.ok() ? fmt::format("{:g}", p.max_abs_diff) : "&ndash;", notes);
  }
  h += "</tbody></table>";

  h += "<h2 id=\"config\">Configuration</h2><table><tbody>";
  for (const auto& [k, v] : r.config) h += "<tr><th>" + esc(k) + "</th><td>" + esc(v) + "</td></tr>";
  for (const auto& [k, v] : r.conventions) h += "<tr><th>" + esc(k) + "</th><td>" + esc(v) + "</td></tr>";
  h += fmt::format("<tr><th>elapsed</th><td>{:.2f} s</td></tr>", r.elapsed_s);
  h += "</tbody></table>";
  h += html::page_end(html::kGainToggleJs);
  return h;
}

std::string render_junit(const CompareImagesReport& r) {
  return render_gate_junit(r.gate, "qeval compare-images", r.elapsed_s);
}

void write_compare_images_report(const CompareImagesReport& report, const std::filesystem::path& out_dir) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw InputError(out_dir.string() + ": cannot create the output folder: " + ec.message());
  // HTML and JUnit first: report.json appearing is the signal that the report is complete.
  base::write_file_atomic(out_dir / "report.html", render_html(report));
  base::write_file_atomic(out_dir / "junit.xml", render_junit(report));
  base::write_file_atomic(out_dir / "report.json", dump_json_utf8_safe(to_json(report), 2) + "\n");
}

}  // namespace qeval::reports
