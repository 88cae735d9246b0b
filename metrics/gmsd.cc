// GMSD (Xue, Zhang, Mou, Bovik 2014): gradient magnitude similarity deviation on luma; lower is better.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "metrics/image_metric.h"

namespace qeval::metrics {

namespace {

constexpr double kT = 170.0;  // the paper's stabilising constant, for luma on [0, 255]

struct Plane {
  int h = 0, w = 0;
  std::vector<double> v;
  double at(int y, int x) const { return y < 0 || x < 0 || y >= h || x >= w ? 0.0 : v[std::size_t(y) * w + x]; }
};

// Luma on [0, 255]: BT.601 Y = 0.299 R + 0.587 G + 0.114 B of channels 0..2; channel 0 with fewer
// than three (gray, gray + alpha). An alpha plane never enters it.
Plane luma_255(const Tensor& t, double peak) {
  Plane p{int(t.dim(1)), int(t.dim(2)), {}};
  const std::size_t n = std::size_t(p.h) * p.w;
  const float* d = t.data<float>();
  const double scale = 255.0 / peak;
  p.v.resize(n);
  for (std::size_t i = 0; i < n; ++i)
    p.v[i] = scale * (t.dim(0) >= 3 ? 0.299 * d[i] + 0.587 * d[n + i] + 0.114 * d[2 * n + i] : double(d[i]));
  return p;
}

// The reference's conv2(Y, ones(2)/4, 'same') then Y(1:2:end, 1:2:end): the mean of each 2x2 block,
// zero past the last row and column of an odd size.
Plane average_downsample(const Plane& y) {
  Plane o{(y.h + 1) / 2, (y.w + 1) / 2, {}};
  o.v.resize(std::size_t(o.h) * o.w);
  for (int i = 0; i < o.h; ++i)
    for (int j = 0; j < o.w; ++j)
      o.v[std::size_t(i) * o.w + j] =
          (y.at(2 * i, 2 * j) + y.at(2 * i + 1, 2 * j) + y.at(2 * i, 2 * j + 1) + y.at(2 * i + 1, 2 * j + 1)) / 4.0;
  return o;
}

// Prewitt gradient magnitude: conv2 with [1 0 -1; 1 0 -1; 1 0 -1] / 3 and its transpose, 'same',
// zero outside the image (as the reference).
std::vector<double> gradient_magnitude(const Plane& y) {
  std::vector<double> m(y.v.size());
  for (int i = 0; i < y.h; ++i)
    for (int j = 0; j < y.w; ++j) {
      double gx = 0, gy = 0;
      for (int k = -1; k <= 1; ++k) {
        gx += y.at(i + k, j + 1) - y.at(i + k, j - 1);
        gy += y.at(i + 1, j + k) - y.at(i - 1, j + k);
      }
      gx /= 3.0;
      gy /= 3.0;
      m[std::size_t(i) * y.w + j] = std::sqrt(gx * gx + gy * gy);
    }
  return m;
}

class GmsdMetric final : public ImageMetric {
 public:
  std::string_view name() const override { return "gmsd"; }
  std::vector<MetricDef> defs() const override {
    return {{.key = "gmsd",
             .label = "GMSD",
             .higher_is_better = false,
             .decimals = 5,
             .summarized = true,
             .definition = "Xue et al. 2014: luma Y = 0.299 R + 0.587 G + 0.114 B on [0, 255], 2x2 average "
                           "downsampling, Prewitt gradient magnitudes m, GMS = (2 m1 m2 + 170) / (m1^2 + m2^2 + "
                           "170), GMSD = standard deviation of GMS (N - 1); 0 = identical, lower is better"}};
  }
  void compute(const Tensor& ref, const Tensor& test, const ImageMetricOptions& options,
               std::vector<MetricValue>& out) const override {
    check_image_pair(ref, test);
    const Plane a = average_downsample(luma_255(ref, options.peak));
    const Plane b = average_downsample(luma_255(test, options.peak));
    const std::size_t n = a.v.size();
    if (n < 2) {
      out.push_back({"gmsd",
                     std::nullopt,
                     {},
                     "needs more than one 2x2 block (larger than 2x2 px) for a deviation; image is " +
                         std::to_string(ref.dim(2)) + "x" + std::to_string(ref.dim(1))});
      return;
    }
    const std::vector<double> ma = gradient_magnitude(a), mb = gradient_magnitude(b);
    std::vector<double> gms(n);
    double mean = 0;
    for (std::size_t i = 0; i < n; ++i) {
      // Equal magnitudes give exactly 1 (so identical images score exactly 0): the formula would
      // round differently in the numerator and the (contracted) denominator.
      gms[i] = ma[i] == mb[i] ? 1.0 : (2 * ma[i] * mb[i] + kT) / (ma[i] * ma[i] + mb[i] * mb[i] + kT);
      mean += gms[i];
    }
    mean /= double(n);
    double ss = 0;  // mean-subtracted: GMS values crowd near 1, where E[x^2] - mean^2 would cancel
    for (double g : gms) ss += (g - mean) * (g - mean);
    out.push_back({"gmsd", std::sqrt(ss / double(n - 1)), {}, ""});
  }
};

}  // namespace

std::unique_ptr<ImageMetric> make_gmsd_metric() { return std::make_unique<GmsdMetric>(); }

}  // namespace qeval::metrics
