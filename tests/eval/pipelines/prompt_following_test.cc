// The shipped models follow their prompts: the C++ FP32 pipeline's images of prompts/tiny_eval.txt
// (held out from training), judged by the scene checker: tiny-sd draws >= 80% of the named objects
// (issue 4), tiny-sdxl >= 75% (its model card: 76.8% in PyTorch over 4 seeds; the 80% is
// not met yet).
#include <gtest/gtest.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <chrono>
#include <fstream>

#include "datasets/scenes.h"
#include "sdxl.h"
#include "tiny_sd.h"

namespace qeval::eval {
namespace {

std::vector<std::string> read_lines(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<std::string> lines;
  for (std::string s; std::getline(in, s);)
    if (!s.empty()) lines.push_back(s);
  return lines;
}

// The share of prompts/tiny_eval.txt's objects that `models` draws, one image per prompt, noise
// seed = prompt index, `steps` steps at guidance 5, the pipeline's scheduler. Prompts run in
// parallel, each thread with its own sessions.
double objects_drawn(const Txt2ImgModels& models, const char* name, int steps) {
  const auto prompts = read_lines(testing::source_dir() / "prompts" / "tiny_eval.txt");
  EXPECT_EQ(prompts.size(), 64u);
  const auto t0 = std::chrono::steady_clock::now();

  tbb::enumerable_thread_specific<Txt2ImgSessions> sessions([&] { return Txt2ImgSessions::create(models); });
  std::vector<std::vector<datasets::ObjectCheck>> checks(prompts.size());
  tbb::parallel_for(std::size_t(0), prompts.size(), [&](std::size_t i) {
    tbb::this_task_arena::isolate([&] {
      Txt2ImgRequest req = default_request(models.config, prompts[i], i);
      req.steps = steps;
      req.guidance_scale = 5.0;
      const Txt2ImgResult r = generate(models, sessions.local(), req);
      checks[i] = datasets::check_scene_image(image_to_rgb8(r.image), prompts[i]);
    });
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int objects = 0, drawn = 0, complete = 0;
  for (const auto& c : checks) {
    int ok = 0;
    for (const auto& o : c) ok += o.passed;
    objects += int(c.size());
    drawn += ok;
    complete += ok == int(c.size());
  }
  const double share = double(drawn) / objects;
  std::printf(
      "%s C++ FP32, %zu prompts, %d steps, guidance %g, seed = prompt index: %d of %d objects "
      "drawn (%.1f%%), %d of %zu prompts complete (%.1f%%), %.1f s\n",
      name, prompts.size(), steps, 5.0, drawn, objects,
      100 * share, complete, prompts.size(), 100.0 * complete / prompts.size(), seconds);
  ::testing::Test::RecordProperty(std::string(name) + "_objects_drawn_percent", std::to_string(100 * share));
  EXPECT_EQ(objects, 137);
  return share;
}

TEST(TinySdPromptFollowing, DrawsAtLeast80PercentOfTheNamedObjects) {
  EXPECT_GE(objects_drawn(testing::tiny_sd(), "tiny-sd", 20), 0.80);  // DDIM
}

TEST(TinySdxlPromptFollowing, DrawsAtLeast75PercentOfTheNamedObjects) {
  EXPECT_GE(objects_drawn(testing::tiny_sdxl(), "tiny-sdxl", 20), 0.75);  // Euler
}

}  // namespace
}  // namespace qeval::eval
