// Image decoding: formats, bit depths, alpha, and precise errors on corrupt input.
#include <gtest/gtest.h>

#include "datasets/image_io.h"
#include "kernels/error.h"
#include "test_util.h"

namespace qeval::datasets {
namespace {

using testing::data_dir;

std::string error_of(const std::vector<std::uint8_t>& bytes) {
  try {
    decode_image(bytes, "x.png");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(ImageIo, PngRoundTripGrayRgbRgba) {
  for (int channels : {1, 3, 4}) {
    Rgb8 img = testing::pattern(17, 9, channels, 1);
    Image back = decode_image(encode_png(img), "mem");
    EXPECT_EQ(back.format, "png");
    EXPECT_EQ(back.bit_depth, 8);
    EXPECT_EQ(back.width(), 17);
    EXPECT_EQ(back.height(), 9);
    EXPECT_EQ(back.channels(), channels);
    EXPECT_EQ(back.has_alpha, channels == 4);
    const float* p = back.planes.data<float>();
    for (int y = 0; y < 9; ++y)
      for (int x = 0; x < 17; ++x)
        for (int c = 0; c < channels; ++c) ASSERT_EQ(p[(c * 9 + y) * 17 + x], img.pixels[(y * 17 + x) * channels + c]);
  }
}

TEST(ImageIo, SixteenBitPngKeepsFullValues) {
  Image img = load_image(data_dir() / "metrics" / "images" / "camera_u16.png");
  EXPECT_EQ(img.bit_depth, 16);
  EXPECT_EQ(img.peak(), 65535.0);
  Image rgb = load_image(data_dir() / "metrics" / "images" / "coffee_u16_128x144.png");
  EXPECT_EQ(rgb.channels(), 3);
  // Written as value * 257 from 8-bit data: every sample is a multiple of 257.
  float maxv = 0;
  for (float v : rgb.planes.span<float>()) {
    ASSERT_EQ(std::fmod(v, 257.0f), 0.0f);
    maxv = std::max(maxv, v);
  }
  EXPECT_GT(maxv, 255.0f);
}

TEST(ImageIo, TruncatedPngNamesTheProblem) {
  auto bytes = encode_png(testing::pattern(64, 64, 3, 2));
  bytes.resize(bytes.size() / 2);
  std::string e = error_of(bytes);
  EXPECT_NE(e.find("x.png: corrupt PNG"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST(ImageIo, CrcErrorIsReported) {
  auto bytes = encode_png(testing::pattern(16, 16, 3, 3));
  bytes[8 + 8 + 4] ^= 0xFF;  // a byte inside IHDR's data: its CRC no longer matches
  std::string e = error_of(bytes);
  EXPECT_NE(e.find("corrupt PNG"), std::string::npos) << e;
  EXPECT_NE(e.find("CRC"), std::string::npos) << e;
}

TEST(ImageIo, UnknownAndEmptyFiles) {
  EXPECT_NE(error_of({'G', 'I', 'F', '8', '9', 'a', 0, 0}).find("not a PNG or JPEG"), std::string::npos);
  EXPECT_NE(error_of({}).find("empty"), std::string::npos);
  try {
    load_image("/nonexistent/qeval/a.png");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no such file"), std::string::npos);
  }
}

// Fixtures from tools/make_io_fixtures.py with the pixels PIL (libjpeg, libpng) decodes them to.
TEST(ImageIo, FixturesDecodeToTheExpectedPixels) {
  auto expected = testing::read_json(data_dir() / "images" / "expected.json");
  ASSERT_GE(expected.size(), 6u);
  for (const auto& [name, e] : expected.items()) {
    Image img = load_image(data_dir() / "images" / name);
    const int h = e["height"], w = e["width"], c = e["channels"];
    ASSERT_EQ(img.height(), h) << name;
    ASSERT_EQ(img.width(), w) << name;
    ASSERT_EQ(img.channels(), c) << name;
    EXPECT_EQ(img.has_alpha, c == 2 || c == 4) << name;
    const float* p = img.planes.data<float>();
    int mismatches = 0;
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int k = 0; k < c; ++k)
          mismatches += p[(std::size_t(k) * h + y) * w + x] != e["pixels"][y][x][k].get<float>();
    EXPECT_EQ(mismatches, 0) << name;
  }
  EXPECT_EQ(load_image(data_dir() / "images" / "photo.jpg").format, "jpeg");
  EXPECT_EQ(load_image(data_dir() / "images" / "palette_trns.png").color_type(), "rgba");
  EXPECT_EQ(load_image(data_dir() / "images" / "gray_alpha.png").color_type(), "gray+alpha");
}

TEST(ImageIo, TruncatedJpegIsRejectedNotPatched) {
  try {
    load_image(data_dir() / "images" / "photo_truncated.jpg");
    FAIL() << "a truncated JPEG must not decode";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("corrupt JPEG"), std::string::npos) << e.what();
  }
  std::vector<std::uint8_t> header_only = {0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10, 'J', 'F', 'I', 'F', 0};
  EXPECT_NE(error_of(header_only).find("corrupt JPEG"), std::string::npos);
}

}  // namespace
}  // namespace qeval::datasets
