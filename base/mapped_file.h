// A regular file mapped read-only into memory: weights read in place (ONNX external data), their
// pages given back once a transformed copy replaces them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "base/input_file.h"
#include "kernels/tensor.h"

namespace qeval::base {

// The whole of a regular file (its size when it was opened), mapped private and read-only: the
// pages come from the page cache when first read and count in the process's resident memory only
// while mapped in; release_pages lets them go again (the kernel reads them from the file if they
// are read once more). Tensors borrow from it (Tensor::borrowed) and keep it alive.
// The file must not shrink while mapped: a read past its new end is a SIGBUS, as with any mapping.
class MappedFile final : public BorrowedMemory {
 public:
  // nullptr when the file is empty or the system refuses the mapping (the caller then reads).
  static std::shared_ptr<const MappedFile> map(const RegularFile& file);
  // `n` bytes written to an unlinked temporary file in `dir` and mapped back: memory that can be
  // released and read again as a file's (a session's rounded or widened copy of a mapped weight,
  // which its packed form replaces). nullptr when the file cannot be made or written (the caller
  // keeps the bytes in memory).
  static std::shared_ptr<const MappedFile> spill(const std::byte* bytes, std::size_t n,
                                                 const std::filesystem::path& dir);
  ~MappedFile() override;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  std::uint64_t size() const { return size_; }
  void release_pages(const std::byte* p, std::size_t bytes) const noexcept override;

 private:
  MappedFile(const std::byte* data, std::uint64_t size) : data_(data), size_(size) {}
  const std::byte* data_;
  std::uint64_t size_;
};

}  // namespace qeval::base
