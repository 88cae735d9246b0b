// qeval lint on an SDXL UNet (the untrained tiny-sdxl's, tests/data/tiny_sdxl_random/unet): with
// dynamic inputs and no --shape it takes SDXL's 1024x1024 shapes (attention over 4096 and 1024
// tokens, as SDXL base: no attention at the 128x128 level), and says which quantization level
// avoids TensorRT's INT8-slower-than-FP16 case.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "base/json_config.h"
#include "eval/exec/onnx_import.h"
#include "eval/pipelines/noise.h"
#include "eval/quant/apply.h"
#include "eval/quant/calibrate.h"
#include "eval/quant/lint.h"
#include "test_util.h"

namespace qeval::eval::quant {
namespace {

// One calibration sample at 16x16 latents with guidance (batch 2).
std::map<std::string, Tensor> unet_inputs() {
  std::map<std::string, Tensor> in;
  in.emplace("sample", seeded_noise(1, {2, 4, 16, 16}));
  Tensor t(DType::kFloat32, {});
  t.data<float>()[0] = 501.0f;
  in.emplace("timestep", t);
  in.emplace("encoder_hidden_states", seeded_noise(2, {2, 77, 30}));
  in.emplace("text_embeds", seeded_noise(3, {2, 18}));
  Tensor ids(DType::kFloat32, {2, 6});
  const float v[6] = {64, 64, 0, 0, 64, 64};
  for (int b = 0; b < 2; ++b) std::copy(v, v + 6, ids.data<float>() + b * 6);
  in.emplace("time_ids", ids);
  return in;
}

Graph quantized_unet(const Graph& g, int level) {
  const Recipe r = parse_recipe(
      base::JsonConfig::parse(R"({"name": "int8-l)" + std::to_string(level) + R"(", "format": "int8", "level": )" +
                                  std::to_string(level) + R"(, "calibration": {"method": "max"}})",
                              "r.json"));
  const Selection sel = select_nodes(g, r);
  TensorCalibrationSet set({unet_inputs()});
  return apply_recipe(g, sel, r, calibrate(g, sel, r, set)).graph;
}

std::vector<const LintFinding*> findings_of(const LintReport& r, const std::string& rule) {
  std::vector<const LintFinding*> out;
  for (const auto& f : r.findings)
    if (f.rule == rule) out.push_back(&f);
  return out;
}

TEST(LintSdxl, TakesSdxlShapesAndNamesTheLevelThatAvoidsUnfusedInt8Attention) {
  const Graph g = load_onnx(testing::data_dir() / "tiny_sdxl_random/unet/model.onnx");
  const Graph l4 = quantized_unet(g, 4);
  const LintReport r = lint_graph(l4, {});
  const auto shapes = findings_of(r, "sdxl-shapes");
  ASSERT_EQ(shapes.size(), 1u);
  EXPECT_NE(shapes[0]->message.find("sample=[2, 4, 128, 128]"), std::string::npos) << shapes[0]->message;
  EXPECT_NE(shapes[0]->message.find("encoder_hidden_states=[2, 77, 30]"), std::string::npos) << shapes[0]->message;
  // Self-attention over 64x64 = 4096 tokens (second level) and 32x32 = 1024 (third level, mid
  // block); cross-attention's S_q too.
  bool saw4096 = false, saw1024 = false;
  for (const auto* f : findings_of(r, "attention-int8")) {
    saw4096 |= f->message.find("S_q 4096") != std::string::npos;
    saw1024 |= f->message.find("S_q 1024") != std::string::npos;
  }
  EXPECT_TRUE(saw4096 && saw1024);
  const auto level = findings_of(r, "attention-int8-level");
  ASSERT_EQ(level.size(), 1u);
  EXPECT_NE(level[0]->message.find("longest sequences 4096, 1024"), std::string::npos) << level[0]->message;
  EXPECT_NE(level[0]->message.find("level 3 does not"), std::string::npos) << level[0]->message;
  EXPECT_NE(level[0]->fix.find("recipes/int8-level3.json"), std::string::npos) << level[0]->fix;

  // Level 3 leaves the attention matmuls in FP16: nothing to say about INT8 attention.
  const LintReport r3 = lint_graph(quantized_unet(g, 3), {});
  EXPECT_TRUE(findings_of(r3, "attention-int8").empty());
  EXPECT_TRUE(findings_of(r3, "attention-int8-level").empty());

  // --shape still wins: at 16x16 latents (128x128 images) every sequence is <= 512 tokens.
  LintOptions small;
  small.input_shapes = {{"sample", {2, 4, 16, 16}},
                        {"encoder_hidden_states", {2, 77, 30}},
                        {"text_embeds", {2, 18}},
                        {"time_ids", {2, 6}}};
  const LintReport rs = lint_graph(l4, small);
  EXPECT_TRUE(findings_of(rs, "sdxl-shapes").empty());
  for (const auto* f : findings_of(rs, "attention-int8"))
    EXPECT_EQ(f->message.find("exceeds 512"), std::string::npos) << f->message;
}

}  // namespace
}  // namespace qeval::eval::quant
