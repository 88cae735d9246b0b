// Separable N-D resizing: nearest, linear and cubic interpolation with the coordinate mappings of
// the usual frameworks (half pixel, align corners, asymmetric, crop-and-resize, ...).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace qeval::kernels {

enum class ResizeMode { kNearest, kLinear, kCubic };

// How an output index x maps to an input coordinate (scale = output / input size as the model
// states it; `length` = scale * input size, which need not be an integer).
enum class ResizeCoordinates {
  kHalfPixel,           // (x + 0.5) / scale - 0.5
  kHalfPixelSymmetric,  // half pixel, re-centred when the output size was rounded
  kPytorchHalfPixel,    // half pixel, but -0.5 when length == 1
  kAlignCorners,        // x * (in - 1) / (length - 1), 0 when length == 1
  kAsymmetric,          // x / scale
  kTfHalfPixelForNn,    // (x + 0.5) / scale
  kTfCropAndResize,     // within [roi_start, roi_end] of the input; outside -> extrapolation value
};

enum class NearestRounding {
  kRoundPreferFloor,
  kRoundPreferCeil,
  kFloor,
  kCeil,
  kSimple,  // floor when upsampling, ceil when downsampling (legacy Upsample / Resize-10)
};

struct ResizeOptions {
  ResizeMode mode = ResizeMode::kNearest;
  ResizeCoordinates coordinates = ResizeCoordinates::kHalfPixel;
  NearestRounding nearest = NearestRounding::kRoundPreferFloor;
  double cubic_a = -0.75;
  bool exclude_outside = false;  // taps outside the input get weight 0, the rest renormalised
  bool antialias = false;        // linear/cubic: widen the filter by 1/scale when downsampling
  double extrapolation_value = 0;
};

// One dimension of a resize.
struct ResizeAxis {
  std::int64_t in = 1, out = 1;
  double scale = 1;
  double roi_start = 0, roi_end = 1;  // kTfCropAndResize only, as fractions of the input
};

// The taps of every output index along one dimension: output o reads input
// index[o * taps + t] with weight[o * taps + t] (indices clamped into the input, as edge padding
// would), or takes the extrapolation value when extrapolate[o].
struct AxisFilter {
  std::int64_t in = 1, out = 1;
  int taps = 1;
  std::vector<std::int64_t> index;
  std::vector<double> weight;
  std::vector<std::uint8_t> extrapolate;
  bool identity = false;  // out == in and every output copies its own input
};

// The filter of one dimension. Weights are computed in double.
AxisFilter resize_filter(const ResizeAxis& axis, const ResizeOptions& options);

// Resizes x (dimensions axes[i].in) into y (dimensions axes[i].out), one dimension at a time
// (interpolation is separable; shrinking dimensions go first to cut the work). T: float, double.
template <class T>
void resize(const T* x, T* y, const std::vector<ResizeAxis>& axes, const ResizeOptions& options);

// Nearest-neighbour resize of any element type (a gather; no arithmetic on values).
// `fill` holds one element: the value written where the filter extrapolates.
void resize_nearest(const std::byte* x, std::byte* y, std::size_t element_size, const std::vector<ResizeAxis>& axes,
                    const ResizeOptions& options, const std::byte* fill);

}  // namespace qeval::kernels
