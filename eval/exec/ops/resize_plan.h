// The geometry a Resize / Upsample node computes with (for a device backend that runs it with its
// own kernels): per-dimension sizes, scales and roi, and the interpolation options.
#pragma once

#include <optional>
#include <vector>

#include "eval/exec/ops/op.h"
#include "kernels/resize.h"

namespace qeval::eval {

struct ResizePlan {
  std::vector<kernels::ResizeAxis> axes;
  kernels::ResizeOptions options;
};

// The plan of `op` (a Resize or Upsample op made by the registry) for inputs with these metas
// (roi, scales and sizes constant, as planning requires); nullopt for any other op.
std::optional<ResizePlan> resize_plan(const Op& op, std::span<const ValueMeta* const> inputs);

}  // namespace qeval::eval
