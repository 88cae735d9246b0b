// report.json, report.html and the stdout summary of `qeval compare-recipes` (see recipe_comparison.h).
#include "reports/recipe_comparison.h"

#include <fmt/format.h>

#include <cmath>
#include <set>

#include "base/files.h"
#include "kernels/error.h"
#include "reports/compare_report.h"
#include "reports/html.h"
#include "reports/json_text.h"
#include "reports/metric_format.h"
#include "reports/run_report.h"
#include "reports/text_table.h"

namespace qeval::reports {

using nlohmann::json;

namespace {

constexpr std::string_view kComparisonCss = R"(
.wide{overflow-x:auto} #recipes td{min-width:64px} #recipes .layer{max-width:300px;overflow-wrap:anywhere;font-size:12px}
#recipes code{font-size:11px;overflow-wrap:anywhere}
)";

json row_json(const RecipeRow& r) {
  json metrics = json::array();
  for (const auto& m : r.metrics) metrics.push_back(summary_row_json(m));
  json worst = json::array();
  for (const auto& w : r.worst_layers)
    worst.push_back({{"name", w.name}, {"op", w.op}, {"component", w.component}, {"value", special_number(w.value)}});
  const json size_ratio =
      r.reference_weight_bytes > 0 ? json(double(r.weight_bytes) / double(r.reference_weight_bytes)) : json(nullptr);
  return {
      {"variant", r.variant},
      {"recipe", artifact_json(r.recipe)},
      {"format", r.format},
      {"level", r.level},
      {"precision", r.precision},
      {"quantized_models", r.quantized_models},
      {"gate", {{"passed", r.gate_passed}, {"failed_checks", r.failed_checks}}},
      {"samples", r.samples},
      {"errors", r.errors},
      {"metrics", metrics},
      {"worst_layers", worst},
      {"quantized",
       {{"compute_nodes", r.compute_nodes},
        {"quantized_nodes", r.quantized_nodes},
        {"params_total", r.params_total},
        {"params_quantized", r.params_quantized},
        {"param_share", json_number(r.param_share())},
        {"macs_total", json_number(r.macs_total)},
        {"macs_quantized", json_number(r.macs_quantized)},
        {"mac_share", json_number(r.mac_share())}}},
      {"size",
       {{"weight_bytes", r.weight_bytes}, {"reference_weight_bytes", r.reference_weight_bytes}, {"ratio", size_ratio}}},
      {"speed",
       {{"class", r.speed_class},
        {"reasons", r.speed_reasons},
        {"lint_errors", r.lint_errors},
        {"lint_warnings", r.lint_warnings},
        {"lint_rules", r.lint_rules}}},
      {"calibration", {{"seconds", json_number(r.calibration_s)}, {"cache_hit", r.calibration_cache_hit}}}};
}

std::string mb(std::int64_t bytes) { return fmt::format("{:.2f} MB", double(bytes) / 1e6); }

std::string pct(std::optional<double> share) { return share ? fmt::format("{:.1f}%", 100.0 * *share) : "&ndash;"; }

std::string num_td(std::string_view metric, std::optional<double> v, std::string_view extra = {}) {
  return "<td class=\"num\" data-v=\"" + html::sort_value(v) + "\">" + html::fmt_value(metric, v) + std::string(extra) +
         "</td>";
}

const char* speed_color(std::string_view c) {
  if (c == "faster") return "#1f7a3f";
  if (c == "about-fp16") return "#5b6475";
  if (c == "slower-risk") return "#b36b00";
  return "#b3261e";
}

std::string metric_label(const RecipeComparison& r, std::string_view key) {
  for (const auto& m : r.metrics)
    if (m.key == key) return m.label;
  return std::string(key);
}

std::optional<double> mean_of(const RecipeRow& row, std::string_view key) {
  const SummaryRow* s = row.metric(key);
  if (!s || s->count == 0) return std::nullopt;
  return s->mean;
}

// The metrics the table shows: the quality metric and the next one with values (report.json has all).
std::vector<MetricInfo> table_metrics(const RecipeComparison& r) {
  std::vector<MetricInfo> out;
  for (const auto& m : r.metrics) {
    if (out.size() == 2) break;
    bool any = false;
    for (const auto& row : r.rows) any |= mean_of(row, m.key).has_value();
    if (any || m.key == r.quality_metric) out.push_back(m);
  }
  return out;
}

std::string render_table(const RecipeComparison& r) {
  const std::vector<MetricInfo> metrics = table_metrics(r);
  std::string h =
      "<div class=\"wide\"><table class=\"sortable\" id=\"recipes\"><thead><tr><th>recipe</th><th>gate</th>";
  for (const auto& m : metrics) h += "<th>" + html::esc(m.label) + " mean (p5)</th>";
  // "Quantized" is one thing in every report: the share of MACs (per call) run quantized, with the
  // parameters and compute nodes beside it, over the models named in the header.
  std::set<std::string> models;
  for (const auto& row : r.rows) models.insert(row.quantized_models.begin(), row.quantized_models.end());
  std::string scope;
  for (const auto& m : models) scope += (scope.empty() ? "" : " + ") + m;
  h += "<th>worst layers (" + html::esc(r.layer_column) +
       ")</th><th title=\"share of multiply-accumulates run "
       "quantized; then of parameters and compute nodes (Conv, MatMul, Gemm)\">quantized" +
       (scope.empty() ? std::string() : " <span class=\"sub\">(" + html::esc(scope) + ")</span>") +
       "</th><th>est. weights</th><th>speed class (" + html::esc(r.target) +
       ")</th><th>calibration</th></tr></thead><tbody>";
  for (const auto& row : r.rows) {
    h += fmt::format("<tr class=\"{}\" data-recipe=\"{}\">", row.gate_passed ? "" : "bad", html::esc(row.variant));
    h += "<td><b>" + html::esc(row.variant) + "</b><br><span class=\"sub\">" + html::esc(row.format) + ", level " +
         html::esc(row.level) + ", rest " + html::esc(row.precision) + "<br><code>" + html::esc(row.recipe.path) +
         "</code></span></td>";
    h += fmt::format("<td class=\"{}\">{}", row.gate_passed ? "ok" : "no", row.gate_passed ? "pass" : "FAIL");
    for (const auto& f : row.failed_checks) h += "<br><span class=\"sub\">" + html::esc(f) + "</span>";
    h += "</td>";
    for (const auto& m : metrics) {
      const SummaryRow* s = row.metric(m.key);
      const bool has = s && s->count > 0;
      h += num_td(m.key, has ? std::optional<double>(s->mean) : std::nullopt,
                  has ? " <span class=\"sub\">(" + html::fmt_value(m.key, s->p5) + ")</span>" : std::string());
    }
    h += "<td>";
    for (const auto& w : row.worst_layers)
      h += "<div class=\"layer\"><span class=\"num\">" + html::fmt_value(r.layer_column, w.value) + "</span> <code>" +
           html::esc(w.name) + "</code></div>";
    h += "</td>";
    h += fmt::format(
        "<td class=\"num\" data-v=\"{}\">{} <span class=\"sub\">of MACs</span><br><span class=\"sub\">{} "
        "of params &middot; {}/{} nodes</span></td>",
        html::sort_value(row.mac_share()), pct(row.mac_share()), pct(row.param_share()), row.quantized_nodes,
        row.compute_nodes);
    h += fmt::format("<td class=\"num\" data-v=\"{}\">{}<br><span class=\"sub\">{} unquantized</span></td>",
                     row.weight_bytes, mb(row.weight_bytes), mb(row.reference_weight_bytes));
    h += fmt::format("<td><b style=\"color:{}\">{}</b>", speed_color(row.speed_class), html::esc(row.speed_class));
    for (const auto& reason : row.speed_reasons) h += "<br><span class=\"sub\">" + html::esc(reason) + "</span>";
    h += "</td>";
    h +=
        "<td class=\"num\">" +
        (row.calibration_s ? fmt::format("{:.1f} s{}", *row.calibration_s, row.calibration_cache_hit ? " (cached)" : "")
                           : std::string("&ndash;")) +
        "</td></tr>";
  }
  return h + "</tbody></table></div>";
}

std::string render_charts(const RecipeComparison& r) {
  auto points = [&](auto x_of, auto y_of) {
    std::vector<html::ScatterPoint> pts;
    for (const auto& row : r.rows) {
      const std::optional<double> x = x_of(row), y = y_of(row);
      html::ScatterPoint p;
      p.label = row.variant;
      p.x = x ? *x : NAN;
      p.y = y ? *y : NAN;
      p.color = row.gate_passed ? "#1f7a3f" : "#b3261e";
      p.tooltip = fmt::format("{}: gate {}", row.variant, row.gate_passed ? "pass" : "FAIL");
      pts.push_back(p);
    }
    return pts;
  };
  const std::string q = r.quality_metric, ql = metric_label(r, q) + " (mean)";
  auto quality = [&](const RecipeRow& row) { return mean_of(row, q); };
  auto worst = [&](const RecipeRow& row) -> std::optional<double> {
    if (row.worst_layers.empty()) return std::nullopt;
    return row.worst_layers.front().value;
  };
  std::string h = "<div class=\"charts\">";
  h += html::scatter_chart(ql + " vs MACs quantized", "share of multiply-accumulates quantized", ql,
                           points([](const RecipeRow& row) { return row.mac_share(); }, quality), true);
  h += html::scatter_chart(ql + " vs parameters quantized", "share of weight parameters quantized", ql,
                           points([](const RecipeRow& row) { return row.param_share(); }, quality), true);
  h += html::scatter_chart("worst layer vs MACs quantized", "share of multiply-accumulates quantized",
                           "worst " + r.layer_column,
                           points([](const RecipeRow& row) { return row.mac_share(); }, worst), true);
  return h + "</div><p class=\"sub\">Green: passes the gate; red: fails it.</p>";
}

std::string render_config(const RecipeComparison& r) {
  const RunConfig& c = r.config;
  std::string h = "<table><tbody>";
  auto row = [&](std::string_view k, const std::string& v) {
    h += "<tr><th>" + html::esc(k) + "</th><td>" + html::esc(v) + "</td></tr>";
  };
  row("pipeline", c.pipeline + " " + c.model.name + " (" + c.model.path + ")");
  row("inputs", c.inputs.name + " (" + c.inputs.path + ")");
  if (c.calibration) row("calibration", c.calibration->name + " (" + c.calibration->path + ")");
  row("reference", c.reference_variant + " (" + r.reference_precision + ")");
  if (c.steps) row("scheduler", fmt::format("{}, {} steps", c.scheduler, c.steps));
  for (const auto& [k, v] : c.settings) row(k, v);
  row("speed target", r.target);
  row("command", r.command_line);
  row("qeval", r.tool_version + ", " + r.created_utc + fmt::format(", {:.1f} s", r.elapsed_s));
  return h + "</tbody></table>";
}

}  // namespace

json to_json(const RecipeComparison& r) {
  json metrics = json::array();
  for (const auto& m : r.metrics)
    metrics.push_back({{"key", m.key}, {"label", m.label}, {"higher_is_better", m.higher_is_better}});
  json checks = json::array();
  for (const auto& c : r.gate.checks)
    checks.push_back({{"variant", c.variant},
                      {"name", c.name},
                      {"metric", c.metric},
                      {"stat", c.stat},
                      {"op", c.op},
                      {"threshold", c.threshold},
                      {"value", json_number(c.value)},
                      {"passed", c.passed},
                      {"detail", c.detail}});
  json rows = json::array();
  json passed = json::array();
  for (const auto& row : r.rows) {
    rows.push_back(row_json(row));
    if (row.gate_passed) passed.push_back(row.variant);
  }
  const RunConfig& c = r.config;
  json config = {{"pipeline", c.pipeline},
                 {"model", artifact_json(c.model)},
                 {"inputs", artifact_json(c.inputs)},
                 {"calibration", c.calibration ? artifact_json(*c.calibration) : json(nullptr)},
                 {"reference_variant", c.reference_variant},
                 {"reference_precision", r.reference_precision},
                 {"scheduler", c.scheduler},
                 {"steps", c.steps},
                 {"seeds", c.seeds},
                 {"threads", c.threads},
                 {"target", r.target}};
  json j = {{"elapsed_s", r.elapsed_s},
            {"config", config},
            {"metrics", metrics},
            {"quality_metric", r.quality_metric},
            {"layer_column", r.layer_column},
            {"run_report", r.run_report},
            {"gate", {{"source", r.gate.source}, {"passed_recipes", passed}, {"checks", checks}}},
            {"recipes", rows}};
  write_header(j, kRecipeComparisonSchemaVersion, "qeval.compare-recipes", r);
  return j;
}

std::string render_html(const RecipeComparison& r) {
  std::size_t npass = 0;
  std::string names;
  for (const auto& row : r.rows)
    if (row.gate_passed) npass++, names += (names.empty() ? "" : ", ") + html::esc(row.variant);
  std::string h = html::page_begin("qeval compare-recipes: " + r.config.model.name,
                                   std::string(html::kChartCss) + std::string(kComparisonCss));
  h += "<h1>Recipe comparison: " + html::esc(r.config.model.name) + "</h1><p class=\"sub\">" +
       fmt::format("{} recipe(s) against {} ({}), {} pipeline", r.rows.size(), html::esc(r.config.reference_variant),
                   html::esc(r.reference_precision), html::esc(r.config.pipeline)) +
       "</p>";
  h += "<section id=\"verdict\">" +
       html::verdict_banner(npass > 0, fmt::format("{} of {} recipe(s) pass the gate ({}){}", npass, r.rows.size(),
                                                   html::esc(r.gate.source), npass ? ": " + names : "")) +
       "</section>";
  h += "<section id=\"recipes-section\"><h2>Recipes</h2><p class=\"sub\">Click a header to sort. Shares are of the "
       "Conv/MatMul/Gemm weights and multiply-accumulates per call of the models any recipe rewrote; weights are "
       "estimated engine "
       "bytes of every model of the pipeline; speed classes follow the <code>qeval lint</code> rules "
       "(docs/compare-recipes.md).</p>" +
       render_table(r) + "</section>";
  h += "<section id=\"charts\"><h2>Quality against quantized share</h2>" + render_charts(r) + "</section>";
  h += "<section id=\"gate\"><h2>Gate</h2>" + html::gate_table(r.gate, true) + "</section>";
  if (!r.run_report.empty())
    h += "<section id=\"run\"><h2>Full run report</h2><p>Per-sample images, per-layer and per-step tables: <a href=\"" +
         html::esc(r.run_report) + "\">" + html::esc(r.run_report) + "</a></p></section>";
  h += "<section id=\"config\"><h2>Configuration</h2>" + render_config(r) + "</section>";
  h += html::page_end();
  return h;
}

std::string render_summary_text(const RecipeComparison& r, const std::filesystem::path& out_dir, std::size_t width) {
  std::size_t npass = 0;
  for (const auto& row : r.rows) npass += row.gate_passed;
  std::string s = wrap_line(
      fmt::format("qeval compare-recipes: {} of {} recipe(s) pass the gate ({})", npass, r.rows.size(), r.gate.source),
      width);
  s += wrap_line(fmt::format("{} | {} | reference {} | speed target {}", r.config.model.name, r.config.pipeline,
                             r.config.reference_variant, r.target),
                 width);
  s += "\n";
  const std::string q = r.quality_metric;
  TextTable table;
  table.gap = " ";
  table.columns = {{"recipe", false, 16},   {"gate", true, 5},   {metric_label(r, q) + " mean", true, 14},
                   {"worst lyr", true, 10}, {"params", true, 8}, {"MACs", true, 8},
                   {"weights", true, 10},   {"speed", false, 0}};
  for (const auto& row : r.rows) {
    const auto quality = mean_of(row, q);
    auto share = [](std::optional<double> v) { return v ? fmt::format("{:.1f}%", 100 * *v) : std::string("-"); };
    table.rows.push_back({row.variant, row.gate_passed ? "pass" : "FAIL", quality ? format_metric(q, *quality) : "-",
                          row.worst_layers.empty() ? "-" : fmt::format("{:.2f}", row.worst_layers.front().value),
                          share(row.param_share()), share(row.mac_share()),
                          fmt::format("{:.2f} MB", double(row.weight_bytes) / 1e6), row.speed_class});
  }
  s += render_text_table(table, width);
  for (const auto& row : r.rows)
    for (const auto& f : row.failed_checks) s += wrap_line("  " + row.variant + " failed: " + f, width);
  if (!out_dir.empty()) s += "\n" + wrap_line("report: " + (out_dir / "report.html").string(), width);
  return s;
}

void write_recipe_comparison(const RecipeComparison& r, const std::filesystem::path& out_dir) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw InputError(out_dir.string() + ": cannot create the output folder: " + ec.message());
  base::write_file_atomic(out_dir / "report.html", render_html(r));
  base::write_file_atomic(out_dir / "report.json", dump_json_readable(to_json(r)));
}

}  // namespace qeval::reports
