// The broadcast loop nest of elementwise binary maps.
#include "kernels/elementwise.h"

#include "kernels/broadcast.h"

namespace qeval::kernels {

BroadcastLoop plan_broadcast(const Shape& out, const Shape& a, const Shape& b) {
  const auto sa = broadcast_strides(a, out), sb = broadcast_strides(b, out);
  // Dimensions of size 1 contribute nothing; the rest merge with their inner neighbour when both
  // operands step through the pair as through one dimension.
  std::vector<std::int64_t> dims, as, bs;
  for (std::size_t d = 0; d < out.size(); ++d) {
    if (out[d] == 1) continue;
    dims.push_back(out[d]);
    as.push_back(sa[d]);
    bs.push_back(sb[d]);
  }
  BroadcastLoop L;
  for (std::size_t d = 0; d < dims.size(); ++d) {
    if (!L.dims.empty()) {
      const std::size_t p = L.dims.size() - 1;
      if (L.a_strides[p] == as[d] * dims[d] && L.b_strides[p] == bs[d] * dims[d]) {
        L.dims[p] *= dims[d];
        L.a_strides[p] = as[d];
        L.b_strides[p] = bs[d];
        continue;
      }
    }
    L.dims.push_back(dims[d]);
    L.a_strides.push_back(as[d]);
    L.b_strides.push_back(bs[d]);
  }
  if (!L.dims.empty()) {
    L.inner = L.dims.back();
    L.a_inner = L.a_strides.back();
    L.b_inner = L.b_strides.back();
    L.dims.pop_back();
    L.a_strides.pop_back();
    L.b_strides.pop_back();
  }
  for (auto d : L.dims) L.rows *= d;
  for (auto d : out)
    if (d == 0) L.rows = 0;
  return L;
}

}  // namespace qeval::kernels
