// Applying a calibrated recipe: a Graph rewrite that inserts QuantizeLinear/DequantizeLinear in
// TensorRT's convention (symmetric, zero point 0, activations per tensor, weights per output
// channel and stored pre-quantized behind a DequantizeLinear; SmoothQuant as a pre-scale Mul
// before the activation's QuantizeLinear with the scales folded into the weights). The result is
// what qeval runs in memory and what `qeval calibrate` exports.
#pragma once

#include <string>
#include <vector>

#include "eval/exec/graph.h"
#include "eval/quant/calibrate.h"
#include "eval/quant/recipe.h"
#include "eval/quant/select.h"

namespace qeval::eval::quant {

struct WeightQuant {
  std::string node;
  std::string weight;  // the original initializer
  int axis = -1;       // output-channel axis, -1 per tensor
  std::vector<float> amax;
};

struct AppliedRecipe {
  Graph graph;
  std::vector<WeightQuant> weights;
  int quantized_activations = 0;
  int smoothed_layers = 0;
  int opset_from = 0, opset_to = 0;         // default-domain opset before and after
  int opset_rewritten_nodes = 0;            // nodes the opset upgrade rewrote (eval/exec/opset_upgrade.h)
  std::vector<std::string> opset_rewrites;  // one line per rewritten node (OpsetUpgrade::notes)
};

// Throws InputError when the calibration result lacks a selected activation or its amax is not
// finite and positive (naming node and input), or disagrees with the graph (SmoothQuant channel
// count). The graph's ai.onnx opset is raised to what the format needs (int8 per-channel: 13;
// FP8: 19) by eval::upgrade_opset: InputError below opset 7, UnsupportedError for a node whose old
// form has no equivalent at the target.
AppliedRecipe apply_recipe(const Graph& graph, const Selection& selection, const Recipe& recipe,
                           const CalibrationResult& calibration);

// Names of the nodes apply_recipe inserts for node `node` and quantizer role ("input", "q_bmm",
// "weight", ...): "<node>/<role>_quantizer/QuantizeLinear" etc. (ModelOpt's export names).
std::string quantizer_prefix(const std::string& node, const std::string& role);

}  // namespace qeval::eval::quant
