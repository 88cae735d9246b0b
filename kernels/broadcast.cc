// Broadcast strides.
#include "kernels/broadcast.h"

namespace qeval::kernels {

std::vector<std::int64_t> broadcast_strides(const Shape& in, const Shape& out) {
  std::vector<std::int64_t> strides(out.size(), 0);
  std::int64_t stride = 1;
  for (std::size_t k = 0; k < in.size(); ++k) {
    const std::size_t di = in.size() - 1 - k, dout = out.size() - 1 - k;
    strides[dout] = in[di] == 1 ? 0 : stride;
    stride *= in[di];
  }
  return strides;
}

}  // namespace qeval::kernels
