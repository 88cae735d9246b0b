// A float16/bfloat16 graph widened to float32: what PyTorch runs after `module.to(torch.float32)`,
// e.g. diffusers' SDXL pipeline upcasting an FP16 VAE whose config says force_upcast.
#pragma once

#include "eval/exec/graph.h"

namespace qeval::eval {

// Whether the graph declares a float16 or bfloat16 value anywhere: an initializer (Constant nodes
// included), a graph input or output, a Cast or a dtype attribute that produces one.
bool declares_narrow_floats(const Graph& g);

// The graph computed in float32: float16/bfloat16 initializers widened (exactly: every 16-bit value
// is a float32), graph inputs and outputs declared float32, Casts to float16/bfloat16 and the
// dtype attributes of EyeLike/Random* cast to float32 instead, ConstantOfShape values widened.
// Everything else (integer values, float8 and 8-bit quantization) is left as it is.
Graph widened_to_float32(const Graph& g);

}  // namespace qeval::eval
