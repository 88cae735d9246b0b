// Atomic writes (temp file + fsync + rename) and base64.
#include "base/files.h"

#include "kernels/error.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace qeval::base {

AtomicFileWriter::AtomicFileWriter(std::filesystem::path path) : path_(std::move(path)) {
  std::string tmp_name = ".";
  tmp_name += path_.filename().string();
  tmp_name += ".tmp.";
  tmp_name += std::to_string(::getpid());
  tmp_ = path_.parent_path() / tmp_name;
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create temporary file");
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFileWriter::fail(const std::string& what) {
  std::string msg = path_.string() + ": " + what + ": " + std::strerror(errno);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  tmp_.clear();
  throw InputError(msg);
}

void AtomicFileWriter::write(std::string_view bytes) {
  if (fd_ < 0) throw std::logic_error("AtomicFileWriter: write after commit");
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write failed");
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  if (fd_ < 0) throw std::logic_error("AtomicFileWriter: committed twice");
  if (::fsync(fd_) != 0) fail("fsync failed");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("close failed");
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("rename failed");
  tmp_.clear();
}

void write_file_atomic(const std::filesystem::path& path, std::string_view content) {
  AtomicFileWriter out(path);
  out.write(content);
  out.commit();
}

}  // namespace qeval::base
