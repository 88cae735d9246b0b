// triage.json, triage.html and the stdout summary of `qeval triage`.
#include "reports/triage_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "base/files.h"
#include "kernels/error.h"
#include "metrics/metric_registry.h"
#include "reports/html.h"
#include "reports/json_text.h"
#include "reports/run_report.h"  // artifact_json
#include "reports/text_table.h"

namespace qeval::reports {

using nlohmann::json;

namespace {

json gate_json(const GateSection& g) {
  json checks = json::array();
  for (const auto& c : g.checks)
    checks.push_back({{"name", c.name},
                      {"metric", c.metric},
                      {"stat", c.stat},
                      {"op", c.op},
                      {"threshold", special_number(c.threshold)},
                      {"value", special_number(c.value)},
                      {"passed", c.passed},
                      {"detail", c.detail}});
  return {{"passed", g.passed}, {"checks", checks}};
}

std::string num(std::optional<double> v) {
  if (!v || std::isnan(*v)) return "-";
  if (std::isinf(*v)) return *v > 0 ? "inf" : "-inf";
  return fmt::format("{:.4f}", *v);
}

}  // namespace

json to_json(const TriageReport& r) {
  json j;
  write_header(j, kTriageReportSchemaVersion, "triage", r);
  j["tool_version"] = r.tool_version;  // schema 1.0's key, kept for its readers (1.1: "tool")
  j["elapsed_s"] = r.elapsed_s;
  j["pipeline"] = r.pipeline;
  j["model"] = artifact_json(r.model);
  j["inputs"] = artifact_json(r.inputs);
  j["samples"] = r.samples;
  j["variant"] = r.variant;
  j["reference"] = r.reference;
  j["recipe"] = artifact_json(r.recipe);
  j["fallback_precision"] = r.precision;
  j["metric"] = {{"key", r.metric.key}, {"label", r.metric.label}, {"higher_is_better", r.metric.higher_is_better}};
  j["gate"] = r.gate_source;
  j["rank_by"] = r.rank_by;
  j["variant_as_given"] = {
      {"metric", special_number(r.metric_full)}, {"passed", r.full_passed}, {"gate", gate_json(r.gate_full)}};
  j["all_nodes_kept"] = {{"metric", special_number(r.metric_none)}, {"passed", r.none_passed}};
  j["ranking_runs"] = r.ranking_runs;
  json nodes = json::array();
  for (const auto& n : r.nodes)
    nodes.push_back({{"rank", n.rank},
                     {"model", n.model},
                     {"name", n.name},
                     {"op", n.op},
                     {"category", n.category},
                     {"order", n.order},
                     {"local_sqnr_db", special_number(n.local_sqnr_db)},
                     {"local_rel_l2", special_number(n.local_rel_l2)},
                     {"rank_local", n.rank_local},
                     {"metric_only_quantized", special_number(n.metric_only_quantized)},
                     {"metric_only_kept", special_number(n.metric_only_kept)},
                     {"score", special_number(n.score)}});
  j["nodes"] = nodes;
  json searches = json::array();
  for (const auto& s : r.searches) {
    json steps = json::array();
    for (const auto& st : s.steps)
      steps.push_back(
          {{"kept", st.kept}, {"metric", special_number(st.metric)}, {"passed", st.passed}, {"note", st.note}});
    searches.push_back({{"strategy", s.strategy},
                        {"description", s.description},
                        {"passed", s.passed},
                        {"kept", s.kept},
                        {"runs", s.runs},
                        {"metric", special_number(s.metric)},
                        {"elapsed_s", s.elapsed_s},
                        {"steps", steps}});
  }
  j["searches"] = searches;
  j["chosen"] = r.chosen.empty() ? json(nullptr) : json(r.chosen);
  j["kept"] = r.kept();
  j["gate_chosen"] = gate_json(r.gate_chosen);
  j["override_recipe"] = artifact_json(r.override_recipe);
  json settings = json::object();
  for (const auto& [k, v] : r.settings) settings[k] = v;
  j["settings"] = settings;
  return j;
}

std::string render_summary_text(const TriageReport& r, const std::filesystem::path& out_dir, std::size_t width) {
  std::string s;
  const TriageSearch* best = r.chosen_search();
  if (r.full_passed)
    s += fmt::format("qeval triage: {} already passes the gate ({} {}); nothing to keep in {}\n", r.variant,
                     r.metric.key, num(r.metric_full), r.precision);
  else if (best)
    s += fmt::format("qeval triage: FOUND - keep {} of {} quantized nodes in {}: {} {} -> {} ({} search)\n",
                     best->kept.size(), r.nodes.size(), r.precision, r.metric.key, num(r.metric_full),
                     num(best->metric), best->strategy);
  else
    s += fmt::format("qeval triage: NOT FOUND - {} fails the gate even with every node in {} ({} {})\n", r.variant,
                     r.precision, r.metric.key, num(r.metric_none));
  s += fmt::format("{} | {} | {} sample(s) | {} quantized nodes | {} ranking runs | {:.1f} s\n", r.model.name,
                   r.variant, r.samples, r.nodes.size(), r.ranking_runs, r.elapsed_s);
  if (!r.searches.empty()) {
    s += fmt::format("\n{:<20} {:>6} {:>6} {:>10}  {}\n", "search", "kept", "runs", r.metric.key, "verdict");
    for (const auto& x : r.searches)
      s += fmt::format("{:<20} {:>6} {:>6} {:>10}  {}\n", x.strategy, x.kept.size(), x.runs, num(x.metric),
                       x.passed ? (x.strategy == r.chosen ? "pass (chosen)" : "pass") : "not found");
  }
  s += "\nmost to blame:\n";
  for (std::size_t i = 0; i < r.nodes.size() && i < 5; ++i) {
    const auto& n = r.nodes[i];
    s += fmt::format("  {}. {} ({} {}) local SQNR {} dB", n.rank, n.name, n.model, n.op,
                     n.local_sqnr_db ? fmt::format("{:.1f}", *n.local_sqnr_db) : "-");
    if (n.metric_only_quantized || n.metric_only_kept)
      s += fmt::format(", only quantized {}, only kept {}", num(n.metric_only_quantized), num(n.metric_only_kept));
    s += "\n";
  }
  if (!out_dir.empty()) {
    s += fmt::format("\nreport: {}/triage.html", out_dir.string());
    if (!r.override_recipe.path.empty()) s += fmt::format(" | fallback recipe: {}", r.override_recipe.path);
    s += "\n";
  }
  std::string wrapped;  // long node names and paths wrap, never cut
  for (std::size_t at = 0, end; at < s.size(); at = end + 1) {
    end = s.find('\n', at);
    if (end == std::string::npos) end = s.size();
    wrapped += wrap_line(std::string_view(s).substr(at, end - at), width);
  }
  return wrapped;
}

std::string render_html(const TriageReport& r) {
  using html::esc;
  const std::string mk = r.metric.key;
  std::string h = html::page_begin("qeval triage: " + r.variant,
                                   ".bar{display:inline-block;height:10px;background:#b3261e;vertical-align:middle}"
                                   "td.kept{font-weight:600}");
  h += fmt::format(
      "<h1>qeval triage: {}</h1><div class=\"sub\">{} ({}) &middot; variant {} vs {} &middot; "
      "recipe <code>{}</code> &middot; {} samples of {} &middot; {} &middot; {:.1f} s</div>",
      esc(r.variant), esc(r.model.name), esc(r.pipeline), esc(r.variant), esc(r.reference), esc(r.recipe.path),
      r.samples, esc(r.inputs.path), esc(r.created_utc), r.elapsed_s);
  const TriageSearch* best = r.chosen_search();
  std::string verdict;
  if (r.full_passed)
    verdict = fmt::format("{} already passes the gate ({} {}); no node needs to fall back.", esc(r.variant), esc(mk),
                          html::fmt_value(mk, r.metric_full));
  else if (best)
    verdict = fmt::format(
        "{} fails the gate as given. Keeping {} of {} quantized nodes in {} passes it: {} {} "
        "&rarr; {} ({} search). Fallback recipe: <code>{}</code>.",
        esc(r.variant), best->kept.size(), r.nodes.size(), esc(r.precision), esc(mk),
        html::fmt_value(mk, r.metric_full), html::fmt_value(mk, best->metric), esc(best->strategy),
        esc(r.override_recipe.path.empty() ? r.override_recipe.name : r.override_recipe.path));
  else
    verdict = fmt::format("No fallback passes: with every node in {} the variant gives {} {} and still fails.",
                          esc(r.precision), esc(mk), html::fmt_value(mk, r.metric_none));
  // The colour is the gate's verdict on the variant as given: red unless it passes; a fallback
  // found is said in the heading, not by turning the banner green.
  h += html::verdict_banner(r.full_passed, verdict,
                            r.full_passed ? "PASS"
                            : best        ? "FAIL &middot; fallback found"
                                          : "FAIL &middot; no fallback");

  h += "<h2 id=\"searches\">Searches</h2><table><thead><tr><th>search</th><th>nodes kept</th><th>runs</th>"
       "<th>" +
       esc(r.metric.label) + "</th><th>verdict</th><th>how</th></tr></thead><tbody>";
  h += fmt::format(
      "<tr><td>variant as given</td><td class=\"num\">0</td><td class=\"num\">1</td><td class=\"num\">{}</td>"
      "<td class=\"{}\">{}</td><td>every selected node quantized</td></tr>",
      html::fmt_value(mk, r.metric_full), r.full_passed ? "ok" : "no", r.full_passed ? "pass" : "FAIL");
  h += fmt::format(
      "<tr><td>every node kept</td><td class=\"num\">{}</td><td class=\"num\">1</td><td class=\"num\">{}</td>"
      "<td class=\"{}\">{}</td><td>the best any fallback can do (in {})</td></tr>",
      r.nodes.size(), html::fmt_value(mk, r.metric_none), r.none_passed ? "ok" : "no", r.none_passed ? "pass" : "FAIL",
      esc(r.precision));
  for (const auto& s : r.searches)
    h += fmt::format(
        "<tr class=\"{}\"><td>{}{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>"
        "<td class=\"num\">{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
        s.passed ? "" : "bad", esc(s.strategy), s.strategy == r.chosen ? " (chosen)" : "", s.kept.size(), s.runs,
        html::fmt_value(mk, s.metric), s.passed ? "ok" : "no", s.passed ? "pass" : "not found", esc(s.description));
  h += "</tbody></table>";
  h += fmt::format(
      "<p class=\"sub\">Ranking took {} runs ({}); a run is the variant over every sample. "
      "Gate: <code>{}</code>.</p>",
      r.ranking_runs, r.rank_by == "sensitivity" ? "two per node and every node kept" : "every node kept",
      esc(r.gate_source));

  h += "<h2 id=\"gate\">Gate</h2><p class=\"sub\">The variant as given:</p>" + html::gate_table(r.gate_full, false);
  if (best) h += "<p class=\"sub\">With the fallback:</p>" + html::gate_table(r.gate_chosen, false);

  // Ranked nodes: a bar for the score, the kept ones marked.
  double max_score = 0;
  for (const auto& n : r.nodes) max_score = std::max(max_score, std::abs(n.score));
  h += "<h2 id=\"nodes\">Nodes, most to blame first</h2><table class=\"sortable\"><thead><tr><th>rank</th>"
       "<th>node</th><th>model</th><th>op</th><th>category</th><th>local SQNR dB</th><th>local rank</th>"
       "<th>" +
       esc(mk) + ", only this quantized</th><th>" + esc(mk) +
       ", only this kept</th><th>score</th>"
       "<th>kept</th></tr></thead><tbody>";
  for (const auto& n : r.nodes) {
    const bool kept = std::find(r.kept().begin(), r.kept().end(), n.name) != r.kept().end();
    const int bar = max_score > 0 ? int(std::lround(60.0 * std::max(0.0, n.score) / max_score)) : 0;
    h += fmt::format(
        "<tr><td class=\"num\" data-v=\"{}\">{}</td><td{}>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td class=\"num\" data-v=\"{}\">{}</td><td class=\"num\" data-v=\"{}\">{}</td>"
        "<td class=\"num\" data-v=\"{}\">{}</td><td class=\"num\" data-v=\"{}\">{}</td>"
        "<td class=\"num\" data-v=\"{}\">{} <span class=\"bar\" style=\"width:{}px\"></span></td>"
        "<td>{}</td></tr>",
        n.rank, n.rank, kept ? " class=\"kept\"" : "", esc(n.name), esc(n.model), esc(n.op), esc(n.category),
        html::sort_value(n.local_sqnr_db), html::fmt_value(metrics::keys::kSqnrDb, n.local_sqnr_db), n.rank_local,
        n.rank_local, html::sort_value(n.metric_only_quantized), html::fmt_value(mk, n.metric_only_quantized),
        html::sort_value(n.metric_only_kept), html::fmt_value(mk, n.metric_only_kept), html::sort_value(n.score),
        html::fmt_value("score", n.score), bar, kept ? "<span class=\"ok\">kept</span>" : "");
  }
  h += "</tbody></table>";

  for (const auto& s : r.searches) {
    h += fmt::format(
        "<h2 id=\"search-{}\">{}: every run</h2><table><thead><tr><th>#</th><th>nodes kept</th>"
        "<th>{}</th><th>verdict</th><th>step</th></tr></thead><tbody>",
        esc(s.strategy), esc(s.strategy), esc(r.metric.label));
    for (std::size_t i = 0; i < s.steps.size(); ++i) {
      const auto& st = s.steps[i];
      h += fmt::format(
          "<tr><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>"
          "<td class=\"{}\">{}</td><td>{}</td></tr>",
          i + 1, st.kept, html::fmt_value(mk, st.metric), st.passed ? "ok" : "no", st.passed ? "pass" : "fail",
          esc(st.note));
    }
    h += "</tbody></table>";
  }
  h += "<h2 id=\"settings\">Settings</h2><table><tbody>";
  for (const auto& [k, v] : r.settings) h += "<tr><th>" + esc(k) + "</th><td>" + esc(v) + "</td></tr>";
  h += "<tr><th>command line</th><td><code>" + esc(r.command_line) + "</code></td></tr>";
  h += "<tr><th>qeval</th><td>" + esc(r.tool_version) + "</td></tr></tbody></table>";
  return h + html::page_end();
}

void write_triage_report(const TriageReport& r, const std::filesystem::path& out_dir) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw InputError(out_dir.string() + ": cannot create the folder: " + ec.message());
  base::write_file_atomic(out_dir / "triage.html", render_html(r));
  base::write_file_atomic(out_dir / "triage.json", dump_json_readable(to_json(r)));
}

}  // namespace qeval::reports
