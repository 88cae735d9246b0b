#include "eval/pipelines/scheduler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/error.h"

namespace qeval::eval {

namespace {

// numpy.linspace(start, stop, num): start + i * step, the last element exactly `stop`.
std::vector<double> np_linspace(double start, double stop, int num) {
  std::vector<double> y(static_cast<std::size_t>(num));
  if (num == 1) {
    y[0] = start;
    return y;
  }
  const double step = (stop - start) / static_cast<double>(num - 1);
  for (int i = 0; i < num; ++i) y[std::size_t(i)] = static_cast<double>(i) * step + start;
  y.back() = stop;
  return y;
}

// numpy.arange(start, stop, step) for float64: buffer[0] = start, buffer[1] = start + step, then
// start + i * (buffer[1] - buffer[0]); length ceil((stop - start) / step).
std::vector<double> np_arange(double start, double stop, double step) {
  const double n = std::ceil((stop - start) / step);
  std::vector<double> y(n > 0 ? static_cast<std::size_t>(n) : 0);
  if (y.empty()) return y;
  y[0] = start;
  if (y.size() > 1) y[1] = start + step;
  const double delta = y.size() > 1 ? y[1] - y[0] : step;
  for (std::size_t i = 2; i < y.size(); ++i) y[i] = start + static_cast<double>(i) * delta;
  return y;
}

double round_half_even(double x) { return std::nearbyint(x); }  // default rounding mode: ties to even
double f32(double x) { return static_cast<double>(static_cast<float>(x)); }

// The spacing's timesteps before the scheduler's own type conversion, in order of use.
std::vector<double> spaced_timesteps(const SchedulerConfig& c, int n) {
  const int T = c.num_train_timesteps;
  std::vector<double> t;
  switch (c.timestep_spacing) {
    case TimestepSpacing::kLinspace:
      t = np_linspace(0.0, T - 1.0, n);
      std::reverse(t.begin(), t.end());
      break;
    case TimestepSpacing::kLeading: {
      const int ratio = T / n;
      for (int i = n - 1; i >= 0; --i) t.push_back(static_cast<double>(i) * ratio + c.steps_offset);
      break;
    }
    case TimestepSpacing::kTrailing: {
      // numpy's arange(T, 0, -T / n) holds n + 1 values for some n (61, 103, ... with T = 1000),
      // the last one ~1e-13 (timestep -1 after the shift); diffusers then runs an extra step at
      // t = -1. qeval keeps the n values asked for.
      t = np_arange(T, 0.0, -static_cast<double>(T) / n);
      t.resize(static_cast<std::size_t>(n));
      for (double& v : t) v = round_half_even(v) - 1.0;
      break;
    }
  }
  return t;
}

// numpy.interp(x, arange(len(fp)), fp) for x in [0, len - 1].
double np_interp_unit_grid(double x, const std::vector<double>& fp) {
  const double last = static_cast<double>(fp.size() - 1);
  if (x <= 0) return fp.front();
  if (x >= last) return fp.back();
  const auto j = static_cast<std::size_t>(std::floor(x));
  const double slope = (fp[j + 1] - fp[j]) / 1.0;
  return slope * (x - static_cast<double>(j)) + fp[j];
}

}  // namespace

std::vector<double> scheduler_betas(const SchedulerConfig& c) {
  std::vector<double> b;
  if (c.beta_schedule == BetaSchedule::kLinear) {
    b = np_linspace(c.beta_start, c.beta_end, c.num_train_timesteps);
  } else {
    b = np_linspace(std::pow(c.beta_start, 0.5), std::pow(c.beta_end, 0.5), c.num_train_timesteps);
    for (double& v : b) v = v * v;
  }
  return b;
}

std::vector<double> alphas_cumprod(const SchedulerConfig& c) {
  std::vector<double> a = scheduler_betas(c);
  double prod = 1.0;
  for (double& v : a) {
    prod *= 1.0 - v;
    v = prod;
  }
  return a;
}

Scheduler::Scheduler(const SchedulerConfig& config, int n) : config_(config) {
  const int T = config.num_train_timesteps;
  if (n < 1 || n > T)
    throw InputError("scheduler: " + std::to_string(n) + " inference steps asked; must be in [1, " + std::to_string(T) +
                     "] (num_train_timesteps)");
  alphas_cumprod_ = eval::alphas_cumprod(config);
  std::vector<double> t = spaced_timesteps(config, n);

  if (config.type == SchedulerType::kDdim) {
    // DDIMScheduler: integer timesteps (linspace rounds half to even), prev = t - T // n.
    for (double& v : t) v = round_half_even(v);
    const double final_alpha = config.set_alpha_to_one ? 1.0 : alphas_cumprod_[0];
    const int ratio = T / n;
    for (double v : t) {
      const auto ti = static_cast<long long>(v);
      if (ti < 0 || ti >= T)
        throw InputError("scheduler: timestep " + std::to_string(ti) + " outside [0, " + std::to_string(T) +
                         ") (steps_offset " + std::to_string(config.steps_offset) + " with " + std::to_string(n) +
                         " steps, spacing " + std::string(timestep_spacing_name(config.timestep_spacing)) + ")");
      alpha_t_.push_back(alphas_cumprod_[std::size_t(ti)]);
      const long long prev = ti - ratio;
      alpha_prev_.push_back(prev >= 0 ? alphas_cumprod_[std::size_t(prev)] : final_alpha);
    }
    timesteps_ = t;
    init_noise_sigma_ = 1.0;
    return;
  }

  // EulerDiscreteScheduler: float32 timesteps, sigma = sqrt((1 - a) / a) interpolated at them, then 0.
  for (double& v : t) {
    v = f32(v);
    if (v < 0 || v > T - 1)
      throw InputError("scheduler: timestep " + std::to_string(v) + " outside [0, " + std::to_string(T - 1) +
                       "] (steps_offset " + std::to_string(config.steps_offset) + " with " + std::to_string(n) +
                       " steps, spacing " + std::string(timestep_spacing_name(config.timestep_spacing)) + ")");
  }
  std::vector<double> full(alphas_cumprod_.size());
  for (std::size_t i = 0; i < full.size(); ++i) full[i] = std::sqrt((1.0 - alphas_cumprod_[i]) / alphas_cumprod_[i]);
  for (double v : t) sigmas_.push_back(f32(np_interp_unit_grid(v, full)));
  sigmas_.push_back(0.0);
  timesteps_ = t;
  const double max_sigma = *std::max_element(sigmas_.begin(), sigmas_.end());
  init_noise_sigma_ =
      config.timestep_spacing == TimestepSpacing::kLeading ? std::sqrt(max_sigma * max_sigma + 1.0) : max_sigma;
}

double Scheduler::model_input_divisor(int i) const {
  if (config_.type == SchedulerType::kDdim) return 1.0;
  const auto s = static_cast<float>(sigmas_.at(std::size_t(i)));  // float32 as diffusers' sigma tensor
  return std::sqrt(s * s + 1.0f);
}

void Scheduler::scale_model_input(int i, std::span<const float> sample, std::span<float> out) const {
  if (config_.type == SchedulerType::kDdim) {
    if (out.data() != sample.data()) std::copy(sample.begin(), sample.end(), out.begin());
    return;
  }
  const auto d = static_cast<float>(model_input_divisor(i));
  for (std::size_t k = 0; k < sample.size(); ++k) out[k] = sample[k] / d;
}

void Scheduler::step(int i, std::span<const float> model_output, std::span<const float> sample,
                     std::span<float> prev) const {
  if (i < 0 || i >= steps()) throw std::out_of_range("Scheduler::step: step " + std::to_string(i));
  if (model_output.size() != sample.size() || prev.size() != sample.size())
    throw std::invalid_argument("Scheduler::step: model output, sample and result sizes differ");
  const std::size_t n = sample.size();
  const PredictionType pred = config_.prediction_type;

  if (config_.type == SchedulerType::kDdim) {
    // diffusers DDIMScheduler.step, eta = 0.
    const double a_t = alpha_t_[std::size_t(i)], a_prev = alpha_prev_[std::size_t(i)];
    const auto sqrt_a = static_cast<float>(std::sqrt(a_t));
    const auto sqrt_b = static_cast<float>(std::sqrt(1.0 - a_t));
    const auto sqrt_a_prev = static_cast<float>(std::sqrt(a_prev));
    const auto sqrt_b_prev = static_cast<float>(std::sqrt(1.0 - a_prev));
    const bool clip = config_.clip_sample;
    const auto r = static_cast<float>(config_.clip_sample_range);
    for (std::size_t k = 0; k < n; ++k) {
      const float x = sample[k], m = model_output[k];
      float x0, eps;
      if (pred == PredictionType::kEpsilon) {
        x0 = (x - sqrt_b * m) / sqrt_a;
        eps = m;
      } else if (pred == PredictionType::kSample) {
        x0 = m;
        eps = (x - sqrt_a * x0) / sqrt_b;
      } else {
        x0 = sqrt_a * x - sqrt_b * m;
        eps = sqrt_a * m + sqrt_b * x;
      }
      if (clip) x0 = std::clamp(x0, -r, r);
      prev[k] = sqrt_a_prev * x0 + sqrt_b_prev * eps;
    }
    return;
  }

  // diffusers EulerDiscreteScheduler.step, s_churn = 0 (sigma_hat = sigma).
  const auto sigma = static_cast<float>(sigmas_[std::size_t(i)]);
  const float dt = static_cast<float>(sigmas_[std::size_t(i) + 1]) - sigma;
  const float sigma2p1 = sigma * sigma + 1.0f;
  const float v_out = -sigma / std::sqrt(sigma2p1);
  for (std::size_t k = 0; k < n; ++k) {
    const float x = sample[k], m = model_output[k];
    float x0;
    if (pred == PredictionType::kEpsilon) x0 = x - sigma * m;
    else if (pred == PredictionType::kSample) x0 = m;
    else x0 = m * v_out + x / sigma2p1;
    const float derivative = (x - x0) / sigma;
    prev[k] = x + derivative * dt;
  }
}

}  // namespace qeval::eval
