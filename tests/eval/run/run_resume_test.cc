// A run folder's life: one qeval at a time (the lock), a state saved after every unit so that a
// run killed (kill -9) or stopped (SIGINT) resumes to the uninterrupted report, a larger --count
// reusing a smaller one's units, an unreadable state that blocks nothing it should not.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "eval/child_process.h"
#include "comparable_report.h"
#include "eval/run/out_lock.h"
#include "eval/run/run_state.h"
#include "kernels/error.h"
#include "test_util.h"

extern char** environ;

namespace qeval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::run_qeval;

json comparable(const fs::path& report) { return testing::comparable_report(report); }

using Child = testing::QevalChild;

// Polls until `ready` or 60 s have passed (a loaded machine); false on time out.
template <class F>
bool wait_for(F ready) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!ready()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// tiny-sd, 2 steps, the UNet observed, fp32 against fp16: the smallest run with pooled layers.
class RunResume : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::ScratchDir("run-resume");
    config_ = *dir_ / "c.json";
    std::ofstream(config_) << R"({"pipeline": ")" << (testing::source_dir() / "models/tiny-sd").string()
                           << R"(", "count": 3, "steps": 2, "observe": {"models": ["unet"]},
      "variants": [{"name": "fp32"}, {"name": "fp16", "precision": "fp16"}]})";
    // The uninterrupted run every other one must equal.
    const auto r = run_qeval(run_args(*dir_ / "all") + " --threads 1");
    ASSERT_EQ(r.code, 0) << r.out;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string run_args(const fs::path& out) {
    return "run --config " + config_.string() + " --out " + out.string();
  }
  static std::vector<std::string> run_argv(const fs::path& out) {
    return {"run", "--config", config_.string(), "--out", out.string(), "--threads", "1"};
  }
  static fs::path all_report() { return *dir_ / "all/report.json"; }
  static std::size_t saved_units(const fs::path& out) {
    return eval::read_run_state_info(out / eval::kRunStateFile).done.size();
  }

  static testing::ScratchDir* dir_;
  static fs::path config_;
};
testing::ScratchDir* RunResume::dir_ = nullptr;
fs::path RunResume::config_;

TEST_F(RunResume, AFolderInUseIsRefusedNamingTheHolderAndKillMinusNineResumesToTheSameReport) {
  const fs::path out = *dir_ / "killed";
  Child first(run_argv(out), *dir_ / "killed.log");
  ASSERT_GT(first.pid(), 0);
  // The lock file names its holder as soon as it holds the folder.
  ASSERT_TRUE(wait_for([&] { return testing::read_text(out / eval::kOutLockFile).find("pid ") != std::string::npos; }))
      << first.log();
  const std::string pid = "pid " + std::to_string(first.pid()) + " on host ";
  EXPECT_NE(testing::read_text(out / eval::kOutLockFile).find(pid), std::string::npos);

  // A second run, merge, triage, compare-recipes into the same folder: exit 2 naming the holder.
  for (const std::string& second :
       {run_args(out), "merge " + (*dir_ / "all").string() + " --out " + out.string(),
        "triage --config " + config_.string() + " --variant fp16 --gate " +
            (testing::source_dir() / "models/tiny-sd/gate.json").string() + " --out " + out.string(),
        "compare-recipes --config " + config_.string() + " --recipes " +
            (testing::source_dir() / "recipes/int8-level3.json").string() + " --out " + out.string()}) {
    const auto r = run_qeval(second);
    EXPECT_EQ(r.code, 2) << second << "\n" << r.out;
    EXPECT_NE(r.out.find("is in use by another qeval (" + pid), std::string::npos) << second << "\n" << r.out;
  }

  // kill -9 once a unit is saved: the kernel drops the lock, the state holds the finished units.
  ASSERT_TRUE(wait_for([&] { return fs::exists(out / eval::kRunStateFile); })) << first.log();
  ::kill(first.pid(), SIGKILL);
  EXPECT_EQ(first.exit_code(), 128 + SIGKILL) << first.log();
  const std::size_t saved = saved_units(out);
  EXPECT_GE(saved, 1u);
  EXPECT_FALSE(fs::exists(out / "report.json"));

  const auto resumed = run_qeval(run_args(out) + " --threads 2");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("reusing " + std::to_string(saved) + " finished unit(s)"), std::string::npos)
      << resumed.out;
  EXPECT_EQ(comparable(out / "report.json"), comparable(all_report()));
  const json report = testing::read_json(out / "report.json");
  EXPECT_EQ(report["resume"]["reused_units"], saved);
  EXPECT_GE(report["elapsed_s"].get<double>(), report["resume"]["elapsed_s_before"].get<double>());
  EXPECT_EQ(testing::read_json(all_report())["resume"]["reused_units"], 0);
}

TEST_F(RunResume, SigintSavesSaysHowToResumeAndExits130) {
  const fs::path out = *dir_ / "interrupted";
  std::vector<std::string> args = run_argv(out);
  args.push_back("--fresh");  // the resume command must leave it out (it would start over)
  Child first(args, *dir_ / "interrupted.log");
  ASSERT_TRUE(wait_for([&] { return fs::exists(out / eval::kRunStateFile); })) << first.log();
  ::kill(first.pid(), SIGINT);
  const int code = first.exit_code();
  const std::string log = first.log();
  if (code == 0) GTEST_SKIP() << "the run ended before SIGINT arrived (a fast machine): " << log;
  ASSERT_EQ(code, 130) << log;
  EXPECT_NE(log.find("SIGINT received: stopped with "), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(out / "report.json"));
  const std::size_t saved = saved_units(out);
  EXPECT_GE(saved, 1u);
  EXPECT_LT(saved, 3u) << log;
  const auto at = log.find("Resume with:\n  ");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string command = log.substr(at + 15, log.find('\n', at + 15) - at - 15);
  EXPECT_EQ(command, std::string(QEVAL_BINARY) + " run --config " + config_.string() + " --out " + out.string() +
                         " --threads 1");

  const auto resumed = run_qeval(command.substr(std::string(QEVAL_BINARY).size() + 1));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_EQ(comparable(out / "report.json"), comparable(all_report()));
  EXPECT_EQ(testing::read_json(out / "report.json")["resume"]["reused_units"], saved);
}

TEST_F(RunResume, ALargerCountReusesTheFinishedUnitsASmallerOneStartsAfresh) {
  const fs::path out = *dir_ / "grown";
  auto r = run_qeval(run_args(out) + " --count 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(testing::read_json(out / "report.json")["samples"].size(), 2u);
  r = run_qeval(run_args(out) + " --count 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("reusing 2 finished unit(s)"), std::string::npos) << r.out;
  const json report = testing::read_json(out / "report.json");
  EXPECT_EQ(report["resume"]["reused_units"], 2);
  EXPECT_GT(report["resume"]["elapsed_s_before"].get<double>(), 0.0);
  EXPECT_GT(report["elapsed_s"].get<double>(), report["resume"]["elapsed_s_before"].get<double>());
  EXPECT_EQ(comparable(out / "report.json"), comparable(all_report()));

  // Back to 2: the state pools a unit this run does not have, so nothing is reused.
  r = run_qeval(run_args(out) + " --count 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("cannot be reused (it holds unit 2 (p003-s0) and this run has 2 units"), std::string::npos)
      << r.out;
  EXPECT_EQ(testing::read_json(out / "report.json")["resume"]["reused_units"], 0);
  EXPECT_EQ(testing::read_json(out / "report.json")["samples"].size(), 2u);
}

TEST_F(RunResume, AnUnreadableStateSaysFreshAndKeepsThePreviousReport) {
  const fs::path out = *dir_ / "truncated";
  auto r = run_qeval(run_args(out) + " --count 2 --no-layers");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string report = testing::read_text(out / "report.json");
  const json before = comparable(out / "report.json");
  const auto state = testing::read_bytes(out / eval::kRunStateFile);
  ASSERT_GT(state.size(), 100u);
  testing::write_bytes(out / eval::kRunStateFile, {state.begin(), state.begin() + std::ptrdiff_t(state.size() / 2)});

  r = run_qeval(run_args(out) + " --count 2 --no-layers");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find(eval::kRunStateFile), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("unreadable"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--fresh"), std::string::npos) << r.out;
  EXPECT_EQ(testing::read_text(out / "report.json"), report);  // untouched

  r = run_qeval(run_args(out) + " --count 2 --no-layers --fresh");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(comparable(out / "report.json"), before);
  EXPECT_EQ(eval::read_run_state_info(out / eval::kRunStateFile).done.size(), 2u);
}

TEST(OutFolderLock, ASecondHolderIsRefusedUntilTheFirstLetsGo) {
  testing::ScratchDir dir("out-lock");
  {
    const eval::OutFolderLock first(dir / "out", "qeval run --out out");
    try {
      const eval::OutFolderLock second(dir / "out", "qeval merge");
      ADD_FAILURE() << "a second lock on a held folder";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("pid " + std::to_string(::getpid()) + " on host "), std::string::npos) << what;
      EXPECT_NE(what.find("qeval run --out out"), std::string::npos) << what;
      EXPECT_NE(what.find("qeval.lock"), std::string::npos) << what;
    }
  }
  EXPECT_NO_THROW(eval::OutFolderLock(dir / "out", "again"));  // released with its holder
  testing::write_text(dir, "file", "x");
  EXPECT_THROW(eval::OutFolderLock(dir / "file" / "out", "x"), InputError);  // cannot be a folder
}

}  // namespace
}  // namespace qeval
