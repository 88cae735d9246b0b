// Atomic file output: a reader never sees a half-written report.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace qeval::base {

// Writes `content` to `path` through a temporary file in the same folder, flushed and renamed
// over the target. Throws InputError naming the path on failure (an unwritable output location
// is for the user to fix); the target is then untouched.
void write_file_atomic(const std::filesystem::path& path, std::string_view content);

// The same in pieces, for output too large to build in memory first: write() appends to the
// temporary file, commit() flushes it and renames it over `path`. Destroyed uncommitted (an error
// on the way), it removes the temporary file and the target stays untouched.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::filesystem::path path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  void write(std::string_view bytes);
  void commit();

 private:
  [[noreturn]] void fail(const std::string& what);
  std::filesystem::path path_, tmp_;
  int fd_ = -1;
};

}  // namespace qeval::base
