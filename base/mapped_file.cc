// Read-only file mappings (base/mapped_file.h).
#include "base/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

namespace qeval::base {

std::shared_ptr<const MappedFile> MappedFile::map(const RegularFile& file) {
  if (file.size() == 0 || file.size() > std::uint64_t(SIZE_MAX)) return nullptr;
  void* p = ::mmap(nullptr, static_cast<std::size_t>(file.size()), PROT_READ, MAP_PRIVATE, file.fd(), 0);
  if (p == MAP_FAILED) return nullptr;
  return std::shared_ptr<const MappedFile>(new MappedFile(static_cast<const std::byte*>(p), file.size()));
}

std::shared_ptr<const MappedFile> MappedFile::spill(const std::byte* bytes, std::size_t n,
                                                    const std::filesystem::path& dir) {
  if (n == 0) return nullptr;
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);  // no name: gone with its last user
  if (fd < 0) return nullptr;
  std::size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd, bytes + done, n - done);
    if (w <= 0) break;
    done += static_cast<std::size_t>(w);
  }
  void* p = done == n ? ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  ::close(fd);
  if (p == MAP_FAILED) return nullptr;
  return std::shared_ptr<const MappedFile>(new MappedFile(static_cast<const std::byte*>(p), n));
}

MappedFile::~MappedFile() { ::munmap(const_cast<std::byte*>(data_), static_cast<std::size_t>(size_)); }

void MappedFile::release_pages(const std::byte* p, std::size_t bytes) const noexcept {
  static const std::uintptr_t page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const std::uintptr_t lo = reinterpret_cast<std::uintptr_t>(std::max(p, data_));
  const std::uintptr_t hi = reinterpret_cast<std::uintptr_t>(std::min(p + bytes, data_ + size_));
  // Whole pages only: a page it shares with a neighbour may be in use, and is small.
  const std::uintptr_t first = (lo + page - 1) / page * page, last = hi / page * page;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

}  // namespace qeval::base
