// Sliding-window pooling (max, average) and global pooling over the spatial dimensions of arrays
// viewed as [planes, D1, ..., Dk], k = 1..3. (kernels/pooling.h is block pooling for thumbnails.)
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace qeval::kernels {

// Geometry of one pooling: per spatial dimension, the input and output sizes, the window, the
// stride, the dilation and the implicit padding at each end. Output sizes are the caller's (they
// depend on ceil/floor and auto-padding rules); windows may run past the padded input.
struct PoolWindow {
  int rank = 0;  // spatial dimensions, 1..3
  std::array<std::int64_t, 3> in{}, out{}, kernel{}, stride{}, dilation{}, pad_begin{}, pad_end{};
};

// Max over each window, ignoring padding. NaN in a window gives NaN (a NaN must stay visible).
// A window with no input element gives the lowest finite value and index -1. When `indices` is
// not null it receives the flat index of each maximum into the whole input ([planes, D...]),
// row-major, or with the spatial dimensions column-major (first dimension fastest) when
// `column_major`. T: float, double, int8_t, uint8_t.
template <class T>
void max_pool(const T* x, T* y, std::int64_t* indices, std::int64_t planes, const PoolWindow& w, bool column_major);

// Mean over each window, summed in double. The divisor counts the input elements in the window,
// plus, when `count_include_pad`, the window's taps that fall in the declared padding (taps past
// the padding, from ceil-mode windows, never count). An empty window gives NaN. T: float, double.
template <class T>
void average_pool(const T* x, T* y, std::int64_t planes, const PoolWindow& w, bool count_include_pad);

// Inverse of max pooling: y (shape `out`) is zero except where the values of x land. Each x[i]
// goes to flat position indices[i] of an array of shape `inferred`, which sits at the origin of
// `out` (every out dimension >= its inferred one). Returns the position i of the first index
// outside [0, numel(inferred)), or -1 when all are valid (nothing is written for invalid ones).
template <class T>
std::int64_t max_unpool(const T* x, const std::int64_t* indices, std::int64_t count, T* y,
                        const std::vector<std::int64_t>& inferred, const std::vector<std::int64_t>& out);

// Mean (summed in double) or max (NaN-propagating) of each of `planes` contiguous runs of `size`.
template <class T>
void global_pool(const T* x, T* y, std::int64_t planes, std::int64_t size, bool max);

}  // namespace qeval::kernels
