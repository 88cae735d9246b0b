// `qeval generate`: writes the library's image, is deterministic across --threads, and exits 2 with
// a precise message on bad input.
#include <gtest/gtest.h>

#include <fstream>

#include "datasets/image_io.h"
#include "datasets/npy.h"
#include "tiny_sd.h"

namespace qeval {
namespace {

using testing::run_qeval;
using testing::tiny_sd_dir;

const std::string kPrompt = "a large green ring on the right on a gradient orange background";

std::string generate_args(const std::string& extra) {
  return "generate --pipeline " + tiny_sd_dir().string() + " --prompt '" + kPrompt + "' " + extra;
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(GenerateCli, WritesTheSameImageAsTheLibraryForAnyThreadCount) {
  testing::ScratchDir dir("generate-cli");
  const auto r1 = run_qeval("--threads 1 " + generate_args("--seed 7 --steps 6 --out " + (dir / "a.png").string() +
                                                           " --save-latent " + (dir / "a.npy").string()));
  ASSERT_EQ(r1.code, 0) << r1.out;
  EXPECT_HAS(r1.out, "qeval generate: \"" + kPrompt + "\" seed 7 -> ");
  EXPECT_HAS(r1.out, "tiny-sd");
  EXPECT_HAS(r1.out, "ddim 6 steps, guidance 5, fp32");
  const auto r2 = run_qeval(generate_args("--seed 7 --steps 6 --out " + (dir / "b.png").string()));
  ASSERT_EQ(r2.code, 0) << r2.out;
  EXPECT_EQ(testing::read_bytes(dir / "a.png"), testing::read_bytes(dir / "b.png"));

  eval::Txt2ImgRequest req = eval::default_request(testing::tiny_sd().config, kPrompt, 7);
  req.steps = 6;
  const auto lib = eval::generate(testing::tiny_sd(), eval::Txt2ImgSessions::create(testing::tiny_sd()), req);
  EXPECT_EQ(testing::read_bytes(dir / "a.png"), datasets::encode_png(eval::image_to_rgb8(lib.image)));
  const Tensor latent = datasets::read_npy(dir / "a.npy");
  ASSERT_EQ(latent.shape(), lib.final_latent.shape());
  EXPECT_EQ(std::memcmp(latent.raw(), lib.final_latent.raw(), latent.nbytes()), 0);

  // Options change the image.
  const auto r3 =
      run_qeval(generate_args("--seed 7 --steps 6 --scheduler euler --guidance 3 --negative-prompt 'a red circle' "
                              "--precision fp16 --out " +
                              (dir / "c.png").string()));
  ASSERT_EQ(r3.code, 0) << r3.out;
  EXPECT_HAS(r3.out, "euler 6 steps, guidance 3, fp16");
  EXPECT_NE(testing::read_bytes(dir / "a.png"), testing::read_bytes(dir / "c.png"));
  // --noise replaces the seed's noise.
  const auto r4 = run_qeval(generate_args("--seed 99 --steps 6 --noise " +
                                          (testing::data_dir() / "tiny_sd" / "ref0_noise.npy").string() + " --out " +
                                          (dir / "d.png").string()));
  ASSERT_EQ(r4.code, 0) << r4.out;
  EXPECT_EQ(testing::read_bytes(dir / "a.png"), testing::read_bytes(dir / "d.png"));  // ref0's seed is 7
}

TEST(GenerateCli, BadInputExitsTwoWithAPreciseMessage) {
  testing::ScratchDir dir("generate-cli-bad");
  const std::string out = " --out " + (dir / "x.png").string();
  auto expect_error = [&](const std::string& args, const std::string& part) {
    const auto r = run_qeval(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_HAS(r.out, part);
    EXPECT_FALSE(std::filesystem::exists(dir / "x.png")) << args;
  };
  expect_error("generate --pipeline " + tiny_sd_dir().string() + " --prompt '' --steps 2" + out, "the prompt is empty");
  expect_error(generate_args("--steps 0" + out), "0 inference steps asked");
  expect_error(generate_args("--steps many" + out), "--steps");
  expect_error(generate_args("--scheduler pndm" + out), "--scheduler");
  expect_error(generate_args("--precision int8" + out), "--precision");
  expect_error(generate_args("--noise " + (dir / "none.npy").string() + out), "none.npy");
  expect_error(generate_args("--variant int8" + out), "no model lists a variant 'int8' (no variants)");
  expect_error("generate --pipeline " + (dir / "nowhere").string() + " --prompt x" + out, "nowhere: no such file");
  expect_error("generate --pipeline " + (testing::source_dir() / "models" / "tiny-sam").string() + " --prompt x" + out,
               "task is \"segmentation\"; `qeval generate` runs \"txt2img\" pipelines");
  expect_error(generate_args("--steps 2 --out " + (dir / "missing-folder" / "x.png").string()),
               "missing-folder does not exist");

  // A pipeline folder whose UNet file is missing, and one with a broken pipeline.json.
  std::filesystem::create_directories(dir / "p");
  for (const auto& e : std::filesystem::directory_iterator(tiny_sd_dir()))
    if (e.path().filename() != "unet.onnx")
      std::filesystem::copy(e.path(), dir / "p" / e.path().filename(), std::filesystem::copy_options::recursive);
  expect_error("generate --pipeline " + (dir / "p").string() + " --prompt x" + out,
               "pipeline.json: unet.model: no such file: " + (dir / "p" / "unet.onnx").string());
  std::ofstream(dir / "p" / "pipeline.json")
      << "{\"format\": \"qeval.pipeline\", \"version\": 1, \"task\": \"txt2img\"}";
  expect_error("generate --pipeline " + (dir / "p").string() + " --prompt x" + out, "missing required key 'tokenizer'");
}

}  // namespace
}  // namespace qeval
