// Image sets: the image files under a folder, and reference/test sets paired by relative path.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace qeval::datasets {

// Relative paths (generic '/' form, sorted) of the .png/.jpg/.jpeg files under `root`, recursively.
// Throws InputError when root is missing or not a directory.
std::vector<std::string> list_images(const std::filesystem::path& root);

struct ImagePairEntry {
  std::string name;                           // relative path, e.g. "prompts/007.png"
  std::optional<std::filesystem::path> ref;   // empty when the reference set lacks it
  std::optional<std::filesystem::path> test;  // empty when the test set lacks it
};

// Union of both sets by relative path, sorted by name. A file whose counterpart is missing still
// appears, so that it is reported and counted rather than silently skipped. When the names differ
// only by extension (ref/a.png vs test/a.jpg) they are paired too.
std::vector<ImagePairEntry> pair_image_sets(const std::filesystem::path& ref_root,
                                            const std::filesystem::path& test_root);

}  // namespace qeval::datasets
