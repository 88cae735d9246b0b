// Masks from and to image files: gray or equal-channel color, non-zero = foreground.
#include <gtest/gtest.h>

#include "datasets/mask_io.h"
#include "kernels/error.h"
#include "test_util.h"

namespace qeval::datasets {
namespace {

TEST(MaskIo, RoundTripsThroughPng) {
  Tensor mask(DType::kUInt8, {5, 7});
  for (int i = 0; i < 35; ++i) mask.data<std::uint8_t>()[i] = (i * 7) % 3 == 0;
  Rgb8 img = mask_image(mask);
  EXPECT_EQ(img.channels, 1);
  EXPECT_EQ(img.pixels[0], 255);
  EXPECT_EQ(img.pixels[1], 0);
  auto bytes = encode_png(img);
  Tensor back = mask_from_image(decode_image(bytes, "m.png"), "m.png");
  ASSERT_EQ(back.shape(), (Shape{5, 7}));
  for (int i = 0; i < 35; ++i) EXPECT_EQ(back.data<std::uint8_t>()[i], mask.data<std::uint8_t>()[i]);
}

TEST(MaskIo, EqualColorChannelsAreAMaskOtherColorsAreNot) {
  Rgb8 rgb{3, 2, 3, std::vector<std::uint8_t>(18, 0)};
  for (int c = 0; c < 3; ++c) rgb.pixels[3 * 4 + c] = 200;  // pixel (x 1, y 1)
  Tensor m = mask_from_image(decode_image(encode_png(rgb), "rgb.png"), "rgb.png");
  EXPECT_EQ(m.data<std::uint8_t>()[4], 1);
  EXPECT_EQ(m.data<std::uint8_t>()[3], 0);
  rgb.pixels[3 * 5 + 1] = 9;  // pixel (x 2, y 1): green differs
  try {
    mask_from_image(decode_image(encode_png(rgb), "rgb.png"), "rgb.png");
    FAIL() << "colored mask accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("rgb.png: not a mask: pixel (x 2, y 1)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_mask("/nonexistent/mask.png"), InputError);
}

}  // namespace
}  // namespace qeval::datasets
