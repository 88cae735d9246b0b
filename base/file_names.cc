// File names from tensor, node and unit names: one sanitiser, unique per folder.
#include "base/file_names.h"

#include <algorithm>

namespace qeval::base {

namespace {
constexpr std::size_t kMaxStemBytes = 200;  // room for a suffix and ".npy" under NAME_MAX (255)

std::string lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}
}  // namespace

std::string file_name_for(std::string_view name) {
  std::string out(name.substr(0, kMaxStemBytes));
  for (char& c : out) {
    const bool ok =
        (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    if (!ok) c = '_';
  }
  if (out.empty()) return "_";
  if (out.front() == '.') out.front() = '_';
  return out;
}

std::string file_name_key(std::string_view name) { return lower(file_name_for(name)); }

const std::string& FileNamer::stem(const std::string& name) {
  if (auto it = by_name_.find(name); it != by_name_.end()) return it->second;
  const std::string base = file_name_for(name);
  std::string candidate = base;
  for (int k = 2; taken_.count(lower(candidate)); ++k) candidate = base + "__" + std::to_string(k);
  taken_.insert(lower(candidate));
  return by_name_.emplace(name, std::move(candidate)).first->second;
}

}  // namespace qeval::base
