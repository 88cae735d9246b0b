// Run folders and files the user did not expect (issue 21): a FIFO, folder or device where qeval
// reads a run folder's file is named at once (never waited on), full tensors come with an index of
// which name went to which file, and names that are not UTF-8 print escaped on stdout and stderr.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <map>

#include "base/escaped_stdio.h"
#include "datasets/image_io.h"
#include "datasets/npy.h"
#include "eval/run/evaluator.h"
#include "eval/run/run_state.h"
#include "input_error.h"
#include "onnx_builder.h"
#include "test_util.h"

namespace qeval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::contains;

// qeval with a time limit: a reader that blocks on a FIFO is killed at the limit instead of hanging the
// suite. Also how long it took.
struct TimedRun {
  testing::CliRun run;
  double seconds = 0;
};
TimedRun run_qeval_within(const std::string& args, int limit_s = 60) {
  const auto t0 = std::chrono::steady_clock::now();
  TimedRun r;
  FILE* p =
      popen(("timeout -s KILL " + std::to_string(limit_s) + " " + QEVAL_BINARY + " " + args + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  for (std::size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) r.run.out.append(buf.data(), n);
  const int status = pclose(p);
  r.run.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

void make_fifo(const fs::path& p) {
  fs::create_directories(p.parent_path());
  ASSERT_EQ(::mkfifo(p.c_str(), 0644), 0) << p;
}

// A single-model run: x [1, 8] -> Relu "a/b" -> Neg "a:b" -> y (two node names that give one file
// name), two samples, fp32 against fp16.
struct TinyRun {
  explicit TinyRun(const std::string& tag, const std::string& observe = "") : dir(tag) {
    testing::OnnxBuilder b;
    b.input("x", onnx::TensorProto::FLOAT, {1, 8}).output("y", onnx::TensorProto::FLOAT, {1, 8});
    b.node("Relu", {"x"}, {"t"}, "a/b");
    b.node("Neg", {"t"}, {"y"}, "a:b");
    const auto bytes = b.bytes();
    testing::write_text(dir, "m.onnx", std::string(bytes.begin(), bytes.end()));
    for (int s = 0; s < 2; ++s) {
      std::vector<float> x(8);
      for (int i = 0; i < 8; ++i) x[std::size_t(i)] = 0.37f * float(i - 3 + s);
      fs::create_directories(dir / "inputs" / ("s" + std::to_string(s)));
      datasets::write_npy(dir / "inputs" / ("s" + std::to_string(s)) / "x.npy", testing::floats({1, 8}, x));
    }
    config = testing::write_text(dir, "c.json",
                                 R"({"pipeline": ")" + (dir / "m.onnx").string() + R"(", "inputs": ")" +
                                     (dir / "inputs").string() + R"(", )" + observe +
                                     R"("variants": [{"name": "fp32"}, {"name": "fp16", "precision": "fp16"}]})");
  }
  std::string args(const fs::path& out) const { return "run --config " + config.string() + " --out " + out.string(); }
  testing::ScratchDir dir;
  fs::path config;
};

// ---- 1. readers of run-folder files: regular files only, never blocking --------------------------

TEST(RunFolderReaders, AFifoAsARunStateIsNamedAtOnceByRunAndMerge) {
  TinyRun run("fifo-state");
  make_fifo(run.dir / "out" / eval::kRunStateFile);
  const auto r = run_qeval_within(run.args(run.dir / "out"));
  EXPECT_EQ(r.run.code, 2) << r.run.out;
  EXPECT_LT(r.seconds, 30);  // a tiny model on a loaded machine; the FIFO itself costs nothing
  EXPECT_TRUE(contains(r.run.out, (run.dir / "out" / eval::kRunStateFile).string() + ": is a FIFO (named pipe)"))
      << r.run.out;

  // merge reads a shard's state before anything else (~0.5 s here at load 6, mostly start-up).
  const auto m = run_qeval_within("merge " + (run.dir / "out").string() + " --out " + (run.dir / "merged").string());
  EXPECT_EQ(m.run.code, 2) << m.run.out;
  EXPECT_LT(m.seconds, 10.0);  // a FIFO blocked std::ifstream forever (the limit: 60 s, then killed)
  EXPECT_TRUE(contains(m.run.out, eval::kRunStateFile + std::string(": is a FIFO (named pipe), not a regular file")))
      << m.run.out;

  // A folder in its place: named too (std::ifstream read it as an empty, "damaged" state).
  fs::remove(run.dir / "out" / eval::kRunStateFile);
  fs::create_directories(run.dir / "out" / eval::kRunStateFile);
  const auto d = run_qeval_within("merge " + (run.dir / "out").string() + " --out " + (run.dir / "merged").string());
  EXPECT_EQ(d.run.code, 2) << d.run.out;
  EXPECT_TRUE(contains(d.run.out, eval::kRunStateFile + std::string(": is a directory, not a regular file")))
      << d.run.out;
}

TEST(RunFolderReaders, AFifoAsAShardReportIsNamedByMerge) {
  TinyRun run("fifo-shard-report");
  const auto first = testing::run_qeval(run.args(run.dir / "shard") + " --no-layers");
  ASSERT_EQ(first.code, 0) << first.out;
  fs::remove(run.dir / "shard" / "report.json");
  make_fifo(run.dir / "shard" / "report.json");
  const auto m = run_qeval_within("merge " + (run.dir / "shard").string() + " --out " + (run.dir / "merged").string());
  EXPECT_EQ(m.run.code, 2) << m.run.out;
  EXPECT_TRUE(contains(m.run.out, (run.dir / "shard" / "report.json").string() + ": is a FIFO (named pipe)"))
      << m.run.out;
  EXPECT_FALSE(fs::exists(run.dir / "merged" / "report.json"));
}

// ---- 2. observe.full_tensors: unique files and an index -----------------------------------------

TEST(FullTensors, NamesThatGiveOneFileNameGetTwoFilesAndTheIndexListsBoth) {
  TinyRun run("full-tensors", R"("observe": {"full_tensors": true}, )");
  const fs::path out = run.dir / "out";
  const auto r = testing::run_qeval(run.args(out));
  ASSERT_EQ(r.code, 0) << r.out;
  const json index = testing::read_json(out / "tensors" / eval::kTensorIndexFile);
  ASSERT_TRUE(index.contains("tensors")) << index.dump(1);
  // 2 samples x 2 variants x 2 nodes.
  ASSERT_EQ(index["tensors"].size(), 8u) << index.dump(1);
  std::map<std::string, json> by_file;
  for (const auto& e : index["tensors"]) by_file[e["file"].get<std::string>()] = e;
  for (const std::string sample : {"s0", "s1"})
    for (const std::string variant : {"fp32", "fp16"}) {
      const std::string folder = sample + "/" + variant + "/model/";
      ASSERT_TRUE(by_file.count(folder + "a_b.npy") && by_file.count(folder + "a_b__2.npy")) << index.dump(1);
      const json& relu = by_file[folder + "a_b.npy"];
      const json& neg = by_file[folder + "a_b__2.npy"];
      EXPECT_EQ(relu["node"], "a/b");
      EXPECT_EQ(relu["tensor"], "t");
      EXPECT_EQ(neg["node"], "a:b");
      EXPECT_EQ(neg["tensor"], "y");
      EXPECT_EQ(neg["shape"], json::array({1, 8}));
      EXPECT_EQ(neg["dtype"], "float32");
      EXPECT_EQ(neg["sample"], sample);
      EXPECT_EQ(neg["variant"], variant);
      EXPECT_TRUE(neg["step"].is_null());
      // Each file holds its own node's output: Relu >= 0, Neg of it <= 0, one the negation of the other.
      const Tensor a = datasets::read_npy(out / "tensors" / (folder + "a_b.npy"));
      const Tensor b = datasets::read_npy(out / "tensors" / (folder + "a_b__2.npy"));
      ASSERT_EQ(a.numel(), 8);
      ASSERT_EQ(b.numel(), 8);
      float positive = 0;
      for (int i = 0; i < 8; ++i) {
        EXPECT_EQ(a.data<float>()[i], -b.data<float>()[i]);
        positive = std::max(positive, a.data<float>()[i]);
      }
      EXPECT_GT(positive, 0.0f);
    }
  EXPECT_EQ(by_file.begin()->second["model"], "model");
}

// ---- 3. names that are not UTF-8 print escaped on stdout and stderr too ------------------------

TEST(EscapedStdio, ACutSequenceIsHeldAndAnInvalidByteIsNot) {
  using base::incomplete_utf8_tail;
  EXPECT_EQ(incomplete_utf8_tail("abc"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("ab\xC3"), 1u);          // the first byte of "é"
  EXPECT_EQ(incomplete_utf8_tail("ab\xC3\xA9"), 0u);      // "é" whole
  EXPECT_EQ(incomplete_utf8_tail("ab\xE2\x82"), 2u);      // two bytes of "€"
  EXPECT_EQ(incomplete_utf8_tail("ab\xF0\x9F\x98"), 3u);  // three bytes of an emoji
  EXPECT_EQ(incomplete_utf8_tail("ab\xF0"), 1u);          // a 4-byte lead alone
  EXPECT_EQ(incomplete_utf8_tail("ab\xFF"), 0u);          // never starts a sequence
  EXPECT_EQ(incomplete_utf8_tail("ab\xE0\x80"), 0u);      // overlong: no continuation helps
  EXPECT_EQ(incomplete_utf8_tail("ab\x80"), 0u);          // a stray continuation byte
}

TEST(EscapedStdio, CompareImagesPrintsANonUtf8FileNameEscaped) {
  testing::ScratchDir dir("stdout-utf8");
  const std::string name = "pair\xFF\xFEname.png";  // Latin-1 bytes, as an old archive names files
  testing::write_bytes(dir / "ref" / name, datasets::encode_png(testing::pattern(24, 16, 3, 1)));
  testing::write_bytes(dir / "test" / name,
                       datasets::encode_png(testing::perturb(testing::pattern(24, 16, 3, 1), 9, 2)));
  testing::write_bytes(dir / "test" / ("only\xFF.png"), datasets::encode_png(testing::pattern(24, 16, 3, 3)));
  const auto r = testing::run_qeval("compare-images --ref " + (dir / "ref").string() + " --test " +
                                    (dir / "test").string() + " --out " + (dir / "out").string());
  EXPECT_EQ(r.code, 1) << r.out;  // the unpaired file fails the run
  EXPECT_EQ(r.out.find('\xFF'), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\xFE'), std::string::npos) << r.out;
  EXPECT_TRUE(contains(r.out, "worst pairs: pair\\xFF\\xFEname.png")) << r.out;
  EXPECT_TRUE(contains(r.out, "error: only\\xFF.png")) << r.out;
  // stderr too: an error message naming a folder that is not UTF-8.
  const auto e = testing::run_qeval("compare-images --ref " + (dir / "no\xFFsuch").string() + " --test " +
                                    (dir / "test").string() + " --out " + (dir / "out2").string());
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_EQ(e.out.find('\xFF'), std::string::npos) << e.out;
  EXPECT_TRUE(contains(e.out, "no\\xFFsuch")) << e.out;
}

}  // namespace
}  // namespace qeval
