// Atomic file output: a reader never sees a half-written report.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace qeval::base {

// Writes `content` to `path` through a temporary file in the same folder, flushed and renamed
// over the target. Throws InputError naming the path on failure (an unwritable output location
// is for the user to fix); the target is then untouched.
void write_file_atomic(const std::filesystem::path& path, std::string_view content);

// Output in progress, for a process that a signal stops (eval/cli/interrupt.h): every temporary
// file of an atomic write is tracked from its creation to its rename, so that none is left behind.
// A writer tracks its temporary file (track_temporary_file), then renames it into place with
// rename_tracked_file (which also stops tracking it) or removes it and calls untrack_temporary_file.
void track_temporary_file(const std::filesystem::path& tmp);
void untrack_temporary_file(const std::filesystem::path& tmp);
// rename(tmp, target) and untrack tmp, atomically with respect to abandon_temporary_files: a file
// is either in place and counted as complete, or removed. False (errno set) when rename fails.
bool rename_tracked_file(const std::filesystem::path& tmp, const std::filesystem::path& target);

struct AbandonedOutput {
  std::size_t removed = 0;    // temporary files of writes in progress, removed
  std::size_t completed = 0;  // files this process renamed into place, kept
  std::string last_completed;
};
// Removes every tracked temporary file and blocks every later rename_tracked_file for good: only
// for a process about to end (it never returns the lock). Safe to call from any thread.
AbandonedOutput abandon_temporary_files();

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
