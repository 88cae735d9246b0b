// Shards, merge and the result cache give the bits of a single run: qeval run --shard I/N into
// separate folders, qeval merge in any order, and a rerun into a folder holding finished units.
#include <gtest/gtest.h>

#include <fstream>

#include "comparable_report.h"
#include "eval/run/run_state.h"
#include "kernels/error.h"
#include "test_util.h"

namespace qeval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::run_qeval;

json comparable(const fs::path& report) { return testing::comparable_report(report); }

TEST(RunShards, MergedShardsAndAResumedRunEqualASingleRun) {
  testing::ScratchDir dir("run-shards");
  const fs::path config = dir / "c.json";
  std::ofstream(config) << R"({"pipeline": ")" << (testing::source_dir() / "models/tiny-sd").string()
                        << R"(", "count": 3, "steps": 2, "observe": {"models": ["unet"]},
    "variants": [{"name": "fp32"}, {"name": "fp16", "precision": "fp16"}]})";
  const std::string run = "run --config " + config.string() + " --out ";
  ASSERT_EQ(run_qeval(run + (dir / "all").string() + " --threads 1").code, 0);
  for (const char* s : {"1/2", "2/2"}) {
    const auto r = run_qeval(run + (dir / (std::string("s") + s[0])).string() + " --shard " + s);
    ASSERT_EQ(r.code, 0) << r.out;
  }
  EXPECT_EQ(testing::read_json(dir / "s1/report.json")["samples"].size(), 1u);  // units 0 of 0..2
  EXPECT_EQ(testing::read_json(dir / "s2/report.json")["samples"].size(), 2u);
  EXPECT_EQ(testing::read_json(dir / "s2/report.json")["config"]["shard"], "2/2");
  const auto merged =
      run_qeval("merge " + (dir / "s2").string() + " " + (dir / "s1").string() + " --out " + (dir / "merged").string());
  ASSERT_EQ(merged.code, 0) << merged.out;
  EXPECT_EQ(comparable(dir / "merged/report.json"), comparable(dir / "all/report.json"));
  EXPECT_TRUE(fs::exists(dir / "merged/images/p001-s0/fp16.png"));  // copied from the shard's folder
  // Every image the single run wrote (images, heatmaps, x8 heatmaps), with the same bytes.
  std::size_t images = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir / "all/images")) {
    if (!e.is_regular_file()) continue;
    ++images;
    const fs::path rel = fs::relative(e.path(), dir / "all");
    EXPECT_EQ(testing::read_bytes(dir / "merged" / rel), testing::read_bytes(e.path())) << rel;
  }
  EXPECT_GE(images, 9u);  // 3 samples x (fp32, fp16, fp16's heatmap at least)

  // A rerun into a shard's folder reuses its finished unit and runs the rest: the same report.
  const auto resumed = run_qeval(run + (dir / "s1").string());
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("reusing 1 finished unit"), std::string::npos) << resumed.out;
  EXPECT_EQ(comparable(dir / "s1/report.json"), comparable(dir / "all/report.json"));

  // A missing shard, overlapping shards, another run's folder: exit 2 with the reason.
  auto r = run_qeval("merge " + (dir / "s2").string() + " --out " + (dir / "m2").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("1 of 3 units are in none of the given folders"), std::string::npos) << r.out;
  r = run_qeval("merge " + (dir / "s2").string() + " " + (dir / "all").string() + " --out " + (dir / "m3").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("already in the run"), std::string::npos) << r.out;
  r = run_qeval("merge " + dir.path().string() + " --out " + (dir / "m4").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("run-state.msgpack"), std::string::npos) << r.out;
}

TEST(RunShards, ShardsPartitionTheUnitsInOrder) {
  std::vector<std::size_t> all;
  for (int i = 1; i <= 3; ++i)
    for (std::size_t u : eval::shard_units(10, i, 3)) all.push_back(u);
  ASSERT_EQ(all.size(), 10u);
  for (std::size_t k = 0; k < all.size(); ++k) EXPECT_EQ(all[k], k);
  EXPECT_TRUE(eval::shard_units(2, 1, 4).empty());  // more shards than units: some are empty
  EXPECT_EQ(eval::parse_shard("3/8"), (std::pair<int, int>{3, 8}));
  for (const char* bad : {"0/2", "3/2", "2", "a/b", "1/2x", "1/0"})
    EXPECT_THROW(eval::parse_shard(bad), InputError) << bad;
}

}  // namespace
}  // namespace qeval
