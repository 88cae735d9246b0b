// The pipeline kinds `qeval run` knows (txt2img, segmentation, single model, ...): what the run
// config may say for each, how a config's "pipeline" is recognised, and how its driver is loaded.
// run, merge, triage and compare-recipes find a kind here by name, never by a switch: a new kind is
// its driver file (eval/run/<kind>_driver.cc, which defines its PipelineKind) plus one registration
// (pipeline_kind.cc's list, or register_pipeline_kind from anywhere before the config is read).
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace qeval::eval {

class RunDriver;
struct RunSpec;

struct PipelineKind {
  std::string name;  // "txt2img": RunSpec::kind, report.json's config.pipeline, messages
  std::string what;  // how messages name such a pipeline: "a txt2img pipeline", "a single ONNX model"
  // The models, in call order: what a variant's "onnx": {model: file} may name (RunDriver's
  // graphs, the layer space and the report list them in this order).
  std::vector<std::string> models;
  std::string main_model;  // what a variant's "onnx": FILE replaces ("unet", "image_encoder", "model")
  // Which run-config keys apply (docs/run-config.md); the others are an InputError naming the key.
  bool denoising = false;          // seeds, steps, guidance_scale, scheduler, negative_prompt,
                                   // observe.teacher_forced (also in the report and the run key)
  bool judged_outputs = false;     // "outputs" (per-output metrics)
  bool pipeline_variants = false;  // a variant's "pipeline_variant" (pipeline.json "variants")
  std::string inputs_required;     // non-empty: "inputs" is required, and this is the message without it
  // The variants the pipeline itself lists (pipeline.json "variants", an export folder's quantized
  // UNets), for a run config without "variants": the reference and one variant per name. Null or
  // empty: "variants" is required.
  std::function<std::vector<std::string>(const RunSpec& spec)> listed_variants;
  // Whether the config's "pipeline" (an existing file or folder) is of this kind. Kinds are asked in
  // registration order; a claim may throw an InputError for a file of its format that is broken.
  std::function<bool(const std::filesystem::path& pipeline)> claims;
  // Loads the models and the input set (InputError for what the spec names but cannot be read).
  std::function<std::unique_ptr<RunDriver>(const RunSpec& spec)> load;
};

// Adds a kind after the built-in ones (std::logic_error for a name already registered). Returns
// true, so that a file can register a kind with one namespace-scope line:
//   const bool kRegistered = qeval::eval::register_pipeline_kind(my_kind());
bool register_pipeline_kind(PipelineKind kind);

// Every kind: the built-in ones first, in the order pipeline_kind.cc lists them, then registered.
std::vector<const PipelineKind*> pipeline_kinds();

// The kind named `name`; std::logic_error when none is (RunSpec::kind comes from a config reader).
const PipelineKind& pipeline_kind(std::string_view name);

// The first kind that claims `pipeline`; nullptr when none does.
const PipelineKind* pipeline_kind_of(const std::filesystem::path& pipeline);

// For kinds that run a pipeline.json (docs/pipelines.md): whether `pipeline` is a folder holding one
// or a .json file, and its "task" is `task` (InputError for a broken pipeline.json).
bool pipeline_json_has_task(const std::filesystem::path& pipeline, std::string_view task);

// "a txt2img pipeline" (or "a txt2img pipeline or an img2img pipeline"): the kinds for which `flag`
// is set, for messages about a key that applies only to them.
std::string pipeline_kinds_with(bool PipelineKind::*flag);

}  // namespace qeval::eval
