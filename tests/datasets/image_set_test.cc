// Pairing reference and test folders by relative path.
#include <gtest/gtest.h>

#include "datasets/image_set.h"
#include "kernels/error.h"
#include "test_util.h"

namespace qeval::datasets {
namespace {

void touch(const std::filesystem::path& p) { testing::write_bytes(p, {1, 2, 3}); }

TEST(ImageSet, PairsByRelativePathAndKeepsOrphans) {
  testing::ScratchDir dir("pairs");
  touch(dir / "ref/a.png");
  touch(dir / "ref/sub/b.png");
  touch(dir / "ref/only_ref.png");
  touch(dir / "ref/notes.txt");
  touch(dir / "test/a.png");
  touch(dir / "test/sub/b.png");
  touch(dir / "test/only_test.PNG");
  touch(dir / "ref/c.png");
  touch(dir / "test/c.jpg");  // same stem, other extension: paired
  auto pairs = pair_image_sets(dir / "ref", dir / "test");
  ASSERT_EQ(pairs.size(), 5u);
  EXPECT_EQ(pairs[0].name, "a.png");
  EXPECT_TRUE(pairs[0].ref && pairs[0].test);
  EXPECT_EQ(pairs[1].name, "c.png");
  EXPECT_EQ(pairs[1].test->filename(), "c.jpg");
  EXPECT_EQ(pairs[2].name, "only_ref.png");
  EXPECT_FALSE(pairs[2].test.has_value());
  EXPECT_EQ(pairs[3].name, "only_test.PNG");
  EXPECT_FALSE(pairs[3].ref.has_value());
  EXPECT_EQ(pairs[4].name, "sub/b.png");
}

TEST(ImageSet, MissingFolderIsAnInputError) {
  testing::ScratchDir dir("missing");
  EXPECT_THROW(list_images(dir / "nope"), InputError);
  touch(dir / "file.png");
  EXPECT_THROW(list_images(dir / "file.png"), InputError);
}

}  // namespace
}  // namespace qeval::datasets
