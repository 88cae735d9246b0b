// Calibrating a segmentation pipeline's models: point prompts run through the FP32 pipeline as the
// evaluator runs them (the image encoder once per image, the mask decoder once per prompt on the
// FP32 embeddings), the range observers on one of the two models.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "eval/pipelines/point_prompts.h"
#include "eval/pipelines/segmentation.h"
#include "eval/quant/apply.h"
#include "eval/quant/calibrate.h"

namespace qeval::eval::quant {

class SegmentationCalibrationSet : public CalibrationSet {
 public:
  // `model`: "image_encoder" or "mask_decoder" (the one `run` observes). `progress` draws a
  // progress line on stderr.
  SegmentationCalibrationSet(const SegmentationPipeline& pipeline, PointPromptSet prompts, std::string model,
                             bool progress = false);
  // Covers the prompts (image file bytes or scene references, points), the preprocessing and the
  // image encoder's weights (what the decoder sees comes from it); the observed model's weights
  // are the model fingerprint.
  std::string fingerprint() const override;
  std::string describe() const override;
  // `reference` is the observed model's graph (the pipeline's own, or another FP32 graph). One
  // step (no timesteps).
  int run(const Graph& reference, RangeCollector& collector) override;
  std::size_t images() const { return images_.size(); }

 private:
  const SegmentationPipeline& pipeline_;
  PointPromptSet set_;
  std::string model_;
  bool progress_;
  std::vector<std::vector<std::size_t>> images_;  // prompt indices grouped by image, first-seen order
};

// The first `limit` prompts of a point-prompt set (0 = all).
PointPromptSet read_point_prompts_limited(const std::filesystem::path& path, std::size_t limit);

// A recipe calibrated on one model of a segmentation pipeline and applied to it.
struct SegmentationModelRecipe {
  std::string model;  // "image_encoder" or "mask_decoder"
  Selection selection;
  CalibrationResult calibration;
  bool cache_hit = false;
  std::string data_fingerprint, data_description;
  AppliedRecipe applied;
};

// Calibrates and applies `recipe` to each model of the pipeline it selects nodes in (a model it
// selects nothing in stays FP32 and is left out of the result; InputError when it selects nothing
// in either). Reuses <cache_dir>/<key>.json per model when given.
std::vector<SegmentationModelRecipe> calibrate_segmentation(const SegmentationPipeline& pipeline, const Recipe& recipe,
                                                            const PointPromptSet& prompts,
                                                            const std::optional<std::filesystem::path>& cache_dir,
                                                            bool progress = false);

}  // namespace qeval::eval::quant
