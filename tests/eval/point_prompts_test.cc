// Point-prompt sets (JSON Lines): parsing, precise errors, loading images, scenes and masks.
#include <gtest/gtest.h>

#include <cstring>

#include "datasets/mask_io.h"
#include "datasets/scenes.h"
#include "eval/pipelines/point_prompts.h"
#include "kernels/error.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

std::string parse_error(const std::string& text) {
  try {
    parse_point_prompts(text, "/data/set.jsonl");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(PointPrompts, ParsesImagesScenesPointsAndMasks) {
  auto set = parse_point_prompts(
      "{\"id\": \"dog\", \"image\": \"img/dog.png\", \"points\": [[10, 20], [30.5, 4, 0]], \"mask\": \"m/dog.png\"}\n"
      "\n"
      "{\"scene\": {\"seed\": 6221146, \"index\": 3}, \"points\": [[5, 6, 1]], \"mask\": {\"object\": 1}}\r\n"
      "{\"scene\": {\"seed\": 18446744073709551615, \"index\": 0, \"size\": 128}, \"points\": [[0, 0]]}\n",
      "/data/set.jsonl");
  ASSERT_EQ(set.prompts.size(), 3u);
  const auto& a = set.prompts[0];
  EXPECT_EQ(a.id, "dog");
  EXPECT_EQ(a.line, 1);
  EXPECT_EQ(a.image, std::filesystem::path("/data/img/dog.png"));
  EXPECT_EQ(a.mask, std::filesystem::path("/data/m/dog.png"));
  ASSERT_EQ(a.points.size(), 2u);
  EXPECT_EQ(a.points[0].label, 1);  // default: foreground
  EXPECT_EQ(a.points[1].x, 30.5);
  EXPECT_EQ(a.points[1].label, 0);
  EXPECT_TRUE(a.has_reference_mask());
  const auto& b = set.prompts[1];
  EXPECT_EQ(b.id, "line 3");
  ASSERT_TRUE(b.scene.has_value());
  EXPECT_EQ(b.scene->seed, 6221146u);
  EXPECT_EQ(b.scene->size, 64);
  EXPECT_EQ(b.scene_object, 1);
  EXPECT_EQ(set.prompts[2].scene->seed, 18446744073709551615ull);
  EXPECT_FALSE(set.prompts[2].has_reference_mask());
  EXPECT_NE(b.image_key(), set.prompts[2].image_key());
  EXPECT_EQ(b.where("/data/set.jsonl"), "/data/set.jsonl:3 (id line 3)");
}

TEST(PointPrompts, ErrorsNameTheLineTheKeyAndTheRule) {
  auto expect = [](const std::string& text, const std::string& want) {
    std::string got = parse_error(text);
    EXPECT_NE(got.find(want), std::string::npos) << "want: " << want << "\ngot: " << got;
  };
  const std::string ok = "{\"image\": \"a.png\", \"points\": [[1, 2]]}\n";
  expect(ok + "{\"image\": \"a.png\", \"points\": [[1, 2]]\n", "/data/set.jsonl:2: not valid JSON");
  expect(ok + "[1, 2]\n", "/data/set.jsonl:2: the file must hold a JSON object");
  expect("{\"image\": \"a.png\", \"point\": [[1, 2]]}",
         "/data/set.jsonl:1: unknown key 'point' (valid keys: id, image, scene, points, mask)");
  expect("{\"points\": [[1, 2]]}", ":1: give exactly one of 'image' (a file) or 'scene'");
  expect("{\"image\": \"a.png\", \"scene\": {\"seed\": 1, \"index\": 2}, \"points\": [[1, 2]]}", "give exactly one of");
  expect("{\"image\": \"a.png\"}", ":1: missing required key 'points'");
  expect("{\"image\": \"a.png\", \"points\": []}", ":1: points: must be a non-empty array");
  expect("{\"image\": \"a.png\", \"points\": [[1, 2], [3]]}",
         ":1: points[1]: a point is [x, y] or [x, y, label], got [3]");
  expect("{\"image\": \"a.png\", \"points\": [[1, 2, 2]]}",
         "points[0]: label must be 1 (foreground) or 0 (background), got 2");
  expect("{\"image\": \"a.png\", \"points\": [[1, 2, -1]]}", "label must be 1 (foreground) or 0 (background), got -1");
  expect("{\"image\": \"a.png\", \"points\": [[-1, 2]]}",
         "points[0]: x must be a non-negative number (pixels), got -1");
  expect("{\"image\": \"a.png\", \"points\": [[1, \"2\"]]}", "y must be a non-negative number (pixels), got \"2\"");
  expect("{\"scene\": {\"seed\": -4, \"index\": 2}, \"points\": [[1, 2]]}",
         ":1: scene.seed: must be a non-negative integer");
  expect("{\"scene\": {\"seed\": 1, \"index\": 2, \"size\": 8}, \"points\": [[1, 2]]}",
         "scene.size: must be in [16, 1024]");
  expect("{\"scene\": {\"seed\": 1, \"idx\": 2}, \"points\": [[1, 2]]}", "scene: unknown key 'idx'");
  expect("{\"image\": \"a.png\", \"points\": [[1, 2]], \"mask\": {\"object\": 0}}",
         "mask: {\"object\": k} names an object of a scene; this prompt has an image file");
  expect("{\"scene\": {\"seed\": 1, \"index\": 2}, \"points\": [[1, 2]], \"mask\": {\"object\": 3}}",
         "mask.object: must be 0, 1 or 2");
  expect("{\"image\": \"a.png\", \"points\": [[1, 2]], \"mask\": 7}", "mask: must be a mask file or {\"object\": k}");
  expect(
      "{\"id\": \"x\", \"image\": \"a.png\", \"points\": [[1, 2]]}\n{\"id\": \"x\", \"image\": \"b.png\", \"points\": "
      "[[1, 2]]}",
      "/data/set.jsonl:2: id: 'x' was already used on line 1");
  // Ids name image folders in a run: a/b and A:b would share images/a_b/ (case ignored).
  expect(
      "{\"id\": \"a/b\", \"image\": \"a.png\", \"points\": [[1, 2]]}\n{\"id\": \"A:b\", \"image\": \"b.png\", "
      "\"points\": [[1, 2]]}",
      "/data/set.jsonl:2: id: 'A:b' and 'a/b' (line 1) both give the image folder name 'A_b'");
  expect("\n\n", "/data/set.jsonl: no prompts");
  try {
    read_point_prompts("/nonexistent/set.jsonl");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/set.jsonl: no such file"), std::string::npos);
  }
}

TEST(PointPrompts, LoadsImagesScenesAndReferenceMasks) {
  testing::ScratchDir dir("point-prompts");
  datasets::Scene scene = datasets::generate_scene(0x5EED5A, 1);
  testing::write_bytes(dir / "scene.png", datasets::encode_png(scene.image));
  Tensor m(DType::kUInt8, {64, 64});
  for (int i = 0; i < 64 * 64; ++i) m.data<std::uint8_t>()[i] = scene.masks[1][std::size_t(i)] ? 1 : 0;
  testing::write_bytes(dir / "mask.png", datasets::encode_png(datasets::mask_image(m)));
  Tensor small(DType::kUInt8, {32, 64});
  testing::write_bytes(dir / "small.png", datasets::encode_png(datasets::mask_image(small)));
  auto set = parse_point_prompts(
      "{\"id\": \"file\", \"image\": \"scene.png\", \"points\": [[33, 56]], \"mask\": \"mask.png\"}\n"
      "{\"id\": \"scene\", \"scene\": {\"seed\": 6221146, \"index\": 1}, \"points\": [[33, 56]], \"mask\": "
      "{\"object\": 1}}\n"
      "{\"id\": \"no-object\", \"scene\": {\"seed\": 6221146, \"index\": 1}, \"points\": [[3, 5]], \"mask\": "
      "{\"object\": 2}}\n"
      "{\"id\": \"outside\", \"scene\": {\"seed\": 6221146, \"index\": 1}, \"points\": [[3, 64.5]]}\n"
      "{\"id\": \"small\", \"image\": \"scene.png\", \"points\": [[3, 5]], \"mask\": \"small.png\"}\n"
      "{\"id\": \"missing\", \"image\": \"missing.png\", \"points\": [[3, 5]]}\n",
      dir / "set.jsonl");
  PromptInputs file = load_prompt_inputs(set.prompts[0], set.source, 3);
  PromptInputs gen = load_prompt_inputs(set.prompts[1], set.source, 3);
  ASSERT_EQ(file.planes.shape(), (Shape{3, 64, 64}));
  EXPECT_EQ(std::memcmp(file.planes.raw(), gen.planes.raw(), file.planes.nbytes()), 0);
  EXPECT_EQ(std::memcmp(file.mask->raw(), gen.mask->raw(), file.mask->nbytes()), 0);
  EXPECT_EQ(set.prompts[0].image_key(), set.prompts[4].image_key());
  auto error = [&](std::size_t i) -> std::string {
    try {
      load_prompt_inputs(set.prompts[i], set.source, 3);
    } catch (const InputError& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_NE(error(2).find("set.jsonl:3 (id no-object): mask object 2 but scene 1 of seed 6221146 has 2 object(s)"),
            std::string::npos)
      << error(2);
  EXPECT_NE(error(3).find("set.jsonl:4 (id outside): point 1 (3, 64.5) lies outside the 64x64 image"),
            std::string::npos)
      << error(3);
  EXPECT_NE(error(4).find("set.jsonl:5 (id small): the reference mask is 64x32 but the image is 64x64"),
            std::string::npos)
      << error(4);
  EXPECT_NE(error(5).find("set.jsonl:6 (id missing): "), std::string::npos) << error(5);
  EXPECT_NE(error(5).find("missing.png"), std::string::npos) << error(5);
}

TEST(PointPrompts, ShippedTinySamSetsReadAndLoad) {
  for (const char* name : {"tiny_sam_eval.jsonl", "tiny_sam_calib.jsonl"}) {
    auto set = read_point_prompts(testing::source_dir() / "datasets" / "point_prompts" / name);
    EXPECT_GE(set.prompts.size(), 100u) << name;
    for (const auto& p : set.prompts) {
      ASSERT_TRUE(p.scene.has_value()) << name;
      ASSERT_GE(p.scene_object, 0) << name;
    }
    // The reference mask holds the positive point (the object's pixel nearest its centroid).
    const auto& first = set.prompts.front();
    PromptInputs in = load_prompt_inputs(first, set.source, 3);
    const auto& pt = first.points[0];
    EXPECT_EQ(in.mask->data<std::uint8_t>()[std::size_t(pt.y) * 64 + std::size_t(pt.x)], 1) << name;
  }
}

}  // namespace
}  // namespace qeval::eval
