// Which nodes a recipe quantizes: nodes are classified by graph structure (a q/k/v projection is a
// constant-weight MatMul whose output reaches an attention MatMul through reshapes; a feed-forward
// layer sits next to a GELU/GEGLU), then the recipe's level, default exclusions and name patterns
// pick among them.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "eval/exec/graph.h"
#include "eval/quant/recipe.h"

namespace qeval::eval::quant {

enum class NodeCategory {
  kNone,
  kConv,           // Conv with a constant weight (level 1)
  kFeedForward,    // constant-weight MatMul/Gemm before or after a GELU/GEGLU (level 2)
  kQkvProjection,  // constant-weight MatMul/Gemm feeding an attention MatMul (level 2.5)
  kOtherLinear,    // every other constant-weight MatMul/Gemm (level 3)
  kAttentionQK,    // MatMul of two activations whose output reaches a Softmax (level 4)
  kAttentionAV,    // MatMul of two activations whose first input comes from a Softmax (level 4)
  kOtherMatMul,    // MatMul of two activations that is neither (only with the recipe's other_matmuls)
};
constexpr std::size_t kNodeCategoryCount = 8;
const char* category_name(NodeCategory c);
// The lowest level that quantizes this category (0 for never).
double category_level(NodeCategory c);

// One quantized activation input of a node. Roles follow ModelOpt's quantizer names:
// "input" (Conv/MatMul/Gemm input), "q_bmm", "k_bmm", "v_bmm", "softmax"; "a_bmm", "b_bmm" for the
// two inputs of another activation MatMul (the recipe's other_matmuls).
struct ActivationInput {
  std::size_t input = 0;
  std::string role;
};

struct QuantTarget {
  std::string node;  // node name
  std::size_t node_index = 0;
  std::string op_type;
  NodeCategory category = NodeCategory::kNone;
  std::vector<ActivationInput> activations;
  bool has_weight = false;
  std::size_t weight_input = 1;
  std::string weight_name;  // the initializer
  int weight_out_axis = 0;  // output-channel axis of the weight (per-channel scales)
  int weight_in_axis = -1;  // input-channel axis (SmoothQuant), -1 for Conv
  bool is_linear() const {
    return category == NodeCategory::kFeedForward || category == NodeCategory::kQkvProjection ||
           category == NodeCategory::kOtherLinear;
  }
};

// Every node's structural category (indexed like graph.nodes) with its quantization target shape.
std::vector<QuantTarget> classify_nodes(const Graph& graph);

// A candidate the recipe leaves in float, and why.
struct LeftOut {
  std::string node, op_type;
  NodeCategory category = NodeCategory::kNone;
  std::string reason;  // "level 2 < 3 (other linear)", "default exclusion", "'exclude' pattern", ...
};

struct Selection {
  std::vector<QuantTarget> targets;                  // in graph order
  std::vector<LeftOut> left_out;                     // every other candidate, in graph order
  std::array<int, kNodeCategoryCount> candidates{};  // by category, before level and patterns
  std::array<int, kNodeCategoryCount> selected{};
  int excluded_by_default = 0;  // level-selected nodes the demo's default exclusions removed
  int excluded_by_pattern = 0;
  int included_by_pattern = 0;
  int excluded_by_name = 0;  // removed by the recipe's exclude_nodes
};

// Applies the recipe to the graph's classification. Throws InputError naming the recipe and the
// model when nothing is selected, unless `allow_empty` (pipelines whose recipe may leave one of
// their models alone).
Selection select_nodes(const Graph& graph, const Recipe& recipe, bool allow_empty = false);

// A diffusers UNet (UNet2DConditionModel as diffusers, Optimum and the TensorRT demo export it): a
// graph input `sample` (the UNet's first argument), or `down_blocks` and `up_blocks` in its names. The default
// exclusions name layers of such UNets and apply to them only: `conv_in` of another network is
// just its first conv.
bool is_diffusers_unet(const Graph& graph);

}  // namespace qeval::eval::quant
