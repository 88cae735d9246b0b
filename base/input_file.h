// Opening files a user named: regular files only, without blocking, and a precise reason otherwise.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace qeval::base {

// What `path` is when it cannot be read as a regular file, in words for a message: "a directory",
// "a FIFO (named pipe)", "a socket", "a character device", "a block device", "a dangling symlink to
// 'target'", "a symlink loop", "missing" (no such file). Empty when it is a regular file (after
// following symlinks). Looks with lstat/stat only: never opens, so a FIFO cannot block it.
std::string describe_non_regular(const std::filesystem::path& path);

// A regular file open for reading; closed by the destructor.
class RegularFile {
 public:
  RegularFile() = default;
  RegularFile(RegularFile&& other) noexcept;
  RegularFile& operator=(RegularFile&& other) noexcept;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile();

  int fd() const { return fd_; }
  std::uint64_t size() const { return size_; }  // at open time
  // Reads `n` bytes at `offset` into dst; InputError naming `display` when the file ends first (it
  // shrank since it was opened) or the read fails.
  void read_at(void* dst, std::uint64_t n, std::uint64_t offset) const;
  // The whole file (its size at open time).
  std::vector<std::uint8_t> read_all() const;

 private:
  friend RegularFile open_regular_file(const std::filesystem::path&, bool, const std::string&);
  int fd_ = -1;
  std::uint64_t size_ = 0;
  std::string display_;
};

// Opens `path` read-only with O_NONBLOCK (opening a FIFO must not wait for a writer) and fstat's
// the descriptor: anything but a regular file is an InputError "<display>: <what it is>, not a
// regular file" (display defaults to the path as given). follow_symlinks = false adds O_NOFOLLOW
// (for paths already resolved: a symlink there appeared since).
RegularFile open_regular_file(const std::filesystem::path& path, bool follow_symlinks = true,
                              const std::string& display = {});

// open_regular_file(path).read_all().
std::vector<std::uint8_t> read_regular_file(const std::filesystem::path& path);
std::string read_regular_file_text(const std::filesystem::path& path);

}  // namespace qeval::base
