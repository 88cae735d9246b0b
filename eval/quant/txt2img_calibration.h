// Calibrating a txt2img pipeline's UNet: calibration prompts run through the FP32 pipeline, the
// range observers see every UNet call filed under its denoising step (what ModelOpt's diffusion
// calibrator collects per step).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "eval/pipelines/txt2img.h"
#include "eval/quant/calibrate.h"

namespace qeval::eval::quant {

// The prompts of a prompt set (eval/pipelines/prompt_set.h: plain text, '#' comments and blank lines skipped,
// or JSONL), at most `limit` (0 = all). InputError for a missing or empty file.
std::vector<std::string> read_prompt_lines(const std::filesystem::path& path, std::size_t limit = 0);

class Txt2ImgCalibrationSet : public CalibrationSet {
 public:
  // Prompt i runs with seed `first_seed + i`, `steps` steps (0 = the pipeline's default) and the
  // pipeline's guidance and negative prompt. `progress` draws a progress line on stderr.
  Txt2ImgCalibrationSet(const Txt2ImgModels& models, std::vector<std::string> prompts, int steps = 0,
                        std::uint64_t first_seed = 0, bool progress = false);
  // Covers the prompts, seeds, steps, guidance, scheduler and the text encoder's weights (the
  // UNet's are the model fingerprint).
  std::string fingerprint() const override;
  std::string describe() const override;
  // `reference` is the UNet graph to observe (the pipeline's own).
  int run(const Graph& reference, RangeCollector& collector) override;
  int steps() const { return steps_; }

 private:
  const Txt2ImgModels& models_;
  std::vector<std::string> prompts_;
  int steps_;
  std::uint64_t first_seed_;
  bool progress_;
};

}  // namespace qeval::eval::quant
