// SSIM kernels: float fast path (row strips, separable window, ring buffer) and double reference.
#include "metrics/ssim.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace qeval::metrics {

std::string_view ssim_convention_name(SsimConvention c) {
  switch (c) {
    case SsimConvention::kWang: return "wang";
    case SsimConvention::kMatlab: return "matlab";
    case SsimConvention::kSkimageDefault: return "skimage-default";
  }
  return "unknown";
}

std::optional<SsimConvention> parse_ssim_convention(std::string_view name) {
  for (auto c : {SsimConvention::kWang, SsimConvention::kMatlab, SsimConvention::kSkimageDefault})
    if (ssim_convention_name(c) == name) return c;
  return std::nullopt;
}

SsimWindow gaussian_window(int size, double sigma) {
  if (size < 1 || size % 2 == 0) throw std::invalid_argument("SSIM window size must be odd");
  SsimWindow w;
  int r = size / 2;
  for (int i = -r; i <= r; ++i) w.taps.push_back(std::exp(-0.5 * double(i) * i / (sigma * sigma)));
  double sum = std::accumulate(w.taps.begin(), w.taps.end(), 0.0);
  for (double& t : w.taps) t /= sum;
  return w;
}

SsimWindow uniform_window(int size) {
  if (size < 2 || size % 2 == 0) throw std::invalid_argument("SSIM window size must be odd and > 1");
  SsimWindow w;
  w.taps.assign(static_cast<std::size_t>(size), 1.0 / size);
  double n = double(size) * size;
  w.cov_norm = n / (n - 1.0);
  return w;
}

SsimWindow window_for(SsimConvention convention) {
  // scikit-image: truncate 3.5 -> radius int(3.5 * 1.5 + 0.5) = 5 -> 11 taps, as in Wang's ssim.m.
  if (convention == SsimConvention::kSkimageDefault) return uniform_window(7);
  return gaussian_window(11, 1.5);
}

namespace {

#ifndef QEVAL_SSIM_FAST_TYPE
#define QEVAL_SSIM_FAST_TYPE double
#endif
using SsimFastType = QEVAL_SSIM_FAST_TYPE;
constexpr int kStripRows = 32;  // fixed: the strip partition, and so the sum order, never varies

// One SIMD register's worth of T (GCC vector extension: AVX-512 where the target has it, split
// into narrower registers otherwise).
template <class T>
struct Simd {
  static constexpr int kLanes = 64 / sizeof(T);
  typedef T V __attribute__((vector_size(64)));
  static V load(const T* p) {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store(T* p, V v) { std::memcpy(p, &v, sizeof v); }
  static V splat(T s) { return V{} + s; }
};

// Fast path. Moments are accumulated in T on mean-centred samples; T = double keeps the
// E[x^2] - mu^2 cancellation harmless (the numerics contract), T = float is kept for comparison.
// K > 0 fixes the tap count at compile time so the tap loops unroll.
template <class T, int K>
SsimPlaneResult ssim_plane_simd(PlaneView x, PlaneView y, const SsimWindow& window, double peak) {
  using S = Simd<T>;
  using V = typename S::V;
  constexpr int N = S::kLanes;
  constexpr int kMaxTaps = K > 0 ? K : 64;
  constexpr int kBlock = 4;    // vectors per vertical-pass block: 5 x 4 accumulators in registers
  constexpr int kSignals = 5;  // x, y, x^2, y^2, xy (centred)
  const int k = K > 0 ? K : window.size();
  const int h = x.height, w = x.width;
  const int hv = h - k + 1, wv = w - k + 1;
  const int wv_pad = (wv + N * kBlock - 1) / (N * kBlock) * (N * kBlock);  // whole blocks
  const int w_pad = wv_pad + k - 1;  // inputs those outputs read; the tail stays zero
  const T c1 = T((0.01 * peak) * (0.01 * peak)), c2 = T((0.03 * peak) * (0.03 * peak));
  const T cov_norm = T(window.cov_norm);
  T taps[kMaxTaps];
  for (int t = 0; t < k; ++t) taps[t] = T(window.taps[std::size_t(t)]);

  // Centre on the rounded mean of both planes: the moments of (x - c) are smaller, so fewer digits
  // cancel in E[(x-c)^2] - E[x-c]^2. An integer c keeps x - c exact for integer samples.
  const std::int64_t count = std::int64_t(h) * w;
  double lane_sum[8] = {};
  std::int64_t i0 = 0;
  for (; i0 + 8 <= count; i0 += 8)
    for (int l = 0; l < 8; ++l) lane_sum[l] += double(x.data[i0 + l]) + double(y.data[i0 + l]);
  double sum = 0;
  for (; i0 < count; ++i0) sum += double(x.data[i0]) + double(y.data[i0]);
  for (double v : lane_sum) sum += v;
  const T center = T(std::round(sum / (2.0 * double(count))));

  const int strips = (hv + kStripRows - 1) / kStripRows;
  std::vector<double> strip_ssim(static_cast<std::size_t>(strips));
  std::vector<double> strip_cs(static_cast<std::size_t>(strips));

  tbb::parallel_for(0, strips, [&](int s) {
    const int r0 = s * kStripRows, r1 = std::min(hv, r0 + kStripRows);
    // Horizontal results of input row r0 + q are stored at ring rows q % k and q % k + k, so the
    // k rows an output row needs are always contiguous: ring rows (ro % k) .. (ro % k) + k - 1.
    const std::size_t plane_stride = std::size_t(2 * k) * wv_pad;
    std::vector<T> ring(kSignals * plane_stride);
    std::vector<T> row(std::size_t(kSignals) * w_pad, T(0));
    double total_ssim = 0, total_cs = 0;

    for (int i = r0; i < r1 + k - 1; ++i) {
      const float* xr = x.data + std::size_t(i) * w;
      const float* yr = y.data + std::size_t(i) * w;
      T* xc = row.data();
      T* yc = xc + w_pad;
      T* xx = yc + w_pad;
      T* yy = xx + w_pad;
      T* xy = yy + w_pad;
      int j = 0;
      for (; j + N <= w; j += N) {
        typedef float F __attribute__((vector_size(N * sizeof(float))));
        F fx, fy;
        std::memcpy(&fx, xr + j, sizeof fx);
        std::memcpy(&fy, yr + j, sizeof fy);
        const V vx = __builtin_convertvector(fx, V) - center;
        const V vy = __builtin_convertvector(fy, V) - center;
        S::store(xc + j, vx);
        S::store(yc + j, vy);
        S::store(xx + j, vx * vx);
        S::store(yy + j, vy * vy);
        S::store(xy + j, vx * vy);
      }
      for (; j < w; ++j) {
        xc[j] = T(xr[j]) - center;
        yc[j] = T(yr[j]) - center;
        xx[j] = xc[j] * xc[j];
        yy[j] = yc[j] * yc[j];
        xy[j] = xc[j] * yc[j];
      }
      const int slot = (i - r0) % k;
      for (int sgn = 0; sgn < kSignals; ++sgn) {
        const T* in = row.data() + std::size_t(sgn) * w_pad;
        T* out0 = ring.data() + sgn * plane_stride + std::size_t(slot) * wv_pad;
        T* out1 = out0 + std::size_t(k) * wv_pad;
        for (int jj = 0; jj < wv_pad; jj += N) {
          V acc = S::load(in + jj) * taps[0];
          for (int t = 1; t < k; ++t) acc += S::load(in + jj + t) * taps[t];
          S::store(out0 + jj, acc);
          S::store(out1 + jj, acc);
        }
      }
      if (i - r0 < k - 1) continue;

      const int first = (i - k + 1 - r0) % k;  // ring row of the output row's first input row
      const T* base[kSignals];
      for (int sgn = 0; sgn < kSignals; ++sgn)
        base[sgn] = ring.data() + sgn * plane_stride + std::size_t(first) * wv_pad;
      V acc_ssim = S::splat(0), acc_cs = S::splat(0);
      for (int jb = 0; jb < wv_pad; jb += N * kBlock) {
        V m[kSignals][kBlock];
        for (int sgn = 0; sgn < kSignals; ++sgn)
          for (int b = 0; b < kBlock; ++b) m[sgn][b] = S::splat(0);
        for (int t = 0; t < k; ++t) {
          const T wt = taps[t];
          for (int sgn = 0; sgn < kSignals; ++sgn) {
            const T* p = base[sgn] + std::size_t(t) * wv_pad + jb;
            for (int b = 0; b < kBlock; ++b) m[sgn][b] += S::load(p + b * N) * wt;
          }
        }
        for (int b = 0; b < kBlock; ++b) {
          const V mx = m[0][b], my = m[1][b];
          const V vx = (m[2][b] - mx * mx) * cov_norm;
          const V vy = (m[3][b] - my * my) * cov_norm;
          const V vxy = (m[4][b] - mx * my) * cov_norm;
          const V ux = mx + center, uy = my + center;
          const V a1 = ux * uy * T(2) + c1, b1 = ux * ux + uy * uy + c1;
          const V a2 = vxy * T(2) + c2, b2 = vx + vy + c2;
          const V inv = T(1) / (b1 * b2);  // one division for both terms
          V ssim = a1 * a2 * inv;
          V cs = a2 * b1 * inv;
          const int j0 = jb + b * N;
          if (j0 + N > wv) {  // padding lanes past the valid width
            for (int l = 0; l < N; ++l)
              if (j0 + l >= wv) ssim[l] = cs[l] = T(0);
          }
          acc_ssim += ssim;
          acc_cs += cs;
        }
      }
      for (int l = 0; l < N; ++l) {
        total_ssim += double(acc_ssim[l]);
        total_cs += double(acc_cs[l]);
      }
    }
    strip_ssim[std::size_t(s)] = total_ssim;
    strip_cs[std::size_t(s)] = total_cs;
  });

  const double n = double(hv) * wv;
  return {std::accumulate(strip_ssim.begin(), strip_ssim.end(), 0.0) / n,
          std::accumulate(strip_cs.begin(), strip_cs.end(), 0.0) / n};
}

void check_plane_pair(PlaneView x, PlaneView y, const SsimWindow& window) {
  if (x.height != y.height || x.width != y.width)
    throw std::invalid_argument("SSIM planes differ in size");
  if (x.height < window.size() || x.width < window.size())
    throw std::invalid_argument("SSIM plane smaller than the window");
  if (window.size() > 64) throw std::invalid_argument("SSIM window larger than 64 taps");
}

// Whole-plane double filtering, 'valid' region only: what scikit-image computes before cropping.
SsimPlaneResult ssim_plane_reference_d(const double* x, const double* y, int h, int w,
                                       const SsimWindow& window, double peak) {
  const int k = window.size(), hv = h - k + 1, wv = w - k + 1;
  const double c1 = (0.01 * peak) * (0.01 * peak), c2 = (0.03 * peak) * (0.03 * peak);
  const auto& wt = window.taps;
  auto filter = [&](auto signal) {
    std::vector<double> horiz(std::size_t(h) * wv), out(std::size_t(hv) * wv);
    for (int i = 0; i < h; ++i)
      for (int j = 0; j < wv; ++j) {
        double acc = 0;
        for (int t = 0; t < k; ++t) acc += wt[std::size_t(t)] * signal(std::size_t(i) * w + j + t);
        horiz[std::size_t(i) * wv + j] = acc;
      }
    for (int i = 0; i < hv; ++i)
      for (int j = 0; j < wv; ++j) {
        double acc = 0;
        for (int t = 0; t < k; ++t) acc += wt[std::size_t(t)] * horiz[std::size_t(i + t) * wv + j];
        out[std::size_t(i) * wv + j] = acc;
      }
    return out;
  };
  auto ux = filter([&](std::size_t i) { return x[i]; });
  auto uy = filter([&](std::size_t i) { return y[i]; });
  auto uxx = filter([&](std::size_t i) { return x[i] * x[i]; });
  auto uyy = filter([&](std::size_t i) { return y[i] * y[i]; });
  auto uxy = filter([&](std::size_t i) { return x[i] * y[i]; });
  double sum_ssim = 0, sum_cs = 0;
  for (std::size_t i = 0; i < ux.size(); ++i) {
    double vx = window.cov_norm * (uxx[i] - ux[i] * ux[i]);
    double vy = window.cov_norm * (uyy[i] - uy[i] * uy[i]);
    double vxy = window.cov_norm * (uxy[i] - ux[i] * uy[i]);
    double cs = (2 * vxy + c2) / (vx + vy + c2);
    sum_cs += cs;
    sum_ssim += (2 * ux[i] * uy[i] + c1) / (ux[i] * ux[i] + uy[i] * uy[i] + c1) * cs;
  }
  const double n = double(hv) * wv;
  return {sum_ssim / n, sum_cs / n};
}

std::vector<double> box_downsample_d(const double* x, int h, int w, int f, int* oh, int* ow) {
  // MATLAB imfilter 'same' centre for an f-tap kernel: c = floor((f + 1) / 2) (1-based), so output
  // i averages inputs i - (c - 1) .. i + (f - c); 'symmetric' mirrors including the edge sample.
  const int before = (f + 1) / 2 - 1;
  auto mirror = [](int i, int n) {
    while (i < 0 || i >= n) i = i < 0 ? -i - 1 : 2 * n - i - 1;
    return i;
  };
  *oh = (h + f - 1) / f;
  *ow = (w + f - 1) / f;
  std::vector<double> out(std::size_t(*oh) * *ow);
  const double norm = 1.0 / (double(f) * f);
  for (int oi = 0; oi < *oh; ++oi)
    for (int oj = 0; oj < *ow; ++oj) {
      double acc = 0;
      for (int a = 0; a < f; ++a)
        for (int b = 0; b < f; ++b)
          acc += x[std::size_t(mirror(oi * f - before + a, h)) * w + mirror(oj * f - before + b, w)];
      out[std::size_t(oi) * *ow + oj] = acc * norm;
    }
  return out;
}

std::vector<double> to_double(PlaneView p) {
  return std::vector<double>(p.data, p.data + std::size_t(p.height) * p.width);
}

}  // namespace

SsimPlaneResult ssim_plane(PlaneView x, PlaneView y, const SsimWindow& window, double peak) {
  check_plane_pair(x, y, window);
  switch (window.size()) {
    case 7: return ssim_plane_simd<SsimFastType, 7>(x, y, window, peak);
    case 11: return ssim_plane_simd<SsimFastType, 11>(x, y, window, peak);
    default: return ssim_plane_simd<SsimFastType, 0>(x, y, window, peak);
  }
}

SsimPlaneResult ssim_plane_reference(PlaneView x, PlaneView y, const SsimWindow& window,
                                     double peak) {
  check_plane_pair(x, y, window);
  auto xd = to_double(x), yd = to_double(y);
  return ssim_plane_reference_d(xd.data(), yd.data(), x.height, x.width, window, peak);
}

int matlab_downsample_factor(int height, int width) {
  return std::max(1, static_cast<int>(std::lround(std::min(height, width) / 256.0)));
}

std::vector<float> box_downsample(PlaneView x, int f, int* out_height, int* out_width) {
  auto xd = to_double(x);
  auto d = box_downsample_d(xd.data(), x.height, x.width, f, out_height, out_width);
  return std::vector<float>(d.begin(), d.end());
}

namespace {

template <bool kReference>
SsimResult ssim_impl(const Tensor& ref, const Tensor& test, SsimConvention convention,
                     double peak) {
  check_image_pair(ref, test);
  const SsimWindow window = window_for(convention);
  const int channels = static_cast<int>(ref.dim(0));
  int h = static_cast<int>(ref.dim(1)), w = static_cast<int>(ref.dim(2));
  const int f = convention == SsimConvention::kMatlab ? matlab_downsample_factor(h, w) : 1;
  SsimResult result;
  const int eh = (h + f - 1) / f, ew = (w + f - 1) / f;
  if (eh < window.size() || ew < window.size()) {
    result.note = "image " + std::to_string(w) + "x" + std::to_string(h) +
                  (f > 1 ? " (" + std::to_string(ew) + "x" + std::to_string(eh) +
                               " after downsampling by " + std::to_string(f) + ")"
                         : std::string()) +
                  " is smaller than the " + std::to_string(window.size()) + "x" +
                  std::to_string(window.size()) + " SSIM window";
    return result;
  }
  const std::size_t plane = std::size_t(h) * w;
  double total = 0;
  for (int c = 0; c < channels; ++c) {
    PlaneView x{ref.data<float>() + c * plane, h, w}, y{test.data<float>() + c * plane, h, w};
    SsimPlaneResult r;
    if constexpr (kReference) {
      auto xd = to_double(x), yd = to_double(y);
      int dh = h, dw = w;
      if (f > 1) {
        xd = box_downsample_d(xd.data(), h, w, f, &dh, &dw);
        yd = box_downsample_d(yd.data(), h, w, f, &dh, &dw);
      }
      r = ssim_plane_reference_d(xd.data(), yd.data(), dh, dw, window, peak);
    } else if (f > 1) {
      int dh = 0, dw = 0;
      auto xs = box_downsample(x, f, &dh, &dw);
      auto ys = box_downsample(y, f, &dh, &dw);
      r = ssim_plane({xs.data(), dh, dw}, {ys.data(), dh, dw}, window, peak);
    } else {
      r = ssim_plane(x, y, window, peak);
    }
    result.per_channel.push_back(r.ssim);
    total += r.ssim;
  }
  result.ssim = total / channels;
  return result;
}

}  // namespace

SsimResult ssim(const Tensor& ref, const Tensor& test, SsimConvention convention, double peak) {
  return ssim_impl<false>(ref, test, convention, peak);
}

SsimResult ssim_reference(const Tensor& ref, const Tensor& test, SsimConvention convention,
                          double peak) {
  return ssim_impl<true>(ref, test, convention, peak);
}

void SsimMetric::compute(const Tensor& ref, const Tensor& test, const ImageMetricOptions& options,
                         std::vector<MetricValue>& out) const {
  SsimResult r = ssim(ref, test, options.ssim_convention, options.peak);
  std::vector<std::optional<double>> channels(r.per_channel.begin(), r.per_channel.end());
  out.push_back({"ssim", r.ssim, std::move(channels), r.note});
}

}  // namespace qeval::metrics
