// DDIM and Euler discrete schedulers with diffusers' formulas (DDIMScheduler, EulerDiscreteScheduler;
// docs/pipelines.md lists them), tables in float64, steps on float32 tensors.
#pragma once

#include <span>
#include <vector>

#include "eval/pipelines/pipeline_config.h"
#include "kernels/tensor.h"

namespace qeval::eval {

// betas (linear: linspace(beta_start, beta_end, T); scaled_linear: linspace(sqrt(start), sqrt(end),
// T)^2, linspace as numpy's: start + i * step, the last one exactly `end`) and their cumulative
// product of (1 - beta). diffusers computes these in torch float32; qeval in float64 (the gap,
// ~1e-6 relative, is measured in docs/pipelines.md).
std::vector<double> scheduler_betas(const SchedulerConfig& config);
std::vector<double> alphas_cumprod(const SchedulerConfig& config);

// One scheduler set up for a number of inference steps (diffusers' set_timesteps). Immutable:
// step() takes the step index, so one Scheduler serves any number of runs and threads.
class Scheduler {
 public:
  // InputError when steps < 1 or above num_train_timesteps.
  Scheduler(const SchedulerConfig& config, int num_inference_steps);

  const SchedulerConfig& config() const { return config_; }
  int steps() const { return static_cast<int>(timesteps_.size()); }
  // The model's timestep at each step, in order of use (decreasing). DDIM's are integers; Euler's
  // are float32 values (linspace spacing gives fractional ones).
  const std::vector<double>& timesteps() const { return timesteps_; }
  const std::vector<double>& alphas_cumprod() const { return alphas_cumprod_; }
  // Euler: sigma at each step plus the final 0 (steps() + 1 values, float32-rounded as diffusers
  // stores them). DDIM: empty.
  const std::vector<double>& sigmas() const { return sigmas_; }
  // DDIM: alphas_cumprod at each step's timestep and at the previous one (t - T / steps, or the
  // final alpha). Euler: empty.
  const std::vector<double>& alpha_t() const { return alpha_t_; }
  const std::vector<double>& alpha_prev() const { return alpha_prev_; }

  // The initial latent is noise * init_noise_sigma: 1 for DDIM; Euler: max sigma (linspace and
  // trailing spacing) or sqrt(max sigma^2 + 1) (leading).
  double init_noise_sigma() const { return init_noise_sigma_; }
  // diffusers' scale_model_input: the UNet gets sample / model_input_divisor(i), 1 for DDIM,
  // sqrt(sigma_i^2 + 1) for Euler (divided in float32). `out` may alias `sample`.
  double model_input_divisor(int step) const;
  void scale_model_input(int step, std::span<const float> sample, std::span<float> out) const;

  // One denoising step: `prev` (same shape as `sample`) = the sample at the next, lower noise
  // level, from the model output at step `step`. Float32 arithmetic in diffusers' order of
  // operations, coefficients rounded to float32 where they meet a tensor. `prev` may alias
  // `sample`.
  void step(int step, std::span<const float> model_output, std::span<const float> sample, std::span<float> prev) const;

 private:
  SchedulerConfig config_;
  std::vector<double> alphas_cumprod_, timesteps_, sigmas_, alpha_t_, alpha_prev_;
  double init_noise_sigma_ = 1.0;
};

}  // namespace qeval::eval
