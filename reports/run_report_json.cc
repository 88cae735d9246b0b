// report.json of `qeval run`: writer and reader (schema: docs/report.schema.json).
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>

#include "base/files.h"
#include "base/input_file.h"
#include "kernels/error.h"
#include "reports/json_text.h"
#include "reports/run_report.h"

namespace qeval::reports {

using nlohmann::json;

json artifact_json(const Artifact& a) { return {{"name", a.name}, {"path", a.path}, {"fingerprint", a.fingerprint}}; }

json summary_row_json(const SummaryRow& s) {
  json j = {{"metric", s.metric}, {"count", s.count}, {"unbounded", s.unbounded}, {"not_applicable", s.not_applicable}};
  if (s.count > 0)
    j.update({{"mean", s.mean}, {"min", s.min}, {"p5", s.p5}, {"median", s.median}, {"p95", s.p95}, {"max", s.max}});
  return j;
}

namespace {

// A float cell written with the shortest digits that read back to the same float.
json cell_json(float v) {
  if (!std::isfinite(v)) return special_number(double(v));
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v);
  double d = 0;
  std::from_chars(buf, res.ptr, d);
  return d;
}

json cells_json(const std::vector<float>& column) {
  json a = json::array();
  for (float v : column) a.push_back(cell_json(v));
  return a;
}

json columns_json(const LayerColumns& c) {
  json j = json::object();
  for (const auto& info : kLayerColumns)
    if (!(c.*info.column).empty()) j[info.key] = cells_json(c.*info.column);
  return j;
}

json optional_artifact_json(const std::optional<Artifact>& a) { return a ? artifact_json(*a) : json(nullptr); }

json variant_json(const Variant& v) {
  json unmatched = json::array();
  for (const auto& u : v.unmatched)
    unmatched.push_back({{"side", u.side}, {"name", u.name}, {"op", u.op}, {"reason", u.reason}});
  json unquantized = json::array();
  for (const auto& u : v.unquantized)
    unquantized.push_back({{"model", u.model}, {"name", u.name}, {"op", u.op}, {"reason", u.reason}});
  json quantization = json::array();
  for (const auto& q : v.quantization)
    quantization.push_back({{"model", q.model},
                            {"mac_share", special_number(q.mac_share())},
                            {"macs", special_number(q.macs)},
                            {"quantized_macs", special_number(q.quantized_macs)},
                            {"params", q.params},
                            {"quantized_params", q.quantized_params},
                            {"compute_nodes", q.compute_nodes},
                            {"quantized_nodes", q.quantized_nodes}});
  json metrics = json::array();
  for (const auto& s : v.summary.metrics) metrics.push_back(summary_row_json(s));
  json timings = json::array();
  for (const auto& [name, value] : v.summary.timings)
    timings.push_back({{"name", name}, {"value", special_number(value)}});
  return {{"name", v.name},
          {"kind", variant_kind_name(v.kind)},
          {"precision", v.precision},
          {"reference", v.reference},
          {"recipe", optional_artifact_json(v.recipe)},
          {"onnx", optional_artifact_json(v.onnx)},
          {"total_nodes", v.total_nodes},
          {"quantized_nodes", v.quantized_nodes},
          {"quantized_share", special_number(v.quantized_share())},
          {"matched_by_name", v.matched_by_name},
          {"matched_by_output", v.matched_by_output},
          {"matched_by_structure", v.matched_by_structure},
          {"unmatched", unmatched},
          {"unquantized", unquantized},
          {"quantization", quantization},
          {"summary",
           {{"samples", v.summary.samples}, {"errors", v.summary.errors}, {"metrics", metrics}, {"timings", timings}}}};
}

json image_json(const ImageRef& img) { return img.path.empty() ? json(nullptr) : json(img.path); }

json result_json(const SampleResult& r) {
  json metrics = json::object(), notes = json::object(), per_channel = json::object();
  for (const auto& m : r.metrics) {
    metrics[m.key] = special_number(m.value);
    if (!m.note.empty()) notes[m.key] = m.note;
    if (!m.per_channel.empty()) {
      json a = json::array();
      for (const auto& c : m.per_channel) a.push_back(special_number(c));
      per_channel[m.key] = a;
    }
  }
  return {{"variant", r.variant},
          {"status", r.ok() ? "ok" : "error"},
          {"error", r.error},
          {"identical", r.identical},
          {"metrics", metrics},
          {"metric_notes", notes},
          {"per_channel", per_channel},
          {"image", image_json(r.image)},
          {"heatmap", image_json(r.heatmap)},
          {"heatmap_legend", r.heatmap_legend},
          {"heatmap_amplified", image_json(r.heatmap_amplified)},
          {"elapsed_ms", special_number(r.elapsed_ms)},
          {"failed_checks", r.failed_checks}};
}

json gate_json(const GateSection& g) {
  json checks = json::array();
  for (const auto& c : g.checks)
    checks.push_back({{"name", c.name},
                      {"variant", c.variant},
                      {"metric", c.metric},
                      {"stat", c.stat},
                      {"op", c.op},
                      {"threshold", special_number(c.threshold)},
                      {"value", special_number(c.value)},
                      {"passed", c.passed},
                      {"measured", c.measured},
                      {"detail", c.detail}});
  return {{"passed", g.passed}, {"source", g.source}, {"checks", checks}};
}

}  // namespace

json to_json(const RunReport& r) {
  json j;
  write_header(j, kRunReportSchemaVersion, "run", r);
  j["elapsed_s"] = special_number(r.elapsed_s);
  j["resume"] = {{"reused_units", r.reused_units}, {"elapsed_s_before", special_number(r.elapsed_before_s)}};

  const RunConfig& c = r.config;
  json settings = json::array();
  for (const auto& [k, v] : c.settings) settings.push_back({{"key", k}, {"value", v}});
  j["config"] = {{"pipeline", c.pipeline},
                 {"model", artifact_json(c.model)},
                 {"inputs", artifact_json(c.inputs)},
                 {"calibration", optional_artifact_json(c.calibration)},
                 {"reference_variant", c.reference_variant},
                 {"scheduler", c.scheduler},
                 {"steps", c.steps},
                 {"seeds", c.seeds},
                 {"threads", c.threads},
                 {"device", c.device},
                 {"shard", c.shard},
                 {"settings", settings}};

  json metrics = json::array();
  for (const auto& m : r.metrics)
    metrics.push_back({{"key", m.key}, {"label", m.label}, {"higher_is_better", m.higher_is_better}});
  j["metrics"] = metrics;

  json variants = json::array();
  for (const auto& v : r.variants) variants.push_back(variant_json(v));
  j["variants"] = variants;

  json samples = json::array();
  for (const auto& s : r.samples) {
    json results = json::array();
    for (const auto& res : s.results) results.push_back(result_json(res));
    samples.push_back(
        {{"id", s.id}, {"prompt", s.prompt}, {"seed", s.seed ? json(*s.seed) : json(nullptr)}, {"results", results}});
  }
  j["samples"] = samples;

  json nodes = json::array();
  for (const auto& l : r.layers) nodes.push_back({{"name", l.name}, {"op", l.op}, {"component", l.component}});
  json tables = json::array();
  for (const auto& t : r.layer_tables)
    tables.push_back({{"variant", t.variant},
                      {"samples", t.samples},
                      {"format", t.format},
                      {"calib_amax", cells_json(t.calib_amax)},
                      {"out_of_range_steps", cells_json(t.out_of_range_steps)},
                      {"stats", columns_json(t.stats)}});
  j["layers"] = {{"nodes", nodes}, {"tables", tables}};

  json step_tables = json::array();
  for (const auto& t : r.timesteps.tables)
    step_tables.push_back({{"variant", t.variant}, {"stats", columns_json(t.stats)}});
  json t_values = json::array();
  for (double t : r.timesteps.t) t_values.push_back(special_number(t));
  j["timesteps"] = {{"component", r.timesteps.component},
                    {"mode", r.timesteps.mode},
                    {"t", t_values},
                    {"layers", r.timesteps.layers},
                    {"tables", step_tables}};

  json curves = json::array();
  for (const auto& cv : r.step_curves) {
    json values = json::array();
    for (double v : cv.values) values.push_back(special_number(v));
    curves.push_back({{"variant", cv.variant},
                      {"quantity", cv.quantity},
                      {"metric", cv.metric},
                      {"mode", cv.mode},
                      {"values", values}});
  }
  j["step_curves"] = curves;

  json hists = json::array();
  for (const auto& h : r.histograms)
    hists.push_back({{"variant", h.variant},
                     {"layer", h.layer},
                     {"step", h.step},
                     {"lo", h.lo},
                     {"hi", h.hi},
                     {"counts", h.counts},
                     {"below", h.below},
                     {"above", h.above}});
  j["histograms"] = hists;

  json nonfinite = json::array();
  for (const auto& e : r.nonfinite)
    nonfinite.push_back({{"variant", e.variant},
                         {"sample", e.sample},
                         {"step", e.step},
                         {"node", e.node},
                         {"op", e.op},
                         {"nan_count", e.nan_count},
                         {"inf_count", e.inf_count},
                         {"model", e.model}});
  j["nonfinite"] = nonfinite;
  j["gate"] = gate_json(r.gate);
  return j;
}

// ---------------------------------------------------------------------------------------------
// Reader

namespace {

// A value inside the document with its key path, for errors that say where and what.
class In {
 public:
  In(const json& v, const std::string& source, std::string path) : v_(v), source_(source), path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw InputError(source_ + ": " + (path_.empty() ? "top level" : path_) + ": " + what + " (see docs/report.md)");
  }
  const json& value() const { return v_; }

  In operator[](const char* key) const {
    if (!v_.is_object()) fail("expected an object");
    auto it = v_.find(key);
    if (it == v_.end()) In(v_, source_, path_).fail(std::string("missing key '") + key + "'");
    return In(*it, source_, child_path(key));
  }
  In operator[](std::size_t i) const { return In(v_[i], source_, path_ + "[" + std::to_string(i) + "]"); }
  bool has(const char* key) const { return v_.is_object() && v_.contains(key); }

  const json& array() const {
    if (!v_.is_array()) fail("expected an array");
    return v_;
  }
  std::size_t size() const { return array().size(); }
  bool is_null() const { return v_.is_null(); }

  std::string str() const {
    if (!v_.is_string()) fail("expected a string");
    return v_.get<std::string>();
  }
  bool boolean() const {
    if (!v_.is_boolean()) fail("expected true or false");
    return v_.get<bool>();
  }
  double number() const {
    if (!v_.is_number()) fail("expected a number");
    return v_.get<double>();
  }
  std::uint64_t count() const {
    if (!v_.is_number_unsigned() && !(v_.is_number_integer() && v_.get<long long>() >= 0))
      fail("expected a non-negative integer");
    return v_.get<std::uint64_t>();
  }
  long long integer() const {
    if (!v_.is_number_integer()) fail("expected an integer");
    return v_.get<long long>();
  }
  // number | null (NaN) | "inf" | "-inf"
  double special() const {
    if (v_.is_null()) return std::numeric_limits<double>::quiet_NaN();
    if (v_.is_number()) return v_.get<double>();
    if (v_.is_string()) {
      const auto& s = v_.get_ref<const std::string&>();
      if (s == "inf") return std::numeric_limits<double>::infinity();
      if (s == "-inf") return -std::numeric_limits<double>::infinity();
    }
    fail("expected a number, null, \"inf\" or \"-inf\"");
  }
  std::optional<double> optional_special() const {
    double v = special();
    if (std::isnan(v)) return std::nullopt;
    return v;
  }
  std::vector<float> cells(std::size_t expected) const {
    std::vector<float> out;
    const json& a = array();
    if (!a.empty() && a.size() != expected)
      fail(fmt::format("expected {} values (or none), found {}", expected, a.size()));
    out.reserve(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) out.push_back(float((*this)[i].special()));
    return out;
  }
  std::vector<std::string> strings() const {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < size(); ++i) out.push_back((*this)[i].str());
    return out;
  }

 private:
  std::string child_path(const char* key) const { return path_.empty() ? key : path_ + "." + key; }
  const json& v_;
  const std::string& source_;
  std::string path_;
};

Artifact read_artifact(const In& in) { return {in["name"].str(), in["path"].str(), in["fingerprint"].str()}; }
std::optional<Artifact> read_optional_artifact(const In& in) {
  if (in.is_null()) return std::nullopt;
  return read_artifact(in);
}

SummaryRow read_summary_row(const In& in) {
  SummaryRow s;
  s.metric = in["metric"].str();
  s.count = in["count"].count();
  s.unbounded = in["unbounded"].count();
  s.not_applicable = in["not_applicable"].count();
  if (s.count > 0) {
    s.mean = in["mean"].number();
    s.min = in["min"].number();
    s.p5 = in["p5"].number();
    s.median = in["median"].number();
    s.p95 = in["p95"].number();
    s.max = in["max"].number();
  }
  return s;
}

Variant read_variant(const In& in) {
  Variant v;
  v.name = in["name"].str();
  auto kind = parse_variant_kind(in["kind"].str());
  if (!kind) in["kind"].fail("expected one of \"precision\", \"recipe\", \"onnx\"");
  v.kind = *kind;
  v.precision = in["precision"].str();
  v.reference = in["reference"].boolean();
  v.recipe = read_optional_artifact(in["recipe"]);
  v.onnx = read_optional_artifact(in["onnx"]);
  v.total_nodes = in["total_nodes"].count();
  v.quantized_nodes = in["quantized_nodes"].count();
  v.matched_by_name = in["matched_by_name"].count();
  v.matched_by_output = in["matched_by_output"].count();
  v.matched_by_structure = in["matched_by_structure"].count();
  In unmatched = in["unmatched"];
  for (std::size_t i = 0; i < unmatched.size(); ++i) {
    In u = unmatched[i];
    v.unmatched.push_back({u["side"].str(), u["name"].str(), u["op"].str(), u["reason"].str()});
  }
  In unquantized = in["unquantized"];
  for (std::size_t i = 0; i < unquantized.size(); ++i) {
    In u = unquantized[i];
    v.unquantized.push_back({u["model"].str(), u["name"].str(), u["op"].str(), u["reason"].str()});
  }
  if (in.has("quantization")) {  // absent before it existed
    In quantization = in["quantization"];
    for (std::size_t i = 0; i < quantization.size(); ++i) {
      In q = quantization[i];
      ModelQuantization m;
      m.model = q["model"].str();
      m.macs = q["macs"].optional_special();
      m.quantized_macs = q["quantized_macs"].optional_special();
      m.params = std::int64_t(q["params"].count());
      m.quantized_params = std::int64_t(q["quantized_params"].count());
      m.compute_nodes = q["compute_nodes"].count();
      m.quantized_nodes = q["quantized_nodes"].count();
      v.quantization.push_back(std::move(m));
    }
  }
  In sum = in["summary"];
  v.summary.samples = sum["samples"].count();
  v.summary.errors = sum["errors"].count();
  In metrics = sum["metrics"];
  for (std::size_t i = 0; i < metrics.size(); ++i) v.summary.metrics.push_back(read_summary_row(metrics[i]));
  In timings = sum["timings"];
  for (std::size_t i = 0; i < timings.size(); ++i)
    v.summary.timings.emplace_back(timings[i]["name"].str(), timings[i]["value"].special());
  return v;
}

ImageRef read_image(const In& in) {
  ImageRef img;
  if (!in.is_null()) img.path = in.str();
  return img;
}

SampleResult read_result(const In& in, const std::vector<MetricInfo>& order) {
  SampleResult r;
  r.variant = in["variant"].str();
  r.error = in["error"].str();
  const std::string status = in["status"].str();
  if (status != (r.ok() ? "ok" : "error"))
    in["status"].fail("\"" + status + "\" contradicts error \"" + r.error + "\"");
  r.identical = in["identical"].boolean();
  In metrics = in["metrics"], notes = in["metric_notes"], per_channel = in["per_channel"];
  if (!metrics.value().is_object()) metrics.fail("expected an object");
  // Object keys come back sorted: restore the report's metric order, then the rest.
  std::vector<std::string> keys;
  for (const auto& m : order)
    if (metrics.has(m.key.c_str())) keys.push_back(m.key);
  for (const auto& item : metrics.value().items())
    if (std::find(keys.begin(), keys.end(), item.key()) == keys.end()) keys.push_back(item.key());
  for (const auto& key : keys) {
    metrics::MetricValue m;
    m.key = key;
    m.value = metrics[key.c_str()].optional_special();
    if (notes.has(key.c_str())) m.note = notes[key.c_str()].str();
    if (per_channel.has(key.c_str())) {
      In pc = per_channel[key.c_str()];
      for (std::size_t i = 0; i < pc.size(); ++i) m.per_channel.push_back(pc[i].optional_special());
    }
    r.metrics.push_back(std::move(m));
  }
  r.image = read_image(in["image"]);
  r.heatmap = read_image(in["heatmap"]);
  r.heatmap_legend = in["heatmap_legend"].str();
  if (in.has("heatmap_amplified")) r.heatmap_amplified = read_image(in["heatmap_amplified"]);
  r.elapsed_ms = in["elapsed_ms"].special();
  r.failed_checks = in["failed_checks"].strings();
  return r;
}

LayerColumns read_columns(const In& in, std::size_t cells) {
  LayerColumns c;
  if (!in.value().is_object()) in.fail("expected an object of statistic -> values");
  for (const auto& info : kLayerColumns)
    if (in.has(info.key)) c.*info.column = in[info.key].cells(cells);
  return c;
}

}  // namespace

RunReport run_report_from_json(const json& j, const std::string& source) {
  In root(j, source, "");
  if (!j.is_object()) root.fail("expected a JSON object");
  const std::string version = root["schema_version"].str();
  if (version.rfind("1.", 0) != 0)
    root["schema_version"].fail("this qeval reads report schema 1.x, found \"" + version + "\"");
  if (root["kind"].str() != "run") root["kind"].fail("expected \"run\" (a `qeval run` report)");

  RunReport r;
  r.tool_version = root["tool"]["version"].str();
  r.created_utc = root["created_utc"].str();
  r.command_line = root["command_line"].str();
  r.elapsed_s = root["elapsed_s"].special();
  if (root.has("resume")) {  // schema 1.1
    r.reused_units = std::size_t(root["resume"]["reused_units"].count());
    r.elapsed_before_s = root["resume"]["elapsed_s_before"].special();
  }

  In c = root["config"];
  r.config.pipeline = c["pipeline"].str();
  r.config.model = read_artifact(c["model"]);
  r.config.inputs = read_artifact(c["inputs"]);
  r.config.calibration = read_optional_artifact(c["calibration"]);
  r.config.reference_variant = c["reference_variant"].str();
  r.config.scheduler = c["scheduler"].str();
  r.config.steps = int(c["steps"].count());
  In seeds = c["seeds"];
  for (std::size_t i = 0; i < seeds.size(); ++i) r.config.seeds.push_back(seeds[i].count());
  r.config.threads = int(c["threads"].count());
  if (c.has("device")) r.config.device = c["device"].str();  // absent before it existed: the CPU
  r.config.shard = c["shard"].str();
  In settings = c["settings"];
  for (std::size_t i = 0; i < settings.size(); ++i)
    r.config.settings.emplace_back(settings[i]["key"].str(), settings[i]["value"].str());

  In metrics = root["metrics"];
  for (std::size_t i = 0; i < metrics.size(); ++i)
    r.metrics.push_back({metrics[i]["key"].str(), metrics[i]["label"].str(), metrics[i]["higher_is_better"].boolean()});

  In variants = root["variants"];
  std::set<std::string> names;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    r.variants.push_back(read_variant(variants[i]));
    if (!names.insert(r.variants.back().name).second)
      variants[i]["name"].fail("variant \"" + r.variants.back().name + "\" appears twice");
  }
  auto check_variant = [&](const In& in) {
    std::string name = in.str();
    if (!names.count(name)) in.fail("unknown variant \"" + name + "\"");
    return name;
  };

  In samples = root["samples"];
  for (std::size_t i = 0; i < samples.size(); ++i) {
    In s = samples[i];
    SampleRow row;
    row.id = s["id"].str();
    row.prompt = s["prompt"].str();
    if (!s["seed"].is_null()) row.seed = s["seed"].count();
    In results = s["results"];
    for (std::size_t k = 0; k < results.size(); ++k) {
      row.results.push_back(read_result(results[k], r.metrics));
      check_variant(results[k]["variant"]);
    }
    r.samples.push_back(std::move(row));
  }

  In layers = root["layers"];
  In nodes = layers["nodes"];
  for (std::size_t i = 0; i < nodes.size(); ++i)
    r.layers.push_back({nodes[i]["name"].str(), nodes[i]["op"].str(), nodes[i]["component"].str()});
  const std::size_t n_layers = r.layers.size();
  In tables = layers["tables"];
  for (std::size_t i = 0; i < tables.size(); ++i) {
    In t = tables[i];
    LayerTable table;
    table.variant = check_variant(t["variant"]);
    table.samples = t["samples"].count();
    table.format = t["format"].strings();
    if (!table.format.empty() && table.format.size() != n_layers)
      t["format"].fail(fmt::format("expected {} values (or none), found {}", n_layers, table.format.size()));
    table.calib_amax = t["calib_amax"].cells(n_layers);
    table.out_of_range_steps = t["out_of_range_steps"].cells(n_layers);
    table.stats = read_columns(t["stats"], n_layers);
    r.layer_tables.push_back(std::move(table));
  }

  In ts = root["timesteps"];
  r.timesteps.component = ts["component"].str();
  r.timesteps.mode = ts["mode"].str();
  In t_values = ts["t"];
  for (std::size_t i = 0; i < t_values.size(); ++i) r.timesteps.t.push_back(t_values[i].special());
  In rows = ts["layers"];
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::uint64_t idx = rows[i].count();
    if (idx >= n_layers) rows[i].fail(fmt::format("layer index {} >= {} layers", idx, n_layers));
    r.timesteps.layers.push_back(std::uint32_t(idx));
  }
  In step_tables = ts["tables"];
  const std::size_t n_cells = r.timesteps.layers.size() * r.timesteps.steps();
  for (std::size_t i = 0; i < step_tables.size(); ++i)
    r.timesteps.tables.push_back(
        {check_variant(step_tables[i]["variant"]), read_columns(step_tables[i]["stats"], n_cells)});

  In curves = root["step_curves"];
  for (std::size_t i = 0; i < curves.size(); ++i) {
    In cv = curves[i];
    StepCurve curve{check_variant(cv["variant"]), cv["quantity"].str(), cv["metric"].str(), cv["mode"].str(), {}};
    In values = cv["values"];
    for (std::size_t k = 0; k < values.size(); ++k) curve.values.push_back(values[k].special());
    r.step_curves.push_back(std::move(curve));
  }

  In hists = root["histograms"];
  for (std::size_t i = 0; i < hists.size(); ++i) {
    In h = hists[i];
    Histogram hist;
    hist.variant = check_variant(h["variant"]);
    hist.layer = std::uint32_t(h["layer"].count());
    if (hist.layer >= n_layers) h["layer"].fail(fmt::format("layer index {} >= {} layers", hist.layer, n_layers));
    hist.step = int(h["step"].integer());
    hist.lo = h["lo"].number();
    hist.hi = h["hi"].number();
    In counts = h["counts"];
    for (std::size_t k = 0; k < counts.size(); ++k) hist.counts.push_back(counts[k].count());
    hist.below = h["below"].count();
    hist.above = h["above"].count();
    r.histograms.push_back(std::move(hist));
  }

  In nonfinite = root["nonfinite"];
  for (std::size_t i = 0; i < nonfinite.size(); ++i) {
    In e = nonfinite[i];
    r.nonfinite.push_back({check_variant(e["variant"]), e["sample"].str(), int(e["step"].integer()), e["node"].str(),
                           e["op"].str(), e["nan_count"].count(), e["inf_count"].count(),
                           e.has("model") ? e["model"].str() : std::string()});  // absent before it existed
  }

  In gate = root["gate"];
  r.gate.passed = gate["passed"].boolean();
  r.gate.source = gate["source"].str();
  In checks = gate["checks"];
  for (std::size_t i = 0; i < checks.size(); ++i) {
    In ch = checks[i];
    GateCheckRow row;
    row.name = ch["name"].str();
    row.variant = ch["variant"].str();
    row.metric = ch["metric"].str();
    row.stat = ch["stat"].str();
    row.op = ch["op"].str();
    row.threshold = ch["threshold"].special();
    row.value = ch["value"].optional_special();
    row.passed = ch["passed"].boolean();
    if (ch.has("measured")) row.measured = ch["measured"].boolean();  // absent before it existed
    row.detail = ch["detail"].str();
    r.gate.checks.push_back(std::move(row));
  }
  return r;
}

RunReport read_run_report(const std::filesystem::path& path) {
  // A FIFO or folder in a shard's place is named, not waited on.
  const std::string text = base::read_regular_file_text(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw InputError(path.string() + ": not valid JSON: " + e.what());
  } catch (const json::out_of_range& e) {  // a number beyond double's range (1e999)
    throw InputError(path.string() + ": a number is out of range: " + e.what());
  }
  return run_report_from_json(j, path.string());
}

std::vector<std::string> check_run_report(const RunReport& r) {
  std::vector<std::string> problems;
  std::set<std::string> names;
  std::size_t references = 0;
  for (const auto& v : r.variants) {
    if (v.name.empty()) problems.push_back("a variant has no name");
    if (!names.insert(v.name).second) problems.push_back("variant \"" + v.name + "\" appears twice");
    references += v.reference;
  }
  if (references != 1)
    problems.push_back(fmt::format("{} variants are marked reference; expected exactly 1", references));
  auto known = [&](const std::string& name, const std::string& where) {
    if (!names.count(name)) problems.push_back(where + ": unknown variant \"" + name + "\"");
  };
  auto sized = [&](std::size_t size, std::size_t expected, const std::string& where) {
    if (size != 0 && size != expected)
      problems.push_back(fmt::format("{}: {} values, expected {} (or none)", where, size, expected));
  };
  auto columns = [&](const LayerColumns& c, std::size_t expected, const std::string& where) {
    for (const auto& info : kLayerColumns) sized((c.*info.column).size(), expected, where + "." + info.key);
  };
  std::set<std::string> ids;
  for (const auto& s : r.samples) {
    if (!ids.insert(s.id).second) problems.push_back("sample \"" + s.id + "\" appears twice");
    for (const auto& res : s.results) known(res.variant, "sample " + s.id);
  }
  const std::size_t n_layers = r.layers.size(), steps = r.timesteps.steps();
  for (const auto& t : r.layer_tables) {
    const std::string where = "layer table " + t.variant;
    known(t.variant, where);
    columns(t.stats, n_layers, where);
    sized(t.format.size(), n_layers, where + ".format");
    sized(t.calib_amax.size(), n_layers, where + ".calib_amax");
    sized(t.out_of_range_steps.size(), n_layers, where + ".out_of_range_steps");
  }
  for (auto l : r.timesteps.layers)
    if (l >= n_layers) problems.push_back(fmt::format("timesteps.layers: index {} >= {} layers", l, n_layers));
  for (const auto& t : r.timesteps.tables) {
    known(t.variant, "step table " + t.variant);
    columns(t.stats, r.timesteps.layers.size() * steps, "step table " + t.variant);
  }
  for (const auto& c : r.step_curves) {
    known(c.variant, "step curve");
    sized(c.values.size(), steps, "step curve " + c.variant + " " + c.quantity + " " + c.metric);
  }
  for (const auto& h : r.histograms) {
    known(h.variant, "histogram");
    if (h.layer >= n_layers)
      problems.push_back(fmt::format("histogram of {}: layer {} >= {} layers", h.variant, h.layer, n_layers));
    if (h.step < -1 || (h.step >= 0 && std::size_t(h.step) >= steps))
      problems.push_back(fmt::format("histogram of {}: step {} outside [-1, {})", h.variant, h.step, steps));
    if (h.counts.empty() || !(h.hi > h.lo))
      problems.push_back("histogram of " + h.variant + ": needs bins and lo < hi");
  }
  for (const auto& e : r.nonfinite) known(e.variant, "nonfinite");
  for (const auto& c : r.gate.checks)
    if (!c.variant.empty()) known(c.variant, "gate check \"" + c.name + "\"");
  return problems;
}

void write_run_report(const RunReport& report, const std::filesystem::path& out_dir) {
  if (auto problems = check_run_report(report); !problems.empty()) {
    std::string all;
    for (const auto& p : problems) all += "\n  " + p;
    throw std::logic_error("inconsistent run report (not written):" + all);
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw InputError(out_dir.string() + ": cannot create the output folder: " + ec.message());
  base::write_file_atomic(out_dir / "report.html", render_html(report));
  base::write_file_atomic(out_dir / "junit.xml", render_junit(report));
  base::write_file_atomic(out_dir / "report.json", dump_json_readable(to_json(report)));
}

}  // namespace qeval::reports
