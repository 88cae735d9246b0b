// compare-recipes: the run spec for a set of recipes, shapes recorded while the reference runs, and
// the comparison rows (see compare_recipes.h).
#include "eval/run/compare_recipes.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <unordered_map>

#include "eval/quant/cost.h"
#include "eval/quant/lint.h"
#include "eval/quant/recipe.h"
#include "kernels/error.h"

namespace qeval::eval {

namespace fs = std::filesystem;

RunSpec recipe_run_spec(RunSpec base, const std::vector<fs::path>& recipes, Precision precision) {
  if (recipes.empty()) throw InputError("--recipes: give at least one recipe file (docs/recipes.md)");
  VariantSpec reference = base.reference_variant();
  if (!reference.recipe.empty() || !reference.onnx.empty())
    throw InputError((base.source.empty() ? std::string("the config") : base.source.string()) +
                     ": the reference variant '" + reference.name +
                     "' must be a precision variant (fp32, fp16, bf16) to compare recipes against");
  base.variants = {reference};
  base.reference = reference.name;
  std::set<std::string> names = {reference.name};
  std::set<fs::path> seen;
  for (const fs::path& file : recipes) {
    std::error_code ec;
    const fs::path canonical = fs::weakly_canonical(file, ec);
    if (!fs::is_regular_file(file)) throw InputError("--recipes " + file.string() + ": no such file");
    if (!seen.insert(ec ? file : canonical).second) throw InputError("--recipes " + file.string() + ": given twice");
    const quant::Recipe recipe = quant::load_recipe(file);  // InputError naming the file and key
    std::string name = recipe.name.empty() ? file.stem().string() : recipe.name;
    for (int k = 2; names.count(name); ++k)
      name = (recipe.name.empty() ? file.stem().string() : recipe.name) + "-" + std::to_string(k);
    names.insert(name);
    base.variants.push_back(VariantSpec{name, precision, file, {}, {}, {}});
  }
  return base;
}

NodeHook CallShapes::hook() {
  return [this](const std::string& variant, const ModelCall& call, const NodeEvent& e) {
    if (variant != reference_) return;
    const std::string model(call.model);
    std::lock_guard lock(mu_);
    auto [it, fresh] = first_call_.try_emplace(model, std::string(call.context), call.call * 100000 + call.step);
    if (!fresh && (it->second.first != call.context || it->second.second != call.call * 100000 + call.step)) return;
    auto& shapes = shapes_[model];
    for (std::size_t i = 0; i < e.inputs.size() && i < e.node.inputs.size(); ++i)
      if (e.inputs[i] && !e.node.inputs[i].empty()) shapes.try_emplace(e.node.inputs[i], e.inputs[i]->shape());
    for (std::size_t i = 0; i < e.outputs.size() && i < e.node.outputs.size(); ++i)
      if (e.outputs[i] && !e.node.outputs[i].empty()) shapes.try_emplace(e.node.outputs[i], e.outputs[i]->shape());
  };
}

std::map<std::string, Shape> CallShapes::of(const std::string& model) const {
  std::lock_guard lock(mu_);
  auto it = shapes_.find(model);
  return it == shapes_.end() ? std::map<std::string, Shape>{} : it->second;
}

namespace {

std::vector<reports::WorstLayer> worst_layers(const reports::RunReport& report, const std::string& variant,
                                              const std::string& column, std::size_t n) {
  const reports::LayerTable* t = report.layer_table(variant);
  if (!t) return {};
  const std::vector<float>* col = nullptr;
  for (const auto& info : reports::kLayerColumns)
    if (column == info.key) col = &(t->stats.*info.column);
  if (!col) return {};
  std::vector<std::pair<float, std::size_t>> ranked;
  for (std::size_t i = 0; i < col->size() && i < report.layers.size(); ++i) {
    const float v = (*col)[i];
    if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) continue;  // not measured / exact
    ranked.emplace_back(v, i);
  }
  std::sort(ranked.begin(), ranked.end());
  std::vector<reports::WorstLayer> out;
  for (std::size_t k = 0; k < ranked.size() && k < n; ++k) {
    const auto& info = report.layers[ranked[k].second];
    out.push_back({info.name, info.op, info.component, double(ranked[k].first)});
  }
  return out;
}

std::int64_t float_param_count(const Graph& g) {
  std::int64_t n = 0;
  for (const auto& [name, t] : g.initializers)
    if (t.dtype() == DType::kFloat32 || t.dtype() == DType::kFloat16 || t.dtype() == DType::kBFloat16) n += t.numel();
  return n;
}

}  // namespace

std::optional<reports::ModelQuantization> model_quantization(const std::string& model, const Graph& reference,
                                                             const Graph* variant,
                                                             const std::map<std::string, Shape>& call) {
  reports::ModelQuantization q;
  q.model = model;
  q.params = float_param_count(reference);
  std::unordered_map<std::string, quant::ComputeState> state;
  if (variant) {
    quant::LintOptions lo;
    for (const auto& in : variant->inputs)
      if (auto it = call.find(in.name); it != call.end()) lo.input_shapes[in.name] = it->second;
    try {
      for (const auto& n : quant::lint_graph(*variant, lo).nodes) state[n.name] = n.state;
    } catch (const InputError&) {
      return std::nullopt;
    }
  }
  double macs = 0, quantized_macs = 0;
  bool known = true;
  const std::vector<quant::ComputeCost> costs = quant::compute_costs(reference, call);
  for (const quant::ComputeCost& cost : costs) {
    ++q.compute_nodes;
    const auto st = state.find(cost.name);
    // ONNX Runtime's integer forms (QLinearConv, ConvInteger, QGemm, ...) are quantized whatever lint
    // says of them (it judges Conv/MatMul/Gemm between Q/DQ).
    const bool integer_form =
        cost.op_type != "Conv" && cost.op_type != "ConvTranspose" && cost.op_type != "MatMul" && cost.op_type != "Gemm";
    const bool quantized = integer_form || (st != state.end() && st->second == quant::ComputeState::kQuantized);
    q.quantized_nodes += quantized;
    if (quantized || (st != state.end() && st->second == quant::ComputeState::kWeightOnly))
      q.quantized_params += cost.params;
    if (!cost.macs) {
      known = false;
      continue;
    }
    macs += *cost.macs;
    if (quantized) quantized_macs += *cost.macs;
  }
  // A separate export stores quantized weights as int8/fp8 initializers, which are not float: keep
  // the share within the compute nodes' own parameters at least.
  std::int64_t compute_params = 0;
  for (const quant::ComputeCost& cost : costs) compute_params += cost.params;
  q.params = std::max(q.params, compute_params);
  if (known && macs > 0) q.macs = macs, q.quantized_macs = quantized_macs;
  return q;
}

reports::RecipeComparison build_recipe_comparison(const RunSpec& spec, const RunResult& result,
                                                  const reports::RunReport& report, const CallShapes& shapes,
                                                  const CompareRecipesSettings& settings) {
  reports::RecipeComparison c;
  c.tool_version = report.tool_version;
  c.created_utc = report.created_utc;
  c.command_line = report.command_line;
  c.elapsed_s = report.elapsed_s;
  c.config = report.config;
  c.metrics = report.metrics;
  c.target = fmt::format("sm{}", settings.target_sm);
  c.gate = report.gate;
  c.run_report = settings.run_report;
  c.layer_column = spec.observe.local_error ? "local_sqnr_db" : "acc_sqnr_db";
  for (const auto& m : report.metrics) {  // the first metric any recipe has values of
    bool any = false;
    for (const auto& v : report.variants)
      for (const auto& s : v.summary.metrics) any |= s.metric == m.key && s.count > 0;
    if (any) {
      c.quality_metric = m.key;
      break;
    }
  }
  if (c.quality_metric.empty() && !report.metrics.empty()) c.quality_metric = report.metrics.front().key;

  const BuiltVariant& ref = result.variants[result.reference];
  c.reference_precision = std::string(precision_name(ref.options.precision));
  // Shares are over the models any recipe rewrote: one denominator for every row, so that a recipe
  // that leaves a model alone shows a smaller share rather than a share of less.
  std::set<std::string> in_scope;
  for (std::size_t v = 0; v < result.variants.size(); ++v)
    for (const auto& [model, graph] : result.variants[v].graphs)
      if (auto rg = ref.graphs.find(model); v != result.reference && rg != ref.graphs.end() && graph != rg->second)
        in_scope.insert(model);
  auto float_params = [](const Graph& g) {
    std::int64_t n = 0;
    for (const auto& [name, t] : g.initializers)
      if (t.dtype() == DType::kFloat32 || t.dtype() == DType::kFloat16 || t.dtype() == DType::kBFloat16) n += t.numel();
    return n;
  };
  // What the reference's models are, the same for every recipe row: found once per model.
  struct ModelBaseline {
    std::map<std::string, Shape> call;  // the shapes the model ran with
    std::int64_t float_params = 0;
    std::vector<quant::ComputeCost> costs;
  };
  std::map<std::string, ModelBaseline> baseline;
  for (const std::string& model : in_scope) {
    const Graph& g = *ref.graphs.at(model);
    ModelBaseline& b = baseline[model];
    b.call = shapes.of(model);
    b.float_params = float_params(g);
    b.costs = quant::compute_costs(g, b.call);
  }
  std::map<std::pair<std::string, Precision>, std::int64_t> reference_weight_bytes;
  for (std::size_t v = 0; v < result.variants.size(); ++v) {
    if (v == result.reference) continue;
    const BuiltVariant& bv = result.variants[v];
    reports::RecipeRow row;
    row.variant = bv.spec.name;
    if (bv.recipe) row.recipe = *bv.recipe;
    const quant::Recipe recipe = quant::load_recipe(bv.spec.recipe);
    row.format = quant::format_name(recipe.format);
    row.level = fmt::format("{:g}", recipe.level);
    row.precision = std::string(precision_name(bv.options.precision));
    row.calibration_s = bv.calibration_s;
    row.calibration_cache_hit = bv.calibration_cache_hit;
    if (const reports::Variant* rv = report.variant(row.variant)) {
      row.samples = rv->summary.samples;
      row.errors = rv->summary.errors;
      row.metrics = rv->summary.metrics;
    }
    row.gate_passed = true;
    for (const auto& check : report.gate.checks)
      if (check.variant == row.variant && !check.passed) {
        row.gate_passed = false;
        row.failed_checks.push_back(check.name + ": " +
                                    (check.value ? fmt::format("{:.4g}", *check.value) : std::string("no value")));
      }
    row.worst_layers = worst_layers(report, row.variant, c.layer_column, settings.worst_layers);

    double macs_total = 0, macs_quantized = 0;
    bool macs_known = true;
    std::map<std::string, int> rules;
    std::optional<quant::SpeedClass> speed_class;
    bool lint_failed = false;
    for (const auto& [model, graph] : bv.graphs) {
      const auto rg = ref.graphs.find(model);
      if (rg == ref.graphs.end()) continue;
      row.weight_bytes += quant::weight_bytes(*graph, bv.options.precision);
      auto [ref_bytes, fresh] = reference_weight_bytes.try_emplace({model, bv.options.precision}, 0);
      if (fresh) ref_bytes->second = quant::weight_bytes(*rg->second, bv.options.precision);
      row.reference_weight_bytes += ref_bytes->second;
      if (!in_scope.count(model)) continue;
      const ModelBaseline& base = baseline.at(model);
      const std::map<std::string, Shape>& call = base.call;
      if (graph == rg->second) {  // another recipe rewrote it, this one did not: all high precision
        row.params_total += base.float_params;
        for (const quant::ComputeCost& cost : base.costs) {
          ++row.compute_nodes;
          if (cost.macs) macs_total += *cost.macs;
          else macs_known = false;
        }
        continue;
      }
      row.quantized_models.push_back(model);
      quant::LintOptions lo;
      lo.target_sm = settings.target_sm;
      for (const auto& in : rg->second->inputs)
        if (auto it = call.find(in.name); it != call.end()) lo.input_shapes[in.name] = it->second;
      // The shares say what the recipe quantizes whatever the GPU (lint without a target); the
      // speed class what the target makes of it.
      quant::LintReport lint, any_target;
      try {
        lint = quant::lint_graph(*graph, lo);
        lo.target_sm = 0;
        any_target = quant::lint_graph(*graph, lo);
      } catch (const InputError& e) {
        lint_failed = true;
        row.speed_reasons.push_back(std::string("lint could not run: ") + e.what());
        continue;
      }
      row.lint_errors += lint.count(quant::Severity::kError);
      row.lint_warnings += lint.count(quant::Severity::kWarning);
      for (const auto& f : lint.findings)
        if (f.severity != quant::Severity::kInfo) ++rules[f.rule];
      std::unordered_map<std::string, quant::ComputeState> state;
      for (const auto& n : any_target.nodes) state[n.name] = n.state;
      double model_macs = 0, model_quantized = 0;
      bool model_known = true;
      const std::vector<quant::ComputeCost>& costs = base.costs;
      for (const quant::ComputeCost& cost : costs) {
        ++row.compute_nodes;
        const auto st = state.find(cost.name);
        const bool quantized = st != state.end() && st->second == quant::ComputeState::kQuantized;
        const bool weight_quantized =
            quantized || (st != state.end() && st->second == quant::ComputeState::kWeightOnly);
        row.quantized_nodes += quantized;
        if (weight_quantized) row.params_quantized += cost.params;
        if (!cost.macs) {
          model_known = false;
          continue;
        }
        model_macs += *cost.macs;
        if (quantized) model_quantized += *cost.macs;
      }
      row.params_total += base.float_params;
      macs_known &= model_known;
      macs_total += model_macs;
      macs_quantized += model_quantized;
      // The speed class counts only what the target runs quantized.
      std::unordered_map<std::string, bool> on_target;
      for (const auto& n : lint.nodes) on_target[n.name] = n.state == quant::ComputeState::kQuantized;
      double target_quantized = 0;
      for (const quant::ComputeCost& cost : costs)
        if (cost.macs && on_target[cost.name]) target_quantized += *cost.macs;
      const quant::SpeedEstimate speed = quant::estimate_speed(
          lint, model_known && model_macs > 0 ? std::optional<double>(target_quantized / model_macs) : std::nullopt);
      if (!speed_class || speed.speed > *speed_class) speed_class = speed.speed;  // several models: the worst
      for (const auto& r : speed.reasons) row.speed_reasons.push_back(model + ": " + r);
    }
    if (macs_known && macs_total > 0) {
      row.macs_total = macs_total;
      row.macs_quantized = macs_quantized;
    }
    for (const auto& [rule, n] : rules) row.lint_rules.push_back(fmt::format("{} x{}", rule, n));
    row.speed_class = speed_class && !lint_failed ? quant::speed_class_name(*speed_class) : "unknown";
    c.rows.push_back(std::move(row));
  }
  return c;
}

}  // namespace qeval::eval
