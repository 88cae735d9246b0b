// The lock on an output folder: one qeval writes into a --out folder at a time.
#pragma once

#include <filesystem>
#include <string>

namespace qeval::eval {

inline constexpr const char* kOutLockFile = "qeval.lock";

// Creates `folder` and holds an advisory lock (flock) on folder/qeval.lock for the object's life;
// the kernel drops it when the process dies, however it dies, so a stale lock file never blocks.
// The file says who holds it (pid, host, start time, command line). InputError naming the folder
// when it cannot be created, or naming the holder when another process holds the lock.
class OutFolderLock {
 public:
  OutFolderLock(const std::filesystem::path& folder, const std::string& command_line);
  ~OutFolderLock();
  OutFolderLock(OutFolderLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  OutFolderLock(const OutFolderLock&) = delete;
  OutFolderLock& operator=(const OutFolderLock&) = delete;
  OutFolderLock& operator=(OutFolderLock&&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace qeval::eval
