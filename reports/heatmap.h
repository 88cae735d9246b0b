// Heatmaps: a scalar map to colours (a perceptually ordered dark-to-bright ramp).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace qeval::reports {

// Maps each value v to a colour on the ramp at v / scale (clamped to [0, 1]); NaN is magenta so it
// is never mistaken for "no difference". Returns interleaved RGB, 3 bytes per value.
std::vector<std::uint8_t> heatmap_rgb(std::span<const float> values, float scale);

// The ramp colour at t in [0, 1], for legends.
void ramp_color(float t, std::uint8_t rgb[3]);

}  // namespace qeval::reports
