// The qeval binary as users run it: help, version, exit codes, files written.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>

#include "test_util.h"

namespace qeval {
namespace {

testing::CliRun qeval(const std::string& args) { return testing::run_qeval(args); }

std::string samples(const char* sub) { return (testing::source_dir() / "samples" / sub).string(); }

TEST(Cli, HelpAndVersion) {
  auto help = qeval("--help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("compare-images"), std::string::npos);
  EXPECT_NE(help.out.find("Exit codes"), std::string::npos);
  auto sub = qeval("compare-images --help");
  EXPECT_EQ(sub.code, 0);
  for (const char* flag : {"--ref", "--test", "--out", "--gate", "--ssim", "--alpha", "--peak"})
    EXPECT_NE(sub.out.find(flag), std::string::npos) << flag;
  auto version = qeval("--version");
  EXPECT_EQ(version.code, 0);
  EXPECT_NE(version.out.find("qeval 0."), std::string::npos);
}

TEST(Cli, UsageErrorsExitTwo) {
  EXPECT_EQ(qeval("").code, 2);
  EXPECT_EQ(qeval("no-such-verb").code, 2);
  EXPECT_EQ(qeval("compare-images --ref x").code, 2);
  EXPECT_EQ(qeval("compare-images --ref a --test b --out c --ssim gauss").code, 2);
}

TEST(Cli, BadInputExitsTwoWithTheReason) {
  testing::ScratchDir dir("cli-bad");
  auto missing =
      qeval("compare-images --ref /nonexistent/ref --test " + samples("test") + " --out " + (dir / "o").string());
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.out.find("/nonexistent/ref: no such directory"), std::string::npos) << missing.out;
  testing::write_bytes(dir / "gate.json", {'{', '"', 'x', '"', ':', '1', '}'});
  auto gate = qeval("compare-images --ref " + samples("ref") + " --test " + samples("test") + " --out " +
                    (dir / "o").string() + " --gate " + (dir / "gate.json").string());
  EXPECT_EQ(gate.code, 2);
  EXPECT_NE(gate.out.find("unknown key 'x'"), std::string::npos) << gate.out;
  EXPECT_FALSE(std::filesystem::exists(dir / "o" / "report.json"));  // nothing judged, nothing written
}

TEST(Cli, UnwritableOutputIsBadInput) {
  testing::ScratchDir dir("cli-out");
  testing::write_bytes(dir / "file", {'x'});
  auto r = qeval("compare-images --ref " + samples("ref") + " --test " + samples("test") + " --out " +
                 (dir / "file").string() + " --threads 1");  // options after the verb
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("cannot create the output folder"), std::string::npos) << r.out;
}

TEST(Cli, SamplesPassTheShippedGateAndFailAStricterOne) {
  testing::ScratchDir dir("cli-run");
  auto pass = qeval("compare-images --ref " + samples("ref") + " --test " + samples("test") + " --out " +
                    (dir / "pass").string() + " --gate " + samples("gate.json"));
  EXPECT_EQ(pass.code, 0) << pass.out;
  EXPECT_NE(pass.out.find("gate: PASSED"), std::string::npos);
  for (const char* f : {"report.json", "report.html", "junit.xml"})
    EXPECT_TRUE(std::filesystem::exists(dir / "pass" / f)) << f;
  auto j = testing::read_json(dir / "pass" / "report.json");
  EXPECT_TRUE(j["gate"]["passed"].get<bool>());
  EXPECT_EQ(j["pairs"].size(), 7u);

  testing::write_bytes(dir / "strict.json", [] {
    std::string s = R"({"checks": [{"metric": "ssim", "stat": "min", "min": 0.9}]})";
    return std::vector<std::uint8_t>(s.begin(), s.end());
  }());
  auto fail = qeval("--threads 1 compare-images --ref " + samples("ref") + " --test " + samples("test") + " --out " +
                    (dir / "fail").string() + " --gate " + (dir / "strict.json").string());
  EXPECT_EQ(fail.code, 1) << fail.out;
  EXPECT_NE(fail.out.find("[FAIL] ssim min >= 0.9"), std::string::npos) << fail.out;
  EXPECT_NE(fail.out.find("chelsea.png"), std::string::npos);
}

}  // namespace
}  // namespace qeval
