// Regular-file opening shared by every reader of user-named files (images, .npy, models, external
// data, prompt and gate files).
#include "base/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kernels/error.h"

namespace qeval::base {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISREG(mode)) return nullptr;
  if (S_ISDIR(mode)) return "is a directory";
  if (S_ISFIFO(mode)) return "is a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "is a socket";
  if (S_ISCHR(mode)) return "is a character device";
  if (S_ISBLK(mode)) return "is a block device";
  return "is not a regular file";
}

std::string link_target(const std::filesystem::path& path) {
  std::error_code ec;
  const auto target = std::filesystem::read_symlink(path, ec);
  return ec ? std::string("?") : target.string();
}

// "<display>: <predicate>, not a regular file" (just the predicate for a missing file, a dangling
// symlink or a loop).
[[noreturn]] void fail(const std::string& display, const std::string& predicate) {
  if (predicate == "no such file" || predicate.starts_with("is a dangling symlink") ||
      predicate.starts_with("is a symlink loop"))
    throw InputError(display + ": " + predicate);
  throw InputError(display + ": " + predicate + ", not a regular file");
}

}  // namespace

std::string describe_non_regular(const std::filesystem::path& path) {
  struct stat ls {};
  if (::lstat(path.c_str(), &ls) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) return "no such file";
    if (err == ELOOP) return "is a symlink loop (a folder on its path links back)";
    return std::string("cannot be examined: ") + std::strerror(err);
  }
  if (!S_ISLNK(ls.st_mode)) {
    const char* kind = kind_of(ls.st_mode);
    return kind ? kind : "";
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ELOOP) return "is a symlink loop ('" + link_target(path) + "' links back to itself)";
    if (err == ENOENT || err == ENOTDIR) return "is a dangling symlink to '" + link_target(path) + "'";
    return "is a symlink to '" + link_target(path) + "' that cannot be followed: " + std::strerror(err);
  }
  const char* kind = kind_of(st.st_mode);
  return kind ? std::string(kind) + " (through the symlink to '" + link_target(path) + "')" : "";
}

RegularFile::RegularFile(RegularFile&& other) noexcept
    : fd_(other.fd_), size_(other.size_), display_(std::move(other.display_)) {
  other.fd_ = -1;
}

RegularFile& RegularFile::operator=(RegularFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    size_ = other.size_;
    display_ = std::move(other.display_);
    other.fd_ = -1;
  }
  return *this;
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

void RegularFile::read_at(void* dst, std::uint64_t n, std::uint64_t offset) const {
  auto* out = static_cast<std::uint8_t*>(dst);
  std::uint64_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd_, out + done, static_cast<std::size_t>(n - done), static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw InputError(display_ + ": read error: " + std::strerror(errno));
    if (got == 0)
      throw InputError(display_ + ": the file ended after " + std::to_string(offset + done) +
                       " bytes (it shrank while being read)");
    done += static_cast<std::uint64_t>(got);
  }
}

std::vector<std::uint8_t> RegularFile::read_all() const {
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(size_));
  read_at(bytes.data(), size_, 0);
  return bytes;
}

RegularFile open_regular_file(const std::filesystem::path& path, bool follow_symlinks, const std::string& display) {
  const std::string name = display.empty() ? path.string() : display;
  // O_NONBLOCK: opening a FIFO for reading must not wait for a writer (fstat then rejects it).
  const int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY | (follow_symlinks ? 0 : O_NOFOLLOW);
  RegularFile file;
  file.display_ = name;
  file.fd_ = ::open(path.c_str(), flags);
  if (file.fd_ < 0) {
    const int err = errno;
    std::string what = describe_non_regular(path);
    if (what.empty() && err == ELOOP && !follow_symlinks) what = "is a symlink (not followed here)";
    if (what.empty()) throw InputError(name + ": cannot open for reading: " + std::strerror(err));
    fail(name, what);
  }
  struct stat st {};
  if (::fstat(file.fd_, &st) != 0) throw InputError(name + ": cannot stat: " + std::strerror(errno));
  if (const char* kind = kind_of(st.st_mode)) fail(name, kind);
  file.size_ = static_cast<std::uint64_t>(st.st_size);
  return file;
}

std::vector<std::uint8_t> read_regular_file(const std::filesystem::path& path) {
  return open_regular_file(path).read_all();
}

std::string read_regular_file_text(const std::filesystem::path& path) {
  const RegularFile file = open_regular_file(path);
  std::string text(static_cast<std::size_t>(file.size()), '\0');
  file.read_at(text.data(), text.size(), 0);
  return text;
}

}  // namespace qeval::base
