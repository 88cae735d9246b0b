// Per-thread scratch buffers.
#include "kernels/scratch.h"

#include <array>

#include "kernels/gemm.h"

namespace qeval::kernels {

float* thread_scratch(ScratchSlot slot, std::size_t n) {
  struct Buffer {
    AlignedFloats data;
    std::size_t size = 0;
  };
  thread_local std::array<Buffer, std::size_t(ScratchSlot::kCount)> buffers;
  Buffer& b = buffers[std::size_t(slot)];
  if (n > b.size) {
    b.data = alloc_aligned_floats(n);
    b.size = n;
  }
  return b.data.get();
}

namespace detail {
std::size_t& thread_lent_bytes_counter() {
  thread_local std::size_t bytes = 0;
  return bytes;
}
}  // namespace detail

std::size_t thread_lent_bytes() { return detail::thread_lent_bytes_counter(); }

}  // namespace qeval::kernels
