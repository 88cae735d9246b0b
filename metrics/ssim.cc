// SSIM kernels: float fast path (row strips, separable window, ring buffer) and double reference.
#include "metrics/ssim.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <utility>

#include "metrics/metric_registry.h"

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

// Fixed tile sizes: the partition, and so the summation order, never depends on the thread count.
constexpr int kStripRows = 128;
constexpr int kTileCols = 128;

// Eight doubles: one AVX-512 register (GCC splits it into narrower registers on other targets).
// Moments are accumulated in double: single precision loses up to 4e-6 of SSIM on flat regions
// far from the image mean (tests/metrics/ssim_test.cc, FlatRegionsFarFromTheMeanStayAccurate).
constexpr int N = 8;
typedef double V __attribute__((vector_size(64)));
typedef long long VMask __attribute__((vector_size(64)));
typedef float VF __attribute__((vector_size(32)));

inline V load(const double* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(double* p, V v) { std::memcpy(p, &v, sizeof v); }
inline V splat(double s) { return V{} + s; }

// Elements Shift .. Shift + 7 of the 16-element concatenation (a, b): one register shuffle
// instead of an unaligned load.
template <int Shift, std::size_t... I>
inline V shifted(V a, V b, std::index_sequence<I...>) {
  if constexpr (Shift == 0) return a;
  else if constexpr (Shift == N) return b;
#if defined(__clang__)
  else return __builtin_shufflevector(a, b, (Shift + static_cast<int>(I))...);
#else
  else return __builtin_shuffle(a, b, VMask{(Shift + static_cast<long long>(I))...});
#endif
}
template <int Shift>
inline V window_at(const V* regs) {  // regs: consecutive vectors of the input row
  return shifted<Shift % N>(regs[Shift / N], regs[Shift / N + 1], std::make_index_sequence<N>{});
}

// out[j..j+7] = sum_t taps[t] * in[j + t], symmetric taps: pair sums on the adders, half the
// multiply-adds. With the tap count known at compile time the shifted inputs come from shuffles.
template <int K>
inline V filter_horizontal(const double* in, const double* taps, int k) {
  if constexpr (K > 0) {
    constexpr int kHalf = K / 2;
    V regs[(K - 1) / N + 2];
    for (int r = 0; r < (K - 1) / N + 2; ++r) regs[r] = load(in + r * N);
    V acc = window_at<kHalf>(regs) * taps[kHalf];
    [&]<std::size_t... T>(std::index_sequence<T...>) {
      ((acc += (window_at<T>(regs) + window_at<K - 1 - T>(regs)) * taps[T]), ...);
    }
    (std::make_index_sequence<kHalf>{});
    return acc;
  } else {
    const int half = k / 2;
    V acc = load(in + half) * taps[half];
    for (int t = 0; t < half; ++t) acc += (load(in + t) + load(in + k - 1 - t)) * taps[t];
    return acc;
  }
}

// Centred x, y, x^2 + y^2 and xy: cs needs only the sum of the two variances, so four filtered
// signals suffice where the textbook formula filters five.
constexpr int kSignals = 4;
constexpr int kBlock = 2;  // vectors per vertical-pass block

struct MapConstants {
  double c1, c2, cov_norm, center;
};

// Vertical filter of kRows consecutive output rows (1 or 2; two share 10 of their 11 input rows)
// and the SSIM/cs map of those rows, summed into acc_ssim/acc_cs. base[sgn] points at the first
// input row of the first output row, rows `stride` apart; columns [jb, jb + N * kBlock).
template <int K, int kRows>
inline void vertical_block(const double* const* base, std::size_t stride, int jb, int wv, const double* taps, int k,
                           const MapConstants& mc, V& acc_ssim, V& acc_cs) {
  const int kk = K > 0 ? K : k;
  const int half = kk / 2;
  V m[kRows][kSignals][kBlock];
  for (int sgn = 0; sgn < kSignals; ++sgn)
    for (int b = 0; b < kBlock; ++b) {
      const double* p = base[sgn] + jb + b * N;
      auto row = [&](int t) { return load(p + std::size_t(t) * stride); };
      for (int r = 0; r < kRows; ++r) {
        V acc = row(half + r) * taps[half];
        for (int t = 0; t < half; ++t) acc += (row(t + r) + row(kk - 1 - t + r)) * taps[t];
        m[r][sgn][b] = acc;
      }
    }
  for (int r = 0; r < kRows; ++r)
    for (int b = 0; b < kBlock; ++b) {
      const V mx = m[r][0][b], my = m[r][1][b];
      const V v_sum = (m[r][2][b] - mx * mx - my * my) * mc.cov_norm;  // var x + var y
      const V vxy = (m[r][3][b] - mx * my) * mc.cov_norm;
      const V ux = mx + mc.center, uy = my + mc.center;
      const V a1 = ux * uy * 2.0 + mc.c1, b1 = ux * ux + uy * uy + mc.c1;
      const V a2 = vxy * 2.0 + mc.c2, b2 = v_sum + mc.c2;
      const V inv = 1.0 / (b1 * b2);  // one division for both terms
      V ssim = a1 * a2 * inv;
      V cs = a2 * b1 * inv;
      const int j0 = jb + b * N;
      if (j0 + N > wv) {  // padding lanes past the valid width
        for (int l = 0; l < N; ++l)
          if (j0 + l >= wv) ssim[l] = cs[l] = 0.0;
      }
      acc_ssim += ssim;
      acc_cs += cs;
    }
}

template <int K>
SsimPlaneResult ssim_plane_simd(PlaneView x, PlaneView y, const SsimWindow& window, double peak) {
  constexpr int kMaxTaps = K > 0 ? K : 64;
  const int k = K > 0 ? K : window.size();
  const int h = x.height, w = x.width;
  const int hv = h - k + 1, wv_plane = w - k + 1;
  double taps[kMaxTaps];
  for (int t = 0; t < k; ++t) taps[t] = window.taps[std::size_t(t)];

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
  const MapConstants mc{(0.01 * peak) * (0.01 * peak), (0.03 * peak) * (0.03 * peak), window.cov_norm,
                        std::round(sum / (2.0 * double(count)))};

  // Tasks are tiles of kStripRows x kTileCols outputs, so each one's rows stay in L2.
  const int strips = (hv + kStripRows - 1) / kStripRows;
  const int tiles = (wv_plane + kTileCols - 1) / kTileCols;
  std::vector<double> task_ssim(static_cast<std::size_t>(strips * tiles));
  std::vector<double> task_cs(static_cast<std::size_t>(strips * tiles));

  tbb::parallel_for(0, strips * tiles, [&](int task) {
    const int r0 = task / tiles * kStripRows, r1 = std::min(hv, r0 + kStripRows);
    const int c0 = task % tiles * kTileCols;
    const int wv = std::min(kTileCols, wv_plane - c0);                       // outputs of this tile in a row
    const int tw = wv + k - 1;                                               // inputs they read
    const int wv_pad = (wv + N * kBlock - 1) / (N * kBlock) * (N * kBlock);  // whole blocks
    const int w_pad = wv_pad + k - 1 + 2 * N;  // inputs the padded outputs (and shuffles) read
    // A ring of k + 1 horizontal rows, each stored twice (slot q % P and q % P + P), so the k + 1
    // input rows of an output-row pair are always contiguous.
    const int ring_rows = k + 1;
    const std::size_t plane_stride = std::size_t(2 * ring_rows) * wv_pad;
    std::vector<double> ring(kSignals * plane_stride);
    std::vector<double> row(std::size_t(kSignals) * w_pad, 0.0);
    V acc_ssim = splat(0), acc_cs = splat(0);
    const int last_input = r1 + k - 2;

    for (int i = r0; i <= last_input; ++i) {
      const float* xr = x.data + std::size_t(i) * w + c0;
      const float* yr = y.data + std::size_t(i) * w + c0;
      double* xc = row.data();
      double* yc = xc + w_pad;
      double* sq = yc + w_pad;
      double* xy = sq + w_pad;
      int j = 0;
      for (; j + N <= tw; j += N) {
        VF fx, fy;
        std::memcpy(&fx, xr + j, sizeof fx);
        std::memcpy(&fy, yr + j, sizeof fy);
        const V vx = __builtin_convertvector(fx, V) - mc.center;
        const V vy = __builtin_convertvector(fy, V) - mc.center;
        store(xc + j, vx);
        store(yc + j, vy);
        store(sq + j, vx * vx + vy * vy);
        store(xy + j, vx * vy);
      }
      for (; j < tw; ++j) {
        xc[j] = double(xr[j]) - mc.center;
        yc[j] = double(yr[j]) - mc.center;
        sq[j] = xc[j] * xc[j] + yc[j] * yc[j];
        xy[j] = xc[j] * yc[j];
      }
      const int slot = (i - r0) % ring_rows;
      for (int sgn = 0; sgn < kSignals; ++sgn) {
        const double* in = row.data() + std::size_t(sgn) * w_pad;
        double* out0 = ring.data() + sgn * plane_stride + std::size_t(slot) * wv_pad;
        double* out1 = out0 + std::size_t(ring_rows) * wv_pad;
        for (int jj = 0; jj < wv_pad; jj += N) {
          const V acc = filter_horizontal<K>(in + jj, taps, k);
          store(out0 + jj, acc);
          store(out1 + jj, acc);
        }
      }

      // Output rows whose inputs are all in: up to ro = i - k + 1 (strip-relative). They are
      // emitted in pairs; the strip's last row goes alone when the count is odd.
      const int ro = i - k + 1 - r0;
      if (ro < 0) continue;
      const bool pair_ready = ro % 2 == 1;
      const bool lone_last = i == last_input && ro % 2 == 0;
      if (!pair_ready && !lone_last) continue;
      const int first_row = pair_ready ? ro - 1 : ro;
      const double* base[kSignals];
      for (int sgn = 0; sgn < kSignals; ++sgn)
        base[sgn] = ring.data() + sgn * plane_stride + std::size_t(first_row % ring_rows) * wv_pad;
      for (int jb = 0; jb < wv_pad; jb += N * kBlock) {
        if (pair_ready) vertical_block<K, 2>(base, wv_pad, jb, wv, taps, k, mc, acc_ssim, acc_cs);
        else vertical_block<K, 1>(base, wv_pad, jb, wv, taps, k, mc, acc_ssim, acc_cs);
      }
    }
    double total_ssim = 0, total_cs = 0;
    for (int l = 0; l < N; ++l) {
      total_ssim += acc_ssim[l];
      total_cs += acc_cs[l];
    }
    task_ssim[std::size_t(task)] = total_ssim;
    task_cs[std::size_t(task)] = total_cs;
  });

  const double n = double(hv) * wv_plane;
  return {std::accumulate(task_ssim.begin(), task_ssim.end(), 0.0) / n,
          std::accumulate(task_cs.begin(), task_cs.end(), 0.0) / n};
}

void check_plane_pair(PlaneView x, PlaneView y, const SsimWindow& window) {
  if (x.height != y.height || x.width != y.width) throw std::invalid_argument("SSIM planes differ in size");
  if (x.height < window.size() || x.width < window.size())
    throw std::invalid_argument("SSIM plane smaller than the window");
  if (window.size() > 64) throw std::invalid_argument("SSIM window larger than 64 taps");
}

// Whole-plane double filtering, 'valid' region only: what scikit-image computes before cropping.
SsimPlaneResult ssim_plane_reference_d(const double* x, const double* y, int h, int w, const SsimWindow& window,
                                       double peak) {
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

// MATLAB imfilter(img, ones(f)/f^2, 'symmetric', 'same') then img(1:f:end, 1:f:end), on any
// sample type, accumulated in double.
template <class Out, class In>
std::vector<Out> box_downsample_t(const In* x, int h, int w, int f, int* oh, int* ow) {
  // imfilter's 'same' centre for an f-tap kernel is c = floor((f + 1) / 2) (1-based): output i
  // averages inputs i - (c - 1) .. i + (f - c); 'symmetric' mirrors including the edge sample.
  const int before = (f + 1) / 2 - 1;
  auto mirror = [](int i, int n) {
    while (i < 0 || i >= n) i = i < 0 ? -i - 1 : 2 * n - i - 1;
    return i;
  };
  *oh = (h + f - 1) / f;
  *ow = (w + f - 1) / f;
  std::vector<int> rows(std::size_t(*oh) * f), cols(std::size_t(*ow) * f);
  for (int o = 0; o < *oh; ++o)
    for (int a = 0; a < f; ++a) rows[std::size_t(o) * f + a] = mirror(o * f - before + a, h);
  for (int o = 0; o < *ow; ++o)
    for (int b = 0; b < f; ++b) cols[std::size_t(o) * f + b] = mirror(o * f - before + b, w);
  std::vector<Out> out(std::size_t(*oh) * *ow);
  std::vector<double> acc(static_cast<std::size_t>(*ow));
  const double norm = 1.0 / (double(f) * f);
  for (int oi = 0; oi < *oh; ++oi) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int a = 0; a < f; ++a) {
      const In* row = x + std::size_t(rows[std::size_t(oi) * f + a]) * w;
      for (int oj = 0; oj < *ow; ++oj)
        for (int b = 0; b < f; ++b) acc[std::size_t(oj)] += double(row[cols[std::size_t(oj) * f + b]]);
    }
    for (int oj = 0; oj < *ow; ++oj) out[std::size_t(oi) * *ow + oj] = Out(acc[std::size_t(oj)] * norm);
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
    case 7: return ssim_plane_simd<7>(x, y, window, peak);
    case 11: return ssim_plane_simd<11>(x, y, window, peak);
    default: return ssim_plane_simd<0>(x, y, window, peak);
  }
}

SsimPlaneResult ssim_plane_reference(PlaneView x, PlaneView y, const SsimWindow& window, double peak) {
  check_plane_pair(x, y, window);
  auto xd = to_double(x), yd = to_double(y);
  return ssim_plane_reference_d(xd.data(), yd.data(), x.height, x.width, window, peak);
}

int matlab_downsample_factor(int height, int width) {
  return std::max(1, static_cast<int>(std::lround(std::min(height, width) / 256.0)));
}

std::vector<float> box_downsample(PlaneView x, int f, int* out_height, int* out_width) {
  return box_downsample_t<float>(x.data, x.height, x.width, f, out_height, out_width);
}

namespace {

template <bool kReference>
SsimResult ssim_impl(const Tensor& ref, const Tensor& test, SsimConvention convention, double peak) {
  check_image_pair(ref, test);
  const SsimWindow window = window_for(convention);
  const int channels = static_cast<int>(ref.dim(0));
  int h = static_cast<int>(ref.dim(1)), w = static_cast<int>(ref.dim(2));
  const int f = convention == SsimConvention::kMatlab ? matlab_downsample_factor(h, w) : 1;
  SsimResult result;
  const int eh = (h + f - 1) / f, ew = (w + f - 1) / f;
  if (eh < window.size() || ew < window.size()) {
    result.note = "image " + std::to_string(w) + "x" + std::to_string(h) +
                  (f > 1 ? " (" + std::to_string(ew) + "x" + std::to_string(eh) + " after downsampling by " +
                               std::to_string(f) + ")"
                         : std::string()) +
                  " is smaller than the " + std::to_string(window.size()) + "x" + std::to_string(window.size()) +
                  " SSIM window";
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
        xd = box_downsample_t<double>(xd.data(), h, w, f, &dh, &dw);
        yd = box_downsample_t<double>(yd.data(), h, w, f, &dh, &dw);
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

SsimResult ssim_reference(const Tensor& ref, const Tensor& test, SsimConvention convention, double peak) {
  return ssim_impl<true>(ref, test, convention, peak);
}

std::vector<MetricDef> SsimMetric::defs() const {
  return {{.key = keys::kSsim, .label = "SSIM", .decimals = 5, .headline = true, .summarized = true}};
}

std::vector<std::pair<std::string, std::string>> SsimMetric::conventions(const ImageMetricOptions& options) const {
  const SsimConvention convention = options.ssim_convention;
  std::string def = convention == SsimConvention::kSkimageDefault
                        ? "skimage-default: 7x7 uniform window, sample covariance, K1 0.01, K2 0.03"
                        : "11x11 Gaussian window sigma 1.5, population covariance, K1 0.01, K2 0.03, mean over "
                          "the valid region";
  if (convention == SsimConvention::kWang) def = "wang (Wang et al. 2004): " + def;
  if (convention == SsimConvention::kMatlab)
    def = "matlab (Wang's ssim.m): box downsampling by max(1, round(min(H,W)/256)), then " + def;
  return {{keys::kSsim, def + "; mean over channels"}};
}

void SsimMetric::compute(const Tensor& ref, const Tensor& test, const ImageMetricOptions& options,
                         std::vector<MetricValue>& out) const {
  SsimResult r = ssim(ref, test, options.ssim_convention, options.peak);
  std::vector<std::optional<double>> channels(r.per_channel.begin(), r.per_channel.end());
  out.push_back({keys::kSsim, r.ssim, std::move(channels), r.note});
}

std::unique_ptr<ImageMetric> make_ssim_metric() { return std::make_unique<SsimMetric>(); }

}  // namespace qeval::metrics
