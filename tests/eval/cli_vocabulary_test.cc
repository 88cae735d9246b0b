// The command line as a user meets it (issue 25): the stdout summary never cut, progress on stderr
// per --progress (lines with counts and ETA when stderr is not a terminal), one option vocabulary
// with the old spellings kept as aliases that say so.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "test_util.h"

namespace qeval {
namespace {

namespace fs = std::filesystem;
using testing::run_qeval;

// stdout alone (stderr to a file): the summary a CI log or a pipe gets.
struct SplitRun {
  int code = -1;
  std::string out, err;
};
SplitRun run_split(const std::string& args, const fs::path& dir) {
  const fs::path err = dir / "stderr.txt";
  SplitRun r;
  FILE* p = popen((std::string(QEVAL_BINARY) + " " + args + " 2>" + err.string()).c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  for (std::size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = testing::read_text(err);
  return r;
}

// Sets an environment variable for the test's lifetime (inherited by the qeval it starts).
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) { ::setenv(name.c_str(), value.c_str(), 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

// vit_block with `samples` copies of its input (a unit each) and two variants, one with a
// 40-character name.
fs::path vit_config(const testing::ScratchDir& dir, int samples, const std::string& fp16_name) {
  const fs::path vit = testing::source_dir() / "tests/data/onnx/vit_block";
  for (int i = 0; i < samples; ++i) {
    const fs::path sample = dir.path() / "inputs" / fmt::format("s{}", i);
    fs::create_directories(sample);
    fs::copy_file(vit / "inputs/image.npy", sample / "image.npy", fs::copy_options::overwrite_existing);
  }
  return testing::write_text(dir, "c.json",
                             R"({"pipeline": ")" + (vit / "model.onnx").string() + R"(", "inputs": ")" +
                                 (dir / "inputs").string() + R"(",
    "variants": [{"name": "fp32"}, {"name": ")" +
                                 fp16_name + R"(", "precision": "fp16"}]})");
}

TEST(CliSummary, LongVariantNameAndEveryFailedCheckAppearWholeOnStdout) {
  testing::ScratchDir dir("cli-summary-long");
  const std::string name = "fp16-deployment-candidate-for-release-42";
  ASSERT_EQ(name.size(), 40u);
  const fs::path config = vit_config(dir, 1, name);
  // Several checks the fp16 output cannot meet (SQNR of hundreds of dB): each is listed whole.
  const fs::path gate = testing::write_text(dir, "g.json", R"({"checks": [
      {"metric": "output_sqnr_db", "stat": "min", "min": 500},
      {"metric": "output_sqnr_db", "stat": "mean", "min": 600},
      {"metric": "output_rel_l2", "stat": "max", "max": 1e-12}]})");
  const auto r = run_split("--progress none run --no-layers --config " + config.string() + " --gate " + gate.string() +
                               " --out " + (dir / "out").string(),
                           dir.path());
  ASSERT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find(name), std::string::npos) << r.out;
  const auto report = testing::read_json(dir / "out/report.json");
  ASSERT_GE(report["gate"]["checks"].size(), 3u);  // the three, and the default NaN/Inf check
  std::size_t failed = 0;
  for (const auto& check : report["gate"]["checks"]) {
    if (check.at("passed").get<bool>()) continue;
    ++failed;
    const std::string check_name = check["name"].get<std::string>();
    EXPECT_NE(r.out.find(check_name), std::string::npos) << check_name << "\n" << r.out;
  }
  EXPECT_EQ(failed, 3u);
  EXPECT_NE(r.out.find("FAIL 3/4"), std::string::npos) << r.out;  // the gate column, whole
  EXPECT_EQ(r.out.find("..."), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "");  // --progress none: nothing on stderr
}

TEST(CliProgress, LinesWithCountsAndEtaWhenStderrIsAPipe) {
  testing::ScratchDir dir("cli-progress-lines");
  const fs::path config = vit_config(dir, 4, "fp16");
  const ScopedEnv period("QEVAL_PROGRESS_PERIOD_MS", "20");
  // --threads 1: units finish one after another, so lines between them carry an ETA.
  const auto r = run_split(
      "--threads 1 run --no-layers --config " + config.string() + " --out " + (dir / "out").string(), dir.path());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("run: 4/4 units, 2 variants, done in "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" elapsed, ETA "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/4 units, 2 variants, "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "a bar was drawn into a pipe";
  EXPECT_EQ(r.out.find("units, 2 variants"), std::string::npos) << "progress leaked into stdout";

  const auto none = run_split(
      "--progress none run --no-layers --config " + config.string() + " --out " + (dir / "out2").string(), dir.path());
  ASSERT_EQ(none.code, 0) << none.err;
  EXPECT_EQ(none.err.find("units"), std::string::npos) << none.err;
}

TEST(CliProgress, ABadModeIsExitTwoListingTheChoices) {
  const auto r = run_qeval("--progress sometimes inspect --model x.onnx");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("'sometimes' is not a progress mode (expected one of auto, bar, lines, none)"),
            std::string::npos)
      << r.out;
  // After the verb too (a global option).
  EXPECT_EQ(run_qeval("inspect --model x.onnx --progress sometimes").code, 2);
}

TEST(CliVocabulary, OldSpellingsGiveTheSameResultAndSayTheyAreDeprecated) {
  testing::ScratchDir dir("cli-vocabulary");
  const fs::path vit = testing::source_dir() / "tests/data/onnx/vit_block";
  // inspect: --model, and the old positional model.
  const auto now = run_split("inspect --model " + (vit / "model.onnx").string(), dir.path());
  const auto old = run_split("inspect " + (vit / "model.onnx").string(), dir.path());
  EXPECT_EQ(now.code, 0) << now.out << now.err;
  EXPECT_EQ(old.code, now.code);
  EXPECT_EQ(old.out, now.out);
  EXPECT_EQ(now.err, "");
  EXPECT_NE(old.err.find("qeval inspect: the positional model is deprecated: use --model"), std::string::npos)
      << old.err;
  EXPECT_EQ(run_qeval("inspect").code, 2);

  // infer: --out, and the old --outputs.
  const std::string infer = "infer --model " + (vit / "model.onnx").string() + " --inputs " + (vit / "inputs").string();
  const auto a = run_split(infer + " --out " + (dir / "a").string(), dir.path());
  const auto b = run_split(infer + " --outputs " + (dir / "b").string(), dir.path());
  ASSERT_EQ(a.code, 0) << a.out << a.err;
  ASSERT_EQ(b.code, 0) << b.out << b.err;
  EXPECT_EQ(a.err, "");
  EXPECT_NE(b.err.find("qeval infer: --outputs is deprecated: use --out"), std::string::npos) << b.err;
  ASSERT_TRUE(fs::exists(dir / "a/outputs.json"));
  EXPECT_EQ(testing::read_text(dir / "a/outputs.json"), testing::read_text(dir / "b/outputs.json"));
  for (const auto& f : fs::directory_iterator(dir / "a")) {
    if (f.path().extension() != ".npy") continue;
    EXPECT_EQ(testing::read_bytes(f.path()), testing::read_bytes(dir / "b" / f.path().filename())) << f.path();
  }
  // Both at once is a usage error.
  EXPECT_EQ(run_qeval(infer + " --out " + (dir / "c").string() + " --outputs " + (dir / "d").string()).code, 2);

  // calibrate: --count, and the old --limit (tiny-sam's calibration point prompts, 1 of them).
  const std::string calibrate = "calibrate --recipe " + (testing::source_dir() / "recipes/int8-level3.json").string() +
                                " --pipeline " + (testing::source_dir() / "models/tiny-sam").string() + " --no-cache";
  const auto c = run_split("--progress none " + calibrate + " --count 1 --out " + (dir / "cal1").string(), dir.path());
  const auto d = run_split("--progress none " + calibrate + " --limit 1 --out " + (dir / "cal2").string(), dir.path());
  ASSERT_EQ(c.code, 0) << c.out << c.err;
  ASSERT_EQ(d.code, 0) << d.out << d.err;
  EXPECT_EQ(c.err, "");
  EXPECT_NE(d.err.find("qeval calibrate: --limit is deprecated: use --count"), std::string::npos) << d.err;
  // The same scales, calibrated on the same prompt (the time it took aside).
  auto scales = [](const fs::path& p) {
    auto j = testing::read_json(p);
    j.erase("elapsed_s");
    return j.dump();
  };
  for (const char* model : {"image_encoder", "mask_decoder"}) {
    if (!fs::exists(dir / "cal1" / model / "scales.json")) continue;
    EXPECT_EQ(scales(dir / "cal1" / model / "scales.json"), scales(dir / "cal2" / model / "scales.json")) << model;
  }
  EXPECT_TRUE(fs::exists(dir / "cal1/image_encoder/scales.json") || fs::exists(dir / "cal1/mask_decoder/scales.json"));
}

TEST(CliVocabulary, OutIsNeverRequired) {
  testing::ScratchDir dir("cli-out-default");
  const fs::path vit = testing::source_dir() / "tests/data/onnx/vit_block";
  // Run from the scratch folder: the default qeval-infer lands there.
  const std::string cmd = "cd " + dir.path().string() + " && " + std::string(QEVAL_BINARY) + " infer --model " +
                          (vit / "model.onnx").string() + " --inputs " + (vit / "inputs").string() +
                          " > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  EXPECT_TRUE(fs::exists(dir / "qeval-infer/outputs.json"));
}

}  // namespace
}  // namespace qeval
