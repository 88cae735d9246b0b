// How an op packs a constant weight for the CPU GEMMs (kernels/gemm.h PanelStorage).
#pragma once

#include "eval/exec/ops/op.h"
#include "kernels/gemm.h"

namespace qeval::eval {

// Weights whose values are all float16 values keep float16 panels: half the bytes of float ones,
// the same products. An FP16 model's (widened to f32 storage), and an fp16 or bf16 precision
// variant's after rounding (bfloat16 values within float16's range and precision). Any other
// weight's first chunk has an inexact value and keeps float panels (the check stops there).
inline kernels::PanelStorage panel_storage(const ValueMeta&) { return kernels::PanelStorage::kFloat16IfExact; }

}  // namespace qeval::eval
