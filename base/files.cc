// Atomic writes (temp file + fsync + rename) and base64.
#include "base/files.h"

#include "kernels/error.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>

namespace qeval::base {

namespace {

// The process's output in progress. Process-wide by nature: a signal stops the whole process,
// whichever code was writing.
struct Tracked {
  std::mutex mutex;
  std::set<std::string> temporary;
  std::size_t completed = 0;
  std::string last_completed;
};

Tracked& tracked() {
  static Tracked* t = new Tracked;  // never destroyed: abandon_temporary_files may hold its lock at exit
  return *t;
}

}  // namespace

void track_temporary_file(const std::filesystem::path& tmp) {
  Tracked& t = tracked();
  std::lock_guard lock(t.mutex);
  t.temporary.insert(tmp.string());
}

void untrack_temporary_file(const std::filesystem::path& tmp) {
  Tracked& t = tracked();
  std::lock_guard lock(t.mutex);
  t.temporary.erase(tmp.string());
}

bool rename_tracked_file(const std::filesystem::path& tmp, const std::filesystem::path& target) {
  Tracked& t = tracked();
  std::lock_guard lock(t.mutex);
  if (::rename(tmp.c_str(), target.c_str()) != 0) return false;
  t.temporary.erase(tmp.string());
  ++t.completed;
  t.last_completed = target.string();
  return true;
}

AbandonedOutput abandon_temporary_files() {
  Tracked& t = tracked();
  t.mutex.lock();  // held until the process ends: no rename after this
  AbandonedOutput a;
  for (const std::string& f : t.temporary) a.removed += ::unlink(f.c_str()) == 0;
  t.temporary.clear();
  a.completed = t.completed;
  a.last_completed = t.last_completed;
  return a;
}

AtomicFileWriter::AtomicFileWriter(std::filesystem::path path) : path_(std::move(path)) {
  std::string tmp_name = ".";
  tmp_name += path_.filename().string();
  tmp_name += ".tmp.";
  tmp_name += std::to_string(::getpid());
  tmp_ = path_.parent_path() / tmp_name;
  track_temporary_file(tmp_);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create temporary file");
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) {
    ::unlink(tmp_.c_str());
    untrack_temporary_file(tmp_);
  }
}

void AtomicFileWriter::fail(const std::string& what) {
  std::string msg = path_.string() + ": " + what + ": " + std::strerror(errno);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  untrack_temporary_file(tmp_);
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
  if (!rename_tracked_file(tmp_, path_)) fail("rename failed");
  tmp_.clear();
}

void write_file_atomic(const std::filesystem::path& path, std::string_view content) {
  AtomicFileWriter out(path);
  out.write(content);
  out.commit();
}

}  // namespace qeval::base
