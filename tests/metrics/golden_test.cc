// Image metrics against scikit-image / numpy reference values (tools/make_image_goldens.py).
#include <gtest/gtest.h>

#include <cmath>

#include "datasets/image_io.h"
#include "metrics/ms_ssim.h"
#include "metrics/psnr.h"
#include "metrics/ssim.h"
#include "test_util.h"

namespace qeval::metrics {
namespace {

using nlohmann::json;
using testing::data_dir;

constexpr double kSsimTol = 1e-5;
constexpr double kPsnrTol = 1e-4;

struct Case {
  json spec;
  datasets::Image ref, test;
};

std::vector<Case> load_cases() {
  json golden = testing::read_json(data_dir() / "metrics" / "image_golden.json");
  std::vector<Case> cases;
  for (const auto& c : golden["cases"]) {
    auto dir = data_dir() / "metrics";
    cases.push_back({c, datasets::load_image(dir / c["ref"].get<std::string>()),
                     datasets::load_image(dir / c["test"].get<std::string>())});
  }
  return cases;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = load_cases();
  return c;
}

void expect_optional(const json& expected, std::optional<double> actual, double tol, const std::string& what) {
  if (expected.is_null()) {
    EXPECT_FALSE(actual.has_value()) << what << " should be null, got " << actual.value_or(0);
  } else {
    ASSERT_TRUE(actual.has_value()) << what << " should be " << expected.get<double>();
    EXPECT_NEAR(*actual, expected.get<double>(), tol) << what;
  }
}

TEST(GoldenImages, CoverTheDistortionsAndFormats) {
  ASSERT_GE(cases().size(), 20u);
  bool gray = false, sixteen = false, identical = false, matlab_f2 = false, too_small = false;
  for (const auto& c : cases()) {
    EXPECT_EQ(c.ref.height(), c.spec["height"].get<int>()) << c.spec["name"];
    EXPECT_EQ(c.ref.width(), c.spec["width"].get<int>()) << c.spec["name"];
    EXPECT_EQ(c.ref.channels(), c.spec["channels"].get<int>()) << c.spec["name"];
    EXPECT_EQ(c.ref.bit_depth, c.spec["bit_depth"].get<int>()) << c.spec["name"];
    gray |= c.ref.channels() == 1;
    sixteen |= c.ref.bit_depth == 16;
    identical |= c.spec["psnr_db"].is_null();
    matlab_f2 |= matlab_downsample_factor(c.ref.height(), c.ref.width()) == 2;
    too_small |= c.spec["ms_ssim"].is_null();
  }
  EXPECT_TRUE(gray && sixteen && identical && matlab_f2 && too_small);
}

TEST(GoldenImages, PsnrMatchesScikitImage) {
  for (const auto& c : cases()) {
    const std::string name = c.spec["name"];
    PsnrResult r = psnr(c.ref.planes, c.test.planes, c.spec["data_range"].get<double>());
    expect_optional(c.spec["psnr_db"], r.psnr_db, kPsnrTol, name + " psnr");
    expect_optional(c.spec["psnr_y_db"], r.luma_psnr_db, kPsnrTol, name + " psnr_y");
    ASSERT_EQ(r.channel_psnr_db.size(), c.spec["psnr_channel_db"].size()) << name;
    for (std::size_t k = 0; k < r.channel_psnr_db.size(); ++k)
      expect_optional(c.spec["psnr_channel_db"][k], r.channel_psnr_db[k], kPsnrTol,
                      name + " channel " + std::to_string(k));
  }
}

void check_ssim(SsimConvention convention, const char* key, bool reference) {
  for (const auto& c : cases()) {
    const std::string name = c.spec["name"];
    const double peak = c.spec["data_range"];
    SsimResult r = reference ? ssim_reference(c.ref.planes, c.test.planes, convention, peak)
                             : ssim(c.ref.planes, c.test.planes, convention, peak);
    expect_optional(c.spec[key], r.ssim, kSsimTol, name + " " + key);
  }
}

TEST(GoldenImages, SsimWangMatchesScikitImageGaussian) { check_ssim(SsimConvention::kWang, "ssim_wang", false); }
TEST(GoldenImages, SsimSkimageDefaultMatchesScikitImage) {
  check_ssim(SsimConvention::kSkimageDefault, "ssim_skimage_default", false);
}
TEST(GoldenImages, SsimMatlabMatchesPortOfSsimM) { check_ssim(SsimConvention::kMatlab, "ssim_matlab", false); }
TEST(GoldenImages, SsimReferencePathMatchesToo) {
  check_ssim(SsimConvention::kWang, "ssim_wang", true);
  check_ssim(SsimConvention::kSkimageDefault, "ssim_skimage_default", true);
  check_ssim(SsimConvention::kMatlab, "ssim_matlab", true);
}

TEST(GoldenImages, MsSsimMatchesPortOfWang2003) {
  for (const auto& c : cases()) {
    const std::string name = c.spec["name"];
    MsSsimResult r = ms_ssim(c.ref.planes, c.test.planes, c.spec["data_range"].get<double>());
    expect_optional(c.spec["ms_ssim"], r.ms_ssim, kSsimTol, name + " ms_ssim");
    if (!r.ms_ssim) {
      EXPECT_EQ(r.note, c.spec["ms_ssim_note"].get<std::string>()) << name;
    }
  }
}

// The fast float path must sit far inside the tolerance, not at its edge.
TEST(GoldenImages, FastSsimAgreesWithDoubleReferenceTo1e7) {
  for (const auto& c : cases()) {
    for (auto conv : {SsimConvention::kWang, SsimConvention::kSkimageDefault, SsimConvention::kMatlab}) {
      const double peak = c.spec["data_range"];
      auto fast = ssim(c.ref.planes, c.test.planes, conv, peak);
      auto ref = ssim_reference(c.ref.planes, c.test.planes, conv, peak);
      ASSERT_EQ(fast.ssim.has_value(), ref.ssim.has_value());
      if (fast.ssim) {
        EXPECT_NEAR(*fast.ssim, *ref.ssim, 1e-7) << c.spec["name"];
      }
    }
  }
}

}  // namespace
}  // namespace qeval::metrics
