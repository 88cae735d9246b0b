// Gate files and their evaluation.
#include "eval/run/gate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "base/input_file.h"
#include "base/json_config.h"
#include "base/user_regex.h"
#include "kernels/error.h"
#include "metrics/metric_registry.h"
#include "reports/run_report_model.h"

namespace qeval::eval {

using nlohmann::json;

const std::vector<std::string>& gate_metric_keys() {
  static const std::vector<std::string> keys = metrics::metric_keys(metrics::MetricScope::kImagePair);
  return keys;
}

const std::vector<std::string>& gate_step_metrics() {
  static const std::vector<std::string> keys = metrics::metric_keys(metrics::MetricScope::kTensorPair);
  return keys;
}

const std::vector<std::string>& gate_layer_columns() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& c : reports::kLayerColumns) k.push_back(c.key);
    return k;
  }();
  return keys;
}

namespace {

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw InputError(source + ": " + what + " (see docs/gate.md)");
}

void check_keys(const json& obj, std::initializer_list<const char*> allowed, const std::string& source,
                const std::string& where) {
  for (const auto& item : obj.items()) {
    const std::string key = item.key();  // a named copy: lambdas may not capture bindings (clang 14)
    if (std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return key == a; })) {
      std::string list;
      for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
      bad(source, where + ": unknown key '" + key + "' (allowed: " + list + ")");
    }
  }
}

void check_known_metric(const std::string& m, const std::vector<std::string>& keys, const std::string& source,
                        const std::string& where, const char* known) {
  if (std::find(keys.begin(), keys.end(), m) == keys.end()) {
    std::string list;
    for (const auto& k : keys) list += (list.empty() ? "" : ", ") + k;
    bad(source, where + ": unknown metric '" + m + "' (" + known + ": " + list + ")");
  }
}

std::string check_metric(const json& v, const std::string& source, const std::string& where, GateMetrics metrics) {
  if (!v.is_string() || v.get<std::string>().empty()) bad(source, where + ": 'metric' must be a metric's name");
  std::string m = v.get<std::string>();
  if (metrics == GateMetrics::kKnown) check_known_metric(m, gate_metric_keys(), source, where, "known");
  return m;
}

Bound parse_bound(const json& obj, const std::string& source, const std::string& where) {
  Bound b;
  for (const char* key : {"min", "max"}) {
    if (!obj.contains(key)) continue;
    if (!obj[key].is_number()) bad(source, where + ": '" + key + "' must be a number");
    (std::string(key) == "min" ? b.min : b.max) = obj[key].get<double>();
  }
  if (!b.min && !b.max) bad(source, where + ": needs 'min' and/or 'max'");
  return b;
}

std::string fmt_num(double v);

// Bounds on one quantity that no value can meet together: min > max in one check, or across the
// checks of the same quantity (metric, statistic, variant, ...). Such a gate can never pass, which
// is a typo, not a verdict. `quantity(c)` names what a check bounds; equal names are one quantity.
template <class Check, class Quantity>
void check_bounds_can_meet(const std::vector<Check>& checks, const char* section, Quantity quantity,
                           const std::string& source) {
  struct Tightest {
    double min = -INFINITY, max = INFINITY;
    std::size_t min_at = 0, max_at = 0;
  };
  std::map<std::string, Tightest> by_quantity;
  for (std::size_t i = 0; i < checks.size(); ++i) {
    Tightest& t = by_quantity[quantity(checks[i])];
    const Bound& b = checks[i].bound;
    if (b.min && *b.min > t.min) t.min = *b.min, t.min_at = i;
    if (b.max && *b.max < t.max) t.max = *b.max, t.max_at = i;
    if (t.min > t.max) {
      const std::string where = t.min_at == t.max_at
                                    ? fmt::format("{}[{}]", section, i)
                                    : fmt::format("{}[{}] and {}[{}]", section, std::min(t.min_at, t.max_at), section,
                                                  std::max(t.min_at, t.max_at));
      bad(source, fmt::format("{}: {} must be >= {} and <= {}: min is greater than max, no value can pass", where,
                              quantity(checks[i]), fmt_num(t.min), fmt_num(t.max)));
    }
  }
}

std::string fmt_num(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{:.6g}", v);
}

// The part sample, layer and step checks share: "stat" (default `default_stat`), the bound, "variant".
template <class Check>
void parse_summary(const json& c, const char* default_stat, const std::string& source, const std::string& where,
                   Check& check) {
  if (c.contains("stat") && !c["stat"].is_string())  // get<std::string> would throw json's type_error (exit 3)
    bad(source, where + ": 'stat' must be a string such as \"mean\", \"min\" or \"p5\", got " + c["stat"].dump());
  check.stat = c.contains("stat") ? c["stat"].get<std::string>() : default_stat;
  try {
    check.spec = metrics::parse_stat(check.stat);
  } catch (const std::invalid_argument& e) {
    bad(source, where + ": " + e.what());
  }
  check.bound = parse_bound(c, source, where);
  if (c.contains("variant")) {
    if (!c["variant"].is_string()) bad(source, where + ": 'variant' must be a variant's name");
    check.variant = c["variant"].get<std::string>();
  }
}

}  // namespace

Gate parse_gate(const std::string& text, const std::string& source, GateMetrics metrics) {
  json j = base::parse_json_text(text, source, "docs/gate.md");
  if (!j.is_object()) bad(source, "the gate must be a JSON object");
  check_keys(j,
             {"description", "checks", "per_pair", "max_failed_pair_share", "max_errors", "layers", "steps",
              "max_nonfinite", "allow_nonfinite"},
             source, "top level");
  Gate g;
  g.source = source;
  if (j.contains("checks")) {
    if (!j["checks"].is_array()) bad(source, "'checks' must be an array");
    for (std::size_t i = 0; i < j["checks"].size(); ++i) {
      const json& c = j["checks"][i];
      const std::string where = "checks[" + std::to_string(i) + "]";
      if (!c.is_object()) bad(source, where + ": must be an object");
      check_keys(c, {"metric", "stat", "min", "max", "variant"}, source, where);
      if (!c.contains("metric")) bad(source, where + ": missing 'metric'");
      GateCheck check;
      check.metric = check_metric(c["metric"], source, where, metrics);
      parse_summary(c, "mean", source, where, check);
      g.checks.push_back(std::move(check));
    }
  }
  if (j.contains("per_pair")) {
    if (!j["per_pair"].is_object()) bad(source, "'per_pair' must be an object of metric -> bound");
    for (const auto& [metric, bound] : j["per_pair"].items()) {
      const std::string where = "per_pair." + metric;
      check_metric(json(metric), source, where, metrics);
      if (!bound.is_object()) bad(source, where + ": must be an object with min/max");
      check_keys(bound, {"min", "max"}, source, where);
      g.per_pair[metric] = parse_bound(bound, source, where);
      const Bound& b = g.per_pair[metric];
      if (b.min && b.max && *b.min > *b.max)
        bad(source, fmt::format("{}: metric '{}' must be >= {} and <= {}: min is greater than max, no pair can pass",
                                where, metric, fmt_num(*b.min), fmt_num(*b.max)));
    }
  }
  if (j.contains("layers")) {
    if (!j["layers"].is_array()) bad(source, "'layers' must be an array of layer checks");
    for (std::size_t i = 0; i < j["layers"].size(); ++i) {
      const json& c = j["layers"][i];
      const std::string where = "layers[" + std::to_string(i) + "]";
      if (!c.is_object()) bad(source, where + ": must be an object");
      check_keys(c, {"column", "stat", "min", "max", "variant", "nodes"}, source, where);
      if (!c.contains("column") || !c["column"].is_string()) bad(source, where + ": missing 'column' (a string)");
      LayerGateCheck check;
      check.column = c["column"].get<std::string>();
      const auto& cols = gate_layer_columns();
      if (std::find(cols.begin(), cols.end(), check.column) == cols.end()) {
        std::string list;
        for (const auto& k : cols) list += (list.empty() ? "" : ", ") + k;
        bad(source, where + ": unknown layer column '" + check.column + "' (known: " + list + ")");
      }
      parse_summary(c, "min", source, where, check);
      if (c.contains("nodes")) {
        if (!c["nodes"].is_string() || c["nodes"].get<std::string>().empty())
          bad(source, where + ": 'nodes' must be a regular expression (searched in node names)");
        check.nodes = c["nodes"].get<std::string>();
        try {
          base::compile_user_regex(check.nodes);
        } catch (const std::regex_error& e) {
          const std::string shown = check.nodes.size() > 80 ? check.nodes.substr(0, 80) + "..." : check.nodes;
          bad(source, where + ": 'nodes' is not a valid regular expression '" + shown + "': " + e.what());
        }
      }
      g.layer_checks.push_back(std::move(check));
    }
  }
  if (j.contains("steps")) {
    if (!j["steps"].is_array()) bad(source, "'steps' must be an array of step-curve checks");
    for (std::size_t i = 0; i < j["steps"].size(); ++i) {
      const json& c = j["steps"][i];
      const std::string where = "steps[" + std::to_string(i) + "]";
      if (!c.is_object()) bad(source, where + ": must be an object");
      check_keys(c, {"quantity", "mode", "metric", "stat", "min", "max", "variant"}, source, where);
      StepGateCheck check;
      auto choice = [&](const char* key, std::string& into, const std::vector<std::string>& allowed) {
        if (!c.contains(key)) return;
        if (!c[key].is_string()) bad(source, where + ": '" + key + "' must be a string");
        into = c[key].get<std::string>();
        if (std::find(allowed.begin(), allowed.end(), into) == allowed.end()) {
          std::string list;
          for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
          bad(source, where + ": unknown " + key + " '" + into + "' (known: " + list + ")");
        }
      };
      choice("quantity", check.quantity, {"noise_pred", "latent"});
      choice("mode", check.mode, {"teacher-forced", "free-running"});
      choice("metric", check.metric, gate_step_metrics());
      parse_summary(c, "mean", source, where, check);
      g.step_checks.push_back(std::move(check));
    }
  }
  auto variant_of = [](const std::string& v) { return v.empty() ? std::string() : ", variant '" + v + "'"; };
  check_bounds_can_meet(
      g.checks, "checks",
      [&](const GateCheck& c) { return fmt::format("metric '{}' ({}{})", c.metric, c.stat, variant_of(c.variant)); },
      source);
  check_bounds_can_meet(
      g.layer_checks, "layers",
      [&](const LayerGateCheck& c) {
        return fmt::format("layer column '{}' ({}{}{})", c.column, c.stat, variant_of(c.variant),
                           c.nodes.empty() ? "" : ", nodes '" + c.nodes + "'");
      },
      source);
  check_bounds_can_meet(
      g.step_checks, "steps",
      [&](const StepGateCheck& c) {
        return fmt::format("step metric '{}' of {} {} ({}{})", c.metric, c.quantity, c.mode, c.stat,
                           variant_of(c.variant));
      },
      source);
  if (j.contains("max_nonfinite")) {
    const json& v = j["max_nonfinite"];
    if (!v.is_number_integer() || v.get<long long>() < 0) bad(source, "'max_nonfinite' must be a non-negative integer");
    g.max_nonfinite = v.get<std::uint64_t>();
  }
  if (j.contains("allow_nonfinite")) {
    if (!j["allow_nonfinite"].is_boolean()) bad(source, "'allow_nonfinite' must be true or false");
    g.allow_nonfinite = j["allow_nonfinite"].get<bool>();
  }
  if (j.contains("max_failed_pair_share")) {
    const json& v = j["max_failed_pair_share"];
    if (!v.is_number() || v.get<double>() < 0 || v.get<double>() > 1)
      bad(source, "'max_failed_pair_share' must be a number in [0, 1]");
    g.max_failed_pair_share = v.get<double>();
  }
  if (j.contains("max_errors")) {
    const json& v = j["max_errors"];
    if (!v.is_number_integer() || v.get<long long>() < 0) bad(source, "'max_errors' must be a non-negative integer");
    g.max_errors = v.get<std::size_t>();
  }
  return g;
}

Gate load_gate(const std::filesystem::path& path, GateMetrics metrics) {
  return parse_gate(base::read_regular_file_text(path), path.string(), metrics);
}

void check_gate_metrics(const Gate& gate, const std::vector<std::string>& known) {
  for (std::size_t i = 0; i < gate.checks.size(); ++i)
    check_known_metric(gate.checks[i].metric, known, gate.source, "checks[" + std::to_string(i) + "]",
                       "this run's metrics");
  for (const auto& [metric, bound] : gate.per_pair)
    check_known_metric(metric, known, gate.source, "per_pair." + metric, "this run's metrics");
}

static std::string nonfinite_detail(std::size_t samples, std::uint64_t values, const char* what) {
  return fmt::format(
      "{} {} NaN/Inf where the reference is finite ({} value(s)); the gate does not set "
      "'allow_nonfinite'",
      samples, what, values);
}

GateOutcome evaluate_gate(const Gate& gate, const std::vector<GateSample>& samples) {
  GateOutcome out;
  out.section.source = gate.source;
  out.failed_checks.resize(samples.size());
  // Samples whose outputs went non-finite where the reference's did not: they fail every check.
  std::size_t diverged = 0;
  std::uint64_t diverged_values = 0;
  for (const auto& s : samples)
    if (!s.error && s.nonfinite) ++diverged, diverged_values += s.nonfinite;
  const bool fail_diverged = diverged && !gate.allow_nonfinite;

  for (const auto& check : gate.checks) {
    std::vector<double> values;
    std::vector<std::pair<double, const std::string*>> named;
    std::size_t unbounded = 0, missing = 0;
    for (const auto& s : samples) {
      if (s.error) continue;
      auto it = s.values.find(check.metric);
      if (it == s.values.end() || !it->second) {
        ++missing;
        continue;
      }
      values.push_back(*it->second);
      named.emplace_back(*it->second, &s.name);
      unbounded += std::isinf(*it->second);
    }
    std::optional<double> value = metrics::compute_stat(check.spec, values);
    std::string detail;
    if (values.empty()) {
      detail = fmt::format("no compared pair has a value for {} ({} not applicable)", check.metric, missing);
    } else {
      auto [lo, hi] = std::minmax_element(named.begin(), named.end());
      auto summary = metrics::summarize(values);
      detail = fmt::format("{} = {} over {} pairs; min {} ({}), median {}, max {} ({})", check.stat,
                           value ? fmt_num(*value) : "n/a", values.size(), fmt_num(lo->first), *lo->second,
                           fmt_num(summary->median), fmt_num(hi->first), *hi->second);
      if (unbounded) detail += fmt::format("; {} identical (unbounded)", unbounded);
      if (missing) detail += fmt::format("; {} not applicable", missing);
    }
    if (fail_diverged) detail += "; " + nonfinite_detail(diverged, diverged_values, "pair(s) hold");
    for (int side = 0; side < 2; ++side) {
      const std::optional<double>& bound = side == 0 ? check.bound.min : check.bound.max;
      if (!bound) continue;
      reports::GateCheckRow row;
      row.metric = check.metric;
      row.stat = check.stat;
      row.op = side == 0 ? ">=" : "<=";
      row.threshold = *bound;
      row.value = value;
      row.name = fmt::format("{} {} {} {}", check.metric, check.stat, row.op, fmt_num(*bound));
      row.passed = !fail_diverged && value && !std::isnan(*value) && (side == 0 ? *value >= *bound : *value <= *bound);
      row.detail = detail;
      out.section.checks.push_back(std::move(row));
    }
  }

  std::size_t compared = 0, failed = 0;
  std::vector<std::string> failed_names;
  std::vector<std::string> errors;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const auto& s = samples[i];
    if (s.error) {
      errors.push_back(s.name + " (" + s.error_text + ")");
      continue;
    }
    ++compared;
    if (s.nonfinite && !gate.allow_nonfinite)
      out.failed_checks[i].push_back(
          fmt::format("{} output value(s) NaN/Inf where the reference is finite", s.nonfinite));
    for (const auto& [metric, bound] : gate.per_pair) {
      auto it = s.values.find(metric);
      if (it == s.values.end() || !it->second) continue;  // not applicable: not checked
      double v = *it->second;
      if (bound.min && !(v >= *bound.min))
        out.failed_checks[i].push_back(fmt::format("{} {} < {}", metric, fmt_num(v), fmt_num(*bound.min)));
      if (bound.max && !(v <= *bound.max))
        out.failed_checks[i].push_back(fmt::format("{} {} > {}", metric, fmt_num(v), fmt_num(*bound.max)));
    }
    if (!out.failed_checks[i].empty()) {
      ++failed;
      std::string all;
      for (const auto& f : out.failed_checks[i]) all += (all.empty() ? "" : ", ") + f;
      failed_names.push_back(s.name + " (" + all + ")");
    }
  }
  auto list = [](const std::vector<std::string>& items) {
    std::string s;
    for (std::size_t i = 0; i < items.size() && i < 5; ++i) s += (i ? "; " : "") + items[i];
    if (items.size() > 5) s += fmt::format("; and {} more", items.size() - 5);
    return s;
  };
  if (!gate.per_pair.empty() || fail_diverged) {
    reports::GateCheckRow row;
    row.metric = "failed_pair_share";
    row.stat = "share";
    row.op = "<=";
    row.threshold = gate.max_failed_pair_share;
    row.value = compared ? double(failed) / double(compared) : 0.0;
    row.name =
        fmt::format("share of pairs {} <= {}",
                    gate.per_pair.empty() ? "with NaN/Inf where the reference is finite" : "below per-pair thresholds",
                    fmt_num(row.threshold));
    row.passed = *row.value <= gate.max_failed_pair_share;
    row.detail =
        fmt::format("{} of {} compared pairs failed", failed, compared) + (failed ? ": " + list(failed_names) : "");
    out.section.checks.push_back(std::move(row));
  }
  reports::GateCheckRow err;
  err.metric = "errors";
  err.stat = "count";
  err.op = "<=";
  err.threshold = double(gate.max_errors);
  err.value = double(errors.size());
  err.name = fmt::format("pairs that could not be compared <= {}", gate.max_errors);
  err.passed = errors.size() <= gate.max_errors;
  err.detail = errors.empty() ? "every pair was compared" : fmt::format("{} pair(s): ", errors.size()) + list(errors);
  out.section.checks.push_back(std::move(err));

  out.section.passed =
      std::all_of(out.section.checks.begin(), out.section.checks.end(), [](const auto& c) { return c.passed; });
  return out;
}

}  // namespace qeval::eval
