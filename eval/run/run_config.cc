// `qeval run` configuration: reader, validation and the shipped default.
#include "eval/run/run_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "base/input_file.h"
#include "base/json_config.h"
#include "eval/run/pipeline_kind.h"
#include "kernels/error.h"
#include "qeval/version.h"

namespace qeval::eval {

namespace fs = std::filesystem;

std::string_view output_kind_name(OutputKind k) {
  switch (k) {
    case OutputKind::kTensor: return "tensor";
    case OutputKind::kMask: return "mask";
    case OutputKind::kMatte: return "matte";
    case OutputKind::kImage: return "image";
  }
  return "?";
}

std::string output_metric_key(const std::string& output, std::string_view metric) {
  return output + "." + std::string(metric);
}

const VariantSpec& RunSpec::reference_variant() const { return variants.at(reference_index()); }

std::size_t RunSpec::reference_index() const {
  for (std::size_t i = 0; i < variants.size(); ++i)
    if (variants[i].name == reference) return i;
  throw InputError(source.string() + ": the reference variant '" + reference + "' is not among the variants");
}

namespace {

Precision parse_precision(const base::JsonConfig& c, const std::string& key) {
  return *precision_from_name(c.get_choice(key, precision_names(), std::string("fp32")));
}

base::JsonConfig child_of(const base::JsonConfig& c, const std::string& key) {
  return base::JsonConfig(c.value().at(key), c.source(), c.path().empty() ? key : c.path() + "." + key, kRunConfigDoc);
}

void require_exists(const base::JsonConfig& c, const std::string& key, const fs::path& p) {
  if (!fs::exists(p)) child_of(c, key).fail("no such file or folder: " + p.string());
}

int get_count(const base::JsonConfig& c, const std::string& key, int fallback, int min) {
  const long long v = c.get_int(key, fallback);
  if (v < min || v > 1'000'000)
    child_of(c, key).fail(fmt::format("must be an integer in [{}, 1000000], got {}", min, v));
  return int(v);
}

VariantSpec parse_variant(const base::JsonConfig& v, const PipelineKind& kind) {
  v.allow_keys({"name", "precision", "model_precision", "recipe", "onnx", "pipeline_variant"});
  VariantSpec s;
  s.name = v.get_string("name");
  if (s.name.empty() || s.name.find_first_of("/\\ \t\n") != std::string::npos)
    child_of(v, "name").fail("a variant name must be non-empty, without spaces or slashes (it names files)");
  s.precision = parse_precision(v, "precision");
  if (v.has("recipe")) {
    s.recipe = v.get_path("recipe");
    require_exists(v, "recipe", s.recipe);
  }
  if (v.has("onnx")) {
    const auto& o = v.value().at("onnx");
    if (o.is_string()) {
      s.onnx[kind.main_model] = v.get_path("onnx");
    } else if (o.is_object()) {
      const base::JsonConfig oc = child_of(v, "onnx");
      oc.allow_keys(kind.models);
      for (const auto& m : kind.models)
        if (oc.has(m)) s.onnx[m] = oc.get_path(m);
      if (s.onnx.empty()) oc.fail("names no model");
    } else {
      child_of(v, "onnx").fail(
          "must be a file name (the UNet / image encoder / single model) or an object "
          "{model name: file}");
    }
    for (const auto& [m, p] : s.onnx)
      if (!fs::is_regular_file(p)) child_of(v, "onnx").fail("no such file: " + p.string() + " (" + m + ")");
  }
  if (v.has("pipeline_variant")) s.pipeline_variant = v.get_string("pipeline_variant");
  if (v.has("model_precision")) {
    const base::JsonConfig mp = child_of(v, "model_precision");
    if (!mp.value().is_object()) mp.fail("must be an object {model name: precision}");
    mp.allow_keys(kind.models);
    for (const auto& m : kind.models)
      if (mp.has(m)) s.model_precision[m] = parse_precision(mp, m);
  }
  const int kinds = int(!s.recipe.empty()) + int(!s.onnx.empty()) + int(!s.pipeline_variant.empty());
  if (kinds > 1) v.fail("a variant takes at most one of 'recipe', 'onnx' and 'pipeline_variant'");
  if (!s.pipeline_variant.empty() && !kind.pipeline_variants)
    child_of(v, "pipeline_variant").fail(kind.what + " has no pipeline.json variants; use 'onnx'");
  return s;
}

const PipelineKind& detect_kind(const base::JsonConfig& root, const fs::path& pipeline) {
  if (!fs::exists(pipeline)) child_of(root, "pipeline").fail("no such file or folder: " + pipeline.string());
  const PipelineKind* kind = pipeline_kind_of(pipeline);
  if (!kind && fs::is_directory(pipeline))
    child_of(root, "pipeline")
        .fail((pipeline / "pipeline.json").string() +
              ": no such file (a pipeline folder holds a pipeline.json; docs/pipelines.md)");
  if (!kind) {
    std::string kinds;
    for (const PipelineKind* k : pipeline_kinds()) kinds += (kinds.empty() ? "" : ", ") + k->name;
    child_of(root, "pipeline")
        .fail(pipeline.string() + " is no pipeline qeval runs (kinds: " + kinds +
              "; a pipeline folder or its pipeline.json, or an .onnx file)");
  }
  return *kind;
}

OutputSpec parse_output(const base::JsonConfig& o, const std::string& name) {
  o.allow_keys({"kind", "threshold", "range"});
  OutputSpec s;
  s.name = name;
  if (!o.has("kind")) o.fail("missing 'kind' (tensor, mask, matte or image)");
  const std::string kind = o.get_choice("kind", {"tensor", "mask", "matte", "image"});
  s.kind = kind == "tensor"  ? OutputKind::kTensor
           : kind == "mask"  ? OutputKind::kMask
           : kind == "matte" ? OutputKind::kMatte
                             : OutputKind::kImage;
  const bool masklike = s.kind == OutputKind::kMask || s.kind == OutputKind::kMatte;
  if (o.has("threshold")) {
    if (!masklike) child_of(o, "threshold").fail("only applies to kind 'mask' or 'matte', not '" + kind + "'");
    const double t = o.get_number("threshold");
    if (!std::isfinite(t)) child_of(o, "threshold").fail("must be a finite number");
    s.threshold = float(t);
  } else if (s.kind == OutputKind::kMask) {
    // Logits (threshold 0) and probabilities (0.5) both occur: no default can be right for both.
    o.fail(
        "kind 'mask' needs 'threshold' (foreground where value > threshold: 0 for logits, 0.5 for "
        "probabilities)");
  }
  if (o.has("range")) {
    if (s.kind != OutputKind::kImage) child_of(o, "range").fail("only applies to kind 'image', not '" + kind + "'");
    const auto r = o.get_numbers("range");
    if (r.size() != 2 || !std::isfinite(r[0]) || !std::isfinite(r[1]) || !(r[0] < r[1]))
      child_of(o, "range").fail("must be [lo, hi] with finite lo < hi (the image's value range)");
    s.range_lo = r[0], s.range_hi = r[1];
  } else if (s.kind == OutputKind::kImage) {
    o.fail("kind 'image' needs 'range': [lo, hi], the value range PSNR and SSIM are taken on (e.g. [0, 1], [0, 255])");
  }
  return s;
}

void check_variants(RunSpec& s, const base::JsonConfig& root) {
  if (s.variants.size() < 2) root.fail("'variants' needs at least two variants: a reference and one to compare");
  std::set<std::string> names;
  for (const auto& v : s.variants)
    if (!names.insert(v.name).second) root.fail("two variants are named '" + v.name + "'");
  if (s.reference.empty()) s.reference = s.variants.front().name;
  if (!names.count(s.reference)) {
    std::string list;
    for (const auto& v : s.variants) list += (list.empty() ? "" : ", ") + v.name;
    child_of(root, "reference").fail("no variant is named '" + s.reference + "' (variants: " + list + ")");
  }
}

}  // namespace

RunSpec parse_run_config(const std::string& text, const fs::path& source) {
  const base::JsonConfig root = base::JsonConfig::parse(text, source.string(), kRunConfigDoc);
  root.allow_keys({"description", "pipeline", "inputs", "prompts", "first", "count", "seeds", "steps", "guidance_scale",
                   "scheduler", "negative_prompt", "variants", "reference", "observe", "calibration", "gate",
                   "save_images", "outputs"});
  RunSpec s;
  s.source = source;
  s.pipeline = root.get_path("pipeline");
  const PipelineKind& kind = detect_kind(root, s.pipeline);
  s.kind = kind.name;

  for (const char* key : {"inputs", "prompts"}) {
    if (!root.has(key)) continue;
    if (!s.inputs.empty()) root.fail("give either 'inputs' or 'prompts', not both");
    s.inputs = root.get_path(key);
    require_exists(root, key, s.inputs);
  }
  if (!kind.inputs_required.empty() && s.inputs.empty()) root.fail(kind.inputs_required);
  s.first = get_count(root, "first", 0, 0);
  s.count = get_count(root, "count", 0, 0);
  if (root.has("seeds")) {
    const auto& v = root.value().at("seeds");
    if (!v.is_array() || v.empty()) child_of(root, "seeds").fail("must be a non-empty array of non-negative integers");
    s.seeds.clear();
    for (const auto& x : v) {
      if (!x.is_number_unsigned()) child_of(root, "seeds").fail("must hold non-negative integers, got " + x.dump());
      s.seeds.push_back(x.get<std::uint64_t>());
    }
    if (std::set<std::uint64_t>(s.seeds.begin(), s.seeds.end()).size() != s.seeds.size())
      child_of(root, "seeds").fail("holds a seed twice");
  }
  for (const char* key : {"steps", "guidance_scale", "scheduler", "negative_prompt"})
    if (root.has(key) && !kind.denoising)
      child_of(root, key).fail("only applies to " + pipeline_kinds_with(&PipelineKind::denoising) + "; this one is " +
                               kind.name);
  if (root.has("steps")) s.steps = get_count(root, "steps", 0, 1);
  if (root.has("guidance_scale")) {
    const double g = root.get_number("guidance_scale");
    if (!(g >= 0 && g <= 100)) child_of(root, "guidance_scale").fail("must be in [0, 100]");
    s.guidance_scale = g;
  }
  if (root.has("scheduler")) s.scheduler = parse_scheduler_type(root.get_choice("scheduler", {"ddim", "euler"}));
  if (root.has("negative_prompt")) s.negative_prompt = root.get_string("negative_prompt");

  if (root.has("variants")) {
    for (const auto& v : root.array_of_objects("variants")) s.variants.push_back(parse_variant(v, kind));
  } else {
    // The pipeline's own variants (an export folder's quantized UNet beside the FP16 one), each
    // against the pipeline's models as written.
    const std::vector<std::string> listed = kind.listed_variants ? kind.listed_variants(s) : std::vector<std::string>{};
    if (listed.empty())
      root.fail("missing required key 'variants' (" + s.pipeline.string() + " lists no variants of its own)");
    s.variants.push_back(VariantSpec{std::string(kListedReference), Precision::kFp32, {}, {}, {}, {}});
    for (const std::string& name : listed) {
      if (name == kListedReference)
        child_of(root, "pipeline").fail("lists a variant named '" + name + "', the reference's name; give 'variants'");
      s.variants.push_back(VariantSpec{name, Precision::kFp32, {}, {}, name, {}});
    }
  }
  s.reference = root.get_string("reference", "");
  check_variants(s, root);

  if (auto o = root.optional_object("observe")) {
    o->allow_keys({"layers", "models", "local_error", "teacher_forced", "full_tensors", "histograms"});
    s.observe.layers = o->get_bool("layers", true);
    s.observe.models = o->get_strings("models");
    s.observe.local_error = o->get_bool("local_error", s.observe.layers);
    s.observe.teacher_forced = o->get_bool("teacher_forced", true);
    s.observe.full_tensors = o->get_bool("full_tensors", false);
    s.observe.histograms = get_count(*o, "histograms", s.observe.histograms, 0);
    if (o->has("teacher_forced") && !kind.denoising)
      child_of(*o, "teacher_forced").fail("only applies to " + pipeline_kinds_with(&PipelineKind::denoising));
  }
  if (auto c = root.optional_object("calibration")) {
    c->allow_keys({"prompts", "count", "steps", "cache"});
    if (c->has("prompts")) {
      s.calibration.prompts = c->get_path("prompts");
      require_exists(*c, "prompts", s.calibration.prompts);
    }
    s.calibration.count = get_count(*c, "count", 0, 0);
    s.calibration.steps = get_count(*c, "steps", 0, 0);
    if (c->has("cache")) s.calibration.cache = c->get_path("cache");
  }
  if (root.has("gate")) {
    s.gate = root.get_path("gate");
    require_exists(root, "gate", s.gate);
  }
  s.save_images = root.get_bool("save_images", true);
  if (root.has("outputs")) {
    if (!kind.judged_outputs)
      child_of(root, "outputs")
          .fail("only applies to " + pipeline_kinds_with(&PipelineKind::judged_outputs) + "; this pipeline is " +
                kind.name);
    const auto o = root.optional_object("outputs");
    if (!o || o->value().empty())
      child_of(root, "outputs").fail("must be a non-empty object {output name: {\"kind\": ...}}");
    for (const auto& item : o->value().items()) {
      const std::string name = item.key();
      s.outputs.push_back(parse_output(o->object(name), name));
    }
  }
  return s;
}

RunSpec pipeline_run_config(const fs::path& pipeline, const fs::path& prompts) {
  nlohmann::json j = {{"pipeline", fs::absolute(pipeline).string()}};
  if (!prompts.empty()) j["prompts"] = fs::absolute(prompts).string();
  return parse_run_config(j.dump(), "--pipeline");
}

RunSpec read_run_config(const fs::path& path) {
  // Not std::ifstream: a FIFO given as --config blocked the run forever.
  return parse_run_config(base::read_regular_file_text(path), path);
}

fs::path shipped_data_dir() {
  if (const char* env = std::getenv("QEVAL_DATA_DIR"); env && *env) return env;
  if (fs::is_directory(fs::path("models") / "tiny-sd")) return fs::current_path();
  return QEVAL_DATA_DIR;
}

RunSpec default_run_config() {
  const fs::path data = shipped_data_dir();
  RunSpec s;
  s.pipeline = data / "models" / "tiny-sd";
  if (!fs::is_directory(s.pipeline))
    throw InputError("the shipped model " + s.pipeline.string() +
                     " is missing: run from qeval's folder, set QEVAL_DATA_DIR, or give --config");
  s.kind = "txt2img";
  s.count = 8;
  s.seeds = {0};
  VariantSpec fp32{"fp32", Precision::kFp32, {}, {}, {}, {}};
  VariantSpec fp16{"fp16", Precision::kFp16, {}, {}, {}, {}};
  s.variants = {fp32, fp16};
  // The shipped recipes, the rest of the network in FP16 (TensorRT's --int8/--fp8 with --fp16).
  for (const auto& [name, file] :
       {std::pair<std::string, std::string>{"int8-l3", "int8-level3.json"}, {"fp8-l4", "fp8-level4.json"}}) {
    const fs::path recipe = data / "recipes" / file;
    if (fs::is_regular_file(recipe)) s.variants.push_back(VariantSpec{name, Precision::kFp16, recipe, {}, {}, {}});
  }
  s.calibration.count = 32;           // of prompts/tiny_calib.txt, at the run's 20 steps (cached after the first run)
  s.gate = s.pipeline / "gate.json";  // the shipped release gate (docs/gate.md)
  s.reference = "fp32";
  return s;
}

}  // namespace qeval::eval
