#include "eval/pipelines/noise.h"

#include <cmath>
#include <numbers>

#include "datasets/scenes.h"

namespace qeval::eval {

Tensor seeded_noise(std::uint64_t seed, const Shape& shape) {
  Tensor t(DType::kFloat32, shape);
  float* out = t.data<float>();
  const auto n = static_cast<std::size_t>(t.numel());
  datasets::SplitMix64 rng(datasets::SplitMix64::mix(seed));
  constexpr double kUnit = 1.0 / 9007199254740992.0;  // 2^-53
  for (std::size_t i = 0; i < n; i += 2) {
    const double u1 = static_cast<double>((rng.next() >> 11) + 1) * kUnit;
    const double u2 = static_cast<double>(rng.next() >> 11) * kUnit;
    const double r = std::sqrt(-2.0 * std::log(u1));
    // Python evaluates 2.0 * math.pi * u2 left to right; so does this.
    const double angle = 2.0 * std::numbers::pi * u2;
    out[i] = static_cast<float>(r * std::cos(angle));
    if (i + 1 < n) out[i + 1] = static_cast<float>(r * std::sin(angle));
  }
  return t;
}

}  // namespace qeval::eval
