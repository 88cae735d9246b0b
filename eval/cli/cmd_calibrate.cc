// qeval calibrate: a recipe's calibration on a calibration set, scales.json and the Q/DQ export.
#include <fmt/format.h>

#include "base/exit_codes.h"
#include "eval/cli/command.h"
#include "eval/quant/calibrate_run.h"
#include "kernels/error.h"

namespace qeval::cli {
namespace {

struct CalibrateArgs {
  std::string recipe, model, data, pipeline, prompts, out = "qeval-calibrate", cache;
  bool no_cache = false;
  std::size_t limit = 0;
  int steps = 0;
};

int run_calibrate(const CalibrateArgs& a) {
  namespace q = eval::quant;
  q::CalibrateOptions o;
  o.recipe = a.recipe;
  o.model = a.model;
  o.data = a.data;
  o.pipeline = a.pipeline;
  o.prompts = a.prompts;
  o.limit = a.limit;
  o.steps = a.steps;
  o.progress = true;
  o.out = a.out;
  if (!a.no_cache) o.cache_dir = a.cache.empty() ? q::default_calibration_cache() : std::filesystem::path(a.cache);
  const q::CalibrateSummary s = q::run_calibrate(o);
  fmt::print("qeval calibrate: recipe '{}' ({}, level {}, fingerprint {})", s.recipe.name,
             q::format_name(s.recipe.format), q::level_string(s.recipe.level), s.recipe.fingerprint());
  if (s.models.size() == 1 && s.models[0].name.empty()) fmt::print(" on {}", s.models[0].model.string());
  fmt::print("\n");
  for (const q::CalibratedModel& m : s.models) {
    std::string indent = "  ";
    if (!m.name.empty()) {
      fmt::print("  {} ({}):\n", m.name, m.model.string());
      indent = "    ";
    }
    std::string cats;
    for (std::size_t c = 1; c < q::kNodeCategoryCount; ++c)
      if (m.selection.selected[c])
        cats += fmt::format("{}{} {}", cats.empty() ? "" : ", ", m.selection.selected[c],
                            q::category_name(static_cast<q::NodeCategory>(c)));
    fmt::print("{}selected {} nodes ({}); {} removed by default exclusions, {} by 'exclude', {} added by 'include'\n",
               indent, m.selection.targets.size(), cats, m.selection.excluded_by_default,
               m.selection.excluded_by_pattern, m.selection.included_by_pattern);
    if (m.cache_hit) fmt::print("{}calibration: reused from the cache ({})\n", indent, m.data_description);
    else
      fmt::print("{}calibration: {} over {} ({} model runs, {} steps) in {:.2f} s\n", indent, m.calibration.method,
                 m.data_description, m.calibration.calls, m.calibration.total_steps, m.calibration.elapsed_s);
    fmt::print("{}quantized {} activations and {} weights; {} layers smoothed; opset {} -> {}", indent,
               m.quantized_activations, m.quantized_weights, m.smoothed_layers, m.opset_from, m.opset_to);
    if (m.opset_rewritten_nodes) fmt::print(" ({} nodes rewritten for the new opset)", m.opset_rewritten_nodes);
    fmt::print("\n");
    fmt::print("{}wrote {} and {}\n", indent, (m.out / "scales.json").string(), (m.out / "quantized.onnx").string());
  }
  for (const std::string& name : s.left_fp32)
    fmt::print("  {}: the recipe selects no node of it; left FP32, nothing written\n", name);
  return base::kExitPass;
}

Runner add_calibrate(CLI::App& app) {
  auto a = std::make_shared<CalibrateArgs>();
  auto* cmd =
      app.add_subcommand("calibrate",
                         "Calibrate a quantization recipe (docs/recipes.md) on a calibration set and export the\n"
                         "quantized model: scales.json (amax per quantized tensor, per step where collected; weight\n"
                         "amax per channel; SmoothQuant scales) and quantized.onnx (Q/DQ in TensorRT's convention,\n"
                         "INT8 at opset 13 or later, FP8 at 19; models at opset 7-12 are upgraded to that first).\n"
                         "Results are cached by recipe + model + data fingerprints.\n"
                         "A segmentation pipeline's image encoder and mask decoder are calibrated on point prompts as\n"
                         "the pipeline runs them (encoder per image, decoder per prompt); each goes to OUT/<model>/.\n"
                         "Exit: 0 written, 2 bad recipe, model, data or a recipe that selects nothing.");
  cmd->add_option("--recipe", a->recipe, "recipe JSON (recipes/*.json)")->required();
  cmd->add_option("--model", a->model, "the FP32 .onnx model to quantize");
  cmd->add_option("--data", a->data,
                  "calibration samples: a folder of sample folders each holding <input>.npy "
                  "(the `qeval infer --inputs` layout), or one such folder");
  cmd->add_option("--pipeline", a->pipeline,
                  "pipeline folder or pipeline.json: txt2img (its UNet, per denoising step) or segmentation "
                  "(image encoder and mask decoder)");
  cmd->add_option("--prompts", a->prompts,
                  "calibration prompts for --pipeline: text prompts one a line, or a point-prompt set for "
                  "segmentation (default: pipeline.json's calibration set)");
  auto* count =
      cmd->add_option("--count", a->limit, "use only the first N calibration prompts of --pipeline (default all)")
          ->check(whole_number_at_least(1));
  add_old_spelling(cmd, count, "--limit", a->limit);
  cmd->add_option("--steps", a->steps, "denoising steps (default: the pipeline's)");
  cmd->add_option("--out", a->out, "output folder (default qeval-calibrate)");
  cmd->add_option("--cache", a->cache, "calibration cache folder (default $XDG_CACHE_HOME/qeval/calibration)");
  cmd->add_flag("--no-cache", a->no_cache, "always calibrate, store nothing");
  return [a](const Context&) { return run_calibrate(*a); };
}

const bool kRegistered = register_command(40, add_calibrate);

}  // namespace
}  // namespace qeval::cli
