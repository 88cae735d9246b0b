// `qeval segment` as users run it: mask PNG out, predicted IoU and IoU against --ref-mask printed,
// exit 2 with the reason on bad input.
#include <gtest/gtest.h>

#include "datasets/mask_io.h"
#include "datasets/npy.h"
#include "datasets/scenes.h"
#include "metrics/segmentation.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

struct SceneFiles {
  testing::ScratchDir dir{"segment-cli"};
  std::string image, mask, args;
  SceneFiles() {
    datasets::Scene s = datasets::generate_scene(0x5EED5A, 1);  // objects at (52, 52) and (33, 56)
    testing::write_bytes(dir / "scene.png", datasets::encode_png(s.image));
    Tensor m(DType::kUInt8, {64, 64});
    for (int i = 0; i < 64 * 64; ++i) m.data<std::uint8_t>()[i] = s.masks[1][std::size_t(i)] ? 1 : 0;
    testing::write_bytes(dir / "ref.png", datasets::encode_png(datasets::mask_image(m)));
    image = (dir / "scene.png").string();
    mask = (dir / "ref.png").string();
    args = "segment --pipeline " + (testing::source_dir() / "models" / "tiny-sam").string() + " --image " + image;
  }
};

// The README's example runs as written: the image and reference mask it names ship in samples/.
TEST(SegmentCli, TheReadmeExampleRunsOnTheShippedSample) {
  const std::filesystem::path src = testing::source_dir();
  const std::string readme = testing::read_text(src / "README.md");
  const std::size_t a = readme.find("build/qeval segment ");
  ASSERT_NE(a, std::string::npos);
  std::string cmd = readme.substr(a, readme.find("```", a) - a);
  for (std::size_t k; (k = cmd.find("\\\n")) != std::string::npos;) cmd.replace(k, 2, " ");
  while (!cmd.empty() && (cmd.back() == '\n' || cmd.back() == ' ')) cmd.pop_back();
  testing::ScratchDir dir("segment-readme");
  auto replace = [&](const std::string& from, const std::string& to) {
    const std::size_t k = cmd.find(from);
    ASSERT_NE(k, std::string::npos) << from << " not in: " << cmd;
    cmd.replace(k, from.size(), to);
  };
  replace("build/qeval ", "");
  replace(" models/", " " + (src / "models").string() + "/");
  replace("--image samples/", "--image " + (src / "samples").string() + "/");
  replace("--ref-mask samples/", "--ref-mask " + (src / "samples").string() + "/");
  replace("--out mask.png", "--out " + (dir / "mask.png").string());
  const auto r = testing::run_qeval(cmd);
  ASSERT_EQ(r.code, 0) << cmd << "\n" << r.out;
  EXPECT_NE(r.out.find("IoU vs " + (src / "samples/segment/ref.png").string() + " 0.9"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir / "mask.png"));
}

TEST(SegmentCli, WritesTheMaskAndScoresIt) {
  SceneFiles f;
  auto out = f.dir / "out" / "mask.png";
  std::filesystem::create_directories(out.parent_path());
  auto r = testing::run_qeval(f.args + " --point 33,56 --point 52,52,0 --out " + out.string() + " --ref-mask " +
                              f.mask + " --logits " + (f.dir / "logits.npy").string() + " --threads 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("qeval segment: tiny-sam (fp32), " + f.image + " 64x64, 2 points"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("predicted IoU 0."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("IoU vs " + f.mask + " 0.9"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("boundary F "), std::string::npos) << r.out;
  Tensor written = datasets::load_mask(out);
  Tensor ref = datasets::load_mask(f.mask);
  EXPECT_GE(metrics::mask_iou(ref, written).iou, 0.9);
  // The PNG is the logits thresholded at 0.
  Tensor logits = datasets::read_npy(f.dir / "logits.npy");
  ASSERT_EQ(logits.shape(), (Shape{64, 64}));
  Tensor from_logits = metrics::threshold_mask(logits, 0.0f);
  EXPECT_EQ(std::memcmp(from_logits.raw(), written.raw(), written.nbytes()), 0);

  // fp16: a variant, the same object.
  auto h = testing::run_qeval(f.args + " --point 33,56 --out " + (f.dir / "h.png").string() + " --precision fp16");
  ASSERT_EQ(h.code, 0) << h.out;
  EXPECT_NE(h.out.find("tiny-sam (fp16)"), std::string::npos) << h.out;
  EXPECT_GE(metrics::mask_iou(ref, datasets::load_mask(f.dir / "h.png")).iou, 0.9);
}

TEST(SegmentCli, BadInputExitsTwoWithTheReason) {
  SceneFiles f;
  const std::string out = " --out " + (f.dir / "m.png").string();
  auto expect = [&](const std::string& args, const std::string& want) {
    auto r = testing::run_qeval(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << "want: " << want << "\ngot: " << r.out;
  };
  expect(f.args + " --point 64,10" + out,
         "--point '64,10' lies outside " + f.image + " (64x64: X in [0, 64), Y in [0, 64))");
  expect(f.args + " --point 3,-1" + out, "--point '3,-1' lies outside");
  expect(f.args + " --point 3,4,2" + out, "--point '3,4,2': label '2' is not 0 or 1");
  expect(f.args + " --point 3" + out, "--point '3': needs 2 or 3 comma-separated values");
  expect(f.args + " --point 3,y" + out, "--point '3,y': Y 'y' is not a number");
  expect(f.args + out, "--point is required");
  expect(f.args + " --point 3,4 --out " + (f.dir / "m.png").string() + " --precision int3", "--precision");
  expect("segment --pipeline " + (testing::source_dir() / "models" / "tiny-sam").string() + " --image " +
             (f.dir / "nope.png").string() + " --point 3,4" + out,
         "nope.png");
  expect("segment --pipeline " + f.dir.path().string() + " --image " + f.image + " --point 3,4" + out,
         "pipeline.json: no such file");
  expect(f.args + " --point 3,4 --ref-mask " + f.image + out, "not a mask: pixel");
  Tensor small(DType::kUInt8, {8, 8});
  testing::write_bytes(f.dir / "small.png", datasets::encode_png(datasets::mask_image(small)));
  expect(f.args + " --point 3,4 --ref-mask " + (f.dir / "small.png").string() + out,
         "the mask is 8x8 but the image " + f.image + " is 64x64");
  EXPECT_FALSE(std::filesystem::exists(f.dir / "m.png"));
}

}  // namespace
}  // namespace qeval::eval
