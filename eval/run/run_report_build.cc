// The report model from a run's result; the gate over it.
#include "eval/run/run_report_build.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <regex>
#include <set>

#include "base/input_file.h"
#include "base/terminal.h"
#include "eval/quant/calibrate.h"
#include "eval/quant/recipe.h"
#include "eval/run/compare_recipes.h"
#include "kernels/error.h"
#include "metrics/metric_registry.h"
#include "reports/run_report.h"

namespace qeval::eval {

namespace fs = std::filesystem;
using reports::LayerColumns;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// "" when `p` is not a regular file (a folder of samples): a FIFO there is not waited on.
std::string file_fingerprint(const fs::path& p) {
  if (!base::describe_non_regular(p).empty()) return "";
  const base::RegularFile file = base::open_regular_file(p);
  std::uint64_t h = quant::fnv1a64("file", 4);
  std::vector<char> buf(1 << 16);
  for (std::uint64_t at = 0; at < file.size(); at += buf.size()) {
    const std::size_t n = std::size_t(std::min<std::uint64_t>(buf.size(), file.size() - at));
    file.read_at(buf.data(), n, at);
    h = quant::fnv1a64(buf.data(), n, h);
  }
  return "fnv1a64:" + quant::hex64(h);
}

std::string graphs_fingerprint(const std::vector<const Graph*>& graphs) {
  std::string all;
  for (const Graph* g : graphs) all += quant::graph_fingerprint(*g);
  return "fnv1a64:" + quant::fnv1a64_hex(all.data(), all.size());
}

void put(std::vector<float>& col, std::size_t i, std::size_t n, std::optional<double> v) {
  if (col.empty()) col.assign(n, kNaN);
  col[i] = v ? float(*v) : kNaN;
}

struct ColumnsWanted {
  bool acc = false, local = false, clip = false;
};

void fill(LayerColumns& c, std::size_t i, std::size_t n, const LayerCell& cell, ColumnsWanted w) {
  const auto& a = cell.act;
  const bool seen = a.calls > 0;
  put(c.absmax, i, n, seen && a.count ? std::optional<double>(a.absmax) : std::nullopt);
  put(c.p99_9, i, n, a.abs_quantile(0.999));
  put(c.mean, i, n, a.mean());
  put(c.std, i, n, a.stddev());
  put(c.nonfinite, i, n, seen ? std::optional<double>(double(a.nonfinite())) : std::nullopt);
  if (w.clip) put(c.clip_rate, i, n, a.clip_rate());
  if (w.acc) {
    const auto& e = cell.acc;
    put(c.acc_sqnr_db, i, n, e.sqnr_db());
    put(c.acc_cosine, i, n, e.cosine());
    put(c.acc_rel_l2, i, n, e.rel_l2());
    put(c.acc_max_abs, i, n, e.count ? std::optional<double>(e.max_abs) : std::nullopt);
  }
  if (w.local) {
    const auto& e = cell.local();
    put(c.local_sqnr_db, i, n, e.sqnr_db());
    put(c.local_cosine, i, n, e.cosine());
    put(c.local_rel_l2, i, n, e.rel_l2());
    put(c.local_max_abs, i, n, e.count ? std::optional<double>(e.max_abs) : std::nullopt);
  }
}

// The |x| histogram of an activation on `bins` equal bins over [0, hi): each log bin's count spread
// over the linear bins it overlaps, in proportion, with integer counts that keep the total.
reports::Histogram linear_histogram(const metrics::ActivationStats& s, double hi, int bins) {
  reports::Histogram h;
  h.lo = 0;
  h.hi = hi;
  h.counts.assign(std::size_t(bins), 0);
  const auto& lh = s.abs_hist;
  const double width = hi / bins;
  for (std::size_t k = 0; k < lh.bins(); ++k) {
    const std::uint64_t c = lh.at(k);
    if (!c) continue;
    const int bin = lh.first() + int(k);
    const double a = metrics::LogAbsHistogram::bin_lower(bin);
    double b = std::min(metrics::LogAbsHistogram::bin_upper(bin), double(s.absmax));
    if (b <= a) b = a;
    if (a >= hi) {
      h.above += c;
      continue;
    }
    if (b == a) {
      h.counts[std::min(std::size_t(a / width), std::size_t(bins - 1))] += c;
      continue;
    }
    // Cumulative share of [a, b) below each linear edge, rounded down: integer parts sum to c.
    std::uint64_t given = 0;
    const int first = std::min(int(a / width), bins - 1);
    for (int j = first; j < bins && given < c; ++j) {
      const double edge = std::min(b, (j + 1) * width);
      const std::uint64_t upto =
          j + 1 >= bins || edge >= b ? c : std::uint64_t(std::floor(double(c) * (edge - a) / (b - a)));
      h.counts[std::size_t(j)] += upto - given;
      given = upto;
    }
    h.above += c - given;
  }
  return h;
}

reports::VariantKind kind_of(const BuiltVariant& v) { return v.kind; }

}  // namespace

reports::RunReport build_run_report(const RunSpec& spec, const RunDriver& driver, const RunResult& res,
                                    const ReportContext& ctx) {
  reports::RunReport rep;
  rep.tool_version = ctx.tool_version;
  rep.created_utc = ctx.created_utc;
  rep.command_line = ctx.command_line;
  rep.elapsed_s = res.elapsed_before_s + res.elapsed_s;
  rep.reused_units = res.reused;
  rep.elapsed_before_s = res.elapsed_before_s;
  const std::size_t nv = res.variants.size(), r = res.reference;

  // Configuration.
  auto& cfg = rep.config;
  cfg.pipeline = driver.kind().name;
  std::vector<const Graph*> ref_graphs;
  for (const auto& m : driver.models()) ref_graphs.push_back(res.variants[r].graphs.at(m).get());
  cfg.model = {driver.description().name, spec.pipeline.string(),
               ctx.fingerprints ? graphs_fingerprint(ref_graphs) : ""};
  cfg.inputs = driver.description().inputs;
  if (ctx.fingerprints) cfg.inputs.fingerprint = file_fingerprint(cfg.inputs.path);
  for (const auto& v : res.variants)
    if (v.calibration && !cfg.calibration) cfg.calibration = v.calibration;
  cfg.reference_variant = spec.reference;
  cfg.scheduler = driver.description().scheduler;
  cfg.steps = driver.description().steps;
  if (driver.kind().denoising) cfg.seeds = spec.seeds;
  cfg.threads = ctx.threads;
  cfg.device = ctx.device;
  cfg.shard = ctx.shard;
  cfg.settings = driver.description().settings;
  cfg.settings.emplace_back("config", spec.source.empty() ? "default (no --config)" : spec.source.string());
  cfg.settings.emplace_back("first", std::to_string(spec.first));
  cfg.settings.emplace_back("count", spec.count ? std::to_string(spec.count) : "all");
  cfg.settings.emplace_back("observe.layers", spec.observe.layers ? "true" : "false");
  cfg.settings.emplace_back("observe.local_error", spec.observe.layers && spec.observe.local_error ? "true" : "false");
  if (driver.kind().denoising)
    cfg.settings.emplace_back("observe.teacher_forced", spec.observe.teacher_forced ? "true" : "false");
  rep.metrics = driver.description().metrics;

  // Variants.
  const bool layers_on = spec.observe.layers && res.observation.space->layers() > 0;
  for (std::size_t v = 0; v < nv; ++v) {
    const BuiltVariant& b = res.variants[v];
    reports::Variant out;
    out.name = b.spec.name;
    out.kind = kind_of(b);
    out.precision = std::string(precision_name(b.options.precision));
    out.recipe = b.recipe;
    out.onnx = b.onnx;
    if (out.onnx && ctx.fingerprints) {
      std::vector<const Graph*> gs;
      for (const auto& m : driver.models()) gs.push_back(b.graphs.at(m).get());
      out.onnx->fingerprint = graphs_fingerprint(gs);
    }
    out.reference = v == r;
    out.unquantized = b.unquantized;
    for (const auto& m : driver.models()) {
      const Graph& g = *b.graphs.at(m);
      for (const Node& n : g.nodes)
        if (!is_quantization_plumbing(n) && n.op_type != "Constant") ++out.total_nodes;
      out.quantized_nodes += count_quantized_nodes(g);
    }
    if (ctx.shapes) {
      // Per model, as compare-recipes counts it (the share of MACs); all models or none.
      for (const auto& m : driver.models()) {
        const Graph* g = b.graphs.at(m).get();
        const Graph* rg = res.variants[r].graphs.at(m).get();
        const bool separate = b.kind == reports::VariantKind::kOnnx;
        auto q = model_quantization(m, separate ? *g : *rg, g == rg ? nullptr : g, ctx.shapes->of(m));
        if (!q) {
          out.quantization.clear();
          break;
        }
        out.quantization.push_back(std::move(*q));
      }
    }
    if (layers_on) {
      // Matching is reported where the variant runs another graph than the reference.
      const auto& models = res.observation.variants[v].models;
      for (std::size_t m = 0; m < models.size(); ++m) {
        const ObservedModel& om = models[m];
        if (om.graph == res.observation.space->models()[m].graph) continue;
        out.matched_by_name += om.match.by_name;
        out.matched_by_output += om.match.by_output;
        out.matched_by_structure += om.match.by_structure;
        for (const auto& u : om.match.unmatched) out.unmatched.push_back({u.side, u.name, u.op, u.reason});
        // Matched nodes that local error cannot re-run or compare, with why (never silently).
        const Graph& ref_graph = *res.observation.space->models()[m].graph;
        for (std::size_t i = 0; i < om.local.size(); ++i) {
          const int ref_node = om.match.ref_of_variant[i];
          if (ref_node < 0 || om.local[i].ok()) continue;
          const Node& n = om.graph->nodes[i];
          out.unmatched.push_back({"variant", n.name, n.op_type,
                                   "matched to " + ref_graph.nodes[std::size_t(ref_node)].name +
                                       ", no local error: " + om.local[i].error});
        }
      }
    }
    rep.variants.push_back(std::move(out));
  }

  // The steps (step curves and the timestep x layer tables refer to them).
  if (!driver.description().stepped_model.empty()) {
    rep.timesteps.component = driver.description().stepped_model;
    rep.timesteps.mode = "free-running";
    rep.timesteps.t = driver.description().timesteps;
  }

  // Samples.
  for (std::size_t ui = 0; ui < res.units.size(); ++ui) {
    if (!res.done.empty() && !res.done[ui]) continue;
    for (const SampleOutcome& s : res.units[ui].samples) {
      reports::SampleRow row;
      row.id = s.id;
      row.prompt = s.prompt;
      row.seed = s.seed;
      for (std::size_t v = 0; v < nv && v < s.variants.size(); ++v) {
        const VariantOutcome& o = s.variants[v];
        reports::SampleResult sr;
        sr.variant = res.variants[v].spec.name;
        sr.error = o.error;
        sr.identical = o.identical;
        sr.metrics = o.metrics;
        sr.image = {o.image_path, o.thumbnail_png};
        if (v != r) sr.heatmap = {o.heatmap_path, o.heatmap_png};
        sr.heatmap_legend = o.heatmap_legend;
        if (v != r) sr.heatmap_amplified = {o.heatmap_x8_path, o.heatmap_x8_png};
        sr.elapsed_ms = o.elapsed_ms;
        row.results.push_back(std::move(sr));
      }
      rep.samples.push_back(std::move(row));
    }
  }
  reports::summarize_samples(rep);
  for (std::size_t v = 0; v < nv; ++v) {
    double total = 0;
    std::size_t count = 0;
    for (const auto& s : rep.samples)
      if (const auto* sr = s.result(rep.variants[v].name)) total += sr->elapsed_ms, ++count;
    if (count) rep.variants[v].summary.timings.emplace_back("ms_per_sample", total / double(count));
    if (res.variants[v].calibration)
      rep.variants[v].summary.timings.emplace_back(
          res.variants[v].calibration_cache_hit ? "calibration_s_cached" : "calibration_s",
          res.variants[v].calibration_s);
  }

  if (layers_on) {
    const LayerSpace& space = *res.observation.space;
    const LayerCells& ref_cells = res.layers[r];
    // Layers the reference ran (constant sub-graphs folded at plan time are not layers).
    std::vector<int> report_index(space.layers(), -1);
    std::vector<std::size_t> kept;
    for (std::size_t l = 0; l < space.layers(); ++l) {
      bool ran = false;
      for (int s = 0; s < space.cells_of(l) && !ran; ++s)
        if (const LayerCell* c = ref_cells.find(l, s)) ran = c->act.calls > 0;
      if (!ran) continue;
      report_index[l] = int(kept.size());
      kept.push_back(l);
      const Node& n = space.node_of(l);
      rep.layers.push_back({n.name, n.op_type, space.models()[space.model_of(l)].name});
    }
    const std::size_t nl = kept.size();
    const int stepped = space.model_index(driver.description().stepped_model);
    std::vector<std::size_t> stepped_layers;
    if (stepped >= 0)
      for (std::size_t k = 0; k < nl; ++k)
        if (int(space.model_of(kept[k])) == stepped) stepped_layers.push_back(k);
    const int steps = space.steps();
    for (std::size_t k : stepped_layers) rep.timesteps.layers.push_back(std::uint32_t(k));
    for (std::size_t v = 0; v < nv; ++v) {
      const ObservedVariant& ov = res.observation.variants[v];
      // Per layer: the variant node holding it, for quantizer ranges and formats.
      std::vector<float> clip(nl, kNaN);
      std::vector<std::string> format(nl);
      bool any_clip = false;
      for (std::size_t m = 0; m < ov.models.size(); ++m) {
        const ObservedModel& om = ov.models[m];
        for (std::size_t i = 0; i < om.layer_of_node.size(); ++i) {
          const int l = om.layer_of_node[i];
          if (l < 0 || report_index[std::size_t(l)] < 0) continue;
          const std::size_t k = std::size_t(report_index[std::size_t(l)]);
          if (std::isfinite(om.clip_amax[i])) clip[k] = om.clip_amax[i], any_clip = true;
          format[k] = om.format[i];
        }
      }
      const ColumnsWanted want{v != r, v != r && res.observation.local_error, any_clip};
      reports::LayerTable table;
      table.variant = res.variants[v].spec.name;
      table.samples = rep.samples.size();
      table.format = format;
      table.calib_amax = clip;
      table.out_of_range_steps.assign(nl, kNaN);
      for (std::size_t k = 0; k < nl; ++k) {
        const std::size_t l = kept[k];
        LayerCell pooled;
        for (int s = 0; s < space.cells_of(l); ++s)
          if (const LayerCell* c = res.layers[v].find(l, s)) {
            pooled.merge(*c);
            if (std::isfinite(clip[k]) && c->act.clipped > 0)
              table.out_of_range_steps[k] =
                  std::isnan(table.out_of_range_steps[k]) ? 1 : table.out_of_range_steps[k] + 1;
          }
        if (std::isfinite(clip[k]) && std::isnan(table.out_of_range_steps[k])) table.out_of_range_steps[k] = 0;
        ColumnsWanted wk = want;
        wk.clip = want.clip && std::isfinite(clip[k]);  // no quantizer range: no clip rate
        fill(table.stats, k, nl, pooled, wk);
      }
      if (!any_clip) table.out_of_range_steps.clear(), table.calib_amax.clear();
      if (std::all_of(table.format.begin(), table.format.end(), [](const std::string& f) { return f.empty(); }))
        table.format.clear();
      rep.layer_tables.push_back(std::move(table));
      if (stepped >= 0) {
        reports::StepTable st;
        st.variant = res.variants[v].spec.name;
        const std::size_t cells = stepped_layers.size() * std::size_t(steps);
        for (std::size_t row = 0; row < stepped_layers.size(); ++row)
          for (int s = 0; s < steps; ++s) {
            const LayerCell* c = res.layers[v].find(kept[stepped_layers[row]], s);
            fill(st.stats, row * std::size_t(steps) + std::size_t(s), cells, c ? *c : LayerCell{}, want);
          }
        rep.timesteps.tables.push_back(std::move(st));
      }
    }

    // Histograms: each compared variant's worst layers by accumulated SQNR, with the reference's.
    for (std::size_t v = 0; v < nv && spec.observe.histograms > 0; ++v) {
      if (v == r) continue;
      const auto& col = rep.layer_tables[v].stats.acc_sqnr_db;
      std::vector<std::size_t> order;
      for (std::size_t k = 0; k < col.size(); ++k)
        if (std::isfinite(col[k])) order.push_back(k);
      std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return col[a] < col[b]; });
      order.resize(std::min(order.size(), std::size_t(spec.observe.histograms)));
      for (std::size_t k : order) {
        LayerCell pv, pr;
        for (int s = 0; s < space.cells_of(kept[k]); ++s) {
          if (const LayerCell* c = res.layers[v].find(kept[k], s)) pv.act.merge(c->act);
          if (const LayerCell* c = ref_cells.find(kept[k], s)) pr.act.merge(c->act);
        }
        const double hi = std::max<double>({pv.act.absmax, pr.act.absmax, 1e-30});
        for (auto [variant, stats] : {std::pair{v, &pv.act}, std::pair{r, &pr.act}}) {
          reports::Histogram h = linear_histogram(*stats, hi * (1 + 1e-6), 48);
          h.variant = res.variants[variant].spec.name;
          h.layer = std::uint32_t(k);
          if (std::none_of(rep.histograms.begin(), rep.histograms.end(),
                           [&](const reports::Histogram& x) { return x.variant == h.variant && x.layer == h.layer; }))
            rep.histograms.push_back(std::move(h));
        }
      }
    }
  }

  // Per-step error curves.
  for (std::size_t v = 0; v < nv; ++v)
    for (const StepSeries& s : res.series[v])
      for (const std::string_view metric :
           {metrics::keys::kSqnrDb, metrics::keys::kRelL2, metrics::keys::kCosine, metrics::keys::kMaxAbs}) {
        reports::StepCurve c;
        c.variant = res.variants[v].spec.name;
        c.quantity = s.quantity;
        c.mode = s.mode;
        c.metric = std::string(metric);
        for (const auto& e : s.steps) {
          std::optional<double> x;
          if (metric == metrics::keys::kSqnrDb) x = e.sqnr_db();
          else if (metric == metrics::keys::kRelL2) x = e.rel_l2();
          else if (metric == metrics::keys::kCosine) x = e.cosine();
          else if (e.count) x = e.max_abs;
          c.values.push_back(x.value_or(std::numeric_limits<double>::quiet_NaN()));
        }
        rep.step_curves.push_back(std::move(c));
      }

  for (std::size_t v = 0; v < nv; ++v)
    if (const auto& hit = res.first_nonfinite[v])
      rep.nonfinite.push_back(
          {res.variants[v].spec.name, hit->sample, hit->step, hit->node, hit->op, hit->nan, hit->inf, hit->model});
  return rep;
}

namespace {

std::string fmt_num(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{:.6g}", v);
}

// NaN/Inf values of layer k in `table` beyond the reference's own (`ref_table`, null when the
// reference was not observed; its attention masks' -inf are by design); 0 when not measured.
double nonfinite_beyond_reference(const reports::LayerTable& table, const reports::LayerTable* ref_table,
                                  std::size_t k) {
  const float x = reports::cell(table.stats.nonfinite, k);
  const float base = ref_table ? reports::cell(ref_table->stats.nonfinite, k) : 0.0f;
  return std::isnan(x) ? 0.0 : std::max(0.0, double(x) - (std::isnan(base) ? 0.0 : double(base)));
}

}  // namespace

void apply_run_gate(const Gate& gate, reports::RunReport& rep) {
  std::set<std::string> names;
  for (const auto& v : rep.variants) names.insert(v.name);
  auto check_variant = [&](const std::string& v, const std::string& where) {
    if (!v.empty() && !names.count(v))
      throw InputError(gate.source + ": " + where + " names variant '" + v + "', which this run does not have");
  };
  for (std::size_t i = 0; i < gate.checks.size(); ++i)
    check_variant(gate.checks[i].variant, fmt::format("checks[{}]", i));
  for (std::size_t i = 0; i < gate.layer_checks.size(); ++i)
    check_variant(gate.layer_checks[i].variant, fmt::format("layers[{}]", i));
  for (std::size_t i = 0; i < gate.step_checks.size(); ++i)
    check_variant(gate.step_checks[i].variant, fmt::format("steps[{}]", i));
  // Metric names are checked here, against what this run measured (per-output keys of a single
  // model included), rather than against a fixed list when the gate file is read.
  std::vector<std::string> metric_keys;
  for (const auto& m : rep.metrics) metric_keys.push_back(m.key);
  check_gate_metrics(gate, metric_keys);

  rep.gate = {};
  rep.gate.source = gate.source;
  // What the run was told not to measure: checks reading it are "not measured" (neither pass nor
  // fail). A run that observed layers and matched none of a check's is measured and fails.
  auto setting_off = [&](std::string_view key) {
    for (const auto& [k, v] : rep.config.settings)
      if (k == key) return v == "false";
    return false;
  };
  const bool layers_off = setting_off("observe.layers");
  const bool local_off = layers_off || setting_off("observe.local_error");
  const bool teacher_forcing_off = setting_off("observe.teacher_forced");
  auto not_measured = [](reports::GateCheckRow& row, std::string why) {
    row.measured = false;
    row.passed = true;  // fails nothing; summaries count it apart
    row.value = std::nullopt;
    row.detail = "not measured: " + std::move(why);
  };
  // The layer checks' node patterns (load_gate checked them), compiled once for every variant.
  std::vector<std::optional<std::regex>> node_patterns(gate.layer_checks.size());
  for (std::size_t i = 0; i < gate.layer_checks.size(); ++i)
    if (!gate.layer_checks[i].nodes.empty())
      node_patterns[i].emplace(gate.layer_checks[i].nodes, std::regex::ECMAScript);
  for (const auto& variant : rep.variants) {
    if (variant.reference) continue;
    // Sample checks.
    Gate sub = gate;
    sub.checks.clear();
    for (const auto& c : gate.checks)
      if (c.variant.empty() || c.variant == variant.name) sub.checks.push_back(c);
    std::vector<GateSample> samples;
    std::vector<reports::SampleResult*> results;
    for (auto& row : rep.samples)
      for (auto& sr : row.results) {
        if (sr.variant != variant.name) continue;
        GateSample g;
        g.name = row.id;
        g.error = !sr.ok();
        g.error_text = sr.error;
        for (const auto& info : rep.metrics) {
          const auto* m = sr.metric(info.key);
          g.values[info.key] =
              m ? metrics::counted_value(metrics::find_metric(info.key), m->value, sr.identical) : std::nullopt;
        }
        if (const auto* m = sr.metric(kOutputNonfiniteMetric); m && m->value) g.nonfinite = std::uint64_t(*m->value);
        samples.push_back(std::move(g));
        results.push_back(&sr);
      }
    GateOutcome out = evaluate_gate(sub, samples);
    for (std::size_t i = 0; i < results.size(); ++i) results[i]->failed_checks = out.failed_checks[i];
    for (auto& row : out.section.checks) {
      row.variant = variant.name;
      rep.gate.checks.push_back(std::move(row));
    }
    // Layer checks.
    const reports::LayerTable* table = rep.layer_table(variant.name);
    const reports::LayerTable* ref_table = rep.reference() ? rep.layer_table(rep.reference()->name) : nullptr;
    for (std::size_t check = 0; check < gate.layer_checks.size(); ++check) {
      const auto& lc = gate.layer_checks[check];
      if (!lc.variant.empty() && lc.variant != variant.name) continue;
      std::vector<double> values;
      std::optional<std::pair<double, std::size_t>> worst;
      const bool higher_better = [&] {
        for (const auto& c : reports::kLayerColumns)
          if (lc.column == c.key) return c.higher_is_better;
        return true;
      }();
      const std::optional<std::regex>& nodes = node_patterns[check];
      std::size_t matched = 0;
      // Layers whose values went NaN/Inf beyond the reference's own: their error columns are
      // unbounded or undefined, and the check fails on them unless the gate allows it.
      std::size_t diverged = 0;
      std::string first_diverged;
      if (table)
        for (std::size_t k = 0; k < table->stats.nonfinite.size(); ++k) {
          if (nodes && !std::regex_search(rep.layers[k].name, *nodes)) continue;
          if (nonfinite_beyond_reference(*table, ref_table, k) > 0 && diverged++ == 0)
            first_diverged = rep.layers[k].name;
        }
      if (table)
        for (const auto& c : reports::kLayerColumns)
          if (lc.column == c.key) {
            const auto& col = table->stats.*(c.column);
            for (std::size_t k = 0; k < col.size(); ++k) {
              if (nodes && !std::regex_search(rep.layers[k].name, *nodes)) continue;
              ++matched;
              if (std::isnan(col[k])) continue;
              values.push_back(col[k]);
              if (!worst || (higher_better ? col[k] < worst->first : col[k] > worst->first)) worst = {col[k], k};
            }
          }
      const auto value = metrics::compute_stat(lc.spec, values);
      const std::string scope = nodes ? fmt::format(" matching '{}'", lc.nodes) : std::string();
      const bool fail_diverged = diverged && !gate.allow_nonfinite;
      std::string detail =
          nodes && matched == 0 && table ? fmt::format("no layer name matches '{}'", lc.nodes)
          : values.empty()
              ? "no layer has a value (were layers observed? is this column measured for this variant?)"
              : fmt::format("{} = {} over {} layers{}; worst {} ({})", lc.stat, value ? fmt_num(*value) : "n/a",
                            values.size(), scope, fmt_num(worst->first), rep.layers[worst->second].name);
      if (fail_diverged)
        detail += fmt::format(
            "; {} layer(s) NaN/Inf where the reference is finite (first '{}'); the gate does not "
            "set 'allow_nonfinite'",
            diverged, first_diverged);
      for (int side = 0; side < 2; ++side) {
        const auto& bound = side == 0 ? lc.bound.min : lc.bound.max;
        if (!bound) continue;
        reports::GateCheckRow row;
        row.metric = "layer." + lc.column;
        row.stat = lc.stat;
        row.op = side == 0 ? ">=" : "<=";
        row.threshold = *bound;
        row.value = value;
        row.name = fmt::format("layer {} {} {} {}{}", lc.column, lc.stat, row.op, fmt_num(*bound),
                               nodes ? fmt::format(" (nodes ~ {})", lc.nodes) : std::string());
        row.passed =
            !fail_diverged && value && !std::isnan(*value) && (side == 0 ? *value >= *bound : *value <= *bound);
        row.detail = detail;
        row.variant = variant.name;
        if (layers_off) not_measured(row, "this run did not observe layers (--no-layers or observe.layers false)");
        else if (local_off && lc.column.rfind("local_", 0) == 0)
          not_measured(row, "this run did not measure local error (observe.local_error false)");
        rep.gate.checks.push_back(std::move(row));
      }
    }
    // Step-curve checks.
    for (const auto& sc : gate.step_checks) {
      if (!sc.variant.empty() && sc.variant != variant.name) continue;
      const reports::StepCurve* curve = nullptr;
      for (const auto& c : rep.step_curves)
        if (c.variant == variant.name && c.quantity == sc.quantity && c.mode == sc.mode && c.metric == sc.metric)
          curve = &c;
      std::vector<double> values;
      std::optional<std::pair<double, std::size_t>> worst;
      const bool higher_better = metrics::metric_def(sc.metric).higher_is_better;  // load_gate checked the name
      if (curve)
        for (std::size_t k = 0; k < curve->values.size(); ++k) {
          const double x = curve->values[k];
          if (std::isnan(x)) continue;
          values.push_back(x);
          if (!worst || (higher_better ? x < worst->first : x > worst->first)) worst = {x, k};
        }
      const auto value = metrics::compute_stat(sc.spec, values);
      const std::string what = sc.quantity + " " + sc.mode + " " + sc.metric;
      const std::string detail =
          values.empty()
              ? "no " + what + " curve (a diffusion pipeline with teacher forcing on?)"
              : fmt::format("{} = {} over {} steps; worst {} at step {}", sc.stat, value ? fmt_num(*value) : "n/a",
                            values.size(), fmt_num(worst->first), worst->second);
      for (int side = 0; side < 2; ++side) {
        const auto& bound = side == 0 ? sc.bound.min : sc.bound.max;
        if (!bound) continue;
        reports::GateCheckRow row;
        row.metric = "steps." + sc.quantity + "." + sc.metric;
        row.stat = sc.stat;
        row.op = side == 0 ? ">=" : "<=";
        row.threshold = *bound;
        row.value = value;
        row.name = fmt::format("{} {} {} {}", what, sc.stat, row.op, fmt_num(*bound));
        row.passed = value && !std::isnan(*value) && (side == 0 ? *value >= *bound : *value <= *bound);
        row.detail = detail;
        row.variant = variant.name;
        if (teacher_forcing_off && sc.mode == "teacher-forced")
          not_measured(row, "this run did not run teacher-forced steps (observe.teacher_forced false)");
        rep.gate.checks.push_back(std::move(row));
      }
    }
    if (gate.max_nonfinite) {
      // Values the reference does not have (its attention masks' -inf are by design).
      double total = 0;
      if (table)
        for (std::size_t k = 0; k < table->stats.nonfinite.size(); ++k)
          total += nonfinite_beyond_reference(*table, ref_table, k);
      reports::GateCheckRow row;
      row.metric = "nonfinite";
      row.stat = "count";
      row.op = "<=";
      row.threshold = double(*gate.max_nonfinite);
      row.value = total;
      row.name = fmt::format("NaN/Inf values beyond the reference's <= {}", *gate.max_nonfinite);
      row.passed = table && total <= row.threshold;
      row.detail = !table ? "layers were not observed: no NaN/Inf count" : fmt::format("{} non-finite values", total);
      for (const auto& hit : rep.nonfinite)
        if (hit.variant == variant.name)
          row.detail +=
              fmt::format("; first at node '{}' ({}) step {} of sample {}", hit.node, hit.op, hit.step, hit.sample);
      row.variant = variant.name;
      if (layers_off)
        not_measured(row,
                     "this run did not observe layers (--no-layers or observe.layers false): NaN/Inf inside "
                     "the network not counted (final outputs are checked by the sample checks)");
      rep.gate.checks.push_back(std::move(row));
    }
  }
  rep.gate.passed = std::all_of(rep.gate.checks.begin(), rep.gate.checks.end(), [](const auto& c) { return c.passed; });
}

int write_run_outputs(const RunSpec& spec, const RunDriver& driver, const RunResult& result, const Gate& gate,
                      const ReportContext& context, const fs::path& out_dir) {
  reports::RunReport report = build_run_report(spec, driver, result, context);
  apply_run_gate(gate, report);
  reports::write_run_report(report, out_dir);
  fmt::print("{}", reports::render_summary_text(report, out_dir, base::stdout_columns()));
  return report.gate.passed ? 0 : 1;
}

}  // namespace qeval::eval
