// compare-images end to end in-process: every kind of bad pair is reported, good pairs are scored.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include "eval/run/compare_images.h"
#include "kernels/error.h"
#include "metrics/ssim.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

using datasets::encode_png;
using testing::pattern;
using testing::perturb;
using testing::write_bytes;

class CompareImagesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ref = dir_ / "ref";
    auto test = dir_ / "test";
    auto good = pattern(200, 180, 3, 1);
    write_bytes(ref / "good.png", encode_png(good));
    write_bytes(test / "good.png", encode_png(perturb(good, 8, 2)));
    auto worse = pattern(190, 170, 3, 3);
    write_bytes(ref / "nested/worse.png", encode_png(worse));
    write_bytes(test / "nested/worse.png", encode_png(perturb(worse, 40, 4)));
    auto same = pattern(40, 40, 3, 5);
    write_bytes(ref / "same.png", encode_png(same));
    write_bytes(test / "same.png", encode_png(same));
    write_bytes(ref / "sized.png", encode_png(pattern(32, 32, 3, 6)));
    write_bytes(test / "sized.png", encode_png(pattern(32, 30, 3, 6)));
    write_bytes(ref / "gray.png", encode_png(pattern(32, 32, 1, 7)));
    write_bytes(test / "gray.png", encode_png(pattern(32, 32, 3, 7)));
    auto rgb = pattern(48, 48, 3, 8);
    datasets::Rgb8 rgba{48, 48, 4, {}};
    for (std::size_t p = 0; p < rgb.pixels.size() / 3; ++p) {
      rgba.pixels.insert(rgba.pixels.end(), rgb.pixels.begin() + 3 * p, rgb.pixels.begin() + 3 * p + 3);
      rgba.pixels.push_back(static_cast<std::uint8_t>(p % 251));
    }
    write_bytes(ref / "alpha.png", encode_png(rgba));
    write_bytes(test / "alpha.png", encode_png(rgb));
    write_bytes(ref / "corrupt.png", encode_png(pattern(32, 32, 3, 9)));
    write_bytes(test / "corrupt.png", {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0});
    write_bytes(ref / "orphan.png", encode_png(pattern(32, 32, 3, 10)));
    options_.ref_dir = ref;
    options_.test_dir = test;
  }

  const reports::PairRow& row(const reports::CompareImagesReport& r, const std::string& name) {
    for (const auto& p : r.pairs)
      if (p.name == name) return p;
    throw std::runtime_error("no row " + name);
  }

  testing::ScratchDir dir_{"compare"};
  CompareImagesOptions options_;
};

TEST_F(CompareImagesTest, ScoresGoodPairsAndExplainsBadOnes) {
  auto r = run_compare_images(options_, Gate{}, false);
  ASSERT_EQ(r.pairs.size(), 8u);

  const auto& good = row(r, "good.png");
  ASSERT_TRUE(good.ok()) << good.error;
  EXPECT_EQ(good.width, 200);
  EXPECT_EQ(good.height, 180);
  ASSERT_TRUE(good.metric("ssim")->value);
  EXPECT_LT(*good.metric("ssim")->value, 1.0);
  EXPECT_GT(*good.metric("ssim")->value, *row(r, "nested/worse.png").metric("ssim")->value);
  EXPECT_TRUE(good.metric("ms_ssim")->value.has_value());
  EXPECT_FALSE(good.identical);

  const auto& same = row(r, "same.png");
  EXPECT_TRUE(same.identical);
  EXPECT_FALSE(same.metric("psnr_db")->value.has_value());
  EXPECT_DOUBLE_EQ(*same.metric("ssim")->value, 1.0);
  EXPECT_FALSE(same.metric("ms_ssim")->value.has_value());  // 40 px: too small for 5 scales
  EXPECT_NE(same.metric("ms_ssim")->note.find("161"), std::string::npos);

  EXPECT_EQ(row(r, "sized.png").error_kind, "size_mismatch");
  EXPECT_EQ(row(r, "sized.png").error, "reference is 32x32, test is 32x30");
  EXPECT_EQ(row(r, "gray.png").error_kind, "channel_mismatch");
  EXPECT_EQ(row(r, "gray.png").error, "reference is gray, test is rgb");
  EXPECT_EQ(row(r, "corrupt.png").error_kind, "unreadable");
  EXPECT_NE(row(r, "corrupt.png").error.find("corrupt.png: corrupt PNG"), std::string::npos);
  EXPECT_EQ(row(r, "orphan.png").error_kind, "missing_test");

  const auto& alpha = row(r, "alpha.png");
  ASSERT_TRUE(alpha.ok()) << alpha.error;
  EXPECT_EQ(alpha.channels, 3);
  ASSERT_EQ(alpha.notes.size(), 1u);
  EXPECT_NE(alpha.notes[0].find("alpha channel ignored"), std::string::npos);
  EXPECT_TRUE(alpha.identical);  // same colour planes, only the reference has alpha

  EXPECT_EQ(r.count_errors(), 4u);
  EXPECT_FALSE(r.gate.passed);  // the default gate allows no error
  ASSERT_FALSE(r.worst.empty());
  EXPECT_EQ(r.worst[0].name, "nested/worse.png");
  EXPECT_FALSE(r.worst[0].heatmap_png.empty());
}

TEST_F(CompareImagesTest, AlphaCompareNeedsAlphaOnBothSides) {
  options_.alpha = AlphaMode::kCompare;
  auto r = run_compare_images(options_, Gate{}, false);
  EXPECT_EQ(row(r, "alpha.png").error_kind, "channel_mismatch");
  EXPECT_NE(row(r, "alpha.png").error.find("only one side has alpha"), std::string::npos);
}

TEST_F(CompareImagesTest, GateAllowancesPassTheRun) {
  Gate g = parse_gate(R"({"checks": [{"metric": "ssim", "stat": "min", "min": 0.1}],
                         "max_errors": 4})",
                      "g");
  auto r = run_compare_images(options_, g, false);
  EXPECT_TRUE(r.gate.passed);
}

TEST_F(CompareImagesTest, ResultsDoNotDependOnThreadCount) {
  auto many = run_compare_images(options_, Gate{}, false);
  reports::CompareImagesReport one;
  {
    tbb::global_control c(tbb::global_control::max_allowed_parallelism, 1);
    one = run_compare_images(options_, Gate{}, false);
  }
  ASSERT_EQ(one.pairs.size(), many.pairs.size());
  for (std::size_t i = 0; i < one.pairs.size(); ++i) {
    ASSERT_EQ(one.pairs[i].name, many.pairs[i].name);
    ASSERT_EQ(one.pairs[i].metrics.size(), many.pairs[i].metrics.size());
    for (std::size_t k = 0; k < one.pairs[i].metrics.size(); ++k)
      EXPECT_EQ(one.pairs[i].metrics[k].value, many.pairs[i].metrics[k].value);
  }
}

TEST_F(CompareImagesTest, EmptyOrMissingFoldersAreInputErrors) {
  testing::ScratchDir empty("empty");
  std::filesystem::create_directories(empty / "a");
  std::filesystem::create_directories(empty / "b");
  CompareImagesOptions o;
  o.ref_dir = empty / "a";
  o.test_dir = empty / "b";
  EXPECT_THROW(run_compare_images(o, Gate{}, false), InputError);
  o.ref_dir = empty / "nope";
  EXPECT_THROW(run_compare_images(o, Gate{}, false), InputError);
}

TEST(CompareImagesSamples, ShippedSamplesScoreAsTheirReadmeSays) {
  CompareImagesOptions o;
  o.ref_dir = testing::source_dir() / "samples" / "ref";
  o.test_dir = testing::source_dir() / "samples" / "test";
  auto r = run_compare_images(o, load_gate(testing::source_dir() / "samples" / "gate.json"), false);
  EXPECT_EQ(r.count_errors(), 0u);
  EXPECT_TRUE(r.gate.passed);
  ASSERT_FALSE(r.worst.empty());
  EXPECT_EQ(r.worst[0].name, "chelsea.png");  // the one clearly degraded pair
  for (const auto& p : r.pairs) {
    if (p.name == "chelsea.png") {
      EXPECT_FALSE(p.failed_checks.empty());
    } else {
      EXPECT_TRUE(p.failed_checks.empty()) << p.name;
    }
  }
}

}  // namespace
}  // namespace qeval::eval
