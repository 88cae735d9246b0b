// Normalisation kernels: per-row moments with a per-channel affine (layer, instance, group norm)
// and inference batch normalisation.
#pragma once

#include <cstdint>

namespace qeval::kernels {

// Per-channel affine parameters of a normalisation: the element at flat index f of the whole
// array uses channel (f / channel_inner) % channels. Layer norm: channels = row length,
// channel_inner = 1; instance norm over [N, C, S]: channels = C, channel_inner = S.
template <class T>
struct ChannelAffine {
  const T* scale = nullptr;  // `channels` values; nullptr means 1
  const T* bias = nullptr;   // `channels` values; nullptr means 0
  std::int64_t channels = 1;
  std::int64_t channel_inner = 1;
};

// Mean and variance of n values: two passes in double (the mean, then centred sums with the
// rounding of the mean corrected), so a mean far larger than the spread does not cancel.
template <class T>
void moments(const T* x, std::int64_t n, double* mean, double* variance);

// Normalises each of `rows` contiguous rows of length n by its own moments:
// y = (x - mean) / sqrt(var + epsilon) * scale + bias, computed in double per element.
// mean_out / inv_std_out (`rows` values each) may be nullptr. T is float or double.
template <class T>
void normalize_rows(const T* x, T* y, std::int64_t rows, std::int64_t n, double epsilon, const ChannelAffine<T>& affine,
                    double* mean_out, double* inv_std_out);

// Inference batch normalisation of x viewed as [outer, channels, inner]:
// y = (x - mean[c]) / sqrt(var[c] + epsilon) * scale[c] + bias[c]; parameters in double.
template <class T>
void batch_norm(const T* x, T* y, std::int64_t outer, std::int64_t channels, std::int64_t inner, const double* scale,
                const double* bias, const double* mean, const double* var, double epsilon);

}  // namespace qeval::kernels
