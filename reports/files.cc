// Atomic writes (temp file + fsync + rename) and base64.
#include "reports/files.h"

#include "kernels/error.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace qeval::reports {

void write_file_atomic(const std::filesystem::path& path, std::string_view content) {
  std::string tmp_name = ".";
  tmp_name += path.filename().string();
  tmp_name += ".tmp.";
  tmp_name += std::to_string(::getpid());
  const std::filesystem::path tmp = path.parent_path() / tmp_name;
  auto fail = [&](const std::string& what) {
    std::string msg = path.string() + ": " + what + ": " + std::strerror(errno);
    ::unlink(tmp.c_str());
    throw InputError(msg);
  };
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create temporary file");
  const char* p = content.data();
  std::size_t left = content.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      fail("write failed");
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail("fsync failed");
  }
  if (::close(fd) != 0) fail("close failed");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename failed");
}

std::string base64(std::string_view bytes) {
  static const char* kTable = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  auto byte = [&](std::size_t k) { return static_cast<unsigned>(static_cast<unsigned char>(bytes[k])); };
  for (; i + 3 <= bytes.size(); i += 3) {
    unsigned v = byte(i) << 16 | byte(i + 1) << 8 | byte(i + 2);
    out += kTable[v >> 18 & 63];
    out += kTable[v >> 12 & 63];
    out += kTable[v >> 6 & 63];
    out += kTable[v & 63];
  }
  if (std::size_t rest = bytes.size() - i; rest > 0) {
    unsigned v = byte(i) << 16 | (rest == 2 ? byte(i + 1) << 8 : 0u);
    out += kTable[v >> 18 & 63];
    out += kTable[v >> 12 & 63];
    out += rest == 2 ? kTable[v >> 6 & 63] : '=';
    out += '=';
  }
  return out;
}

}  // namespace qeval::reports
