// The one rule for files named after tensors, nodes, units and variants (docs/infer.md "File names").
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>

namespace qeval::base {

// A name as a file name: every byte outside [A-Za-z0-9_.-] becomes '_' (so "a/b", "a:b" and
// "a b" all give "a_b"); a leading '.' becomes '_' (no hidden files, no "." or ".."); an empty
// name is "_"; more than 200 bytes are cut to 200. Many names give one file name: FileNamer keeps
// them apart.
std::string file_name_for(std::string_view name);

// The key under which two names would share a file or folder: file_name_for(name) lower-cased
// (ASCII), as a case-insensitive file system compares. For sets whose names must stay apart as
// they are (prompt ids: their folders must not depend on the order shards meet them).
std::string file_name_key(std::string_view name);

// File stems unique within one folder, in the order names are asked for: the first name gets
// file_name_for(name), a later one whose stem is taken gets "<stem>__2", "__3", ... (the first
// free one). Stems are compared ignoring ASCII case, so that they stay distinct on case-insensitive
// file systems too. Asking for the same name again gives the same stem.
class FileNamer {
 public:
  const std::string& stem(const std::string& name);

 private:
  std::map<std::string, std::string> by_name_;
  std::set<std::string> taken_;  // lower-cased stems
};

}  // namespace qeval::base
