// The evaluator: variants, the parallel loop over units, the ordered merge.
#include "eval/run/evaluator.h"

#include <fmt/format.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>

#include "base/file_names.h"
#include "base/files.h"
#include "base/input_file.h"
#include "base/progress.h"
#include "datasets/npy.h"
#include "eval/exec/backend.h"
#include "eval/run/node_match.h"
#include "eval/run/recipe_variant.h"
#include "kernels/error.h"
#include "reports/json_text.h"

namespace qeval::eval {

namespace fs = std::filesystem;

std::unique_ptr<RunDriver> make_run_driver(const RunSpec& spec) { return pipeline_kind(spec.kind).load(spec); }

Precision RunDriver::model_precision(const VariantSpec& variant, const std::string& model) const {
  auto it = variant.model_precision.find(model);
  return it == variant.model_precision.end() ? variant.precision : it->second;
}

namespace {

// Per model: its precision where it is not the variant's, and the reference's node order where
// the variant's graph is another (BuiltVariant::node_order).
void set_model_options(const RunDriver& driver, BuiltVariant& b) {
  for (const auto& m : driver.models()) {
    const Precision p = driver.model_precision(b.spec, m);
    if (p != b.options.precision) b.model_precision[m] = p;
    auto g = b.graphs.find(m);
    const std::shared_ptr<const Graph> reference = driver.reference_graph(m);
    if (g == b.graphs.end() || !g->second || !reference || g->second == reference) continue;
    if (auto order = reference_order(*g->second, *reference); !order.empty())
      b.node_order[m] = std::make_shared<const std::vector<std::string>>(std::move(order));
  }
}

}  // namespace

std::vector<BuiltVariant> build_variants(const RunSpec& spec, const RunDriver& driver, bool progress) {
  std::vector<BuiltVariant> out;
  for (const VariantSpec& v : spec.variants) {
    // The kind allows every model its pipelines may have; this pipeline may have fewer (an SD
    // pipeline has no text_encoder_2): a name it lacks is refused, never ignored.
    const auto& models = driver.models();
    auto check = [&](const std::string& key, const std::string& model) {
      if (std::find(models.begin(), models.end(), model) != models.end()) return;
      std::string list;
      for (const auto& m : models) list += (list.empty() ? "" : ", ") + m;
      throw InputError(fmt::format("{}: variant '{}': {}: this pipeline has no model '{}' (models: {})",
                                   spec.source.string(), v.name, key, model, list));
    };
    for (const auto& [m, _] : v.onnx) check("onnx", m);
    for (const auto& [m, _] : v.model_precision) check("model_precision", m);
    BuiltVariant b;
    b.spec = v;
    b.options.precision = v.precision;
    if (!v.recipe.empty()) {
      out.push_back(recipe_variant(v, apply_pipeline_recipe(driver, v, spec, progress)));
      set_model_options(driver, out.back());
      continue;
    }
    b.graphs = driver.variant_graphs(v);
    if (!v.onnx.empty()) {
      b.kind = reports::VariantKind::kOnnx;
      std::string paths;
      for (const auto& [model, file] : v.onnx) paths += (paths.empty() ? "" : ", ") + model + "=" + file.string();
      b.onnx = reports::Artifact{v.name, paths, ""};
    } else if (!v.pipeline_variant.empty()) {
      b.kind = reports::VariantKind::kOnnx;
      b.onnx = reports::Artifact{v.name, "pipeline.json variants: " + v.pipeline_variant, ""};
    }
    set_model_options(driver, b);
    out.push_back(std::move(b));
  }
  // Every session of the run (all threads, all variants) takes packed and rounded weights from one
  // place: a worker thread's sessions never pack a weight another has packed.
  const auto constants = std::make_shared<SharedConstants>();
  for (BuiltVariant& b : out) b.options.constants = constants;
  return out;
}

namespace {

RunObservation make_observation(const RunSpec& spec, const RunDriver& driver, const std::vector<BuiltVariant>& variants,
                                std::size_t reference) {
  RunObservation obs;
  obs.reference = reference;
  obs.local_error = spec.observe.local_error;
  std::vector<LayerSpace::Model> models;
  for (const auto& m : driver.models()) {
    if (!spec.observe.models.empty() &&
        std::find(spec.observe.models.begin(), spec.observe.models.end(), m) == spec.observe.models.end())
      continue;
    models.push_back({m, variants[reference].graphs.at(m).get(), m == driver.description().stepped_model, 0});
  }
  for (const auto& want : spec.observe.models)
    if (std::none_of(models.begin(), models.end(), [&](const LayerSpace::Model& m) { return m.name == want; })) {
      std::string list;
      for (const auto& m : driver.models()) list += (list.empty() ? "" : ", ") + m;
      throw InputError(spec.source.string() + ": observe.models: the pipeline has no model '" + want +
                       "' (models: " + list + ")");
    }
  obs.space = std::make_shared<const LayerSpace>(std::move(models), int(driver.description().timesteps.size()));
  for (std::size_t v = 0; v < variants.size(); ++v) {
    ObservedVariant ov;
    ov.name = variants[v].spec.name;
    ov.reference = v == reference;
    ov.options = variants[v].options;
    ov.model_precision = variants[v].model_precision;
    for (std::size_t m = 0; m < obs.space->models().size(); ++m)
      ov.models.push_back(observe_model(*obs.space, m, *variants[v].graphs.at(obs.space->models()[m].name),
                                        obs.local_error && v != reference));
    obs.variants.push_back(std::move(ov));
  }
  obs.count_readers();
  return obs;
}

void merge_series(std::vector<StepSeries>& into, const std::vector<StepSeries>& from) {
  if (into.empty()) {
    into = from;
    return;
  }
  for (std::size_t k = 0; k < from.size() && k < into.size(); ++k)
    for (std::size_t s = 0; s < from[k].steps.size() && s < into[k].steps.size(); ++s)
      into[k].steps[s].merge(from[k].steps[s]);
}

}  // namespace

RunResult start_run(const RunSpec& spec, const RunDriver& driver, std::vector<BuiltVariant> variants,
                    const EvaluatorOptions& options) {
  RunResult result;
  result.reference = spec.reference_index();
  result.variants = std::move(variants);
  const std::size_t nvar = result.variants.size();
  if (spec.observe.layers) result.observation = make_observation(spec, driver, result.variants, result.reference);
  if (spec.observe.full_tensors && spec.observe.layers && !options.out_dir.empty()) {
    const fs::path root = options.out_dir / "tensors";
    // Node names that sanitise alike ("a/b", "a:b") get distinct files: one FileNamer per folder;
    // index.json says which name went to which file.
    struct TensorFiles {
      std::mutex mutex;
      std::map<fs::path, base::FileNamer> by_dir;
      std::map<std::string, nlohmann::json> index;  // by file, relative to tensors/
      bool changed = false;
    };
    auto files = std::make_shared<TensorFiles>();
    // A resumed run keeps the entries of the units it reuses (their files stay where they are).
    if (const fs::path old = root / kTensorIndexFile; base::describe_non_regular(old).empty()) {
      try {
        for (const auto& e : nlohmann::json::parse(base::read_regular_file_text(old)).at("tensors"))
          files->index[e.at("file").get<std::string>()] = e;
      } catch (const std::exception&) {
        files->index.clear();  // unreadable: rewritten from this run's tensors
      }
    }
    result.observation.full_tensors = [root, files](const std::string& variant, const ModelCall& call, const Node& node,
                                                    const Tensor& value) {
      const std::string model =
          call.step >= 0 ? fmt::format("{}_step{:03d}", call.model, call.step) : std::string(call.model);
      const fs::path rel = fs::path(base::file_name_for(std::string(call.context))) / base::file_name_for(variant) /
                           base::file_name_for(model);
      std::string stem;
      {
        std::lock_guard<std::mutex> lock(files->mutex);
        stem = files->by_dir[rel].stem(node.name);
      }
      fs::create_directories(root / rel);
      const std::string file = (rel / (stem + ".npy")).generic_string();
      datasets::write_npy(root / file, value);
      nlohmann::json entry = {{"node", node.name},
                              {"tensor", node.outputs.empty() ? std::string() : node.outputs[0]},
                              {"file", file},
                              {"shape", value.shape()},
                              {"dtype", std::string(dtype_name(value.dtype()))},
                              {"sample", std::string(call.context)},
                              {"variant", variant},
                              {"model", std::string(call.model)},
                              {"step", call.step >= 0 ? nlohmann::json(call.step) : nlohmann::json(nullptr)}};
      std::lock_guard<std::mutex> lock(files->mutex);
      files->index[file] = std::move(entry);
      files->changed = true;
    };
    result.write_tensor_index = [root, files] {
      std::lock_guard<std::mutex> lock(files->mutex);
      if (!files->changed) return;
      nlohmann::json all = nlohmann::json::array();
      for (const auto& [file, entry] : files->index) all.push_back(entry);
      base::write_file_atomic(root / kTensorIndexFile,
                              reports::dump_json_utf8_safe(nlohmann::json{{"tensors", all}}, 1) + "\n");
      files->changed = false;
    };
  }
  result.layers.reserve(nvar);
  for (std::size_t v = 0; v < nvar; ++v) result.layers.emplace_back(result.observation.space);
  result.first_nonfinite.resize(nvar);
  result.series.resize(nvar);
  result.units.resize(driver.units());
  result.done.assign(driver.units(), 0);
  return result;
}

void merge_unit(RunResult& result, std::size_t i, UnitOutcome&& u, UnitObservation* recycle) {
  if (i >= result.units.size())
    throw InputError(fmt::format("unit {} is not one of this run's {}", i, result.units.size()));
  if (result.done[i])
    throw InputError(fmt::format("unit {} ({}) is there twice", i, u.samples.empty() ? "" : u.samples[0].id));
  const std::size_t nvar = result.variants.size();
  for (std::size_t v = 0; v < nvar && v < u.layers.calls.size(); ++v) {
    u.layers.calls[v].merge_into(result.layers[v]);
    const auto& hit = u.layers.first_nonfinite[v];
    auto& first = result.first_nonfinite[v];
    if (hit && (!first || hit->unit < first->unit)) first = hit;
  }
  for (std::size_t v = 0; v < nvar && v < u.series.size(); ++v) merge_series(result.series[v], u.series[v]);
  if (recycle) *recycle = std::move(u.layers);  // cleared by the worker, outside the merge lock
  u.layers = UnitObservation{};
  u.series.clear();
  result.units[i] = std::move(u);
  result.done[i] = 1;
}

void run_units(const RunSpec& spec, const RunDriver& driver, RunResult& result, const EvaluatorOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::size_t> todo;
  if (options.units.empty()) {
    for (std::size_t i = 0; i < driver.units(); ++i) todo.push_back(i);
  } else {
    todo = options.units;
  }
  std::erase_if(todo, [&](std::size_t i) { return i < result.done.size() && result.done[i]; });
  const std::size_t n = todo.size();
  int concurrency = options.workers > 0 ? options.workers : tbb::this_task_arena::max_concurrency();
  // On a device every kernel runs under its backend's lock, one at a time. Large models keep it
  // busy: more units at once only hold more activations in its memory, and two overlap one unit's
  // host work with the other's device work. Small ones leave it waiting on the host (launches,
  // synchronisations, observers), which more workers share out: tiny-sd's default evaluation on an
  // H100 took 14.6 s with 16 workers, 55.8 s with 2.
  if (options.workers <= 0 && default_backend()->memory() && !result.variants.empty()) {
    std::size_t weights = 0;
    for (const auto& [model, graph] : result.variants[result.reference].graphs)
      for (const auto& [name, t] : graph->initializers) weights += t.nbytes();
    // An observed unit holds more than its activations (the capture holds the reference's values
    // until the variants and local runs have read them): the full-size SD-1.5-like UNet's observed
    // call peaked at 64 GB of an H100's 80 while its reference retained every value for local
    // error, and two units at once ran out of memory. Not yet measured since txt2img's local error
    // runs node by node (d09a402): one unit at a time until it is.
    if (weights >= kDeviceLargeModelBytes) concurrency = std::min(concurrency, spec.observe.layers ? 1 : kDeviceWorkers);
  }
  const std::size_t workers = std::max<std::size_t>(1, std::min<std::size_t>(n, std::size_t(concurrency)));

  base::Progress progress(
      options.progress_label, n * std::size_t(driver.ticks_per_unit()), options.progress,
      {"units", std::size_t(std::max(driver.ticks_per_unit(), 1)), fmt::format("{} variants", result.variants.size())});
  std::atomic<std::size_t> next{0};
  std::mutex merge_mu;
  const double elapsed_at_start = result.elapsed_s;
  std::atomic<bool> failed{false};
  auto work = [&](std::size_t) {
    std::unique_ptr<DriverThread> thread = driver.make_thread(result.variants);
    LocalSessions local;
    Capture capture;
    ObservedNodes nodes;
    UnitContext ctx;
    ctx.variants = &result.variants;
    ctx.reference = result.reference;
    ctx.observation = spec.observe.layers ? &result.observation : nullptr;
    ctx.local = &local;
    ctx.capture = &capture;
    ctx.nodes = &nodes;
    ctx.teacher_forced = spec.observe.teacher_forced;
    ctx.interleave = options.interleave;
    ctx.lockstep_window = options.lockstep_window;
    ctx.out_dir = options.out_dir;
    ctx.tick = [&progress] { progress.tick(); };
    // This worker's layer cells, cleared and reused unit after unit.
    UnitObservation layers;
    if (ctx.observation) layers = result.observation.make_unit();
    for (std::size_t k = next++; k < n && !failed && !(options.stop && options.stop()); k = next++) {
      const std::size_t i = todo[k];
      UnitOutcome u;
      u.layers = std::move(layers);
      u.layers.clear();
      try {
        tbb::this_task_arena::isolate([&] { driver.run_unit(i, *thread, ctx, u); });
      } catch (...) {
        failed = true;  // the other workers stop after their current unit
        throw;
      }
      std::lock_guard lock(merge_mu);
      // No malloc_trim here: what a unit frees, the next one allocates again, and pages given back
      // were faulted in (and cleared) again: 7% of an observed 2-thread run's CPU, for ~1% of
      // peak memory.
      merge_unit(result, i, std::move(u), &layers);
      if (result.write_tensor_index) result.write_tensor_index();
      // Saved after every unit, so a run killed at any point loses at most the units in flight.
      if (options.checkpoint) {
        result.elapsed_s =
            elapsed_at_start + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        options.checkpoint(result);
      }
    }
  };
  tbb::parallel_for(std::size_t(0), workers, work, tbb::simple_partitioner());
  progress.finish();
  if (result.write_tensor_index) result.write_tensor_index();
  result.elapsed_s = elapsed_at_start + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (options.checkpoint) options.checkpoint(result);
}

RunResult evaluate(const RunSpec& spec, const RunDriver& driver, std::vector<BuiltVariant> variants,
                   const EvaluatorOptions& options) {
  RunResult result = start_run(spec, driver, std::move(variants), options);
  run_units(spec, driver, result, options);
  return result;
}

}  // namespace qeval::eval
