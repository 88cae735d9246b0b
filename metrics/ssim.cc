// SSIM kernels: float fast path (row strips, separable window, ring buffer) and double reference.
#include "metrics/ssim.h"

#include <tbb/parallel_for.h>

#include <algorithm>
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

constexpr int kStripRows = 32;  // fixed: the strip partition, and so the sum order, never varies
constexpr int kLanes = 8;

struct Constants {
  float c1, c2, cov_norm;
};

Constants constants(const SsimWindow& window, double peak) {
  return {static_cast<float>((0.01 * peak) * (0.01 * peak)),
          static_cast<float>((0.03 * peak) * (0.03 * peak)), static_cast<float>(window.cov_norm)};
}

// out[j] = sum_t w[t] * in[j + t], j in [0, n). K > 0 fixes the tap count at compile time so the
// tap loop unrolls and the j loop vectorises; K == 0 takes it from k.
template <int K>
inline void filter_row(const float* in, float* out, int n, const float* w, int k) {
  const int taps = K > 0 ? K : k;
  for (int j = 0; j < n; ++j) {
    float acc = w[0] * in[j];
    for (int t = 1; t < taps; ++t) acc += w[t] * in[j + t];
    out[j] = acc;
  }
}

inline void accumulate(const float* v, int n, double* lanes, double& tail) {
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] += double(v[j + l]);
  for (; j < n; ++j) tail += double(v[j]);
}

template <int K>
SsimPlaneResult ssim_plane_fast(PlaneView x, PlaneView y, const SsimWindow& window, double peak) {
  const int k = window.size();
  const int h = x.height, w = x.width;
  const int hv = h - k + 1, wv = w - k + 1;
  const Constants cst = constants(window, peak);
  std::vector<float> taps(window.taps.begin(), window.taps.end());

  // Centre on the rounded mean of both planes: moments of (x - c) are small where the image is
  // smooth, so E[(x-c)^2] - E[x-c]^2 keeps its digits in float. Integer c keeps x - c exact.
  double sum = 0;
  for (std::int64_t i = 0, n = std::int64_t(h) * w; i < n; ++i) sum += double(x.data[i]) + y.data[i];
  const float center = static_cast<float>(std::round(sum / (2.0 * h * w)));

  const int strips = (hv + kStripRows - 1) / kStripRows;
  std::vector<double> strip_ssim(static_cast<std::size_t>(strips));
  std::vector<double> strip_cs(static_cast<std::size_t>(strips));

  tbb::parallel_for(0, strips, [&](int s) {
    const int r0 = s * kStripRows, r1 = std::min(hv, r0 + kStripRows);
    constexpr int kSignals = 5;  // x, y, x^2, y^2, xy
    std::vector<float> ring(std::size_t(kSignals) * k * wv);
    std::vector<float> row(std::size_t(kSignals) * w);
    std::vector<float> map_ssim(static_cast<std::size_t>(wv)), map_cs(static_cast<std::size_t>(wv));
    auto ring_row = [&](int signal, int slot) { return ring.data() + (std::size_t(signal) * k + slot) * wv; };
    double lanes_ssim[kLanes] = {}, lanes_cs[kLanes] = {}, tail_ssim = 0, tail_cs = 0;

    for (int i = r0; i < r1 + k - 1; ++i) {
      const float* xr = x.data + std::size_t(i) * w;
      const float* yr = y.data + std::size_t(i) * w;
      float *xc = row.data(), *yc = xc + w, *xx = yc + w, *yy = xx + w, *xy = yy + w;
      for (int j = 0; j < w; ++j) {
        xc[j] = xr[j] - center;
        yc[j] = yr[j] - center;
        xx[j] = xc[j] * xc[j];
        yy[j] = yc[j] * yc[j];
        xy[j] = xc[j] * yc[j];
      }
      const int slot = (i - r0) % k;
      for (int sgn = 0; sgn < kSignals; ++sgn)
        filter_row<K>(row.data() + std::size_t(sgn) * w, ring_row(sgn, slot), wv, taps.data(), k);
      if (i - r0 < k - 1) continue;

      // Output row r = i - k + 1 needs ring rows r..i; slot of input row r + t is (r - r0 + t) % k.
      const int ro = i - k + 1 - r0;
      const float* rows[kSignals][K > 0 ? K : 64];
      for (int sgn = 0; sgn < kSignals; ++sgn)
        for (int t = 0; t < k; ++t) rows[sgn][t] = ring_row(sgn, (ro + t) % k);
      const int taps_n = K > 0 ? K : k;
      for (int j = 0; j < wv; ++j) {
        float mx = 0, my = 0, mxx = 0, myy = 0, mxy = 0;
        for (int t = 0; t < taps_n; ++t) {
          const float wt = taps[std::size_t(t)];
          mx += wt * rows[0][t][j];
          my += wt * rows[1][t][j];
          mxx += wt * rows[2][t][j];
          myy += wt * rows[3][t][j];
          mxy += wt * rows[4][t][j];
        }
        const float vx = cst.cov_norm * (mxx - mx * mx);
        const float vy = cst.cov_norm * (myy - my * my);
        const float vxy = cst.cov_norm * (mxy - mx * my);
        const float ux = mx + center, uy = my + center;
        const float a2 = 2.0f * vxy + cst.c2, b2 = vx + vy + cst.c2;
        const float cs = a2 / b2;
        map_cs[std::size_t(j)] = cs;
        map_ssim[std::size_t(j)] = (2.0f * ux * uy + cst.c1) / (ux * ux + uy * uy + cst.c1) * cs;
      }
      accumulate(map_ssim.data(), wv, lanes_ssim, tail_ssim);
      accumulate(map_cs.data(), wv, lanes_cs, tail_cs);
    }
    for (int l = 0; l < kLanes; ++l) {
      tail_ssim += lanes_ssim[l];
      tail_cs += lanes_cs[l];
    }
    strip_ssim[std::size_t(s)] = tail_ssim;
    strip_cs[std::size_t(s)] = tail_cs;
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
    case 7: return ssim_plane_fast<7>(x, y, window, peak);
    case 11: return ssim_plane_fast<11>(x, y, window, peak);
    default: return ssim_plane_fast<0>(x, y, window, peak);
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
