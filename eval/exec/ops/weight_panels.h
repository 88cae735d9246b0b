// How an op packs a constant weight for the CPU GEMMs (kernels/gemm.h PanelStorage).
#pragma once

#include "eval/exec/ops/op.h"
#include "kernels/gemm.h"

namespace qeval::eval {

// An FP16 model's float16 weights (widened to f32 storage) keep float16 panels: half the bytes of
// float ones, the same products.
inline kernels::PanelStorage panel_storage(const ValueMeta& weight) {
  return weight.declared == DType::kFloat16 ? kernels::PanelStorage::kFloat16IfExact : kernels::PanelStorage::kFloat;
}

}  // namespace qeval::eval
