// The evaluator's drivers, one per pipeline kind (eval/run/evaluator.h: RunDriver).
#pragma once

#include <memory>

#include "eval/pipelines/prompt_set.h"
#include "eval/run/evaluator.h"

namespace qeval::eval {

// txt2img: one unit = one (prompt, seed); the prompt set is the config's or the pipeline's
// evaluation set.
std::unique_ptr<RunDriver> make_txt2img_driver(const RunSpec& spec);
// segmentation: one unit = one image of the point-prompt set with all its prompts.
std::unique_ptr<RunDriver> make_segmentation_driver(const RunSpec& spec);
// single model: one unit = one sample of input tensors.
std::unique_ptr<RunDriver> make_single_model_driver(const RunSpec& spec);

}  // namespace qeval::eval
