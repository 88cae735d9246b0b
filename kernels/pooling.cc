// Block pooling of planes.
#include "kernels/pooling.h"

#include <cmath>
#include <stdexcept>

namespace qeval::kernels {

std::vector<float> pool_plane(const float* in, int h, int w, int f, PoolMode mode, int* out_h, int* out_w) {
  if (f < 1) throw std::invalid_argument("pool_plane: factor must be >= 1");
  const int oh = (h + f - 1) / f, ow = (w + f - 1) / f;
  std::vector<float> out(std::size_t(oh) * ow);
  for (int oi = 0; oi < oh; ++oi)
    for (int oj = 0; oj < ow; ++oj) {
      double sum = 0;
      float mx = -INFINITY;
      int n = 0;
      for (int i = oi * f; i < std::min(h, oi * f + f); ++i)
        for (int j = oj * f; j < std::min(w, oj * f + f); ++j) {
          float v = in[std::size_t(i) * w + j];
          sum += v;
          if (std::isnan(v) || (!std::isnan(mx) && v > mx)) mx = std::isnan(mx) ? mx : v;
          ++n;
        }
      out[std::size_t(oi) * ow + oj] = mode == PoolMode::kAverage ? float(sum / n) : mx;
    }
  *out_h = oh;
  *out_w = ow;
  return out;
}

}  // namespace qeval::kernels
