// Block pooling of planes by an integer factor (thumbnails, heatmap reduction).
#pragma once

#include <vector>

namespace qeval::kernels {

enum class PoolMode { kAverage, kMax };

// Pools f x f blocks of an h x w plane; partial blocks at the right/bottom edges pool what they
// have. Output is ceil(h/f) x ceil(w/f). NaN propagates in kMax mode (a NaN must stay visible).
std::vector<float> pool_plane(const float* in, int h, int w, int f, PoolMode mode, int* out_h, int* out_w);

}  // namespace qeval::kernels
