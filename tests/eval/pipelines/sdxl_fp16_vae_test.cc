// An Optimum SDXL export made with `--fp16` has a float16 vae_decoder; diffusers' SDXL pipeline
// upcasts a VAE whose config says force_upcast (vae.to(float32)), so qeval runs that export widened
// to float32 (eval/exec/widen.h) and says so. In a non-SDXL pipeline.json force_upcast is refused.
// The FP16 VAE here is tests/data/tiny_sdxl_random's with its float initializers and I/O narrowed
// to float16, as torch's .half() export writes it (Resize's scales stay float, as ONNX requires).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "eval/exec/onnx_export.h"
#include "eval/exec/onnx_import.h"
#include "eval/exec/widen.h"
#include "eval/input_error.h"
#include "eval/pipelines/txt2img.h"
#include "kernels/numeric.h"
#include "metrics/tensor_error.h"
#include "sdxl.h"
#include "test_util.h"

namespace qeval {
namespace {

namespace fs = std::filesystem;
using namespace eval;

Tensor narrowed(const Tensor& t) {
  Tensor out(DType::kFloat16, t.shape());
  auto* bits = reinterpret_cast<std::uint16_t*>(out.raw());
  for (std::int64_t i = 0; i < t.numel(); ++i) bits[i] = to_float16(t.data<float>()[i]).bits;
  return out;
}

// The fixture copied, its VAE decoder in float16; `force_upcast` written into its config.
fs::path fp16_vae_export(const testing::ScratchDir& dir, bool force_upcast) {
  const fs::path to = dir / "sdxl-fp16";
  fs::copy(testing::tiny_sdxl_random_dir(), to, fs::copy_options::recursive);
  fs::remove_all(to / "reference");
  Graph g = load_onnx(to / "vae_decoder" / "model.onnx");
  std::set<std::string> keep;  // Resize's roi and scales are float32 by definition
  for (const Node& n : g.nodes)
    if (n.op_type == "Resize")
      for (std::size_t i = 1; i < n.inputs.size() && i < 3; ++i) keep.insert(n.inputs[i]);
  for (auto& [name, t] : g.initializers)
    if (t.dtype() == DType::kFloat32 && !keep.count(name)) t = narrowed(t);
  for (auto* values : {&g.inputs, &g.outputs})
    for (ValueInfo& v : *values) v.dtype = DType::kFloat16;
  EXPECT_TRUE(declares_narrow_floats(g));
  save_onnx(g, to / "vae_decoder" / "model.onnx");
  std::string config = testing::read_text(to / "vae_decoder" / "config.json");
  const std::string key = "\"force_upcast\": true";
  const auto at = config.find(key);
  EXPECT_NE(at, std::string::npos);
  config.replace(at, key.size(), force_upcast ? key : "\"force_upcast\": false");
  std::ofstream(to / "vae_decoder" / "config.json") << config;
  return to;
}

bool all_finite(const Tensor& t) {
  return std::all_of(t.data<float>(), t.data<float>() + t.numel(), [](float v) { return std::isfinite(v); });
}

TEST(SdxlFp16Vae, AnFp16ExportUnderForceUpcastRunsWidenedToFp32) {
  testing::ScratchDir dir("sdxl-fp16-vae");
  const fs::path folder = fp16_vae_export(dir, true);
  const Txt2ImgModels models = Txt2ImgModels::load(folder);
  EXPECT_TRUE(models.vae_decoder_widened);
  EXPECT_FALSE(declares_narrow_floats(*models.vae_decoder));
  EXPECT_EQ(find_value(models.vae_decoder->inputs, "latent_sample")->dtype, DType::kFloat32);

  Txt2ImgRequest req = default_request(models.config, "a small red circle", 3);
  req.steps = 2;
  const Txt2ImgResult r = generate(models, Txt2ImgSessions::create(models), req);
  EXPECT_TRUE(all_finite(r.image));
  // The FP32 export's image, up to its weights' rounding to float16.
  const Txt2ImgResult fp32 =
      generate(testing::tiny_sdxl_random(), Txt2ImgSessions::create(testing::tiny_sdxl_random()), req);
  const auto err = metrics::tensor_error(fp32.image, r.image);
  EXPECT_EQ(err.diverged, 0);
  ASSERT_TRUE(err.sqnr_db.has_value());
  EXPECT_GT(*err.sqnr_db, 30.0);

  // Without force_upcast the export runs as written (float16 values rounded where declared) and
  // overflows, as diffusers' FP16 VAE would: what force_upcast avoids.
  testing::ScratchDir dir2("sdxl-fp16-vae-as-written");
  const Txt2ImgModels written = Txt2ImgModels::load(fp16_vae_export(dir2, false));
  EXPECT_FALSE(written.vae_decoder_widened);
  EXPECT_TRUE(declares_narrow_floats(*written.vae_decoder));
  const Txt2ImgSessions s = Txt2ImgSessions::create(written);
  const Tensor overflowed = decode_latent(written, *s.vae_decoder, r.final_latent);
  EXPECT_GT(metrics::tensor_error(r.image, overflowed).diverged, 0);
}

// `qeval run` on the folder says, in report.json's settings, that the VAE export was widened; every
// variant's image is finite.
TEST(SdxlFp16VaeCli, TheRunReportSaysTheFp16VaeWasWidened) {
  testing::ScratchDir dir("sdxl-fp16-vae-run");
  const fs::path folder = fp16_vae_export(dir, true);
  const fs::path prompts = testing::write_text(dir, "p.txt", "a small red circle\n");
  const fs::path config = testing::write_text(
      dir, "c.json", R"({"pipeline": ")" + folder.string() + R"(", "prompts": ")" + prompts.string() + R"(", "steps": 1,
      "variants": [{"name": "fp32"}, {"name": "fp16", "precision": "fp16"}]})");
  const auto r = testing::run_qeval("run --config " + config.string() + " --no-layers --out " + (dir / "out").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = testing::read_json(dir / "out/report.json");
  std::string vae;
  for (const auto& s : j["config"]["settings"])
    if (s["key"] == "vae_decoder") vae = s["value"].get<std::string>();
  EXPECT_NE(vae.find("fp32 in every variant"), std::string::npos) << vae;
  EXPECT_NE(vae.find("float16 export widened to float32"), std::string::npos) << vae;
  EXPECT_TRUE(j["nonfinite"].empty()) << j["nonfinite"].dump();
}

// diffusers' SD pipelines never read force_upcast: a pipeline.json without text_encoder_2 that
// sets it is refused, naming the file and key (it was accepted and ignored).
TEST(SdxlFp16Vae, ForceUpcastInAnSdPipelineJsonIsRefused) {
  testing::ScratchDir dir("sd-force-upcast");
  std::string text = testing::read_text(testing::source_dir() / "models/tiny-sd/pipeline.json");
  const std::string key = "\"scaling_factor\": 0.814783";
  const auto at = text.find(key);
  ASSERT_NE(at, std::string::npos);
  text.insert(at + key.size(), ", \"force_upcast\": true");
  const fs::path file = testing::write_text(dir, "pipeline.json", text);
  const std::string e = testing::input_error([&] { read_txt2img_config(file); });
  EXPECT_NE(e.find(file.string()), std::string::npos) << e;
  EXPECT_NE(e.find("vae_decoder.force_upcast"), std::string::npos) << e;
  EXPECT_NE(e.find("only an SDXL pipeline"), std::string::npos) << e;
  // false changes nothing and stays accepted.
  std::string off = text;
  off.replace(off.find("\"force_upcast\": true"), 22, "\"force_upcast\": false");
  testing::write_text(dir, "pipeline.json", off);
  EXPECT_EQ(testing::input_error([&] { read_txt2img_config(file); }), "");
}

}  // namespace
}  // namespace qeval
