// flock on <out>/qeval.lock: released by the kernel when the holder exits or is killed. On a
// filesystem without locks (ENOLCK, EOPNOTSUPP) it warns on stderr and holds nothing.
#include "eval/run/out_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <system_error>

#include "kernels/error.h"

namespace qeval::eval {

namespace fs = std::filesystem;

namespace {

std::string holder_text(int pid) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return "pid " + std::to_string(pid) + " on host " + host + ", started " + when;
}

std::string read_all(int fd) {
  std::string s;
  char buf[1024];
  off_t at = 0;
  for (ssize_t n; (n = ::pread(fd, buf, sizeof buf, at)) > 0 && s.size() < 8192; at += n) s.append(buf, std::size_t(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

}  // namespace

OutFolderLock::OutFolderLock(const fs::path& folder, const std::string& command_line) {
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) throw InputError("--out " + folder.string() + ": cannot create the folder: " + ec.message());
  const fs::path file = folder / kOutLockFile;
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0)
    throw InputError("--out " + folder.string() + ": cannot open the lock file " + file.string() + ": " +
                     std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS) {
      // A filesystem without locks (some network and FUSE mounts): running unguarded beats not
      // running at all, but say so.
      std::fprintf(stderr,
                   "qeval: warning: --out %s: the filesystem does not lock %s (%s): another qeval "
                   "writing into this folder would not be noticed\n",
                   folder.c_str(), file.c_str(), std::strerror(err));
      return;  // fd_ stays open (closed by the destructor); nothing is held
    }
    std::string holder = err == EWOULDBLOCK ? read_all(fd_) : std::string();
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK)
      throw InputError("--out " + folder.string() + ": cannot lock " + file.string() + ": " + std::strerror(err));
    if (holder.empty()) holder = "a process that has not written its name yet";
    throw InputError("--out " + folder.string() + " is in use by another qeval (" + holder + "; lock " + file.string() +
                     "): wait for it to finish or give another --out");
  }
  const std::string text = holder_text(int(::getpid())) + ": " + command_line + "\n";
  // Whoever reads it holds no lock: a short write beside a reader shows at worst a cut-off name.
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != ssize_t(text.size())) {
    // The lock holds without its note; say nothing worse than an anonymous holder.
  }
}

OutFolderLock::~OutFolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays (removing it would race a new holder)
}

}  // namespace qeval::eval
