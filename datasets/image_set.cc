// Folder walking and pairing by relative path.
#include "datasets/image_set.h"

#include <algorithm>
#include <map>

#include "kernels/error.h"

namespace qeval::datasets {

namespace fs = std::filesystem;

namespace {
bool is_image_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

// The entry's path below root, from the text: the iterator builds entries as root / name.
// (fs::relative resolves symlinks: a symlinked file took its target's name, a symlink loop threw.)
std::string relative_name(const fs::path& entry, const fs::path& root) {
  const std::string& e = entry.native();
  const std::string& r = root.native();
  std::string rel = e.compare(0, r.size(), r) == 0 ? e.substr(r.size()) : entry.lexically_relative(root).native();
  while (!rel.empty() && rel.front() == '/') rel.erase(0, 1);
  return fs::path(rel).generic_string();
}

std::string stem_key(const std::string& rel) { return fs::path(rel).replace_extension().generic_string(); }
}  // namespace

std::vector<std::string> list_images(const fs::path& root) {
  std::error_code ec;
  if (!fs::exists(root, ec)) throw InputError(root.string() + ": no such directory");
  if (!fs::is_directory(root, ec)) throw InputError(root.string() + ": not a directory");
  std::vector<std::string> out;
  // Directory symlinks are not followed (a cycle would never end); symlinked files are read.
  fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec);
  if (ec) throw InputError(root.string() + ": cannot list: " + ec.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) throw InputError(root.string() + ": cannot list: " + ec.message());
    // Every entry named like an image is listed, whatever it is: a folder, FIFO, dangling symlink
    // or symlink loop named x.png then fails to load saying what it is, instead of vanishing.
    if (is_image_extension(it->path())) out.push_back(relative_name(it->path(), root));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<ImagePairEntry> pair_image_sets(const fs::path& ref_root, const fs::path& test_root) {
  auto refs = list_images(ref_root);
  auto tests = list_images(test_root);
  std::map<std::string, ImagePairEntry> by_name;
  std::map<std::string, std::string> ref_by_stem;
  for (const auto& r : refs) {
    by_name[r] = {r, ref_root / r, std::nullopt};
    ref_by_stem.emplace(stem_key(r), r);
  }
  // Exact names first, so that test/x.png takes ref/x.png even when test/x.jpg sorts before it;
  // then one test file per reference stem (ref/x.png with test/x.jpg). A test file left over is
  // an entry of its own ("no reference image"): never dropped.
  std::vector<std::string> by_stem;
  for (const auto& t : tests) {
    auto exact = by_name.find(t);
    if (exact != by_name.end()) exact->second.test = test_root / t;
    else by_stem.push_back(t);
  }
  for (const auto& t : by_stem) {
    auto stem = ref_by_stem.find(stem_key(t));
    if (stem != ref_by_stem.end() && !by_name[stem->second].test) {
      by_name[stem->second].test = test_root / t;
      continue;
    }
    by_name[t] = {t, std::nullopt, test_root / t};
  }
  std::vector<ImagePairEntry> out;
  out.reserve(by_name.size());
  for (auto& [name, entry] : by_name) out.push_back(std::move(entry));
  return out;
}

}  // namespace qeval::datasets
