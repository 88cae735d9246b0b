// The seeded initial noise of qeval's diffusion pipelines: splitmix64 + Box-Muller, bit-identical to
// tools/tiny_sd_pipeline.py's seeded_noise (spec in docs/pipelines.md, "Initial noise").
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace qeval::eval {

// Standard normal float32 values filled in row-major order:
//   rng = SplitMix64(mix64(seed)); per pair of values:
//   u1 = ((rng.next() >> 11) + 1) * 2^-53   in (0, 1]
//   u2 = (rng.next() >> 11) * 2^-53         in [0, 1)
//   r = sqrt(-2 ln u1); z0 = r cos(2 pi u2); z1 = r sin(2 pi u2)   (float64, C library log/cos/sin)
// each then rounded to float32; an odd count drops the last z1. Depends on nothing but the seed
// and the element count (never on threads).
Tensor seeded_noise(std::uint64_t seed, const Shape& shape);

}  // namespace qeval::eval
