// Sliding-window and global pooling: per-dimension tap lists, then a 3-D loop nest per plane.
#include "kernels/window_pool.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

namespace qeval::kernels {

namespace {

// The taps of every output position along one dimension: the in-range input positions, and how
// many taps fall inside the input plus its declared padding.
struct AxisTaps {
  std::vector<std::int64_t> start;  // out + 1 offsets into `pos`
  std::vector<std::int64_t> pos;
  std::vector<std::int64_t> padded_count;
};

AxisTaps axis_taps(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride, std::int64_t dilation,
                   std::int64_t pad_begin, std::int64_t pad_end) {
  AxisTaps t;
  t.start.reserve(std::size_t(out + 1));
  t.padded_count.reserve(std::size_t(out));
  t.start.push_back(0);
  for (std::int64_t o = 0; o < out; ++o) {
    const std::int64_t first = o * stride - pad_begin;
    std::int64_t padded = 0;
    for (std::int64_t k = 0; k < kernel; ++k) {
      const std::int64_t p = first + k * dilation;
      if (p >= 0 && p < in) t.pos.push_back(p);
      if (p >= -pad_begin && p < in + pad_end) ++padded;
    }
    t.start.push_back(static_cast<std::int64_t>(t.pos.size()));
    t.padded_count.push_back(padded);
  }
  return t;
}

// The geometry lifted to exactly three dimensions (leading unit dimensions added).
struct Lifted {
  std::array<std::int64_t, 3> in{1, 1, 1}, out{1, 1, 1};
  std::array<AxisTaps, 3> taps;
};

Lifted lift(const PoolWindow& w) {
  if (w.rank < 1 || w.rank > 3) throw std::invalid_argument("pooling: spatial rank must be 1..3");
  Lifted l;
  const int shift = 3 - w.rank;
  for (int d = 0; d < 3; ++d) {
    if (d < shift) {
      l.taps[std::size_t(d)] = axis_taps(1, 1, 1, 1, 1, 0, 0);
      continue;
    }
    const std::size_t s = std::size_t(d - shift);
    if (w.kernel[s] < 1 || w.stride[s] < 1 || w.dilation[s] < 1)
      throw std::invalid_argument("pooling: kernel, stride and dilation must be >= 1");
    l.in[std::size_t(d)] = w.in[s];
    l.out[std::size_t(d)] = w.out[s];
    l.taps[std::size_t(d)] =
        axis_taps(w.in[s], w.out[s], w.kernel[s], w.stride[s], w.dilation[s], w.pad_begin[s], w.pad_end[s]);
  }
  return l;
}

template <class F>
void for_planes(std::int64_t planes, std::int64_t work_per_plane, F&& f) {
  const std::int64_t grain = std::max<std::int64_t>(1, 65536 / std::max<std::int64_t>(1, work_per_plane));
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, planes, grain), [&](const auto& r) {
    for (std::int64_t p = r.begin(); p < r.end(); ++p) f(p);
  });
}

}  // namespace

template <class T>
void max_pool(const T* x, T* y, std::int64_t* indices, std::int64_t planes, const PoolWindow& w, bool column_major) {
  const Lifted l = lift(w);
  // Plain variables, not structured bindings: lambdas below capture them (clang 14 forbids that).
  const std::int64_t D = l.in[0], H = l.in[1], W = l.in[2];
  const std::int64_t OD = l.out[0], OH = l.out[1], OW = l.out[2];
  const std::int64_t in_plane = D * H * W, out_plane = OD * OH * OW;
  const auto& td = l.taps[0];
  const auto& th = l.taps[1];
  const auto& tw = l.taps[2];
  for_planes(planes, out_plane * 4, [&](std::int64_t p) {
    const T* xp = x + p * in_plane;
    T* yp = y + p * out_plane;
    std::int64_t* ip = indices ? indices + p * out_plane : nullptr;
    std::int64_t o = 0;
    for (std::int64_t od = 0; od < OD; ++od)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow, ++o) {
          if (!ip) {
            // Without indices: branch-free max, NaN noted on the side.
            T best = std::numeric_limits<T>::lowest();
            bool nan = false;
            for (std::int64_t a = td.start[std::size_t(od)]; a < td.start[std::size_t(od) + 1]; ++a)
              for (std::int64_t b = th.start[std::size_t(oh)]; b < th.start[std::size_t(oh) + 1]; ++b) {
                const T* row = xp + (td.pos[std::size_t(a)] * H + th.pos[std::size_t(b)]) * W;
                for (std::int64_t c = tw.start[std::size_t(ow)]; c < tw.start[std::size_t(ow) + 1]; ++c) {
                  const T v = row[tw.pos[std::size_t(c)]];
                  nan |= v != v;
                  best = v > best ? v : best;
                }
              }
            yp[o] = nan ? std::numeric_limits<T>::quiet_NaN() : best;
            continue;
          }
          T best = std::numeric_limits<T>::lowest();
          std::int64_t arg = -1;
          bool nan = false;
          for (std::int64_t a = td.start[std::size_t(od)]; a < td.start[std::size_t(od) + 1] && !nan; ++a) {
            const std::int64_t d = td.pos[std::size_t(a)];
            for (std::int64_t b = th.start[std::size_t(oh)]; b < th.start[std::size_t(oh) + 1] && !nan; ++b) {
              const std::int64_t h = th.pos[std::size_t(b)];
              const T* row = xp + (d * H + h) * W;
              for (std::int64_t c = tw.start[std::size_t(ow)]; c < tw.start[std::size_t(ow) + 1]; ++c) {
                const std::int64_t wpos = tw.pos[std::size_t(c)];
                const T v = row[wpos];
                if constexpr (std::is_floating_point_v<T>) {
                  if (std::isnan(v)) {
                    best = v;
                    arg = (d * H + h) * W + wpos;
                    nan = true;
                    break;
                  }
                }
                if (v > best || arg < 0) {
                  best = v;
                  arg = (d * H + h) * W + wpos;
                }
              }
            }
          }
          yp[o] = best;
          if (ip) {
            if (arg < 0) {
              ip[o] = -1;
            } else if (column_major) {
              const std::int64_t d = arg / (H * W), h = (arg / W) % H, wpos = arg % W;
              ip[o] = p * in_plane + d + h * D + wpos * D * H;
            } else {
              ip[o] = p * in_plane + arg;
            }
          }
        }
  });
}

template <class T>
void average_pool(const T* x, T* y, std::int64_t planes, const PoolWindow& w, bool count_include_pad) {
  const Lifted l = lift(w);
  // Plain variables, not structured bindings: lambdas below capture them (clang 14 forbids that).
  const std::int64_t D = l.in[0], H = l.in[1], W = l.in[2];
  const std::int64_t OD = l.out[0], OH = l.out[1], OW = l.out[2];
  const std::int64_t in_plane = D * H * W, out_plane = OD * OH * OW;
  const auto& td = l.taps[0];
  const auto& th = l.taps[1];
  const auto& tw = l.taps[2];
  for_planes(planes, out_plane * 4, [&](std::int64_t p) {
    const T* xp = x + p * in_plane;
    T* yp = y + p * out_plane;
    std::int64_t o = 0;
    for (std::int64_t od = 0; od < OD; ++od)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow, ++o) {
          double sum = 0;
          for (std::int64_t a = td.start[std::size_t(od)]; a < td.start[std::size_t(od) + 1]; ++a)
            for (std::int64_t b = th.start[std::size_t(oh)]; b < th.start[std::size_t(oh) + 1]; ++b) {
              const T* row = xp + (td.pos[std::size_t(a)] * H + th.pos[std::size_t(b)]) * W;
              for (std::int64_t c = tw.start[std::size_t(ow)]; c < tw.start[std::size_t(ow) + 1]; ++c)
                sum += static_cast<double>(row[tw.pos[std::size_t(c)]]);
            }
          std::int64_t count;
          if (count_include_pad) {
            count =
                td.padded_count[std::size_t(od)] * th.padded_count[std::size_t(oh)] * tw.padded_count[std::size_t(ow)];
          } else {
            count = (td.start[std::size_t(od) + 1] - td.start[std::size_t(od)]) *
                    (th.start[std::size_t(oh) + 1] - th.start[std::size_t(oh)]) *
                    (tw.start[std::size_t(ow) + 1] - tw.start[std::size_t(ow)]);
          }
          yp[o] = count > 0 ? static_cast<T>(sum / static_cast<double>(count)) : std::numeric_limits<T>::quiet_NaN();
        }
  });
}

template <class T>
void global_pool(const T* x, T* y, std::int64_t planes, std::int64_t size, bool max) {
  for_planes(planes, size, [&](std::int64_t p) {
    const T* xp = x + p * size;
    if (max) {
      T best = size > 0 ? xp[0] : std::numeric_limits<T>::lowest();
      for (std::int64_t i = 1; i < size && !std::isnan(best); ++i)
        best = (xp[i] > best || std::isnan(xp[i])) ? xp[i] : best;
      y[p] = best;
    } else {
      double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      std::int64_t i = 0;
      for (; i + 8 <= size; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += static_cast<double>(xp[i + j]);
      for (; i < size; ++i) acc[0] += static_cast<double>(xp[i]);
      const double sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      y[p] = size > 0 ? static_cast<T>(sum / static_cast<double>(size)) : std::numeric_limits<T>::quiet_NaN();
    }
  });
}

template <class T>
std::int64_t max_unpool(const T* x, const std::int64_t* indices, std::int64_t count, T* y,
                        const std::vector<std::int64_t>& inferred, const std::vector<std::int64_t>& out) {
  std::int64_t inferred_numel = 1, out_numel = 1;
  for (auto d : inferred) inferred_numel *= d;
  for (auto d : out) out_numel *= d;
  std::fill_n(y, out_numel, T(0));
  const bool same = inferred == out;
  std::int64_t bad = -1;
  for (std::int64_t i = 0; i < count; ++i) {
    std::int64_t idx = indices[i];
    if (idx < 0 || idx >= inferred_numel) {
      if (bad < 0) bad = i;
      continue;
    }
    if (!same) {
      // Coordinates in the inferred shape, re-flattened in the output shape.
      std::int64_t flat = 0, stride = 1;
      for (std::size_t d = inferred.size(); d-- > 0;) {
        flat += (idx % inferred[d]) * stride;
        idx /= inferred[d];
        stride *= out[d];
      }
      idx = flat;
    }
    y[idx] = x[i];
  }
  return bad;
}

template void max_pool<float>(const float*, float*, std::int64_t*, std::int64_t, const PoolWindow&, bool);
template void max_pool<double>(const double*, double*, std::int64_t*, std::int64_t, const PoolWindow&, bool);
template void max_pool<std::int8_t>(const std::int8_t*, std::int8_t*, std::int64_t*, std::int64_t, const PoolWindow&,
                                    bool);
template void max_pool<std::uint8_t>(const std::uint8_t*, std::uint8_t*, std::int64_t*, std::int64_t, const PoolWindow&,
                                     bool);
template void average_pool<float>(const float*, float*, std::int64_t, const PoolWindow&, bool);
template void average_pool<double>(const double*, double*, std::int64_t, const PoolWindow&, bool);
template std::int64_t max_unpool<float>(const float*, const std::int64_t*, std::int64_t, float*,
                                        const std::vector<std::int64_t>&, const std::vector<std::int64_t>&);
template std::int64_t max_unpool<double>(const double*, const std::int64_t*, std::int64_t, double*,
                                         const std::vector<std::int64_t>&, const std::vector<std::int64_t>&);
template void global_pool<float>(const float*, float*, std::int64_t, std::int64_t, bool);
template void global_pool<double>(const double*, double*, std::int64_t, std::int64_t, bool);

}  // namespace qeval::kernels
