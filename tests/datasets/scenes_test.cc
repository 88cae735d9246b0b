// Synthetic scenes: pixel-, mask- and caption-exact agreement with tools/scenes.py's goldens,
// the PRNG's reference values, determinism, grammar round trips and caption parsing errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "datasets/scenes.h"
#include "kernels/error.h"
#include "test_util.h"

namespace qeval::datasets {
namespace {

using testing::data_dir;

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  for (std::string field; std::getline(ss, field, '\t');) out.push_back(field);
  return out;
}

struct GoldenCase {
  std::uint64_t seed, index;
  SceneOptions options;
  std::string file, objects, caption, points;
};

std::vector<GoldenCase> golden_cases() {
  std::ifstream in(data_dir() / "scenes" / "scenes.tsv");
  std::vector<GoldenCase> cases;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto f = split_tabs(line);
    if (f.size() != 9) throw std::runtime_error("bad scenes.tsv line: " + line);
    cases.push_back({std::stoull(f[0]),
                     std::stoull(f[1]),
                     {std::stoi(f[2]), std::stoi(f[3]), std::stoi(f[4])},
                     f[5],
                     f[6],
                     f[7],
                     f[8]});
  }
  return cases;
}

std::string objects_field(const SceneDescription& d) {
  std::string s;
  for (const SceneObject& o : d.objects) {
    if (!s.empty()) s += ';';
    s += std::to_string(static_cast<int>(o.shape)) + ',' + std::to_string(static_cast<int>(o.color)) + ',' +
         std::to_string(static_cast<int>(o.size)) + ',' + std::to_string(o.cell) + ',' + std::to_string(o.center_x) +
         ',' + std::to_string(o.center_y) + ',' + std::to_string(o.radius);
  }
  return s;
}

TEST(SplitMix64, MatchesReferenceSequence) {
  // Reference values of splitmix64 seeded with 0 (Vigna's splitmix64.c).
  SplitMix64 rng(0);
  EXPECT_EQ(rng.next(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(rng.next(), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(rng.next(), 0x06C45D188009454Full);
}

TEST(SplitMix64, UniformStaysInRange) {
  SplitMix64 rng(42);
  std::vector<int> hits(7);
  for (int i = 0; i < 7000; ++i) {
    const auto v = rng.uniform(7);
    ASSERT_LT(v, 7u);
    ++hits[v];
  }
  for (int h : hits) EXPECT_GT(h, 800);
}

TEST(Scenes, MatchPythonGoldensExactly) {
  const auto cases = golden_cases();
  ASSERT_EQ(cases.size(), 20u);
  for (const GoldenCase& c : cases) {
    SCOPED_TRACE(c.file);
    const Scene s = generate_scene(c.seed, c.index, c.options);
    EXPECT_EQ(s.description.caption, c.caption);
    EXPECT_EQ(objects_field(s.description), c.objects);
    std::string points;
    for (const auto& p : scene_object_points(s)) {
      if (!points.empty()) points += ';';
      points += std::to_string(p[0]) + ',' + std::to_string(p[1]);
    }
    EXPECT_EQ(points, c.points);

    const Image golden = load_image(data_dir() / "scenes" / (c.file + ".png"));
    ASSERT_EQ(golden.channels(), 3);
    ASSERT_EQ(golden.width(), c.options.size);
    ASSERT_EQ(golden.height(), c.options.size);
    const auto* g = golden.planes.data<float>();
    const std::size_t plane = std::size_t(c.options.size) * c.options.size;
    int diffs = 0;
    for (std::size_t p = 0; p < plane; ++p)
      for (int k = 0; k < 3; ++k) diffs += s.image.pixels[3 * p + k] != static_cast<std::uint8_t>(g[k * plane + p]);
    EXPECT_EQ(diffs, 0);

    const Image bits = load_image(data_dir() / "scenes" / (c.file + "_masks.png"));
    ASSERT_EQ(bits.channels(), 1);
    const auto* b = bits.planes.data<float>();
    ASSERT_EQ(s.masks.size(), s.description.objects.size());
    int mask_diffs = 0;
    for (std::size_t i = 0; i < s.masks.size(); ++i)
      for (std::size_t p = 0; p < plane; ++p) mask_diffs += (s.masks[i][p] != 0) != ((static_cast<int>(b[p]) >> i) & 1);
    EXPECT_EQ(mask_diffs, 0);
  }
}

TEST(Scenes, DeterministicAndDistinct) {
  const Scene a = generate_scene(7, 3), b = generate_scene(7, 3), c = generate_scene(7, 4);
  EXPECT_EQ(a.description.caption, b.description.caption);
  EXPECT_EQ(a.image.pixels, b.image.pixels);
  EXPECT_EQ(a.masks, b.masks);
  EXPECT_NE(a.image.pixels, c.image.pixels);
}

TEST(Scenes, InvariantsOverManyScenes) {
  std::set<int> counts;
  for (std::uint64_t i = 0; i < 300; ++i) {
    const SceneDescription d = describe_scene(99, i);
    ASSERT_GE(d.objects.size(), 1u);
    ASSERT_LE(d.objects.size(), 3u);
    counts.insert(static_cast<int>(d.objects.size()));
    std::set<int> cells;
    for (const SceneObject& o : d.objects) {
      EXPECT_NE(o.color, d.background) << d.caption;
      EXPECT_TRUE(cells.insert(o.cell).second) << "two objects share a cell: " << d.caption;
    }
  }
  EXPECT_EQ(counts.size(), 3u);
  // Every object is visible: its mask is non-empty and its pixels carry its color.
  for (std::uint64_t i = 0; i < 40; ++i) {
    const Scene s = generate_scene(5, i);
    for (std::size_t k = 0; k < s.masks.size(); ++k) {
      int on = 0;
      for (auto m : s.masks[k]) on += m != 0;
      EXPECT_GT(on, 20) << s.description.caption;
      // The point prompt lies on the object's own mask.
      const auto p = scene_object_points(s)[k];
      EXPECT_NE(s.masks[k][std::size_t(p[1]) * 64 + p[0]], 0) << s.description.caption;
    }
  }
}

TEST(Scenes, OptionsControlObjectCountAndSize) {
  for (std::uint64_t i = 0; i < 50; ++i) {
    const Scene s = generate_scene(3, i, {.size = 48, .min_objects = 2, .max_objects = 2});
    EXPECT_EQ(s.description.objects.size(), 2u);
    EXPECT_EQ(s.image.width, 48);
    EXPECT_EQ(s.image.pixels.size(), 48u * 48u * 3u);
  }
  EXPECT_THROW(describe_scene(1, 1, {.size = 8}), InputError);
  EXPECT_THROW(describe_scene(1, 1, {.size = 2048}), InputError);
  EXPECT_THROW(describe_scene(1, 1, {.size = 64, .min_objects = 2, .max_objects = 1}), InputError);
  EXPECT_THROW(describe_scene(1, 1, {.size = 64, .min_objects = 1, .max_objects = 4}), InputError);
}

TEST(SceneCaptions, GrammarExamples) {
  SceneObject a{SceneShape::kCircle, SceneColor::kRed, SceneSize::kSmall, 0};
  SceneObject b{SceneShape::kSquare, SceneColor::kBlue, SceneSize::kMedium, 4};
  SceneObject c{SceneShape::kRing, SceneColor::kOrange, SceneSize::kMedium, 8};
  EXPECT_EQ(scene_caption({a, b}, BackgroundStyle::kStriped, SceneColor::kYellow),
            "a small red circle at the top left and a blue square in the center on a striped yellow background");
  EXPECT_EQ(scene_caption({c}, BackgroundStyle::kPlain, SceneColor::kWhite),
            "an orange ring at the bottom right on a plain white background");
  EXPECT_EQ(scene_caption({b, a, c}, BackgroundStyle::kGradient, SceneColor::kBlack),
            "a blue square in the center, a small red circle at the top left and an orange ring at the bottom "
            "right on a gradient black background");
}

TEST(SceneCaptions, ParseInvertsTheGrammar) {
  for (std::uint64_t i = 0; i < 500; ++i) {
    const SceneDescription d = describe_scene(11, i);
    const ParsedCaption p = parse_scene_caption(d.caption);
    ASSERT_EQ(p.objects.size(), d.objects.size()) << d.caption;
    EXPECT_EQ(p.style, d.style);
    EXPECT_EQ(p.background, d.background);
    for (std::size_t k = 0; k < p.objects.size(); ++k) {
      EXPECT_EQ(p.objects[k].shape, d.objects[k].shape) << d.caption;
      EXPECT_EQ(p.objects[k].color, d.objects[k].color) << d.caption;
      EXPECT_EQ(p.objects[k].size, d.objects[k].size) << d.caption;
      EXPECT_EQ(p.objects[k].cell, d.objects[k].cell) << d.caption;
    }
  }
  // Case and whitespace do not matter.
  const ParsedCaption p = parse_scene_caption("  A Large  GREEN ring\ton the right on a gradient orange background\n");
  ASSERT_EQ(p.objects.size(), 1u);
  EXPECT_EQ(p.objects[0].size, SceneSize::kLarge);
  EXPECT_EQ(p.objects[0].cell, 5);
}

TEST(SceneCaptions, ParseRejectsOtherText) {
  for (const char* bad :
       {"a photo of a cat", "a red circle at the top on a blue wall",
        "a red circle somewhere on a plain blue background", "an red circle at the top on a plain blue background",
        "a medium red circle at the top on a plain blue background", "a red blob at the top on a plain blue background",
        "a red circle at the top and a red circle at the top and a red circle at the top on a "
        "plain blue background"}) {
    EXPECT_THROW(parse_scene_caption(bad), InputError) << bad;
  }
  try {
    parse_scene_caption("a red blob at the top on a plain blue background");
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("a red blob at the top"), std::string::npos) << e.what();
  }
}

Rgb8 to_rgb8(const Image& img) {
  Rgb8 out{img.width(), img.height(), 3, std::vector<std::uint8_t>(std::size_t(img.width()) * img.height() * 3)};
  const auto* p = img.planes.data<float>();
  const std::size_t plane = std::size_t(img.width()) * img.height();
  for (std::size_t i = 0; i < plane; ++i)
    for (int k = 0; k < 3; ++k) out.pixels[3 * i + k] = static_cast<std::uint8_t>(p[k * plane + i]);
  return out;
}

TEST(ScenePromptCheck, GeneratorScenesPass) {
  int objects = 0;
  for (std::uint64_t i = 0; i < 30; ++i) {
    const Scene s = generate_scene(2024, i);
    for (const ObjectCheck& c : check_scene_image(s.image, s.description.caption)) {
      EXPECT_TRUE(c.passed) << s.description.caption << ": found shape " << c.shape_found << " IoU " << c.shape_iou;
      ++objects;
    }
  }
  EXPECT_GT(objects, 50);
}

TEST(ScenePromptCheck, MatchesPythonVerdictsOnGeneratedImages) {
  // tiny-sd samples with tools/scene_check.py's verdicts (passed, shape found, soft IoU).
  std::ifstream in(data_dir() / "scenes" / "check" / "check.tsv");
  int images = 0, passed = 0, total = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto f = split_tabs(line);
    ASSERT_EQ(f.size(), 3u) << line;
    SCOPED_TRACE(f[0] + ": " + f[1]);
    const auto checks = check_scene_image(to_rgb8(load_image(data_dir() / "scenes" / "check" / f[0])), f[1]);
    std::stringstream verdicts(f[2]);
    std::size_t k = 0;
    for (std::string v; std::getline(verdicts, v, ';'); ++k) {
      ASSERT_LT(k, checks.size());
      int ok = 0, shape = 0;
      double iou = 0;
      ASSERT_EQ(std::sscanf(v.c_str(), "%d,%d,%lf", &ok, &shape, &iou), 3) << v;
      EXPECT_EQ(checks[k].passed, ok != 0) << "object " << k;
      EXPECT_EQ(checks[k].shape_found, shape) << "object " << k;
      EXPECT_NEAR(checks[k].shape_iou, iou, 1e-6) << "object " << k;
      passed += checks[k].passed;
      ++total;
    }
    EXPECT_EQ(k, checks.size());
    ++images;
  }
  EXPECT_EQ(images, 16);
  EXPECT_GT(total, 30);
  EXPECT_LT(passed, total);  // the goldens include misses, so both verdicts are exercised
}

TEST(ScenePromptCheck, RejectsBadInput) {
  const Scene s = generate_scene(1, 1);
  EXPECT_THROW(check_scene_image(s.image, "a photo of a cat"), InputError);
  Rgb8 gray{64, 64, 1, std::vector<std::uint8_t>(64 * 64)};
  EXPECT_THROW(check_scene_image(gray, s.description.caption), InputError);
}

TEST(ScenePrompts, EvalSetIsHeldOutFromCalibration) {
  const auto read = [](const std::string& name) {
    std::ifstream in(testing::source_dir() / "prompts" / name);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) lines.push_back(line);
    return lines;
  };
  const auto calib = read("tiny_calib.txt"), eval = read("tiny_eval.txt");
  EXPECT_GE(calib.size(), 128u);
  EXPECT_GE(eval.size(), 32u);
  const std::set<std::string> calib_set(calib.begin(), calib.end());
  for (const std::string& e : eval) {
    EXPECT_EQ(calib_set.count(e), 0u) << e;
    EXPECT_NO_THROW(parse_scene_caption(e)) << e;
  }
  for (const std::string& c : calib) EXPECT_NO_THROW(parse_scene_caption(c)) << c;
}

// prompts/sd_calib.txt: at least 200 distinct natural-language prompts (for calibrating a real
// Stable Diffusion model), none of them the tiny grammar's.
TEST(ScenePrompts, SdCalibrationSetHas200DistinctNaturalLanguagePrompts) {
  std::ifstream in(testing::source_dir() / "prompts" / "sd_calib.txt");
  std::set<std::string> prompts;
  std::size_t lines = 0, grammar = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    ++lines;
    prompts.insert(line);
    try {
      parse_scene_caption(line);
      ++grammar;
    } catch (const std::exception&) {
    }
  }
  EXPECT_GE(prompts.size(), 200u);
  EXPECT_EQ(prompts.size(), lines);  // no duplicates
  EXPECT_EQ(grammar, 0u);
}

// The shipped models (tiny-sd, tiny-sam and tiny-sdxl: graphs, tokenizers, pipeline files, cards
// and sample images) together stay within 40 MB (issue 24), tiny-sdxl's graphs within 12 MB.
TEST(ShippedModels, AllFilesTogetherWithin40MB) {
  namespace fs = std::filesystem;
  std::uintmax_t bytes = 0, sdxl_onnx_bytes = 0;
  std::size_t onnx = 0;
  const fs::path models = testing::source_dir() / "models";
  for (const auto& e : fs::recursive_directory_iterator(models))
    if (e.is_regular_file()) {
      bytes += e.file_size();
      const bool graph = e.path().extension() == ".onnx";
      onnx += graph;
      if (graph && fs::relative(e.path(), models).begin()->string() == "tiny-sdxl") sdxl_onnx_bytes += e.file_size();
    }
  // text encoder, UNet, VAE decoder; image encoder, mask decoder; tiny-sdxl's four
  EXPECT_EQ(onnx, 9u);
  EXPECT_LE(sdxl_onnx_bytes, 12u * 1000 * 1000);
  EXPECT_LE(bytes, 40u * 1000 * 1000);
}

}  // namespace
}  // namespace qeval::datasets
