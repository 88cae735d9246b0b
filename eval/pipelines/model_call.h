// Observing a pipeline's model calls: each call of a model (image encoder, mask decoder, UNet step,
// ...) may get its own executor Observer, told which model runs and in what context.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "eval/exec/session.h"

namespace qeval::eval {

// One call of one model inside a pipeline run.
struct ModelCall {
  std::string_view model;    // the pipeline.json key of the model: "image_encoder", "mask_decoder", ...
  std::string_view context;  // what the caller passed for this run (e.g. the prompt's id); may be ""
  int call = 0;              // 0, 1, ...: the n-th call of this model in this run (mask_decoder: the prompt)
  int step = -1;             // denoising step for diffusion models, -1 otherwise
};

// Given to a pipeline run by its caller (the evaluator: one per run, so runs on other threads
// never share one). The pipeline calls begin() before a model runs and end() after it.
class ModelCallObserver {
 public:
  virtual ~ModelCallObserver() = default;
  // The executor observer for this call, or nullptr to run it unobserved.
  virtual Observer* begin(const ModelCall& call) = 0;
  // The call's outputs, as the model returned them (declared types).
  virtual void end(const ModelCall& call, const std::map<std::string, Tensor>& outputs) {
    (void)call;
    (void)outputs;
  }
};

// A ModelCallObserver made of a function: the observer for each call (nullptr = unobserved).
class ModelCallObserverFn : public ModelCallObserver {
 public:
  explicit ModelCallObserverFn(std::function<Observer*(const ModelCall&)> begin) : begin_(std::move(begin)) {}
  Observer* begin(const ModelCall& call) override { return begin_ ? begin_(call) : nullptr; }

 private:
  std::function<Observer*(const ModelCall&)> begin_;
};

}  // namespace qeval::eval
