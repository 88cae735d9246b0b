// qeval triage: node ranking (local error, sensitivity) and the fallback searches (docs/triage.md).
#include "eval/run/triage.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "base/progress.h"
#include "eval/run/evaluator.h"
#include "eval/run/recipe_variant.h"
#include "eval/run/run_report_build.h"
#include "kernels/error.h"

namespace qeval::eval {

namespace {

// Triage reads a report's metrics and gate only: no fingerprints (they hash every weight).
ReportContext metrics_only() {
  ReportContext c;
  c.fingerprints = false;
  return c;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A quantized node of the variant: a selection target of one of its quantized models.
struct QNode {
  std::size_t model = 0;   // index into RecipeGraphs::quantized
  std::size_t target = 0;  // index into that model's selection.targets
};

// Which nodes a configuration keeps in high precision (one flag per QNode).
using KeptSet = std::vector<char>;

struct Evaluated {
  bool passed = false;
  std::optional<double> metric;  // variant_metric()
  reports::GateSection gate;     // the candidate's checks
};

// The gate as it applies to configurations of the triaged variant: checks naming that variant (or
// none) apply to every configuration; checks naming other variants are dropped.
Gate gate_for_candidates(Gate gate, const std::string& variant) {
  auto keep = [&](auto& checks) {
    std::erase_if(checks, [&](const auto& c) { return !c.variant.empty() && c.variant != variant; });
    for (auto& c : checks) c.variant.clear();
  };
  keep(gate.checks);
  keep(gate.layer_checks);
  keep(gate.step_checks);
  return gate;
}

// Evaluates configurations of the variant, a batch at a time: one evaluator pass runs the
// reference once per unit and every configuration of the batch beside it.
class ConfigEvaluator {
 public:
  ConfigEvaluator(const RunSpec& spec, const RunDriver& driver, const BuiltVariant& reference,
                  const BuiltVariant& target, const RecipeGraphs& recipe, std::vector<QNode> nodes, Gate gate,
                  reports::MetricInfo metric, const TriageOptions& options)
      : spec_(spec),
        driver_(driver),
        reference_(reference),
        target_(target),
        recipe_(recipe),
        nodes_(std::move(nodes)),
        gate_(std::move(gate)),
        metric_(std::move(metric)),
        options_(options) {}

  std::vector<Evaluated> evaluate(const std::vector<KeptSet>& sets, base::Progress* progress = nullptr) {
    std::vector<Evaluated> out;
    const std::size_t batch = std::max<std::size_t>(1, options_.batch);
    for (std::size_t first = 0; first < sets.size(); first += batch) {
      const std::size_t last = std::min(sets.size(), first + batch);
      std::vector<BuiltVariant> variants = {reference_};
      RunSpec sub = spec_;
      sub.variants = {reference_.spec};
      sub.reference = reference_.spec.name;
      sub.observe.layers = !gate_.layer_checks.empty();
      sub.observe.histograms = 0;
      sub.observe.full_tensors = false;
      for (std::size_t i = first; i < last; ++i) {
        variants.push_back(build(sets[i], fmt::format("{}#{}", target_.spec.name, runs_ + (i - first))));
        sub.variants.push_back(variants.back().spec);
      }
      EvaluatorOptions eo;
      eo.workers = options_.workers;
      RunResult result = eval::evaluate(sub, driver_, std::move(variants), eo);
      reports::RunReport rep = build_run_report(sub, driver_, result, metrics_only());
      apply_run_gate(gate_, rep);
      for (std::size_t i = first; i < last; ++i) {
        const std::string name = sub.variants[1 + i - first].name;
        Evaluated e;
        e.passed = true;
        for (const auto& row : rep.gate.checks)
          if (row.variant == name) {
            e.gate.checks.push_back(row);
            e.passed = e.passed && row.passed;
          }
        e.gate.passed = e.passed;
        e.gate.source = rep.gate.source;
        e.metric = variant_metric(rep, name, metric_.key);
        out.push_back(std::move(e));
        if (progress) progress->tick();
      }
      runs_ += last - first;
    }
    return out;
  }
  Evaluated evaluate_one(const KeptSet& set) { return evaluate(std::vector<KeptSet>{set})[0]; }
  std::size_t runs() const { return runs_; }

 private:
  // The variant with the nodes of `kept` in high precision: the recipe re-applied to each model's
  // remaining targets with the same calibration (a node's range does not depend on the others').
  BuiltVariant build(const KeptSet& kept, const std::string& name) const {
    BuiltVariant b = target_;
    b.spec.name = name;
    for (std::size_t m = 0; m < recipe_.quantized.size(); ++m) {
      const auto& qm = recipe_.quantized[m];
      quant::Selection sel = qm.selection;
      sel.targets.clear();
      for (std::size_t k = 0; k < nodes_.size(); ++k)
        if (nodes_[k].model == m && !kept[k]) sel.targets.push_back(qm.selection.targets[nodes_[k].target]);
      if (sel.targets.size() == qm.selection.targets.size()) continue;  // the variant's own graph
      b.graphs[qm.model] = sel.targets.empty() ? qm.base : recipe_graph(*qm.base, sel, recipe_.parsed, qm.calibration);
    }
    return b;
  }

  const RunSpec& spec_;
  const RunDriver& driver_;
  const BuiltVariant& reference_;
  const BuiltVariant& target_;
  const RecipeGraphs& recipe_;
  std::vector<QNode> nodes_;
  Gate gate_;
  reports::MetricInfo metric_;
  const TriageOptions& options_;
  std::size_t runs_ = 0;
};

// Signed so that larger is better.
double better(const reports::MetricInfo& m, std::optional<double> v) {
  if (!v) return -std::numeric_limits<double>::infinity();
  return m.higher_is_better ? *v : -*v;
}

std::string fmt_metric(std::optional<double> v) { return v ? fmt::format("{:.4f}", *v) : std::string("n/a"); }

reports::TriageStep step_of(std::size_t kept, const Evaluated& e, std::string note) {
  return {kept, e.metric, e.passed, std::move(note)};
}

// Polygraphy's `debug precision --mode bisect`: the smallest prefix of `order` (kept in high
// precision) that passes, assuming that keeping more never hurts. Prefix 0 (the variant) fails and
// the whole order passes (both measured before).
reports::TriageSearch bisect(const std::string& strategy, const std::string& description,
                             const std::vector<std::size_t>& order, ConfigEvaluator& ev,
                             const std::vector<std::string>& names, const Evaluated& all_kept,
                             reports::GateSection& gate_of_result) {
  const auto t0 = Clock::now();
  reports::TriageSearch s;
  s.strategy = strategy;
  s.description = description;
  const std::size_t n = order.size();
  std::size_t lo = 0, hi = n;
  std::optional<double> hi_metric = all_kept.metric;
  reports::GateSection hi_gate = all_kept.gate;
  while (hi - lo > 1) {
    const std::size_t mid = lo + (hi - lo) / 2;
    KeptSet kept(n, 0);
    for (std::size_t i = 0; i < mid; ++i) kept[order[i]] = 1;
    const Evaluated e = ev.evaluate_one(kept);
    s.runs++;
    s.steps.push_back(step_of(mid, e, fmt::format("first {} of {} kept", mid, n)));
    if (e.passed) {
      hi = mid;
      hi_metric = e.metric;
      hi_gate = e.gate;
    } else {
      lo = mid;
    }
  }
  s.passed = true;
  s.metric = hi_metric;
  std::vector<std::size_t> kept(order.begin(), order.begin() + std::ptrdiff_t(hi));
  std::sort(kept.begin(), kept.end());
  for (std::size_t k : kept) s.kept.push_back(names[k]);
  gate_of_result = hi_gate;
  s.elapsed_s = seconds_since(t0);
  return s;
}

}  // namespace

std::optional<double> variant_metric(const reports::RunReport& rep, const std::string& variant,
                                     const std::string& key) {
  if (const reports::Variant* v = rep.variant(variant))
    for (const auto& row : v->summary.metrics)
      if (row.metric == key) {
        if (row.count > 0) return row.mean;
        if (row.unbounded > 0) return std::numeric_limits<double>::infinity();
      }
  return std::nullopt;
}

TriageOutcome run_triage(const RunSpec& spec_in, const Gate& gate_in, const TriageOptions& options) {
  const auto t0 = Clock::now();
  RunSpec spec = spec_in;
  const std::string where = spec.source.empty() ? std::string("the default run") : spec.source.string();
  std::string names;
  for (const auto& v : spec.variants) names += (names.empty() ? "" : ", ") + v.name;
  auto it = std::find_if(spec.variants.begin(), spec.variants.end(),
                         [&](const VariantSpec& v) { return v.name == options.variant; });
  if (it == spec.variants.end())
    throw InputError(fmt::format("--variant {}: {} has no such variant (variants: {})", options.variant, where, names));
  const VariantSpec target_spec = *it;
  const VariantSpec reference_spec = spec.reference_variant();
  if (target_spec.name == reference_spec.name)
    throw InputError(
        fmt::format("--variant {}: that is the reference of {}; triage a variant compared with it "
                    "(variants: {})",
                    options.variant, where, names));
  if (target_spec.recipe.empty())
    throw InputError(
        fmt::format("--variant {}: {} gives it no recipe; triage searches which nodes of a recipe "
                    "variant to keep in high precision (\"recipe\": FILE, docs/run-config.md)",
                    options.variant, where));
  if (gate_in.checks.empty() && gate_in.layer_checks.empty() && gate_in.step_checks.empty())
    throw InputError(
        fmt::format("{}: triage needs a gate with checks to search for (--gate G.json or \"gate\" in "
                    "the config; docs/gate.md)",
                    gate_in.source));
  const Gate gate = gate_for_candidates(gate_in, target_spec.name);
  if (gate.checks.empty() && gate.layer_checks.empty() && gate.step_checks.empty())
    throw InputError(fmt::format("{}: every check names another variant than '{}'", gate_in.source, target_spec.name));

  const auto driver = make_run_driver(spec);
  // The ranking metric: --metric, else the gate's first sample check's, else the pipeline's first.
  const std::vector<reports::MetricInfo> infos = driver->description().metrics;
  std::string metric_key = options.metric;
  if (metric_key.empty()) metric_key = gate.checks.empty() ? infos.at(0).key : gate.checks[0].metric;
  auto mi = std::find_if(infos.begin(), infos.end(), [&](const reports::MetricInfo& m) { return m.key == metric_key; });
  if (mi == infos.end()) {
    std::string keys;
    for (const auto& m : infos) keys += (keys.empty() ? "" : ", ") + m.key;
    throw InputError(fmt::format("metric '{}': a {} pipeline reports {}", metric_key, driver->kind().name, keys));
  }
  const reports::MetricInfo metric = *mi;

  // The reference and the variant (calibrated, or read from the cache).
  RunSpec ref_only = spec;
  ref_only.variants = {reference_spec};
  const BuiltVariant reference = build_variants(ref_only, *driver, options.progress).at(0);
  const RecipeGraphs recipe = apply_pipeline_recipe(*driver, target_spec, spec, options.progress);
  const BuiltVariant target = recipe_variant(target_spec, recipe);

  std::vector<QNode> nodes;
  std::vector<std::string> node_names;
  TriageOutcome outcome;
  reports::TriageReport& report = outcome.report;
  for (std::size_t m = 0; m < recipe.quantized.size(); ++m) {
    const auto& qm = recipe.quantized[m];
    for (std::size_t t = 0; t < qm.selection.targets.size(); ++t) {
      const auto& tg = qm.selection.targets[t];
      nodes.push_back({m, t});
      node_names.push_back(tg.node);
      reports::TriageNode tn;
      tn.model = qm.model;
      tn.name = tg.node;
      tn.op = tg.op_type;
      tn.category = quant::category_name(tg.category);
      tn.order = report.nodes.size();
      report.nodes.push_back(std::move(tn));
    }
  }
  const std::size_t n = nodes.size();
  ConfigEvaluator ev(spec, *driver, reference, target, recipe, nodes, gate, metric, options);

  report.pipeline = driver->kind().name;
  report.model = {driver->description().name, spec.pipeline.string(), ""};
  report.inputs = driver->description().inputs;
  report.recipe = recipe.recipe;
  report.variant = target_spec.name;
  report.reference = reference_spec.name;
  report.precision = std::string(precision_name(target_spec.precision));
  report.metric = metric;
  report.gate_source = gate_in.source;
  report.rank_by = options.sensitivity ? "sensitivity" : "local";
  for (const auto& [k, v] : driver->description().settings) report.settings.emplace_back(k, v);
  report.settings.emplace_back("batch", std::to_string(options.batch));

  // 1. The variant as given, observed: its metric, its gate verdict and every node's local error.
  {
    const auto t1 = Clock::now();
    RunSpec sub = spec;
    sub.variants = {reference_spec, target_spec};
    sub.reference = reference_spec.name;
    sub.observe.layers = true;
    sub.observe.local_error = true;
    sub.observe.histograms = 0;
    sub.observe.full_tensors = false;
    sub.observe.models.clear();
    for (const auto& qm : recipe.quantized) sub.observe.models.push_back(qm.model);
    EvaluatorOptions eo;
    eo.workers = options.workers;
    eo.progress = options.progress;
    eo.progress_label = "triage: " + target_spec.name + " as given";
    RunResult result = evaluate(sub, *driver, {reference, target}, eo);
    reports::RunReport rr = build_run_report(sub, *driver, result, metrics_only());
    apply_run_gate(gate, rr);
    report.samples = rr.samples.size();
    report.gate_full = rr.gate;
    report.full_passed = rr.gate.passed;
    report.metric_full = variant_metric(rr, target_spec.name, metric.key);
    if (const reports::LayerTable* table = rr.layer_table(target_spec.name))
      for (std::size_t l = 0; l < rr.layers.size(); ++l)
        for (auto& tn : report.nodes)
          if (tn.name == rr.layers[l].name && tn.model == rr.layers[l].component) {
            const float s = reports::cell(table->stats.local_sqnr_db, l),
                        r = reports::cell(table->stats.local_rel_l2, l);
            if (!std::isnan(s)) tn.local_sqnr_db = s;
            if (!std::isnan(r)) tn.local_rel_l2 = r;
          }
    if (options.progress)
      fmt::print(stderr, "qeval triage: {} as given: {} {} ({}), {} quantized nodes; {:.1f} s\n", target_spec.name,
                 metric.key, fmt_metric(report.metric_full), report.full_passed ? "passes" : "fails the gate", n,
                 seconds_since(t1));
  }
  // Local ranking: worst local SQNR first (not measured last).
  {
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    auto local_key = [&](std::size_t k) {
      return report.nodes[k].local_sqnr_db.value_or(std::numeric_limits<double>::infinity());
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return local_key(a) < local_key(b); });
    for (std::size_t r = 0; r < n; ++r) report.nodes[order[r]].rank_local = r + 1;
  }

  // 2. Every node in high precision (the best any fallback can do), and the sensitivity runs.
  std::vector<KeptSet> sets;
  Evaluated all_kept;
  sets.push_back(KeptSet(n, 1));
  if (options.sensitivity)
    for (std::size_t k = 0; k < n; ++k) {
      KeptSet only_quantized(n, 1), only_kept(n, 0);
      only_quantized[k] = 0;
      only_kept[k] = 1;
      sets.push_back(std::move(only_quantized));
      sets.push_back(std::move(only_kept));
    }
  {
    const auto t1 = Clock::now();
    base::Progress progress("triage: ranking", sets.size(), options.progress, {"node sets"});
    const std::vector<Evaluated> res = ev.evaluate(sets, &progress);
    progress.finish();
    all_kept = res[0];
    report.metric_none = res[0].metric;
    report.none_passed = res[0].passed;
    report.ranking_runs = sets.size() - 1;
    for (std::size_t k = 0; k < n && options.sensitivity; ++k) {
      auto& tn = report.nodes[k];
      tn.metric_only_quantized = res[1 + 2 * k].metric;
      tn.metric_only_kept = res[2 + 2 * k].metric;
      // What quantizing this node alone costs plus what keeping it alone recovers.
      const double drop = better(metric, report.metric_none) - better(metric, tn.metric_only_quantized);
      const double gain = better(metric, tn.metric_only_kept) - better(metric, report.metric_full);
      tn.score = (std::isfinite(drop) ? drop : 0) + (std::isfinite(gain) ? gain : 0);
    }
    if (!options.sensitivity)
      for (auto& tn : report.nodes) tn.score = -tn.local_sqnr_db.value_or(std::numeric_limits<double>::infinity());
    if (options.progress)
      fmt::print(stderr, "qeval triage: every node kept: {} {} ({}); {} ranking runs, {:.1f} s\n", metric.key,
                 fmt_metric(report.metric_none), report.none_passed ? "passes" : "fails the gate", report.ranking_runs,
                 seconds_since(t1));
  }
  // The rank: score, then local SQNR (worse first), then topological order.
  std::vector<std::size_t> ranked(n);
  std::iota(ranked.begin(), ranked.end(), 0);
  std::stable_sort(ranked.begin(), ranked.end(), [&](std::size_t a, std::size_t b) {
    const auto& x = report.nodes[a];
    const auto& y = report.nodes[b];
    if (x.score != y.score) return x.score > y.score;
    return x.rank_local < y.rank_local;
  });
  for (std::size_t r = 0; r < n; ++r) report.nodes[ranked[r]].rank = r + 1;

  // 3. The searches (only when there is something to find: the variant fails, all kept passes).
  std::map<std::string, reports::GateSection> final_gates;
  if (!report.full_passed && report.none_passed) {
    // Ranked greedy: keep nodes in rank order until the gate passes, then try to put each back
    // (latest added first) and keep it quantized when the gate still passes.
    {
      const auto t1 = Clock::now();
      reports::TriageSearch s;
      s.strategy = "greedy";
      s.description =
          "keep nodes in rank order until the gate passes, then re-quantize each kept node "
          "(latest first) whose return still passes; every set verified by a run";
      base::Progress progress("triage: greedy", n, options.progress, {"nodes"});
      KeptSet kept(n, 0);
      std::vector<std::size_t> added;
      reports::GateSection last_gate;
      for (std::size_t r = 0; r < n; ++r) {
        kept[ranked[r]] = 1;
        added.push_back(ranked[r]);
        const Evaluated e = ev.evaluate_one(kept);
        s.runs++;
        progress.tick();
        s.steps.push_back(step_of(added.size(), e, "keep " + node_names[ranked[r]]));
        if (e.passed) {
          s.passed = true;
          s.metric = e.metric;
          last_gate = e.gate;
          break;
        }
      }
      progress.finish();
      // The last node added made it pass: the others may not be needed any more.
      for (std::size_t i = added.size(); s.passed && i-- > 1;) {
        const std::size_t k = added[i - 1];
        kept[k] = 0;
        const Evaluated e = ev.evaluate_one(kept);
        s.runs++;
        std::size_t count = 0;
        for (char c : kept) count += c != 0;
        s.steps.push_back(step_of(count, e, "re-quantize " + node_names[k] + (e.passed ? "" : ": fails, kept")));
        if (e.passed) {
          s.metric = e.metric;
          last_gate = e.gate;
        } else {
          kept[k] = 1;
        }
      }
      for (std::size_t k = 0; k < n; ++k)
        if (kept[k]) s.kept.push_back(node_names[k]);
      s.elapsed_s = seconds_since(t1);
      final_gates[s.strategy] = last_gate;
      report.searches.push_back(std::move(s));
    }
    std::vector<std::size_t> topo(n);
    std::iota(topo.begin(), topo.end(), 0);
    report.searches.push_back(bisect("bisect-topological",
                                     "Polygraphy-style bisection over the topological order: the shortest prefix of "
                                     "nodes (from the input) kept in high precision that passes",
                                     topo, ev, node_names, all_kept, final_gates["bisect-topological"]));
    report.searches.push_back(bisect("bisect-ranked",
                                     "bisection over the ranked order: the shortest prefix of the ranking kept in "
                                     "high precision that passes",
                                     ranked, ev, node_names, all_kept, final_gates["bisect-ranked"]));
    if (options.progress)
      for (const auto& s : report.searches)
        fmt::print(stderr, "qeval triage: {}: {} nodes kept, {} runs, {} {}, {:.1f} s\n", s.strategy, s.kept.size(),
                   s.runs, metric.key, fmt_metric(s.metric), s.elapsed_s);
  }

  // 4. The chosen set: the fewest nodes among passing searches, then the fewest runs.
  const reports::TriageSearch* best = nullptr;
  for (const auto& s : report.searches)
    if (s.passed &&
        (!best || s.kept.size() < best->kept.size() || (s.kept.size() == best->kept.size() && s.runs < best->runs)))
      best = &s;
  quant::Recipe r = recipe.parsed;
  if (best) {
    report.chosen = best->strategy;
    report.gate_chosen = final_gates[best->strategy];
    outcome.passed = true;
    r.name = recipe.parsed.name + "-fallback";
    r.description = fmt::format(
        "{}{}qeval triage of variant '{}' ({} {} {} -> {} with {} of {} quantized nodes kept in {}; {} search, "
        "{} runs; gate {}).",
        recipe.parsed.description,
        recipe.parsed.description.empty() ? "" : (recipe.parsed.description.back() == '.' ? " " : ". "),
        target_spec.name, metric.key, "mean", fmt_metric(report.metric_full), fmt_metric(best->metric),
        best->kept.size(), n, report.precision, best->strategy, best->runs, gate_in.source);
    for (const auto& k : best->kept)
      if (std::find(r.exclude_nodes.begin(), r.exclude_nodes.end(), k) == r.exclude_nodes.end())
        r.exclude_nodes.push_back(k);
  } else {
    outcome.passed = report.full_passed;
    report.gate_chosen = report.full_passed ? report.gate_full : reports::GateSection{};
  }
  std::stable_sort(report.nodes.begin(), report.nodes.end(),
                   [](const reports::TriageNode& a, const reports::TriageNode& b) { return a.rank < b.rank; });
  outcome.override_recipe = r;
  report.override_recipe = {r.name, "", "fnv1a64:" + r.fingerprint()};
  report.elapsed_s = seconds_since(t0);
  return outcome;
}

}  // namespace qeval::eval
