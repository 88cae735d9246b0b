#include "eval/quant/select.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include "base/json_config.h"
#include "eval/exec/onnx_import.h"
#include "eval/quant/mini_block.h"
#include "kernels/error.h"
#include "test_util.h"

namespace qeval::eval::quant {
namespace {

Recipe recipe(double level, const std::string& extra = "") {
  return parse_recipe(base::JsonConfig::parse(
      R"({"format": "int8", "calibration": {"method": "max"}, "level": )" + std::to_string(level) + extra + "}",
      "r.json"));
}

int count(const Selection& s, NodeCategory c) { return s.selected[static_cast<std::size_t>(c)]; }

std::vector<std::string> names(const Selection& s) {
  std::vector<std::string> v;
  for (const auto& t : s.targets) v.push_back(t.node);
  return v;
}

TEST(SelectNodes, ClassifiesTheMiniBlockByStructure) {
  const Graph g = testing::mini_unet_block().graph();
  const auto classes = classify_nodes(g);
  std::map<std::string, NodeCategory> by_name;
  for (const auto& t : classes) by_name[t.node] = t.category;
  EXPECT_EQ(by_name["/conv_in/Conv"], NodeCategory::kConv);
  EXPECT_EQ(by_name["/block/conv1/Conv"], NodeCategory::kConv);
  EXPECT_EQ(by_name["/block/emb_proj/Gemm"], NodeCategory::kOtherLinear);
  EXPECT_EQ(by_name["/attn/attn1/to_q/MatMul"], NodeCategory::kQkvProjection);
  EXPECT_EQ(by_name["/attn/attn1/to_k/MatMul"], NodeCategory::kQkvProjection);
  EXPECT_EQ(by_name["/attn/attn1/to_v/MatMul"], NodeCategory::kQkvProjection);
  EXPECT_EQ(by_name["/attn/attn1/MatMul"], NodeCategory::kAttentionQK);
  EXPECT_EQ(by_name["/attn/attn1/MatMul_1"], NodeCategory::kAttentionAV);
  EXPECT_EQ(by_name["/attn/attn1/to_out.0/MatMul"], NodeCategory::kOtherLinear);
  EXPECT_EQ(by_name["/attn/ff/net.0/proj/MatMul"], NodeCategory::kFeedForward);
  EXPECT_EQ(by_name["/attn/ff/net.2/MatMul"], NodeCategory::kFeedForward);
  EXPECT_EQ(by_name["/attn/Add_res1"], NodeCategory::kNone);
  for (const auto& t : classes)
    if (t.node == "/block/emb_proj/Gemm") {
      EXPECT_EQ(t.weight_out_axis, 0);  // transB = 1: [N, K]
      EXPECT_EQ(t.weight_in_axis, 1);
    } else if (t.node == "/attn/ff/net.2/MatMul") {
      EXPECT_EQ(t.weight_out_axis, 1);  // [K, N]
      EXPECT_EQ(t.weight_in_axis, 0);
    }
}

TEST(SelectNodes, StructureNotNamesDecides) {
  // The same graph with every node renamed to "<op>_<i>": categories must not change.
  auto b = testing::mini_unet_block();
  for (int i = 0; i < b.proto().graph().node_size(); ++i) b.proto().mutable_graph()->mutable_node(i)->set_name("");
  const Graph g = b.graph();
  const Selection s = select_nodes(g, recipe(4));
  // conv_in/conv_out are still excluded by default: their weight initializers keep the names.
  EXPECT_EQ(count(s, NodeCategory::kConv), 1);
  EXPECT_EQ(count(s, NodeCategory::kQkvProjection), 3);
  EXPECT_EQ(count(s, NodeCategory::kFeedForward), 2);
  EXPECT_EQ(count(s, NodeCategory::kOtherLinear), 2);
  EXPECT_EQ(count(s, NodeCategory::kAttentionQK), 1);
  EXPECT_EQ(count(s, NodeCategory::kAttentionAV), 1);
}

TEST(SelectNodes, LevelsAddCategoriesAndPatternsOverride) {
  const Graph g = testing::mini_unet_block().graph();
  EXPECT_EQ(names(select_nodes(g, recipe(1))), std::vector<std::string>{"/block/conv1/Conv"});
  EXPECT_EQ(select_nodes(g, recipe(2)).targets.size(), 3u);
  EXPECT_EQ(select_nodes(g, recipe(2.5)).targets.size(), 6u);
  EXPECT_EQ(select_nodes(g, recipe(3)).targets.size(), 8u);
  const Selection l4 = select_nodes(g, recipe(4));
  EXPECT_EQ(l4.targets.size(), 10u);
  EXPECT_EQ(l4.excluded_by_default, 2);  // conv_in, conv_out
  for (const auto& t : l4.targets)
    if (t.category == NodeCategory::kAttentionAV) {
      ASSERT_EQ(t.activations.size(), 2u);
      EXPECT_EQ(t.activations[0].role, "softmax");
      EXPECT_EQ(t.activations[1].role, "v_bmm");
      EXPECT_FALSE(t.has_weight);
    }

  const Selection no_defaults = select_nodes(g, recipe(1, R"(, "default_exclusions": false)"));
  EXPECT_EQ(no_defaults.targets.size(), 3u);
  const Selection patterns =
      select_nodes(g, recipe(1, R"(, "include": ["ff/net\\.2", "conv_out"], "exclude": ["conv1"])"));
  EXPECT_EQ(names(patterns), (std::vector<std::string>{"/attn/ff/net.2/MatMul", "/conv_out/Conv"}));
  EXPECT_EQ(patterns.included_by_pattern, 2);
  EXPECT_EQ(patterns.excluded_by_pattern, 1);
  // Weight initializer names match too.
  EXPECT_EQ(names(select_nodes(g, recipe(1, R"(, "include": ["^to_v$"])"))),
            (std::vector<std::string>{"/block/conv1/Conv", "/attn/attn1/to_v/MatMul"}));
}

// The default exclusions name diffusers UNet layers: another network's `conv_in` is quantized.
TEST(SelectNodes, DefaultExclusionsApplyToDiffusersUnetsOnly) {
  const Graph unet = testing::mini_unet_block().graph();  // input `sample`
  EXPECT_TRUE(is_diffusers_unet(unet));
  Graph other = unet;
  for (auto& in : other.inputs)
    if (in.name == "sample") in.name = "image";
  for (auto& n : other.nodes)
    for (auto& i : n.inputs)
      if (i == "sample") i = "image";
  EXPECT_FALSE(is_diffusers_unet(other));
  const Selection in_unet = select_nodes(unet, recipe(1));
  EXPECT_EQ(in_unet.excluded_by_default, 2);  // conv_in, conv_out
  // Every candidate left in float is listed with the reason.
  std::map<std::string, std::string> why;
  for (const auto& l : in_unet.left_out) why[l.node] = l.reason;
  EXPECT_EQ(why.size() + in_unet.targets.size(),
            std::size_t(std::accumulate(in_unet.candidates.begin(), in_unet.candidates.end(), 0)));
  EXPECT_NE(why["/conv_in/Conv"].find("default exclusion"), std::string::npos) << why["/conv_in/Conv"];
  EXPECT_NE(why["/attn/attn1/to_q/MatMul"].find("recipe level 1 < 2.5"), std::string::npos)
      << why["/attn/attn1/to_q/MatMul"];
  for (const auto& l : select_nodes(unet, recipe(1, R"(, "exclude": ["conv1"])"), true).left_out)
    if (l.node == "/block/conv1/Conv") {
      EXPECT_NE(l.reason.find("'exclude'"), std::string::npos) << l.reason;
    }
  const Selection s = select_nodes(other, recipe(1));
  EXPECT_EQ(s.excluded_by_default, 0);
  EXPECT_EQ(names(s), (std::vector<std::string>{"/conv_in/Conv", "/block/conv1/Conv", "/conv_out/Conv"}));
  // Names alone make a UNet too (an export whose input is called otherwise).
  for (auto& n : other.nodes)
    if (n.name == "/block/conv1/Conv") n.name = "/down_blocks.0/resnets.0/conv1/Conv";
  EXPECT_FALSE(is_diffusers_unet(other));
  other.nodes.back().name = "/up_blocks.0/conv/Conv";
  EXPECT_TRUE(is_diffusers_unet(other));
}

TEST(SelectNodes, SelectingNothingIsAnInputError) {
  const Graph g = testing::mini_unet_block().graph();
  try {
    select_nodes(g, recipe(1, R"(, "exclude": ["."])"));
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "r.json: recipe 'r' selects no node of test.onnx (12 quantizable nodes; level 1, "
              "2 removed by the default exclusions, 1 by 'exclude')");
  }
}

// tiny-sd's UNet (diffusers UNet2DConditionModel, TorchScript export): counts per level are
// documented in docs/recipes.md.
TEST(SelectNodes, TinySdUnetCountsPerLevel) {
  const Graph g = load_onnx(testing::source_dir() / "models/tiny-sd/unet.onnx");
  const Selection l4 = select_nodes(g, recipe(4));
  EXPECT_EQ(l4.candidates[static_cast<std::size_t>(NodeCategory::kConv)], 39);
  EXPECT_EQ(l4.candidates[static_cast<std::size_t>(NodeCategory::kFeedForward)], 14);
  EXPECT_EQ(l4.candidates[static_cast<std::size_t>(NodeCategory::kQkvProjection)], 42);
  EXPECT_EQ(l4.candidates[static_cast<std::size_t>(NodeCategory::kOtherLinear)], 24);
  EXPECT_EQ(l4.candidates[static_cast<std::size_t>(NodeCategory::kAttentionQK)], 14);
  EXPECT_EQ(l4.candidates[static_cast<std::size_t>(NodeCategory::kAttentionAV)], 14);
  EXPECT_EQ(l4.candidates[static_cast<std::size_t>(NodeCategory::kOtherMatMul)], 0);
  // Default exclusions: conv_in, conv_out, 5 conv_shortcut, 7 proj_out, 2 time_embedding
  // linears, 8 time_emb_proj.
  EXPECT_EQ(l4.excluded_by_default, 24);
  EXPECT_EQ(count(l4, NodeCategory::kConv), 25);
  EXPECT_EQ(count(l4, NodeCategory::kOtherLinear), 14);
  EXPECT_EQ(select_nodes(g, recipe(1)).targets.size(), 25u);
  EXPECT_EQ(select_nodes(g, recipe(2)).targets.size(), 39u);
  EXPECT_EQ(select_nodes(g, recipe(2.5)).targets.size(), 81u);
  EXPECT_EQ(select_nodes(g, recipe(3)).targets.size(), 95u);
  EXPECT_EQ(l4.targets.size(), 123u);
  for (const auto& t : select_nodes(g, recipe(2.5)).targets) {
    if (t.category == NodeCategory::kQkvProjection) {
      EXPECT_NE(t.node.find("/to_"), std::string::npos) << t.node;
    }
    if (t.category == NodeCategory::kFeedForward) {
      EXPECT_NE(t.node.find("/ff/net."), std::string::npos) << t.node;
    }
  }
}

}  // namespace
}  // namespace qeval::eval::quant

namespace qeval::eval::quant {
namespace {

// Every shipped recipe parses and selects what docs/recipes.md says on tiny-sd's UNet.
// EfficientViT's ReLU linear attention (two MatMuls of activations, no Softmax) is quantized only
// with other_matmuls; exclude_nodes removes exact node names whatever selected them.
TEST(SelectNodes, OtherMatMulsAndExcludedNodesOnTinySam) {
  const Graph g = load_onnx(testing::source_dir() / "models/tiny-sam/image_encoder.onnx");
  const Selection l3 = select_nodes(g, recipe(3));
  EXPECT_EQ(count(l3, NodeCategory::kOtherMatMul), 0);
  const Selection la = select_nodes(g, recipe(3, R"(, "other_matmuls": true)"));
  EXPECT_EQ(count(la, NodeCategory::kOtherMatMul), 4);
  EXPECT_EQ(la.targets.size(), l3.targets.size() + 4);
  for (const auto& t : la.targets)
    if (t.category == NodeCategory::kOtherMatMul) {
      EXPECT_NE(t.node.find("context_module/main/MatMul"), std::string::npos) << t.node;
      ASSERT_EQ(t.activations.size(), 2u);
      EXPECT_EQ(t.activations[0].role, "a_bmm");
      EXPECT_EQ(t.activations[1].role, "b_bmm");
      EXPECT_FALSE(t.has_weight);
    }
  const Selection kept = select_nodes(g, recipe(3, R"(, "other_matmuls": true,
                     "exclude_nodes": ["/stem/stem.0/conv/Conv", "/stage2/stage2.1/context_module/main/MatMul_1",
                                       "no/such/node"])"));
  EXPECT_EQ(kept.targets.size(), la.targets.size() - 2);
  EXPECT_EQ(kept.excluded_by_name, 2);
  for (const auto& n : names(kept)) {
    EXPECT_NE(n, "/stem/stem.0/conv/Conv");
    EXPECT_NE(n, "/stage2/stage2.1/context_module/main/MatMul_1");
  }
}

TEST(ShippedRecipes, ParseAndSelectTheDocumentedNodesOnTinySd) {
  const Graph g = load_onnx(testing::source_dir() / "models/tiny-sd/unet.onnx");
  const std::map<std::string, std::size_t> expected{{"int8-level1", 25}, {"int8-level2", 39}, {"int8-level2.5", 81},
                                                    {"int8-level3", 95}, {"fp8-level3", 95},  {"fp8-level4", 123},
                                                    {"int8-naive", 147}};
  std::size_t seen = 0;
  for (const auto& e : std::filesystem::directory_iterator(testing::source_dir() / "recipes")) {
    if (e.path().extension() != ".json") continue;
    const Recipe r = load_recipe(e.path());
    ASSERT_TRUE(expected.count(r.name)) << e.path();
    EXPECT_EQ(r.name, e.path().stem().string());
    EXPECT_EQ(select_nodes(g, r).targets.size(), expected.at(r.name)) << r.name;
    if (r.format == QuantFormat::kInt8 && r.name != "int8-naive") {
      EXPECT_EQ(r.calibration.method, CalibrationMethod::kPercentile) << r.name;
      EXPECT_DOUBLE_EQ(r.smoothquant.alpha, 0.8) << r.name;
    } else {
      EXPECT_EQ(r.calibration.method, CalibrationMethod::kMax) << r.name;
      EXPECT_FALSE(r.smoothquant.enabled) << r.name;
    }
    ++seen;
  }
  EXPECT_EQ(seen, expected.size());
}

}  // namespace
}  // namespace qeval::eval::quant
