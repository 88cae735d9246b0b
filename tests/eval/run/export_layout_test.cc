// A quantized UNet export beside the FP16 one in an export folder (eval/pipelines/diffusers_folder.h),
// as the TensorRT demo (demo/Diffusion: unetxl-int8.l2.5..., unetxl_int8.l3.../model_optimized.onnx)
// and ModelOpt's diffusers example (--onnx-dir: model.onnx, output "latent") leave them: each such
// folder is a variant of the UNet, and a run config without "variants" (or `qeval run --pipeline`)
// runs the folder's models as the reference against each of them. The folder here is the untrained
// tiny-sdxl (tests/data/tiny_sdxl_random) with a Q/DQ UNet that `qeval calibrate` exported.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "eval/exec/onnx_export.h"
#include "eval/exec/onnx_import.h"
#include "eval/pipelines/pipeline_config.h"
#include "eval/pipelines/txt2img.h"
#include "test_util.h"

namespace qeval {
namespace {

namespace fs = std::filesystem;
using testing::run_qeval;

constexpr const char* kDemoInt8 = "unetxl_int8.l3.bs2.c1.p1.0.a0.8";  // the TensorRT demo's name for it

fs::path copy_sdxl(const testing::ScratchDir& dir) {
  const fs::path to = dir / "sdxl-export";
  fs::copy(testing::data_dir() / "tiny_sdxl_random", to, fs::copy_options::recursive);
  fs::remove_all(to / "reference");
  return to;
}

TEST(ExportLayout, UnetExportsBesideUnetAreItsVariantsNamedAfterTheirFolders) {
  testing::ScratchDir dir("layout-names");
  const fs::path sdxl = copy_sdxl(dir);
  const fs::path unet = sdxl / "unet" / "model.onnx";
  auto put = [&](const std::string& folder, const std::string& file) {
    fs::create_directories(sdxl / folder);
    fs::copy_file(unet, sdxl / folder / file);
  };
  put("unetxl_int8.l3.bs2.c32.p1.0.a0.8", "model_optimized.onnx");  // the demo since TensorRT 10.9
  put("unet-int8.l2.5.bs2.s30.c32.p1.0.a0.8", "model.onnx");        // the demo before
  put("unet_fp8", "model.onnx");                                    // ModelOpt's --onnx-dir, renamed
  put("unetish", "model.onnx");                                     // no separator after the name
  put("vae_decoder_int8", "model.onnx");                            // not the UNet
  fs::create_directories(sdxl / "unet.opt");                        // no model in it
  const eval::Txt2ImgConfig c = eval::read_txt2img_config(sdxl);
  EXPECT_EQ(c.variant_names(), (std::vector<std::string>{"unet-int8.l2.5.bs2.s30.c32.p1.0.a0.8", "unet_fp8",
                                                         "unetxl_int8.l3.bs2.c32.p1.0.a0.8"}));
  EXPECT_EQ(c.unet.file_for("unetxl_int8.l3.bs2.c32.p1.0.a0.8", "unet"),
            sdxl / "unetxl_int8.l3.bs2.c32.p1.0.a0.8" / "model_optimized.onnx");
  EXPECT_TRUE(c.text_encoder.variant_models.empty());
  EXPECT_TRUE(c.vae_decoder.variant_models.empty());
  // The plain export lists none.
  EXPECT_TRUE(eval::read_txt2img_config(testing::data_dir() / "tiny_sdxl_random").variant_names().empty());
}

// The Q/DQ UNet of `qeval calibrate`, its output renamed "latent" as ModelOpt and the TensorRT demo
// name it, placed beside unet/ as the demo names an INT8 level-3 UNet.
fs::path add_quantized_unet(const testing::ScratchDir& dir, const fs::path& sdxl, const fs::path& prompts) {
  const auto cal = run_qeval("calibrate --recipe " + (testing::source_dir() / "recipes/int8-level3.json").string() +
                             " --pipeline " + sdxl.string() + " --prompts " + prompts.string() +
                             " --steps 2 --no-cache --out " + (dir / "cal").string());
  EXPECT_EQ(cal.code, 0) << cal.out;
  eval::Graph g = eval::load_onnx(dir / "cal" / "quantized.onnx");
  EXPECT_EQ(g.outputs.size(), 1u);
  const std::string old_name = g.outputs[0].name;
  for (eval::Node& n : g.nodes)
    for (std::string& o : n.outputs)
      if (o == old_name) o = "latent";
  g.outputs[0].name = "latent";
  const fs::path folder = sdxl / kDemoInt8;
  fs::create_directories(folder);
  eval::save_onnx(g, folder / "model.onnx");
  return folder / "model.onnx";
}

TEST(ExportLayoutCli, AQuantizedUnetBesideTheFp16OneRunsAsAVariantWithNoVariantConfig) {
  testing::ScratchDir dir("layout-run");
  const fs::path sdxl = copy_sdxl(dir);
  const fs::path prompts =
      testing::write_text(dir, "p.txt", "a large green ring on the right on a gradient orange background\n");
  add_quantized_unet(dir, sdxl, prompts);

  // A run config that names the pipeline and no variants.
  const fs::path config = testing::write_text(
      dir, "c.json",
      R"({"pipeline": ")" + sdxl.string() + R"(", "prompts": ")" + prompts.string() + R"(", "steps": 2})");
  const auto r = run_qeval("run --config " + config.string() + " --out " + (dir / "out").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = testing::read_json(dir / "out/report.json");
  ASSERT_EQ(j["variants"].size(), 2u) << j["variants"].dump();
  EXPECT_EQ(j["variants"][0]["name"], "reference");
  EXPECT_EQ(j["variants"][1]["name"], kDemoInt8);
  EXPECT_EQ(j["config"]["reference_variant"], "reference");
  EXPECT_EQ(j["variants"][0]["quantized_nodes"], 0);
  EXPECT_GT(j["variants"][1]["quantized_nodes"].get<int>(), 0);  // its Q/DQ pairs
  // The variant is the Q/DQ UNet: a different image, per-layer error on the UNet's layers.
  ASSERT_EQ(j["samples"].size(), 1u);
  const auto& v = j["samples"][0]["results"][1];
  EXPECT_EQ(v["variant"], kDemoInt8);
  EXPECT_FALSE(v["identical"].get<bool>()) << v.dump();
  bool unet_layers = false;
  for (const auto& l : j["layers"]["nodes"]) unet_layers |= l["component"] == "unet";
  EXPECT_TRUE(unet_layers);
  EXPECT_NE(r.out.find(kDemoInt8), std::string::npos) << r.out;

  // `qeval run --pipeline`: the same two variants with no config at all (the folder's 50 steps).
  const auto p = run_qeval("run --pipeline " + sdxl.string() + " --prompts " + prompts.string() +
                           " --no-layers --out " + (dir / "out2").string());
  ASSERT_EQ(p.code, 0) << p.out;
  const auto k = testing::read_json(dir / "out2/report.json");
  ASSERT_EQ(k["variants"].size(), 2u);
  EXPECT_EQ(k["variants"][1]["name"], kDemoInt8);
  EXPECT_EQ(k["config"]["steps"], 50);
}

TEST(ExportLayoutCli, APipelineWithoutVariantsOfItsOwnNeedsThemGiven) {
  testing::ScratchDir dir("layout-none");
  const fs::path prompts = testing::write_text(dir, "p.txt", "a small red circle\n");
  const std::string sdxl = (testing::data_dir() / "tiny_sdxl_random").string();
  const auto r =
      run_qeval("run --pipeline " + sdxl + " --prompts " + prompts.string() + " --out " + (dir / "out").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("missing required key 'variants' (" + sdxl + " lists no variants of its own)"),
            std::string::npos)
      << r.out;
  const fs::path config = testing::write_text(dir, "c.json", R"({"pipeline": ")" + sdxl + R"(", "variants": []})");
  const auto both = run_qeval("run --pipeline " + sdxl + " --config " + config.string());
  EXPECT_EQ(both.code, 2) << both.out;
  EXPECT_NE(both.out.find("either --config or --pipeline"), std::string::npos) << both.out;
}

}  // namespace
}  // namespace qeval
