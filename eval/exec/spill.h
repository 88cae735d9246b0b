// A session's large host copies moved out of anonymous memory (docs/infer.md "Weights in memory").
#pragma once

#include <cstddef>
#include <filesystem>
#include <system_error>
#include <utility>

#include "base/mapped_file.h"
#include "kernels/tensor.h"

namespace qeval::eval {

// Copies smaller than this stay in memory.
inline constexpr std::size_t kSpillBytes = std::size_t(1) << 20;

// `t` written to an unlinked temporary file in TMPDIR (else /tmp) and mapped back (a borrowed
// tensor with the same bytes): once what reads it has made its own form (a packed weight), its
// pages can leave memory (Tensor::release_pages). `t` itself when it is below kSpillBytes or no
// file can be made.
inline Tensor spilled(Tensor t) {
  if (t.nbytes() < kSpillBytes) return t;
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::temp_directory_path(ec);
  if (auto file = ec ? nullptr : base::MappedFile::spill(std::as_const(t).raw(), t.nbytes(), dir))
    return Tensor::borrowed(t.dtype(), t.shape(), file->data(), file);
  return t;
}

}  // namespace qeval::eval
