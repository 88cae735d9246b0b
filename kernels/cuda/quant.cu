// Quantization on the device (kernels/cuda/kernels.h "quantization"): QuantizeLinear and
// DequantizeLinear in the CPU kernels' formulas (kernels/numeric.h), and the pieces of an int8 x
// int8 -> int32 product: operands in int8 form, 8-bit im2col rows, a plain exact GEMM and the
// dequantizing epilogue (kernels/int8_gemm.h Int8Epilogue's rounding).
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/kernels.h"
#include "kernels/cuda/launch.cuh"

namespace qeval::kernels::cuda {
namespace {

using namespace launch;

__device__ inline i64 channel_of(i64 i, QuantAxis a) { return a.channels == 1 ? 0 : (i / a.inner) % a.channels; }

// kernels/numeric.h round_to_float8_e4m3fn, the same integer steps.
__device__ inline float round_e4m3fn(float v, bool saturate) {
  const unsigned x = __float_as_uint(v);
  const unsigned sign = x & 0x80000000u, a = x & 0x7fffffffu;
  const unsigned normal = (a + 0x7ffffu + ((a >> 20) & 1u)) & 0xfff00000u;
  const float sub = __fmul_rn(rintf(__fmul_rn(__uint_as_float(a), 512.0f)), 1.0f / 512.0f);
  unsigned r = a < 0x3c800000u ? __float_as_uint(sub) : normal;
  const unsigned kMax = 0x43e00000u, kNaN = 0x7fc00000u;
  const unsigned over = saturate ? kMax : kNaN;
  r = a > 0x7f800000u ? kNaN : (r > kMax ? over : r);
  return __uint_as_float(r | sign);
}

__global__ void quantize_kernel(const float* x, void* y, i64 n, const float* scale, const std::int32_t* zp,
                                QuantAxis a, QuantTo to, bool saturate) {
  QEVAL_FOR(i, n) {
    const i64 c = channel_of(i, a);
    if (to == QuantTo::kFloat8E4M3FN) {
      // a division, as ONNX (not a reciprocal's product)
      static_cast<float*>(y)[i] = round_e4m3fn(__fdiv_rn(x[i], scale[c]), saturate);
      continue;
    }
    const bool s8 = to == QuantTo::kInt8;
    const float v = quantize_to(x[i], scale[c], zp ? float(zp[c]) : 0.0f, s8);
    if (s8) static_cast<std::int8_t*>(y)[i] = static_cast<std::int8_t>(v);
    else static_cast<std::uint8_t*>(y)[i] = static_cast<std::uint8_t>(v);
  }
}

template <class T>
__global__ void dequantize_kernel(const T* x, float* y, i64 n, const float* scale, const std::int32_t* zp,
                                  QuantAxis a) {
  QEVAL_FOR(i, n) {
    const i64 c = channel_of(i, a);
    if constexpr (std::is_same_v<T, float>) {
      // float8 values stored as float (zero point 0); a NaN passes unchanged, as the CPU's
      // product keeps its operand's NaN bits (the device would write its canonical NaN).
      y[i] = x[i] != x[i] ? x[i] : __fmul_rn(x[i], scale[c]);
    } else {
      // kernels/numeric.h dequantize: float(q - zero point) * scale.
      const std::int32_t q = std::int32_t(x[i]) - (zp ? zp[c] : 0);
      y[i] = __fmul_rn(float(q), scale[c]);
    }
  }
}

__device__ inline std::int8_t int8_form(std::uint8_t v, bool from_uint8) {
  return static_cast<std::int8_t>(from_uint8 ? v ^ 0x80u : v);
}

__global__ void to_int8_kernel(const std::uint8_t* x, bool from_uint8, std::int8_t* y, i64 n) {
  QEVAL_FOR(i, n) y[i] = int8_form(x[i], from_uint8);
}

// rows[image][s][kk]: kk = (channel, ky, kx) of the window of output position s. One thread per
// (image, s, channel) writes that channel's kh * kw bytes.
__global__ void im2col_int8_kernel(const std::uint8_t* x, bool from_uint8, std::int8_t* rows, Conv2d p, i64 n,
                                   std::int8_t pad) {
  const i64 taps = p.kh * p.kw, window = p.c * taps, spatial = p.oh * p.ow;
  QEVAL_FOR(i, n) {
    const i64 c = i % p.c, s = (i / p.c) % spatial, b = i / (p.c * spatial);
    const i64 ox = s % p.ow, oy = s / p.ow;
    const std::uint8_t* xc = x + (b * p.c + c) * p.h * p.w;
    std::int8_t* out = rows + (b * spatial + s) * window + c * taps;
    for (i64 ky = 0; ky < p.kh; ++ky) {
      const i64 iy = oy * p.sh - p.ph + ky * p.dh;
      const bool row_in = iy >= 0 && iy < p.h;
      for (i64 kx = 0; kx < p.kw; ++kx) {
        const i64 ix = ox * p.sw - p.pw + kx * p.dw;
        out[ky * p.kw + kx] = row_in && ix >= 0 && ix < p.w ? int8_form(xc[iy * p.w + ix], from_uint8) : pad;
      }
    }
  }
}

// 64 x 64 outputs per block of 256 threads (4 x 4 each), k in steps of 32 bytes through shared
// memory as packed words, __dp4a products: exact int32 sums, any m, n, k and alignment.
constexpr int kTile = 64, kStepBytes = 32, kWords = kStepBytes / 4;

__device__ inline int load_word(const std::int8_t* p, i64 row, i64 rows, i64 k, i64 kk) {
  if (row >= rows) return 0;
  const std::int8_t* r = p + row * k;
  unsigned w = 0;
  for (int t = 0; t < 4; ++t)
    if (kk + t < k) w |= unsigned(std::uint8_t(r[kk + t])) << (8 * t);
  return int(w);
}

__global__ void int8_gemm_tn_kernel(const std::int8_t* a, const std::int8_t* b, std::int32_t* c, i64 m, i64 n, i64 k,
                                    i64 ldc) {
  __shared__ int sa[kTile][kWords + 1];
  __shared__ int sb[kTile][kWords + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const i64 i0 = i64(blockIdx.x) * kTile, j0 = i64(blockIdx.y) * kTile;
  int acc[4][4] = {};
  for (i64 k0 = 0; k0 < k; k0 += kStepBytes) {
    for (int w = threadIdx.x; w < kTile * kWords; w += blockDim.x) {
      const int r = w / kWords, q = w % kWords;
      sa[r][q] = load_word(a, i0 + r, m, k, k0 + 4 * q);
      sb[r][q] = load_word(b, j0 + r, n, k, k0 + 4 * q);
    }
    __syncthreads();
    for (int q = 0; q < kWords; ++q) {
      int av[4], bv[4];
      for (int u = 0; u < 4; ++u) {
        av[u] = sa[tx + 16 * u][q];
        bv[u] = sb[ty + 16 * u][q];
      }
      for (int u = 0; u < 4; ++u)
        for (int v = 0; v < 4; ++v) acc[u][v] = __dp4a(av[u], bv[v], acc[u][v]);
    }
    __syncthreads();
  }
  for (int u = 0; u < 4; ++u)
    for (int v = 0; v < 4; ++v) {
      const i64 i = i0 + tx + 16 * u, j = j0 + ty + 16 * v;
      if (i < m && j < n) c[i + j * ldc] = acc[u][v];
    }
}

__global__ void int8_epilogue_kernel(std::int32_t* c, i64 n, const std::int32_t* add, const float* scale,
                                     const float* bias, QuantAxis a) {
  QEVAL_FOR(i, n) {
    const i64 ch = channel_of(i, a);
    // Int8Epilogue: float(sum + add), times the scale, plus the bias: each step rounded (no FMA).
    float v = float(add ? c[i] + add[ch] : c[i]);
    v = __fmul_rn(v, scale[ch]);
    if (bias) v = __fadd_rn(v, bias[ch]);
    reinterpret_cast<float*>(c)[i] = v;
  }
}

}  // namespace

void quantize_linear(const float* x, void* y, std::int64_t n, const float* scale, const std::int32_t* zero_point,
                     QuantAxis a, QuantTo to, bool saturate, Stream s) {
  if (n == 0) return;
  quantize_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(x, y, n, scale, zero_point, a, to, saturate);
  check_launch("quantize_linear");
}

void dequantize_linear(Elem elem, const void* x, float* y, std::int64_t n, const float* scale,
                       const std::int32_t* zero_point, QuantAxis a, Stream s) {
  if (n == 0) return;
  const unsigned g = blocks_for(n);
  cudaStream_t st = stream_of(s);
  switch (elem) {
    case Elem::kI8:
      dequantize_kernel<<<g, kThreads, 0, st>>>(static_cast<const std::int8_t*>(x), y, n, scale, zero_point, a);
      break;
    case Elem::kU8:
      dequantize_kernel<<<g, kThreads, 0, st>>>(static_cast<const std::uint8_t*>(x), y, n, scale, zero_point, a);
      break;
    case Elem::kI32:
      dequantize_kernel<<<g, kThreads, 0, st>>>(static_cast<const std::int32_t*>(x), y, n, scale, zero_point, a);
      break;
    case Elem::kF32:
      dequantize_kernel<<<g, kThreads, 0, st>>>(static_cast<const float*>(x), y, n, scale, nullptr, a);
      break;
    default: throw std::invalid_argument("dequantize_linear: int8, uint8, int32 or float values expected");
  }
  check_launch("dequantize_linear");
}

void to_int8(const void* x, bool from_uint8, std::int8_t* y, std::int64_t n, Stream s) {
  if (n == 0) return;
  to_int8_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(static_cast<const std::uint8_t*>(x), from_uint8, y, n);
  check_launch("to_int8");
}

void im2col_int8_rows(const void* x, bool from_uint8, std::int8_t* rows, const Conv2d& p, std::int64_t images,
                      std::int8_t pad, Stream s) {
  const i64 n = images * p.c * p.oh * p.ow;
  if (n == 0 || p.kh * p.kw == 0) return;
  im2col_int8_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(static_cast<const std::uint8_t*>(x), from_uint8,
                                                                   rows, p, n, pad);
  check_launch("im2col_int8_rows");
}

void int8_gemm_tn(const std::int8_t* a, const std::int8_t* b, std::int32_t* c, std::int64_t m, std::int64_t n,
                  std::int64_t k, std::int64_t ldc, Stream s) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (i64 j = 0; j < n; ++j) cudaMemsetAsync(c + j * ldc, 0, std::size_t(m) * 4, stream_of(s));
    return;
  }
  if ((n + kTile - 1) / kTile > 65535) throw std::invalid_argument("int8_gemm_tn: n beyond 65535 tiles");
  const dim3 grid(unsigned((m + kTile - 1) / kTile), unsigned((n + kTile - 1) / kTile));
  int8_gemm_tn_kernel<<<grid, kThreads, 0, stream_of(s)>>>(a, b, c, m, n, k, ldc);
  check_launch("int8_gemm_tn");
}

void int8_epilogue(std::int32_t* c, std::int64_t n, const std::int32_t* add, const float* scale, const float* bias,
                   QuantAxis a, Stream s) {
  if (n == 0) return;
  int8_epilogue_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(c, n, add, scale, bias, a);
  check_launch("int8_epilogue");
}

}  // namespace qeval::kernels::cuda
