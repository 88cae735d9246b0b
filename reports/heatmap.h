// Heatmaps: a scalar map to colours (a perceptually ordered dark-to-bright ramp).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace qeval::reports {

// Maps each value v to a colour on the ramp at v / scale (clamped to [0, 1]); NaN is magenta so it
// is never mistaken for "no difference". Returns interleaved RGB, 3 bytes per value.
std::vector<std::uint8_t> heatmap_rgb(std::span<const float> values, float scale);

// The one scale of the image difference heatmaps in a `qeval run` report, in 8-bit levels (0-255):
// black 0, brightest at |diff| >= this. Fixed, not per image, so that heatmaps compare across
// samples and variants (a per-image scale drew FP16's 1/255 noise as brightly as INT8's 75/255).
inline constexpr double kDifferenceScale255 = 32;
// The amplified view beside it (report.html's "x8" toggle): the same differences at this gain, so
// bright at |diff| >= kDifferenceScale255 / kAmplifiedGain; FP16-sized 1-3 level noise shows there.
inline constexpr double kAmplifiedGain = 8;

// The ramp colour at t in [0, 1], for legends.
void ramp_color(float t, std::uint8_t rgb[3]);

}  // namespace qeval::reports
