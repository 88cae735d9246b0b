// Calibration of a segmentation pipeline's image encoder and mask decoder through the pipeline.
#include "eval/quant/segmentation_calibration.h"

#include <fmt/format.h>

#include <map>

#include "base/input_file.h"
#include "base/progress.h"
#include "kernels/error.h"

namespace qeval::eval::quant {

namespace {

constexpr const char* kEncoder = "image_encoder";
constexpr const char* kDecoder = "mask_decoder";

}  // namespace

PointPromptSet read_point_prompts_limited(const std::filesystem::path& path, std::size_t limit) {
  PointPromptSet set = read_point_prompts(path);
  if (limit != 0 && set.prompts.size() > limit) set.prompts.resize(limit);
  return set;
}

SegmentationCalibrationSet::SegmentationCalibrationSet(const SegmentationPipeline& pipeline, PointPromptSet prompts,
                                                       std::string model, bool progress)
    : pipeline_(pipeline), set_(std::move(prompts)), model_(std::move(model)), progress_(progress) {
  if (model_ != kEncoder && model_ != kDecoder)
    throw std::logic_error("SegmentationCalibrationSet: unknown model '" + model_ + "'");
  std::map<std::string, std::size_t> image_of_key;
  for (std::size_t i = 0; i < set_.prompts.size(); ++i) {
    auto [it, added] = image_of_key.emplace(set_.prompts[i].image_key(), images_.size());
    if (added) images_.emplace_back();
    images_[it->second].push_back(i);
  }
}

std::string SegmentationCalibrationSet::fingerprint() const {
  const SegmentationConfig& c = pipeline_.config();
  std::string s =
      fmt::format("segmentation/image={}x{}x{}/resize={}/padding_point={}/image_encoder={}", c.channels, c.height,
                  c.width, int(c.resize), int(c.append_padding_point), graph_fingerprint(pipeline_.image_encoder()));
  for (float v : c.pixel_mean) s += fmt::format("/m{}", v);
  for (float v : c.pixel_std) s += fmt::format("/s{}", v);
  std::uint64_t h = fnv1a64(s.data(), s.size());
  for (const PointPrompt& p : set_.prompts) {
    std::string line = fmt::format("\n{}", p.image_key());
    for (const auto& pt : p.points) line += fmt::format(" {},{},{}", pt.x, pt.y, pt.label);
    h = fnv1a64(line.data(), line.size(), h);
    if (!p.image.empty()) {  // the file's bytes, not only its name
      const std::vector<std::uint8_t> bytes = base::read_regular_file(p.image);
      h = fnv1a64(bytes.data(), bytes.size(), h);
    }
  }
  return hex64(h);
}

std::string SegmentationCalibrationSet::describe() const {
  return fmt::format("{} point prompts on {} images", set_.prompts.size(), images_.size());
}

int SegmentationCalibrationSet::run(const Graph& reference, RangeCollector& collector) {
  const bool encoder_observed = model_ == kEncoder;
  Session observed(reference);
  std::optional<Session> encoder;  // unobserved FP32 encoder feeding the observed decoder
  if (!encoder_observed) encoder.emplace(pipeline_.image_encoder());
  Session& encoder_session = encoder_observed ? observed : *encoder;
  ModelCallObserverFn observer([&](const ModelCall& call) -> Observer* {
    if (call.model != model_) return nullptr;
    collector.set_step(0);
    return &collector;
  });
  base::Progress progress("calibrating " + (recipe_name.empty() ? model_ : recipe_name + " (" + model_ + ")"),
                          images_.size(), progress_, {"images"});
  for (const auto& prompts : images_) {
    const PointPrompt& first = set_.prompts[prompts[0]];
    const PromptInputs inputs = load_prompt_inputs(first, set_.source, pipeline_.config().channels);
    const ImageEmbedding embedding = pipeline_.encode(encoder_session, inputs.planes, &observer, first.image_key());
    if (!encoder_observed)
      for (std::size_t k = 0; k < prompts.size(); ++k) {
        const PointPrompt& p = set_.prompts[prompts[k]];
        pipeline_.decode(observed, embedding, p.points, &observer, p.id, int(k));
      }
    progress.tick();
  }
  progress.finish();
  return 1;
}

std::vector<SegmentationModelRecipe> calibrate_segmentation(const SegmentationPipeline& pipeline, const Recipe& recipe,
                                                            const PointPromptSet& prompts,
                                                            const std::optional<std::filesystem::path>& cache_dir,
                                                            bool progress) {
  std::vector<SegmentationModelRecipe> out;
  for (const std::string model : {kEncoder, kDecoder}) {
    const Graph& graph = model == kEncoder ? pipeline.image_encoder() : pipeline.mask_decoder();
    SegmentationModelRecipe r;
    r.model = model;
    r.selection = select_nodes(graph, recipe, /*allow_empty=*/true);
    if (r.selection.targets.empty()) continue;  // this model stays FP32
    SegmentationCalibrationSet set(pipeline, prompts, model, progress);
    r.data_fingerprint = set.fingerprint();
    r.data_description = set.describe();
    r.calibration = cache_dir ? calibrate_cached(graph, r.selection, recipe, set, *cache_dir, &r.cache_hit)
                              : calibrate(graph, r.selection, recipe, set);
    r.applied = apply_recipe(graph, r.selection, recipe, r.calibration);
    out.push_back(std::move(r));
  }
  if (out.empty())
    throw InputError(recipe.source + ": recipe '" + recipe.name + "' selects no node of " +
                     pipeline.config().source.string() + "'s image encoder or mask decoder (level " +
                     level_string(recipe.level) + ")");
  return out;
}

}  // namespace qeval::eval::quant
