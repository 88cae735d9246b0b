// The colour ramp: black -> purple -> red -> orange -> pale yellow (inferno-like anchors).
#include "reports/heatmap.h"

#include <algorithm>
#include <cmath>

namespace qeval::reports {

namespace {
constexpr float kAnchors[][3] = {
    {0, 0, 4},     {40, 11, 84},   {101, 21, 110}, {159, 42, 99},
    {212, 72, 66}, {245, 125, 21}, {250, 193, 39}, {252, 255, 164},
};
constexpr int kAnchorCount = sizeof(kAnchors) / sizeof(kAnchors[0]);
}  // namespace

void ramp_color(float t, std::uint8_t rgb[3]) {
  if (std::isnan(t)) {
    rgb[0] = 255, rgb[1] = 0, rgb[2] = 255;
    return;
  }
  t = std::clamp(t, 0.0f, 1.0f) * float(kAnchorCount - 1);
  int i = std::min(static_cast<int>(t), kAnchorCount - 2);
  float f = t - float(i);
  for (int c = 0; c < 3; ++c)
    rgb[c] = static_cast<std::uint8_t>(std::lround(kAnchors[i][c] + (kAnchors[i + 1][c] - kAnchors[i][c]) * f));
}

std::vector<std::uint8_t> heatmap_rgb(std::span<const float> values, float scale) {
  std::vector<std::uint8_t> out(values.size() * 3);
  const float inv = scale > 0 ? 1.0f / scale : 0.0f;
  for (std::size_t i = 0; i < values.size(); ++i)
    ramp_color(std::isnan(values[i]) ? values[i] : values[i] * inv, &out[i * 3]);
  return out;
}

}  // namespace qeval::reports
