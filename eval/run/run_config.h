// The configuration of `qeval run` (docs/run-config.md): which pipeline, which variants against
// which reference, over which prompts and seeds, what to observe, which gate. Read from a JSON
// file through JsonConfig, or the shipped default (tiny-sd).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eval/exec/session.h"
#include "eval/pipelines/pipeline_config.h"

namespace qeval::eval {

inline constexpr const char* kRunConfigDoc = "docs/run-config.md";

// One variant: the reference's graphs in another precision, quantized by a recipe, or other
// ONNX files (an export next to the reference's, e.g. a Q/DQ model from ModelOpt).
struct VariantSpec {
  std::string name;
  Precision precision = Precision::kFp32;  // of everything a recipe or export leaves in float
  std::filesystem::path recipe;            // a recipe file (docs/recipes.md); empty when none
  // Separate exports: model name ("unet", "image_encoder", ...; "model" for a single model) -> file.
  std::map<std::string, std::filesystem::path> onnx;
  std::string pipeline_variant;  // a name under pipeline.json's "variants"; empty when none
  // "model_precision": models that run in another precision than `precision` (e.g. an SDXL VAE
  // asked for in FP16, which force_upcast would otherwise run in FP32).
  std::map<std::string, Precision> model_precision;
};

// How a single model's output is judged (docs/run-config.md, "outputs").
enum class OutputKind {
  kTensor,  // SQNR dB, cosine, relative L2, max-abs of the values
  kMask,    // a mask map (logits or probabilities): mask IoU, boundary F, flipped share at a threshold
  kMatte,   // an alpha matte on [0, 1]: as kMask, threshold 0.5 unless given
  kImage,   // an image [C, H, W] or [1, C, H, W] on a value range: PSNR, SSIM
};
std::string_view output_kind_name(OutputKind k);  // "tensor" | "mask" | "matte" | "image"

struct OutputSpec {
  std::string name;  // the graph output
  OutputKind kind = OutputKind::kTensor;
  float threshold = 0.5f;                 // mask / matte: foreground where value > threshold
  double range_lo = 0.0, range_hi = 1.0;  // image: values are clamped to [lo, hi], peak = hi - lo
};

// A per-output metric key: "<output>.<metric>" ("sigmoid_0.tmp_0.mask_iou"). The output's name is
// kept as written (it may hold '/', ':' and '.'): keys are matched whole, never split.
std::string output_metric_key(const std::string& output, std::string_view metric);

struct ObserveSpec {
  bool layers = true;               // per-layer statistics and error
  std::vector<std::string> models;  // which models' layers; empty = all
  bool local_error = true;          // each node re-run on the reference's inputs per variant
  bool teacher_forced = true;       // txt2img: each variant's UNet also run on the reference latent
  bool full_tensors = false;        // also write every observed node output (.npy) under --out
  int histograms = 8;               // activation histograms kept for the N worst layers per variant
};

struct CalibrationSpec {
  std::filesystem::path prompts;  // default: the pipeline's calibration set
  int count = 0;                  // first N (0 = all)
  int steps = 0;                  // txt2img: denoising steps (0 = the run's)
  std::filesystem::path cache;    // calibration cache folder (default: <out>/calibration)
};

struct RunSpec {
  std::filesystem::path source;  // the config file; empty for the shipped default
  std::filesystem::path pipeline;
  std::string kind = "txt2img";  // the pipeline's kind: a PipelineKind's name (eval/run/pipeline_kind.h)

  // Prompts (txt2img: a text prompt set; segmentation: a point-prompt set) or, for a single model,
  // a folder of input samples. Default: the pipeline's evaluation set.
  std::filesystem::path inputs;
  int first = 0;                           // skip this many prompts
  int count = 0;                           // then take this many (0 = all)
  std::vector<std::uint64_t> seeds = {0};  // txt2img: each prompt runs once per seed

  // txt2img overrides of pipeline.json's defaults.
  std::optional<int> steps;
  std::optional<double> guidance_scale;
  std::optional<SchedulerType> scheduler;
  std::optional<std::string> negative_prompt;

  std::vector<VariantSpec> variants;
  std::string reference;  // a variant's name (default: the first)
  ObserveSpec observe;
  CalibrationSpec calibration;
  std::filesystem::path gate;  // empty: no gate file (only errors fail)
  bool save_images = true;     // outputs written under <out>/images
  // Single model: the outputs judged, each with its metrics (sorted by name); empty = every float
  // output pooled into one set of output_* metrics.
  std::vector<OutputSpec> outputs;

  const VariantSpec& reference_variant() const;
  std::size_t reference_index() const;
};

// Reads and validates a config file; paths are resolved against its folder. InputError names the
// file and key: unknown keys (listing the valid ones), wrong types, duplicate or missing variant
// names, an unknown reference, a variant with both a recipe and an export, a missing file.
RunSpec read_run_config(const std::filesystem::path& path);
RunSpec parse_run_config(const std::string& json_text, const std::filesystem::path& source);

// A run config without "variants" names the pipeline's own (PipelineKind::listed_variants):
// this reference, in FP32 (the pipeline's models as written), then one variant per listed name.
inline constexpr std::string_view kListedReference = "reference";
// `qeval run --pipeline DIR [--prompts FILE]`: the config {"pipeline": DIR, "prompts": FILE}, so the
// pipeline's listed variants against its reference, every prompt, seed 0, no gate file.
RunSpec pipeline_run_config(const std::filesystem::path& pipeline, const std::filesystem::path& prompts);

// The shipped default: tiny-sd, fp32 reference, fp16 (and the shipped int8/fp8 recipes when
// present), the first 8 prompts of its evaluation set, seed 0.
RunSpec default_run_config();

// Where the shipped models, prompts and recipes are: $QEVAL_DATA_DIR, else the current folder when
// it holds models/tiny-sd, else the source tree qeval was built from.
std::filesystem::path shipped_data_dir();

}  // namespace qeval::eval
