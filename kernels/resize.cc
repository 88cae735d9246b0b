// Separable resizing: per-dimension tap filters (coordinates and weights in double), applied one
// dimension at a time; nearest-neighbour as a gather.
#include "kernels/resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

namespace qeval::kernels {

namespace {

double source_coordinate(double x, const ResizeAxis& a, ResizeCoordinates mode) {
  const double in = static_cast<double>(a.in);
  // The frameworks' formulas use the unrounded output length scale * in, not the integer size.
  const double length = a.scale * in;
  switch (mode) {
    case ResizeCoordinates::kHalfPixel: return (x + 0.5) / a.scale - 0.5;
    case ResizeCoordinates::kHalfPixelSymmetric: {
      const double adjustment = static_cast<double>(a.out) / length;
      const double offset = in / 2 * (1 - adjustment);
      return offset + (x + 0.5) / a.scale - 0.5;
    }
    case ResizeCoordinates::kPytorchHalfPixel: return length == 1 ? -0.5 : (x + 0.5) / a.scale - 0.5;
    case ResizeCoordinates::kAlignCorners: return length == 1 ? 0.0 : x * (in - 1) / (length - 1);
    case ResizeCoordinates::kAsymmetric: return x / a.scale;
    case ResizeCoordinates::kTfHalfPixelForNn: return (x + 0.5) / a.scale;
    case ResizeCoordinates::kTfCropAndResize: {
      const double span = (a.roi_end - a.roi_start) * (in - 1);
      const double v = length == 1 ? span / 2 : x * span / (length - 1);
      return v + a.roi_start * (in - 1);
    }
  }
  return x;
}

// Keys' cubic convolution kernel with parameter a, at distance |t|.
double cubic_kernel(double t, double a) {
  t = std::fabs(t);
  if (t <= 1) return ((a + 2) * t - (a + 3)) * t * t + 1;
  if (t < 2) return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a;
  return 0;
}

template <class T>
void apply_axis(const T* src, T* dst, std::int64_t outer, const AxisFilter& f, std::int64_t inner, T fill) {
  const int taps = f.taps;
  std::vector<T> w(f.weight.size());
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<T>(f.weight[i]);
  if (inner == 1) {
    // The last dimension: one output element per tap set, rows of the outer dimensions.
    const std::int64_t grain = std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(1, f.out * taps));
    tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, outer, grain), [&](const auto& r) {
      for (std::int64_t n = r.begin(); n < r.end(); ++n) {
        const T* s = src + n * f.in;
        T* d = dst + n * f.out;
        for (std::int64_t o = 0; o < f.out; ++o) {
          const std::int64_t* idx = f.index.data() + o * taps;
          const T* wt = w.data() + o * taps;
          T acc = 0;
          for (int t = 0; t < taps; ++t) acc += wt[t] * s[idx[t]];
          d[o] = f.extrapolate[std::size_t(o)] ? fill : acc;
        }
      }
    });
    return;
  }
  const std::int64_t rows = outer * f.out;
  const std::int64_t grain = std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(1, inner * taps));
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, rows, grain), [&](const auto& r) {
    for (std::int64_t row = r.begin(); row < r.end(); ++row) {
      const std::int64_t n = row / f.out, o = row % f.out;
      T* d = dst + row * inner;
      if (f.extrapolate[std::size_t(o)]) {
        std::fill_n(d, inner, fill);
        continue;
      }
      const std::int64_t* idx = f.index.data() + o * taps;
      const T* wt = w.data() + o * taps;
      const T* s = src + n * f.in * inner;
      const T* s0 = s + idx[0] * inner;
      for (std::int64_t j = 0; j < inner; ++j) d[j] = wt[0] * s0[j];
      for (int t = 1; t < taps; ++t) {
        const T* st = s + idx[t] * inner;
        const T wv = wt[t];
        for (std::int64_t j = 0; j < inner; ++j) d[j] += wv * st[j];
      }
    }
  });
}

// dst[i * F + t] = src[i] for t < F, i < n.
template <int F, class U>
void repeat_each(const U* __restrict src, U* __restrict dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    for (int t = 0; t < F; ++t) dst[i * F + t] = src[i];
}

template <class U>
void gather(const U* x, U* y, const std::vector<AxisFilter>& f, U fill) {
  const int rank = static_cast<int>(f.size());
  if (rank == 0) {
    y[0] = x[0];
    return;
  }
  std::vector<std::int64_t> in_stride(std::size_t(rank), 1);
  for (int d = rank - 2; d >= 0; --d)
    in_stride[std::size_t(d)] = in_stride[std::size_t(d) + 1] * f[std::size_t(d) + 1].in;
  const AxisFilter& last = f.back();
  std::int64_t rows = 1;
  for (int d = 0; d + 1 < rank; ++d) rows *= f[std::size_t(d)].out;
  // The last axis without extrapolation reads src[index[j]]; an upsampling by 2, 4 or 8 that
  // repeats each input element (index[j] = j / f: nearest with asymmetric or half-pixel floor
  // mappings) writes each element f times without reading the index.
  const bool last_extrapolates =
      std::any_of(last.extrapolate.begin(), last.extrapolate.end(), [](std::uint8_t e) { return e != 0; });
  std::int64_t factor = 0;
  if (!last_extrapolates && last.in > 0 && last.out % last.in == 0) {
    const std::int64_t fct = last.out / last.in;
    bool repeats = fct == 2 || fct == 4 || fct == 8;
    for (std::int64_t j = 0; repeats && j < last.out; ++j) repeats = last.index[std::size_t(j)] == j / fct;
    if (repeats) factor = fct;
  }
  const std::int64_t grain = std::max<std::int64_t>(1, 65536 / std::max<std::int64_t>(1, last.out));
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, rows, grain), [&](const auto& r) {
    std::int64_t previous = -1;  // the source offset of the task's previous row (-1: none, or outside)
    for (std::int64_t row = r.begin(); row < r.end(); ++row) {
      std::int64_t rem = row, offset = 0;
      bool outside = false;
      for (int d = rank - 2; d >= 0; --d) {
        const AxisFilter& fd = f[std::size_t(d)];
        const std::int64_t o = rem % fd.out;
        rem /= fd.out;
        outside |= fd.extrapolate[std::size_t(o)] != 0;
        offset += fd.index[std::size_t(o)] * in_stride[std::size_t(d)];
      }
      U* dst = y + row * last.out;
      if (outside) {
        std::fill_n(dst, last.out, fill);
        previous = -1;
        continue;
      }
      if (offset == previous) {  // the row above read the same input row (upsampling): a copy
        std::memcpy(dst, dst - last.out, std::size_t(last.out) * sizeof(U));
        continue;
      }
      previous = offset;
      const U* src = x + offset;
      if (factor == 2) repeat_each<2>(src, dst, last.in);
      else if (factor == 4) repeat_each<4>(src, dst, last.in);
      else if (factor == 8) repeat_each<8>(src, dst, last.in);
      else if (!last_extrapolates)
        for (std::int64_t j = 0; j < last.out; ++j) dst[j] = src[last.index[std::size_t(j)]];
      else
        for (std::int64_t j = 0; j < last.out; ++j)
          dst[j] = last.extrapolate[std::size_t(j)] ? fill : src[last.index[std::size_t(j)]];
    }
  });
}

std::vector<AxisFilter> filters_for(const std::vector<ResizeAxis>& axes, const ResizeOptions& options) {
  std::vector<AxisFilter> f;
  f.reserve(axes.size());
  for (const auto& a : axes) f.push_back(resize_filter(a, options));
  return f;
}

}  // namespace

AxisFilter resize_filter(const ResizeAxis& axis, const ResizeOptions& options) {
  if (axis.in < 1 || axis.out < 0) throw std::invalid_argument("resize: input size must be >= 1");
  if (!(axis.scale > 0)) throw std::invalid_argument("resize: scale must be > 0");
  AxisFilter f;
  f.in = axis.in;
  f.out = axis.out;
  const double s = axis.scale;
  const bool antialias = options.antialias && s < 1 && options.mode != ResizeMode::kNearest;
  // First tap offset relative to floor(x), and the number of taps.
  int first = 0;
  switch (options.mode) {
    case ResizeMode::kNearest: f.taps = 1; break;
    case ResizeMode::kLinear:
      first = antialias ? static_cast<int>(std::floor(-1 / s)) + 1 : 0;
      f.taps = 2 - 2 * first;
      break;
    case ResizeMode::kCubic:
      first = antialias ? static_cast<int>(std::floor(-2 / s)) + 1 : -1;
      f.taps = 2 - 2 * first;
      break;
  }
  const std::size_t taps = std::size_t(f.taps);
  f.index.assign(std::size_t(axis.out) * taps, 0);
  f.weight.assign(std::size_t(axis.out) * taps, 0.0);
  f.extrapolate.assign(std::size_t(axis.out), 0);
  const double in_max = static_cast<double>(axis.in - 1);
  // The filter's own scale: antialiasing stretches the kernel by 1/s when shrinking.
  const double kernel_scale = antialias ? s : 1.0;
  for (std::int64_t o = 0; o < axis.out; ++o) {
    const double x = source_coordinate(static_cast<double>(o), axis, options.coordinates);
    if (options.coordinates == ResizeCoordinates::kTfCropAndResize && (x < 0 || x > in_max)) {
      f.extrapolate[std::size_t(o)] = 1;
      continue;
    }
    const double base_f = std::floor(x);
    const double ratio = x - base_f;
    const std::int64_t base = static_cast<std::int64_t>(base_f);
    std::int64_t* idx = f.index.data() + std::size_t(o) * taps;
    double* w = f.weight.data() + std::size_t(o) * taps;
    if (options.mode == ResizeMode::kNearest) {
      bool up = false;
      switch (options.nearest) {
        case NearestRounding::kRoundPreferFloor: up = ratio > 0.5; break;
        case NearestRounding::kRoundPreferCeil: up = ratio >= 0.5; break;
        case NearestRounding::kFloor: up = false; break;
        case NearestRounding::kCeil: up = ratio > 0; break;
        case NearestRounding::kSimple: up = s < 1 && ratio > 0; break;
      }
      idx[0] = std::clamp<std::int64_t>(base + (up ? 1 : 0), 0, axis.in - 1);
      w[0] = 1;
      continue;
    }
    double sum = 0;
    for (std::size_t t = 0; t < taps; ++t) {
      const std::int64_t i = first + static_cast<std::int64_t>(t);
      idx[t] = base + i;
      const double d = (static_cast<double>(i) - ratio) * kernel_scale;
      if (options.mode == ResizeMode::kLinear) w[t] = std::clamp(1 - std::fabs(d), 0.0, 1.0);
      else w[t] = cubic_kernel(d, options.cubic_a);
      sum += w[t];
    }
    // Antialiased weights are normalised (the stretched kernel does not sum to 1 on its own).
    if (antialias && sum != 0)
      for (std::size_t t = 0; t < taps; ++t) w[t] /= sum;
    if (options.exclude_outside) {
      double kept = 0;
      for (std::size_t t = 0; t < taps; ++t) {
        if (idx[t] < 0 || idx[t] >= axis.in) w[t] = 0;
        kept += w[t];
      }
      if (kept != 0)
        for (std::size_t t = 0; t < taps; ++t) w[t] /= kept;
    }
    for (std::size_t t = 0; t < taps; ++t) idx[t] = std::clamp<std::int64_t>(idx[t], 0, axis.in - 1);
  }
  f.identity = axis.out == axis.in;
  for (std::int64_t o = 0; f.identity && o < axis.out; ++o) {
    if (f.extrapolate[std::size_t(o)]) {
      f.identity = false;
      break;
    }
    double own = 0;
    for (std::size_t t = 0; t < taps; ++t) {
      const std::size_t k = std::size_t(o) * taps + t;
      if (f.index[k] == o) own += f.weight[k];
      else if (f.weight[k] != 0) f.identity = false;
    }
    if (own != 1) f.identity = false;
  }
  return f;
}

template <class T>
void resize(const T* x, T* y, const std::vector<ResizeAxis>& axes, const ResizeOptions& options) {
  if (options.mode == ResizeMode::kNearest) {
    const T fill = static_cast<T>(options.extrapolation_value);
    resize_nearest(reinterpret_cast<const std::byte*>(x), reinterpret_cast<std::byte*>(y), sizeof(T), axes, options,
                   reinterpret_cast<const std::byte*>(&fill));
    return;
  }
  const std::vector<AxisFilter> f = filters_for(axes, options);
  std::int64_t out_numel = 1;
  for (const auto& a : axes) out_numel *= a.out;
  if (out_numel == 0) return;
  std::vector<std::size_t> order;
  for (std::size_t d = 0; d < f.size(); ++d)
    if (!f[d].identity) order.push_back(d);
  if (order.empty()) {
    std::copy_n(x, out_numel, y);
    return;
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return double(f[a].out) / double(f[a].in) < double(f[b].out) / double(f[b].in);
  });
  std::vector<std::int64_t> dims;
  for (const auto& a : axes) dims.push_back(a.in);
  std::vector<T> buffers[2];
  const T* cur = x;
  const T fill = static_cast<T>(options.extrapolation_value);
  for (std::size_t k = 0; k < order.size(); ++k) {
    const std::size_t d = order[k];
    std::int64_t outer = 1, inner = 1;
    for (std::size_t i = 0; i < d; ++i) outer *= dims[i];
    for (std::size_t i = d + 1; i < dims.size(); ++i) inner *= dims[i];
    T* dst = y;
    if (k + 1 < order.size()) {
      buffers[k % 2].resize(std::size_t(outer * f[d].out * inner));
      dst = buffers[k % 2].data();
    }
    apply_axis(cur, dst, outer, f[d], inner, fill);
    dims[d] = f[d].out;
    cur = dst;
  }
}

void resize_nearest(const std::byte* x, std::byte* y, std::size_t element_size, const std::vector<ResizeAxis>& axes,
                    const ResizeOptions& options, const std::byte* fill) {
  ResizeOptions nearest = options;
  nearest.mode = ResizeMode::kNearest;
  const std::vector<AxisFilter> f = filters_for(axes, nearest);
  std::int64_t out_numel = 1;
  for (const auto& a : axes) out_numel *= a.out;
  if (out_numel == 0) return;
  auto run = [&](auto tag) {
    using U = decltype(tag);
    U v;
    std::memcpy(&v, fill, sizeof(U));
    gather(reinterpret_cast<const U*>(x), reinterpret_cast<U*>(y), f, v);
  };
  switch (element_size) {
    case 1: return run(std::uint8_t{});
    case 2: return run(std::uint16_t{});
    case 4: return run(std::uint32_t{});
    case 8: return run(std::uint64_t{});
    default: throw std::invalid_argument("resize_nearest: element size must be 1, 2, 4 or 8");
  }
}

template void resize<float>(const float*, float*, const std::vector<ResizeAxis>&, const ResizeOptions&);
template void resize<double>(const double*, double*, const std::vector<ResizeAxis>&, const ResizeOptions&);

}  // namespace qeval::kernels
