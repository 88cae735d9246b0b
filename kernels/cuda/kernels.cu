// qeval's CUDA kernels (kernels/cuda/kernels.h): data movement, elementwise maps, rounding,
// softmax, norms, reductions, convolution pieces, pooling and resize. One file, no heavy templates:
// nvcc time on CI's 2 cores matters.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cuda_pipeline.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/kernels.h"
#include "kernels/cuda/launch.cuh"

namespace qeval::kernels::cuda {
namespace {

using namespace launch;

// Offsets of operands 0..K-1 for dense index i of a walk of n elements: one division per axis but
// the outermost, shared by the operands, in 32 bits where n allows (64-bit divisions are several
// times slower, and elementwise kernels are mostly index arithmetic).
template <int K>
__device__ inline void walk_offsets(const Walk& w, i64 n, i64 i, i64 (&off)[K]) {
#pragma unroll
  for (int k = 0; k < K; ++k) off[k] = w.base[k];
  auto walk = [&](auto u) {
    using U = decltype(u);
    for (int d = w.rank - 1; d > 0; --d) {
      const U c = U(w.counts[d]), q = u / c, r = u - q * c;
#pragma unroll
      for (int k = 0; k < K; ++k) off[k] += i64(r) * w.strides[k][d];
      u = q;
    }
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] += i64(u) * w.strides[k][0];
  };
  if (n <= i64(0xffffffffu)) walk(unsigned(i));
  else walk(i);
}

// (i / repeat) % period, in 32 bits where n (above i) allows.
__device__ inline i64 block_index(i64 i, i64 n, i64 repeat, i64 period) {
  if (n <= i64(0xffffffffu) && repeat <= i64(0xffffffffu) && period <= i64(0xffffffffu))
    return i64((unsigned(i) / unsigned(repeat)) % unsigned(period));
  return (i / repeat) % period;
}

i64 walk_numel(const Walk& w) {
  i64 n = 1;
  for (int d = 0; d < w.rank; ++d) n *= w.counts[d];
  return n;
}


// ---- data movement ----------------------------------------------------------------------------

template <class T>
__global__ void strided_copy_kernel(const T* src, T* dst, Walk w, i64 n) {
  QEVAL_FOR(i, n) {
    i64 off[2];
    walk_offsets(w, n, i, off);
    dst[off[1]] = src[off[0]];
  }
}

template <class T>
__global__ void gather_map_kernel(const T* src, T* dst, const i64* map, i64 n, T fill) {
  QEVAL_FOR(i, n) {
    const i64 m = map[i];
    dst[i] = m >= 0 ? src[m] : fill;
  }
}

template <class T>
__global__ void gather_separable_kernel(const T* src, T* dst, SeparableGather g, const i64* tables, i64 n, T fill) {
  auto element = [&](auto rem) {  // 32-bit divisions where n allows (walk_offsets)
    using U = decltype(rem);
    i64 off = g.base;
    bool valid = true;
    for (int d = g.rank - 1; d >= 0; --d) {
      const U c = U(g.counts[d]), q = rem / c;
      const i64 t = tables[g.offsets[d] + i64(rem - q * c)];
      rem = q;
      if (t == INT64_MIN) valid = false;
      else off += t;
    }
    return valid ? src[off] : fill;
  };
  const bool small = n <= i64(0xffffffffu);
  QEVAL_FOR(i, n) dst[i] = small ? element(unsigned(i)) : element(i);
}

template <class T>
__global__ void gather_axis_kernel(const T* src, const void* idx, bool idx64, T* dst, i64 axis, i64 inner, i64 count,
                                   i64 n) {
  QEVAL_FOR(i, n) {
    const i64 in = i % inner;
    const i64 j = (i / inner) % count;
    const i64 o = i / (inner * count);
    i64 k = idx64 ? static_cast<const i64*>(idx)[j] : i64(static_cast<const std::int32_t*>(idx)[j]);
    if (k < 0) k += axis;
    dst[i] = (k >= 0 && k < axis) ? src[(o * axis + k) * inner + in] : T{};
  }
}

template <class F>
void by_size(int bytes, F&& f) {
  switch (bytes) {
    case 1: return f(std::uint8_t{});
    case 2: return f(std::uint16_t{});
    case 4: return f(std::uint32_t{});
    case 8: return f(std::uint64_t{});
    default: throw std::logic_error("CUDA kernels: element size " + std::to_string(bytes));
  }
}

// ---- elementwise ------------------------------------------------------------------------------

// kernels/elementwise.h's erf_vectorisable and sigmoid_vectorisable, term for term.
__device__ inline float erf_q(float x) {
  const float a = fabsf(x);
  const float t = a * a;
  float p = -6.024572649039328e-4f;
  p = p * t + 5.000889301300049e-3f;
  p = p * t + -2.677295356988907e-2f;
  p = p * t + 1.1282039433717728e-1f;
  p = p * t + -3.761252462863922e-1f;
  p = p * t + 1.2837916612625122e-1f;
  const float small = a + a * p;
  const float c = a < 4.0f ? a : 4.0f;
  float q = 3.3717236647134996e-7f;
  q = q * c + 1.6803254766273312e-5f;
  q = q * c + -4.1108153527602553e-4f;
  q = q * c + 4.09982493147254e-3f;
  q = q * c + -2.498658187687397e-2f;
  q = q * c + 1.0812472552061081e-1f;
  q = q * c + 6.334582567214966e-1f;
  q = q * c + 1.1294702291488647f;
  q = q * c + -1.6695375961717218e-4f;
  const float big = 1.0f - expf(-q);
  const float r = a < 0.921875f ? small : big;
  return x == x ? copysignf(r, x) : x;
}

__device__ inline float sigmoid_q(float x) {
  const float e = expf(-fabsf(x));
  const float r = 1.0f / (1.0f + e);
  return x >= 0.0f ? r : (x == x ? e * r : x);
}

__device__ inline float clamp01_nan(float v) { return v != v ? v : fmaxf(0.0f, fminf(1.0f, v)); }

__device__ inline float unary_f(Unary op, float x, float p0, float p1) {
  switch (op) {
    case Unary::kNeg: return -x;
    case Unary::kAbs: return fabsf(x);
    case Unary::kSqrt: return sqrtf(x);
    case Unary::kExp: return expf(x);
    case Unary::kLog: return logf(x);
    case Unary::kErf: return erf_q(x);
    case Unary::kTanh: return tanhf(x);
    case Unary::kSigmoid: return sigmoid_q(x);
    case Unary::kRelu: return x > 0 ? x : (x == x ? 0.0f : x);
    case Unary::kReciprocal: return 1.0f / x;
    case Unary::kFloor: return floorf(x);
    case Unary::kCeil: return ceilf(x);
    case Unary::kRound: return rintf(x);
    case Unary::kSign: return x > 0 ? 1.0f : (x < 0 ? -1.0f : x);
    case Unary::kSin: return sinf(x);
    case Unary::kCos: return cosf(x);
    case Unary::kSoftplus: return x > 0 ? x + log1pf(expf(-x)) : log1pf(expf(x));
    case Unary::kSoftsign: return x / (1.0f + fabsf(x));
    case Unary::kLeakyRelu: return x >= 0 ? x : p0 * x;
    case Unary::kElu: return x >= 0 ? x : p0 * (expf(x) - 1.0f);
    case Unary::kHardSigmoid: return clamp01_nan(p0 * x + p1);
    case Unary::kHardSwish: return x * clamp01_nan(x / 6.0f + 0.5f);
    case Unary::kGeluErf: return 0.5f * x * (1.0f + erf_q(x * 0.7071067811865476f));
    case Unary::kGeluTanh: return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case Unary::kClip: return x != x ? x : (x < p0 ? p0 : (x > p1 ? p1 : x));
    case Unary::kNot: return x;
  }
  return x;
}

__global__ void unary_f32_kernel(Unary op, const float* x, float* y, i64 n, float p0, float p1) {
  QEVAL_FOR(i, n) y[i] = unary_f(op, x[i], p0, p1);
}

template <class T>
__global__ void unary_int_kernel(Unary op, const T* x, T* y, i64 n, T lo, T hi) {
  QEVAL_FOR(i, n) {
    const T v = x[i];
    switch (op) {
      case Unary::kNeg: y[i] = T(-v); break;
      case Unary::kAbs: y[i] = v < 0 ? T(-v) : v; break;
      case Unary::kRelu: y[i] = v > 0 ? v : T(0); break;
      case Unary::kSign: y[i] = v > 0 ? T(1) : (v < 0 ? T(-1) : T(0)); break;
      case Unary::kClip: y[i] = v < lo ? lo : (v > hi ? hi : v); break;
      default: y[i] = v;
    }
  }
}

__global__ void not_kernel(const bool* x, bool* y, i64 n) { QEVAL_FOR(i, n) y[i] = !x[i]; }

template <class T>
__device__ inline T arith(Binary op, T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    return a;  // bools only compare
  } else {
    switch (op) {
      case Binary::kAdd: return T(a + b);
      case Binary::kSub: return T(a - b);
      case Binary::kMul: return T(a * b);
      case Binary::kDiv:
        if constexpr (std::is_integral_v<T>) {
          if (b == 0) return T(0);
          if (b == T(-1)) return T(std::make_unsigned_t<T>(0) - std::make_unsigned_t<T>(a));
        }
        return T(a / b);
      case Binary::kPow:
        if constexpr (std::is_same_v<T, float>) return powf(a, b);
        else return T(pow(double(a), double(b)));
      case Binary::kMax:
        if constexpr (std::is_floating_point_v<T>) {
          if (a != a) return a;
          if (b != b) return b;
        }
        return a < b ? b : a;
      case Binary::kMin:
        if constexpr (std::is_floating_point_v<T>) {
          if (a != a) return a;
          if (b != b) return b;
        }
        return b < a ? b : a;
      case Binary::kMod:
        if constexpr (std::is_floating_point_v<T>) return T(fmod(a, b));
        else return b == 0 ? T(0) : T(a % b);
      default: return T(0);
    }
  }
}

template <class T>
__device__ inline bool compare(Binary op, T a, T b) {
  switch (op) {
    case Binary::kEqual: return a == b;
    case Binary::kGreater: return a > b;
    case Binary::kLess: return a < b;
    case Binary::kGreaterOrEqual: return a >= b;
    case Binary::kLessOrEqual: return a <= b;
    case Binary::kAnd: return a && b;
    case Binary::kOr: return a || b;
    case Binary::kXor: return bool(a) != bool(b);
    default: return false;
  }
}

template <class T>
__global__ void binary_kernel(Binary op, const T* a, const T* b, void* y, Walk w, i64 n) {
  const bool cmp = op >= Binary::kEqual;
  QEVAL_FOR(i, n) {
    i64 off[2];
    walk_offsets(w, n, i, off);
    const T x = a[off[0]];
    const T z = b[off[1]];
    if (cmp) static_cast<bool*>(y)[i] = compare(op, x, z);
    else static_cast<T*>(y)[i] = arith(op, x, z);
  }
}

template <class T>
__global__ void where_kernel(const bool* c, const T* x, const T* y, T* out, Walk w, i64 n) {
  QEVAL_FOR(i, n) {
    i64 off[3];
    walk_offsets(w, n, i, off);
    out[i] = c[off[0]] ? x[off[1]] : y[off[2]];
  }
}

template <class F, class T>
__global__ void cast_kernel(const F* x, T* y, i64 n) {
  QEVAL_FOR(i, n) {
    if constexpr (std::is_same_v<T, bool>) y[i] = x[i] != F(0);
    else y[i] = static_cast<T>(x[i]);
  }
}

template <class F>
void by_elem(Elem e, F&& f) {
  switch (e) {
    case Elem::kF32: return f(float{});
    case Elem::kF64: return f(double{});
    case Elem::kI8: return f(std::int8_t{});
    case Elem::kU8: return f(std::uint8_t{});
    case Elem::kI16: return f(std::int16_t{});
    case Elem::kU16: return f(std::uint16_t{});
    case Elem::kI32: return f(std::int32_t{});
    case Elem::kU32: return f(std::uint32_t{});
    case Elem::kI64: return f(std::int64_t{});
    case Elem::kU64: return f(std::uint64_t{});
    case Elem::kBool: return f(bool{});
  }
}

// ---- rounding (kernels/numeric.cc's integer forms) ----------------------------------------------

__device__ inline std::uint32_t shift_right_rne(std::uint32_t sig, std::uint32_t shift) {
  return (sig + (1u << (shift - 1)) - 1 + ((sig >> shift) & 1)) >> shift;
}

__device__ inline std::uint16_t float_bits_to_half(std::uint32_t x) {
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7fffffffu;
  const std::uint32_t nm = (a + 0xfffu + ((a >> 13) & 1) - (112u << 23)) >> 13;
  const std::uint32_t normal = nm < 0x7c00u ? nm : 0x7c00u;
  const std::uint32_t e = a >> 23;
  const std::uint32_t sig = (a & 0x7fffffu) | 0x800000u;
  const std::uint32_t e2 = e < 112u ? e : 112u;
  const std::uint32_t sh = 126u - e2;
  const std::uint32_t shift = sh < 25u ? sh : 25u;
  const std::uint32_t subnormal = shift_right_rne(sig, shift);
  const std::uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  const std::uint32_t mag = a > 0x7f800000u ? nan : (a < 0x38800000u ? subnormal : normal);
  return static_cast<std::uint16_t>(sign | mag);
}

__device__ inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t em = h & 0x7fffu;
  const std::uint32_t mant = em & 0x3ffu;
  const std::uint32_t normal = (em << 13) + (112u << 23);
  const std::uint32_t special = 0x7f800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u);
  const std::uint32_t subnormal = __float_as_uint(__fmul_rn(float(mant), 0x1p-24f));
  const std::uint32_t mag = em >= 0x7c00u ? special : (em < 0x400u ? subnormal : normal);
  return __uint_as_float(sign | mag);
}

__device__ inline float round_f16(float x) { return half_to_float(float_bits_to_half(__float_as_uint(x))); }

__device__ inline float round_bf16(float x) {
  const std::uint32_t b = __float_as_uint(x);
  const bool nan = (b & 0x7fffffffu) > 0x7f800000u;
  const std::uint32_t r = (b + 0x7fffu + ((b >> 16) & 1)) >> 16;
  return __uint_as_float((nan ? 0x7fc0u : (r & 0xffffu)) << 16);
}

// The value as round_float16 / round_bfloat16 leave it (kNone: itself).
__device__ inline float round_as(float x, RoundTo r) {
  return r == RoundTo::kFp16 ? round_f16(x) : (r == RoundTo::kBf16 ? round_bf16(x) : x);
}

__global__ void round_f16_kernel(float* x, i64 n) { QEVAL_FOR(i, n) x[i] = round_f16(x[i]); }

__global__ void round_bf16_kernel(float* x, i64 n) { QEVAL_FOR(i, n) x[i] = round_bf16(x[i]); }

// ---- block reductions (fixed order: per-thread strided sums, then a shared-memory tree) -------

template <class T, class Op>
__device__ T block_reduce(T v, T* shared, Op op) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] = op(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  const T r = shared[0];
  __syncthreads();
  return r;
}

struct AddD {
  __device__ double operator()(double a, double b) const { return a + b; }
};
struct MaxF {
  __device__ float operator()(float a, float b) const { return (a != a) ? a : ((b != b) ? b : fmaxf(a, b)); }
};
struct MinF {
  __device__ float operator()(float a, float b) const { return (a != a) ? a : ((b != b) ? b : fminf(a, b)); }
};
struct MulD {
  __device__ double operator()(double a, double b) const { return a * b; }
};

// Softmax rows (inner == 1): one block a row.
__global__ void softmax_rows_kernel(const float* x, float* y, i64 n, bool log) {
  __shared__ float sf[kThreads];
  __shared__ double sd[kThreads];
  const float* xr = x + i64(blockIdx.x) * n;
  float* yr = y + i64(blockIdx.x) * n;
  float m = -INFINITY;
  for (i64 j = threadIdx.x; j < n; j += blockDim.x) m = MaxF{}(m, xr[j]);
  m = block_reduce(m, sf, MaxF{});
  double s = 0;
  for (i64 j = threadIdx.x; j < n; j += blockDim.x) s += double(expf(xr[j] - m));
  s = block_reduce(s, sd, AddD{});
  if (log) {
    const float ls = float(::log(s));
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) yr[j] = xr[j] - m - ls;
  } else {
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) yr[j] = float(double(expf(xr[j] - m)) / s);
  }
}

// Softmax along a strided axis (inner > 1): one thread a column.
__global__ void softmax_cols_kernel(const float* x, float* y, i64 outer, i64 n, i64 inner, bool log) {
  QEVAL_FOR(t, outer * inner) {
    const i64 o = t / inner, i = t % inner;
    const float* xc = x + o * n * inner + i;
    float* yc = y + o * n * inner + i;
    float m = -INFINITY;
    for (i64 j = 0; j < n; ++j) m = MaxF{}(m, xc[j * inner]);
    double s = 0;
    for (i64 j = 0; j < n; ++j) s += double(expf(xc[j * inner] - m));
    if (log) {
      const float ls = float(::log(s));
      for (i64 j = 0; j < n; ++j) yc[j * inner] = xc[j * inner] - m - ls;
    } else {
      for (i64 j = 0; j < n; ++j) yc[j * inner] = float(double(expf(xc[j * inner] - m)) / s);
    }
  }
}

// A row's mean and 1 / sqrt(var + eps) from its first mean and centred sums (kernels::moments'
// correction of the mean's rounding), and its elements [j0, j1) normalised with scale and bias by
// channel ((row0 + j) / channel_inner) % channels; `total`: the elements of all rows.
struct RowMoments {
  double mean, inv_std;
  __device__ void write(i64 r, float* mean_out, float* inv_std_out) const {
    if (mean_out) mean_out[r] = float(mean);
    if (inv_std_out) inv_std_out[r] = float(inv_std);
  }
};
__device__ inline RowMoments row_moments(double mean0, double c, double c2, i64 n, double eps) {
  double var = (c2 - c * c / double(n)) / double(n);
  if (var < 0) var = 0;
  return {mean0 + c / double(n), 1.0 / sqrt(var + eps)};
}
// This thread's share of the sums of (x - mean0) and its squares over [j0, j1) (strided by the block).
__device__ inline void centred_sums(const float* xr, i64 j0, i64 j1, double mean0, double& c, double& c2) {
  for (i64 j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
    const double d = double(xr[j]) - mean0;
    c += d;
    c2 += d * d;
  }
}
__device__ inline void normalize_span(const RowMoments& mo, const float* xr, float* yr, i64 row0, i64 total, i64 j0,
                                      i64 j1, const float* scale, const float* bias, i64 channels, i64 channel_inner) {
  for (i64 j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
    const i64 ch = block_index(row0 + j, total, channel_inner, channels);
    const double sc = scale ? double(scale[ch]) : 1.0;
    const double b = bias ? double(bias[ch]) : 0.0;
    yr[j] = float((double(xr[j]) - mo.mean) * mo.inv_std * sc + b);
  }
}

// kernels::moments: the mean, then centred sums with the mean's rounding corrected.
__global__ void normalize_rows_kernel(const float* x, float* y, i64 n, double eps, const float* scale,
                                      const float* bias, i64 channels, i64 channel_inner, float* mean_out,
                                      float* inv_std_out) {
  __shared__ double sd[kThreads];
  const i64 r = blockIdx.x;
  const float* xr = x + r * n;
  float* yr = y + r * n;
  double s = 0;
  for (i64 j = threadIdx.x; j < n; j += blockDim.x) s += double(xr[j]);
  const double mean0 = block_reduce(s, sd, AddD{}) / double(n);
  double c = 0, c2 = 0;
  centred_sums(xr, 0, n, mean0, c, c2);
  c = block_reduce(c, sd, AddD{});
  c2 = block_reduce(c2, sd, AddD{});
  const RowMoments mo = row_moments(mean0, c, c2, n, eps);
  if (threadIdx.x == 0) mo.write(r, mean_out, inv_std_out);
  normalize_span(mo, xr, yr, r * n, i64(gridDim.x) * n, 0, n, scale, bias, channels, channel_inner);
}

// normalize_rows_kernel's steps for few long rows (GroupNorm's 64 rows of 40960 at SD's highest
// resolution kept half the SMs idle): each row in gridDim.x segments of `seg`, a block a segment;
// the sums per segment (fixed order), written to `part`, combined in segment order by each block
// that needs them. Three launches: sums; centred sums; the normalisation.
__device__ inline double segments_total(const double* part, i64 segs, int stride) {
  double t = 0;
  for (i64 s = 0; s < segs; ++s) t += part[s * stride];
  return t;
}

__global__ void norm_segment_sums_kernel(const float* x, i64 n, i64 seg, double* part) {
  __shared__ double sd[kThreads];
  const i64 r = blockIdx.y, sg = blockIdx.x, j1 = min(n, (sg + 1) * seg);
  const float* xr = x + r * n;
  double acc = 0;
  for (i64 j = sg * seg + threadIdx.x; j < j1; j += blockDim.x) acc += double(xr[j]);
  acc = block_reduce(acc, sd, AddD{});
  if (threadIdx.x == 0) part[r * gridDim.x + sg] = acc;
}

__global__ void norm_segment_centred_kernel(const float* x, i64 n, i64 seg, const double* part, double* part2) {
  __shared__ double sd[kThreads];
  const i64 r = blockIdx.y, sg = blockIdx.x, segs = gridDim.x, j1 = min(n, (sg + 1) * seg);
  const float* xr = x + r * n;
  const double mean0 = segments_total(part + r * segs, segs, 1) / double(n);
  double c = 0, c2 = 0;
  centred_sums(xr, sg * seg, j1, mean0, c, c2);
  c = block_reduce(c, sd, AddD{});
  c2 = block_reduce(c2, sd, AddD{});
  if (threadIdx.x == 0) {
    part2[(r * segs + sg) * 2] = c;
    part2[(r * segs + sg) * 2 + 1] = c2;
  }
}

__global__ void norm_segment_apply_kernel(const float* x, float* y, i64 rows, i64 n, i64 seg, double eps,
                                          const float* scale, const float* bias, i64 channels, i64 channel_inner,
                                          const double* part, const double* part2, float* mean_out,
                                          float* inv_std_out) {
  const i64 r = blockIdx.y, sg = blockIdx.x, segs = gridDim.x, j1 = min(n, (sg + 1) * seg);
  const double mean0 = segments_total(part + r * segs, segs, 1) / double(n);
  const double c = segments_total(part2 + r * segs * 2, segs, 2), c2 = segments_total(part2 + r * segs * 2 + 1, segs, 2);
  const RowMoments mo = row_moments(mean0, c, c2, n, eps);
  if (sg == 0 && threadIdx.x == 0) mo.write(r, mean_out, inv_std_out);
  normalize_span(mo, x + r * n, y + r * n, r * n, rows * n, sg * seg, j1, scale, bias, channels, channel_inner);
}

__global__ void batch_norm_kernel(const float* x, float* y, i64 channels, i64 inner, const double* scale,
                                  const double* bias, const double* mean, const double* var, double eps, i64 n) {
  QEVAL_FOR(i, n) {
    const i64 c = (i / inner) % channels;
    const double a = scale[c] / sqrt(var[c] + eps);
    y[i] = float((double(x[i]) - mean[c]) * a + bias[c]);
  }
}

__global__ void reduce_rows_kernel(Reduce op, const float* x, float* y, i64 n) {
  __shared__ float sf[kThreads];
  __shared__ double sd[kThreads];
  const i64 r = blockIdx.x;
  const float* xr = x + r * n;
  if (op == Reduce::kMax || op == Reduce::kMin) {
    float m = op == Reduce::kMax ? -INFINITY : INFINITY;
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) m = op == Reduce::kMax ? MaxF{}(m, xr[j]) : MinF{}(m, xr[j]);
    m = op == Reduce::kMax ? block_reduce(m, sf, MaxF{}) : block_reduce(m, sf, MinF{});
    if (threadIdx.x == 0) y[r] = m;
    return;
  }
  if (op == Reduce::kProd) {
    double p = 1;
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) p *= double(xr[j]);
    p = block_reduce(p, sd, MulD{});
    if (threadIdx.x == 0) y[r] = float(p);
    return;
  }
  float m = 0;
  if (op == Reduce::kLogSumExp) {
    m = -INFINITY;
    for (i64 j = threadIdx.x; j < n; j += blockDim.x) m = MaxF{}(m, xr[j]);
    m = block_reduce(m, sf, MaxF{});
    if (!isfinite(m)) m = 0;
  }
  double s = 0;
  for (i64 j = threadIdx.x; j < n; j += blockDim.x) {
    const double v = xr[j];
    switch (op) {
      case Reduce::kL1: s += fabs(v); break;
      case Reduce::kL2:
      case Reduce::kSumSquare: s += v * v; break;
      case Reduce::kLogSumExp: s += exp(v - double(m)); break;
      default: s += v;
    }
  }
  s = block_reduce(s, sd, AddD{});
  if (threadIdx.x == 0) {
    switch (op) {
      case Reduce::kMean: y[r] = float(s / double(n)); break;
      case Reduce::kL2: y[r] = float(sqrt(s)); break;
      case Reduce::kLogSum: y[r] = float(::log(s)); break;
      case Reduce::kLogSumExp: y[r] = float(::log(s) + double(m)); break;
      default: y[r] = float(s);
    }
  }
}

// ---- convolution, pooling, resize ---------------------------------------------------------------

// A float as the element type a kernel stores (float, or a 16-bit format the value is exact in).
template <class T>
__device__ T store_as(float v);
template <>
__device__ float store_as<float>(float v) {
  return v;
}
template <>
__device__ __half store_as<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __nv_bfloat16 store_as<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <class T>
__global__ void to_16bit_kernel(const float* x, T* y, i64 n) {
  QEVAL_FOR(i, n) y[i] = store_as<T>(x[i]);
}

// im2col of `images` consecutive images at once: col [image][c * kh * kw][oh * ow]. A block a row
// (image, channel, ky, kx) of the columns at a time, its threads over the row's outputs: the row's
// indices computed once, one 32-bit division an element (was six 64-bit ones).
template <class T>
__global__ void im2col_images_kernel(const float* x, T* col, Conv2d p, i64 rows) {
  const int ow = int(p.ow), spatial = int(p.oh * p.ow);
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    const i64 kx = r % p.kw, ky = (r / p.kw) % p.kh, plane = r / (p.kw * p.kh);  // plane: image * c + channel
    const float* xc = x + plane * p.h * p.w;
    T* out = col + r * spatial;
    const i64 y0 = ky * p.dh - p.ph, x0 = kx * p.dw - p.pw;
    for (int s = threadIdx.x; s < spatial; s += blockDim.x) {
      const int oy = s / ow, ox = s - oy * ow;
      const i64 iy = oy * p.sh + y0, ix = ox * p.sw + x0;
      out[s] = store_as<T>((iy >= 0 && iy < p.h && ix >= 0 && ix < p.w) ? xc[iy * p.w + ix] : 0.0f);
    }
  }
}

__global__ void conv2d_direct_kernel(const float* x, const float* w, const float* bias, float* y, Conv2d p, i64 n) {
  const i64 cg = p.c / p.group, mg = p.m / p.group;
  QEVAL_FOR(i, n) {
    const i64 ox = i % p.ow, oy = (i / p.ow) % p.oh, m = (i / (p.ow * p.oh)) % p.m, b = i / (p.ow * p.oh * p.m);
    const i64 g = m / mg;
    float acc = 0;
    for (i64 c = 0; c < cg; ++c) {
      const float* xc = x + ((b * p.c + g * cg + c) * p.h) * p.w;
      const float* wc = w + ((m * cg + c) * p.kh) * p.kw;
      for (i64 ky = 0; ky < p.kh; ++ky) {
        const i64 iy = oy * p.sh - p.ph + ky * p.dh;
        if (iy < 0 || iy >= p.h) continue;
        for (i64 kx = 0; kx < p.kw; ++kx) {
          const i64 ix = ox * p.sw - p.pw + kx * p.dw;
          if (ix < 0 || ix >= p.w) continue;
          acc = __fadd_rn(acc, __fmul_rn(xc[iy * p.w + ix], wc[ky * p.kw + kx]));
        }
      }
    }
    y[i] = bias ? acc + bias[m] : acc;
  }
}

__global__ void add_channel_bias_kernel(float* y, const float* bias, i64 channels, i64 inner, i64 n) {
  QEVAL_FOR(i, n) y[i] += bias[block_index(i, n, inner, channels)];
}

__global__ void pool2d_kernel(const float* x, float* y, Pool2d p, i64 n) {
  QEVAL_FOR(i, n) {
    const i64 ox = i % p.ow, oy = (i / p.ow) % p.oh, plane = i / (p.ow * p.oh);
    const float* xp = x + plane * p.h * p.w;
    float m = -INFINITY;
    double s = 0;
    i64 count = 0;
    for (i64 ky = 0; ky < p.kh; ++ky) {
      const i64 iy = oy * p.sh - p.ph + ky * p.dh;
      for (i64 kx = 0; kx < p.kw; ++kx) {
        const i64 ix = ox * p.sw - p.pw + kx * p.dw;
        const bool inside = iy >= 0 && iy < p.h && ix >= 0 && ix < p.w;
        if (inside) {
          const float v = xp[iy * p.w + ix];
          m = MaxF{}(m, v);
          s += v;
          ++count;
        } else if (p.count_include_pad && iy < p.h + p.pad_h_end && ix < p.w + p.pad_w_end) {
          ++count;  // a pad position (not beyond the end pads, which ceil_mode may add)
        }
      }
    }
    y[i] = p.max ? m : (count ? float(s / double(count)) : 0.0f);
  }
}

__global__ void resize_axis_kernel(const float* x, float* y, i64 in, i64 out, i64 inner, int taps, const i64* index,
                                   const double* weight, const std::uint8_t* extrapolate, double value, i64 n) {
  QEVAL_FOR(i, n) {
    const i64 k = i % inner, j = (i / inner) % out, o = i / (inner * out);
    if (extrapolate && extrapolate[j]) {
      y[i] = float(value);
      continue;
    }
    double s = 0;
    for (int t = 0; t < taps; ++t) s += weight[j * taps + t] * double(x[(o * in + index[j * taps + t]) * inner + k]);
    y[i] = float(s);
  }
}


// ---- fused attention ------------------------------------------------------------------------------

// Flash-attention style, FP32 (fused multiply-adds in both products: half the instructions of a
// product and a sum, and more exact), in a fixed order: a block takes kAttRows query rows of
// one entry and walks the keys in tiles of kAttKeys. A tile's scores stay in registers (each
// thread 4 rows x 4 keys, summed over the head dimension in order), scaled and rounded as the
// unfused ops round them; each row's maximum and sum are kept online (shuffles in a fixed tree);
// the tile's probabilities go through shared memory into the product with V. The scores never
// reach global memory. kTwoPass (probabilities rounded to a format, as the unfused Softmax's
// output is): a first walk finds each row's maximum and sum, a second normalises, rounds and
// multiplies by V. Otherwise one walk rescales the running output and divides it by the sum at
// the end. W: output columns per thread in float4 groups (v_dim <= 64 W).
constexpr int kAttRows = 64, kAttKeys = 64, kAttThreads = 256, kAttProbStride = kAttKeys + 4, kAttMaxDim = 256;

struct AttentionArgs {
  i64 q_len, kv_len;
  int d, dv;
  ScoreScale scale_kind;
  float scale;
  RoundTo round_scores, round_scaled, round_probs;
};

std::size_t attention_shared_bytes(i64 d, i64 dv) {
  return sizeof(float) * std::size_t(2 * d * kAttRows + kAttKeys * dv + kAttRows * kAttProbStride);
}

template <int W, bool kTwoPass>
__global__ void __launch_bounds__(kAttThreads)
    attention_kernel(AttentionArgs a, const float* __restrict__ q, const float* __restrict__ kt,
                     const float* __restrict__ v, float* __restrict__ out) {
  extern __shared__ float4 att_smem[];
  const int d = a.d, dv = a.dv;
  const i64 L = a.q_len, Lk = a.kv_len, e = blockIdx.y, i0 = i64(blockIdx.x) * kAttRows;
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  float* qs = reinterpret_cast<float*>(att_smem);  // [d][kAttRows]
  float* ks = qs + d * kAttRows;                   // [d][kAttKeys]
  float* vs = ks + d * kAttKeys;                   // [kAttKeys][dv]
  float* ps = vs + kAttKeys * dv;                  // [kAttRows][kAttProbStride]
  const float* qe = q + e * L * d;
  const float* ke = kt + e * d * Lk;
  const float* ve = v + e * Lk * dv;
  for (int idx = tid; idx < kAttRows * d; idx += kAttThreads) {
    const int r = idx / d, k = idx % d;
    qs[k * kAttRows + r] = i0 + r < L ? qe[(i0 + r) * d + k] : 0.0f;
  }
  float m[4], l[4], acc[4][4 * W];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < 4 * W; ++c) acc[i][c] = 0.0f;
  }
  for (int pass = kTwoPass ? 0 : 1; pass < 2; ++pass) {
    const bool stats_only = pass == 0;
    for (i64 j0 = 0; j0 < Lk; j0 += kAttKeys) {
      const int jn = int(Lk - j0 < kAttKeys ? Lk - j0 : kAttKeys);
      __syncthreads();  // the previous tile's readers are done
      for (int idx = tid; idx < d * kAttKeys; idx += kAttThreads) {
        const int k = idx / kAttKeys, j = idx % kAttKeys;
        ks[idx] = j < jn ? ke[i64(k) * Lk + j0 + j] : 0.0f;
      }
      if (!stats_only)
        for (int idx = tid; idx < kAttKeys * dv; idx += kAttThreads) vs[idx] = idx < jn * dv ? ve[j0 * dv + idx] : 0.0f;
      __syncthreads();
      float sc[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) sc[i][j] = 0.0f;
      for (int k = 0; k < d; ++k) {
        const float4 qa = *reinterpret_cast<const float4*>(qs + k * kAttRows + ty * 4);
        const float4 kb = *reinterpret_cast<const float4*>(ks + k * kAttKeys + tx * 4);
        const float qv[4] = {qa.x, qa.y, qa.z, qa.w}, kv[4] = {kb.x, kb.y, kb.z, kb.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) sc[i][j] = __fmaf_rn(qv[i], kv[j], sc[i][j]);
      }
      float p[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float x = round_as(sc[i][j], a.round_scores);
          if (a.scale_kind == ScoreScale::kMul) x = x * a.scale;
          else if (a.scale_kind == ScoreScale::kDiv) x = x / a.scale;
          x = round_as(x, a.round_scaled);
          sc[i][j] = tx * 4 + j < jn ? x : -INFINITY;
        }
        if (kTwoPass && !stats_only) {
#pragma unroll
          for (int j = 0; j < 4; ++j)
            p[i][j] = tx * 4 + j < jn ? round_as(expf(sc[i][j] - m[i]) / l[i], a.round_probs) : 0.0f;
          continue;
        }
        float mx = MaxF{}(MaxF{}(sc[i][0], sc[i][1]), MaxF{}(sc[i][2], sc[i][3]));
#pragma unroll
        for (int off = 8; off > 0; off >>= 1) mx = MaxF{}(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        const float mn = MaxF{}(m[i], mx);
        const float alpha = m[i] == mn ? 1.0f : expf(m[i] - mn);
#pragma unroll
        for (int j = 0; j < 4; ++j) p[i][j] = tx * 4 + j < jn ? expf(sc[i][j] - mn) : 0.0f;
        float rs = (p[i][0] + p[i][1]) + (p[i][2] + p[i][3]);
#pragma unroll
        for (int off = 8; off > 0; off >>= 1) rs = rs + __shfl_xor_sync(0xffffffffu, rs, off);
        l[i] = l[i] * alpha + rs;
        m[i] = mn;
        if (!kTwoPass)
#pragma unroll
          for (int c = 0; c < 4 * W; ++c) acc[i][c] = acc[i][c] * alpha;
      }
      if (stats_only) continue;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        *reinterpret_cast<float4*>(ps + (ty * 4 + i) * kAttProbStride + tx * 4) =
            make_float4(p[i][0], p[i][1], p[i][2], p[i][3]);
      __syncthreads();
      for (int j = 0; j < jn; ++j) {
        float pj[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) pj[i] = ps[(ty * 4 + i) * kAttProbStride + j];
#pragma unroll
        for (int w = 0; w < W; ++w) {
          const int c0 = w * 64 + tx * 4;
          if (c0 < dv) {
            const float4 vv = *reinterpret_cast<const float4*>(vs + j * dv + c0);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              acc[i][w * 4 + 0] = __fmaf_rn(pj[i], vv.x, acc[i][w * 4 + 0]);
              acc[i][w * 4 + 1] = __fmaf_rn(pj[i], vv.y, acc[i][w * 4 + 1]);
              acc[i][w * 4 + 2] = __fmaf_rn(pj[i], vv.z, acc[i][w * 4 + 2]);
              acc[i][w * 4 + 3] = __fmaf_rn(pj[i], vv.w, acc[i][w * 4 + 3]);
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const i64 r = i0 + ty * 4 + i;
    if (r >= L) continue;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const int c0 = w * 64 + tx * 4;
      if (c0 >= dv) continue;
      float* o = out + (e * L + r) * dv + c0;
#pragma unroll
      for (int u = 0; u < 4; ++u) o[u] = kTwoPass ? acc[i][w * 4 + u] : acc[i][w * 4 + u] / l[i];
    }
  }
}

// Attention's probabilities from stored scores, one block a row in softmax_rows_kernel's order:
// each score rounded, scaled and rounded as the unfused MatMul, Mul/Div and Softmax round them,
// the row's softmax, rounded to round_probs, stored as T (a 16-bit format it is then exact in).
template <class T>
__global__ void attention_probs_kernel(const float* s, T* p, i64 n, AttentionArgs a) {
  __shared__ float sf[kThreads];
  __shared__ double sd[kThreads];
  const float* sr = s + i64(blockIdx.x) * n;
  T* pr = p + i64(blockIdx.x) * n;
  auto score = [&](i64 j) {
    float x = round_as(sr[j], a.round_scores);
    if (a.scale_kind == ScoreScale::kMul) x = x * a.scale;
    else if (a.scale_kind == ScoreScale::kDiv) x = x / a.scale;
    return round_as(x, a.round_scaled);
  };
  float m = -INFINITY;
  for (i64 j = threadIdx.x; j < n; j += blockDim.x) m = MaxF{}(m, score(j));
  m = block_reduce(m, sf, MaxF{});
  double sum = 0;
  for (i64 j = threadIdx.x; j < n; j += blockDim.x) sum += double(expf(score(j) - m));
  sum = block_reduce(sum, sd, AddD{});
  for (i64 j = threadIdx.x; j < n; j += blockDim.x)
    pr[j] = store_as<T>(round_as(float(double(expf(score(j) - m)) / sum), a.round_probs));
}

// ---- attention on tensor cores (16-bit operands) ---------------------------------------------------

// attention_kernel's two walks over the keys (each row's maximum and sum online, then the
// normalised probabilities rounded to T times V) with both products on tensor cores: wmma 16x16x16
// with FP32 accumulators; the exponentials as flash-attention kernels take them (exp2_approx of the
// scaled score's FMA with log2 e), the normalisation a product with the sum's reciprocal. Q, K^T
// and V are first copied to T (exact) padded with zeros to whole tiles (tc_pad_kernel), so the
// tiles arrive in shared memory as aligned 16-byte asynchronous copies. A block: 4 warps, 16 query
// rows each, key tiles of 64; a tile's scores pass through shared memory (each warp its own rows,
// two lanes a row) for the softmax. Fixed order everywhere, no atomics.
constexpr int kTcRows = 64, kTcKeys = 64, kTcThreads = 128, kTcPad = 8, kTcScoreStride = kTcKeys + 4,
              kTcMaxDim = 256;

// The padded copies' sizes and the shared tiles' byte offsets: q [kTcRows][dp + pad], kt [dp][kTcKeys
// + pad], v [kTcKeys][dvp + pad] (T), scores [kTcRows][kTcScoreStride] (float), probabilities
// [kTcRows][kTcKeys + pad] (T); dp, dvp: head_dim and v_dim rounded up to 16, Lp and Lkp: q_len and
// kv_len rounded up to 64 (zeros past them).
struct TcLayout {
  int dp, dvp;
  i64 Lp, Lkp;
  unsigned q, k, v, s, p, total;
};
__host__ __device__ inline unsigned tc_up(unsigned b) { return (b + 127) / 128 * 128; }
__host__ __device__ inline TcLayout tc_layout(i64 L, i64 Lk, int d, int dv) {
  TcLayout t{};
  t.dp = (d + 15) / 16 * 16;
  t.dvp = (dv + 15) / 16 * 16;
  t.Lp = (L + kTcRows - 1) / kTcRows * kTcRows;
  t.Lkp = (Lk + kTcKeys - 1) / kTcKeys * kTcKeys;
  t.q = 0;
  t.k = t.q + tc_up(2u * kTcRows * (t.dp + kTcPad));
  t.v = t.k + tc_up(2u * t.dp * (kTcKeys + kTcPad));
  t.s = t.v + tc_up(2u * kTcKeys * (t.dvp + kTcPad));
  t.p = t.s + tc_up(4u * kTcRows * kTcScoreStride);
  t.total = t.p + tc_up(2u * kTcRows * (kTcKeys + kTcPad));
  return t;
}

constexpr float kLog2e = 1.4426950408889634f;
// 2^x by the hardware's approximation (relative error ~2^-22, subnormal results flushed to zero), as
// flash-attention kernels compute the softmax's exponentials: far below the probabilities' 16-bit
// rounding.
__device__ inline float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// y [batch][rows_p][cols_p] (T) = x [batch][rows][cols] (float, exact in T), zeros past rows and cols.
template <class T>
__global__ void tc_pad_kernel(const float* x, T* y, i64 rows, i64 cols, i64 rows_p, i64 cols_p, i64 n) {
  auto element = [&](auto i) {  // 32-bit divisions where n allows (walk_offsets)
    using U = decltype(i);
    const U q = i / U(cols_p), c = i - q * U(cols_p), b = q / U(rows_p), r = q - b * U(rows_p);
    return store_as<T>(i64(r) < rows && i64(c) < cols ? x[(i64(b) * rows + i64(r)) * cols + i64(c)] : 0.0f);
  };
  const bool small = n <= i64(0xffffffffu);
  QEVAL_FOR(i, n) y[i] = small ? element(unsigned(i)) : element(i);
}

// `rows` rows of `row_bytes` (a multiple of 16) from global `src` (pitch `src_pitch` bytes) to shared
// `dst` (pitch `dst_pitch`), 16 bytes a copy, all in flight at once (cp.async); the caller waits.
__device__ inline void tc_copy_rows(void* dst, int dst_pitch, const void* src, i64 src_pitch, int rows, int row_bytes) {
  const int chunks = row_bytes / 16;
  for (int idx = threadIdx.x; idx < rows * chunks; idx += kTcThreads) {
    const int r = idx / chunks, c = idx % chunks;
    __pipeline_memcpy_async(static_cast<char*>(dst) + r * dst_pitch + c * 16,
                            static_cast<const char*>(src) + r * src_pitch + c * 16, 16);
  }
}

// NV: output column tiles of 16 a warp accumulates (at least v_dim / 16 rounded up). q, kt, v: the
// padded copies.
template <class T, int NV>
__global__ void __launch_bounds__(kTcThreads)
    attention16_kernel(AttentionArgs a, const T* __restrict__ q, const T* __restrict__ kt,
                       const T* __restrict__ v, float* __restrict__ out) {
  using namespace nvcuda;
  using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
  using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
  using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  const TcLayout lay = tc_layout(a.q_len, a.kv_len, a.d, a.dv);
  const int dv = a.dv, dp = lay.dp, dvp = lay.dvp;
  const int ldq = dp + kTcPad, ldk = kTcKeys + kTcPad, ldv = dvp + kTcPad, ldp = kTcKeys + kTcPad;
  T* qs = reinterpret_cast<T*>(tc_smem + lay.q);
  T* ks = reinterpret_cast<T*>(tc_smem + lay.k);
  T* vs = reinterpret_cast<T*>(tc_smem + lay.v);
  float* ss = reinterpret_cast<float*>(tc_smem + lay.s);
  T* ps = reinterpret_cast<T*>(tc_smem + lay.p);
  const i64 L = a.q_len, Lk = a.kv_len, Lkp = lay.Lkp, e = blockIdx.y, i0 = i64(blockIdx.x) * kTcRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* qe = q + (e * lay.Lp + i0) * dp;
  const T* ke = kt + e * dp * Lkp;
  const T* ve = v + e * Lkp * dvp;
  tc_copy_rows(qs, 2 * ldq, qe, 2 * dp, kTcRows, 2 * dp);
  // A lane's softmax share: row `row` of the block, columns [c0, c0 + 32) of the tile.
  const int row = warp * 16 + lane / 2, c0 = (lane % 2) * 32;
  float m = -INFINITY, l = 0.0f, inv_l = 0.0f, base1 = 0.0f;
  Acc o[NV];
#pragma unroll
  for (int n = 0; n < NV; ++n) wmma::fill_fragment(o[n], 0.0f);
  for (int pass = 0; pass < 2; ++pass) {
    for (i64 j0 = 0; j0 < Lk; j0 += kTcKeys) {
      const int jn = int(Lk - j0 < kTcKeys ? Lk - j0 : kTcKeys);
      __syncthreads();  // the previous tile's readers are done
      tc_copy_rows(ks, 2 * ldk, ke + j0, 2 * Lkp, dp, 2 * kTcKeys);
      if (pass == 1) tc_copy_rows(vs, 2 * ldv, ve + j0 * dvp, 2 * dvp, kTcKeys, 2 * dvp);
      __pipeline_commit();
      __pipeline_wait_prior(0);
      __syncthreads();
      {
        Acc sc[4];
#pragma unroll
        for (int n = 0; n < 4; ++n) wmma::fill_fragment(sc[n], 0.0f);
        for (int k0 = 0; k0 < dp; k0 += 16) {
          FragA fa;
          wmma::load_matrix_sync(fa, qs + warp * 16 * ldq + k0, ldq);
#pragma unroll
          for (int n = 0; n < 4; ++n) {
            FragB fb;
            wmma::load_matrix_sync(fb, ks + k0 * ldk + n * 16, ldk);
            wmma::mma_sync(sc[n], fa, fb, sc[n]);
          }
        }
#pragma unroll
        for (int n = 0; n < 4; ++n)
          wmma::store_matrix_sync(ss + warp * 16 * kTcScoreStride + n * 16, sc[n], kTcScoreStride, wmma::mem_row_major);
      }
      __syncwarp();
      // The lane's 32 scaled scores (-inf past the keys), in scaled units.
      const float4* sr = reinterpret_cast<const float4*>(ss + row * kTcScoreStride + c0);
      const int valid = jn - c0;
      auto scaled = [&](int i, float4 x4, float out[4]) {
        const float x[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) out[u] = i * 4 + u < valid ? x[u] * a.scale : -INFINITY;
      };
      if (pass == 0) {
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          float t[4];
          scaled(i, sr[i], t);
          mx = MaxF{}(mx, MaxF{}(MaxF{}(t[0], t[1]), MaxF{}(t[2], t[3])));
        }
        mx = MaxF{}(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        const float mn = MaxF{}(m, mx), base = -mn * kLog2e;
        const float alpha = m == mn ? 1.0f : exp2_approx(__fmaf_rn(m, kLog2e, base));
        float rs = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          float t[4];
          scaled(i, sr[i], t);
#pragma unroll
          for (int u = 0; u < 4; ++u) rs = rs + exp2_approx(__fmaf_rn(t[u], kLog2e, base));
        }
        rs = rs + __shfl_xor_sync(0xffffffffu, rs, 1);
        l = l * alpha + rs;
        m = mn;
        continue;
      }
      if (j0 == 0) inv_l = 1.0f / l, base1 = -m * kLog2e;  // the walk's row statistics are final
      uint4* pr = reinterpret_cast<uint4*>(ps + row * ldp + c0);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        alignas(16) T p8[8];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float t[4];
          scaled(2 * i + h, sr[2 * i + h], t);
#pragma unroll
          for (int u = 0; u < 4; ++u) p8[h * 4 + u] = store_as<T>(exp2_approx(__fmaf_rn(t[u], kLog2e, base1)) * inv_l);
        }
        pr[i] = *reinterpret_cast<const uint4*>(p8);
      }
      __syncwarp();
#pragma unroll
      for (int k0 = 0; k0 < kTcKeys; k0 += 16) {
        FragA fa;
        wmma::load_matrix_sync(fa, ps + warp * 16 * ldp + k0, ldp);
#pragma unroll
        for (int n = 0; n < NV; ++n) {
          if (n * 16 >= dvp) break;
          FragB fb;
          wmma::load_matrix_sync(fb, vs + k0 * ldv + n * 16, ldv);
          wmma::mma_sync(o[n], fa, fb, o[n]);
        }
      }
    }
  }
  // The output through the warp's own score rows, 16 columns at a time.
  float* st = ss + warp * 16 * kTcScoreStride;
#pragma unroll
  for (int n = 0; n < NV; ++n) {
    if (n * 16 >= dv) break;
    __syncwarp();
    wmma::store_matrix_sync(st, o[n], kTcScoreStride, wmma::mem_row_major);
    __syncwarp();
    for (int idx = lane; idx < 256; idx += 32) {
      const int r = idx / 16, c = n * 16 + idx % 16;
      const i64 orow = i0 + warp * 16 + r;
      if (orow < L && c < dv) out[(e * L + orow) * dv + c] = st[r * kTcScoreStride + idx % 16];
    }
  }
}

__global__ void scale_kernel(const float* x, float* y, i64 n, bool divide, float c) {
  QEVAL_FOR(i, n) y[i] = divide ? x[i] / c : x[i] * c;
}

// ---- fused elementwise chains ----------------------------------------------------------------------

// Each element through every stage in registers, with the device functions of the unary and
// binary kernels (their bits), rounded between stages as the executor rounds the nodes' outputs.
__global__ void chain_kernel(const __grid_constant__ Chain c, const float* __restrict__ x, void* __restrict__ y, i64 n) {
  QEVAL_FOR(i, n) {
    float v = x[i];
    for (int k = 0; k < c.count; ++k) {
      const ChainStep& st = c.steps[k];
      if (st.kind == ChainStep::kQuantizeInt8 || st.kind == ChainStep::kQuantizeUInt8) {
        const bool s8 = st.kind == ChainStep::kQuantizeInt8;
        const float qv = quantize_to(v, st.p0, float(st.zero_point), s8);
        if (s8) static_cast<std::int8_t*>(y)[i] = static_cast<std::int8_t>(qv);
        else static_cast<std::uint8_t*>(y)[i] = static_cast<std::uint8_t>(qv);
        break;
      }
      if (st.kind == ChainStep::kUnary) {
        v = unary_f(st.unary, v, st.p0, st.p1);
      } else {
        const float o = st.other_scalar  ? st.other[0]
                        : st.period > 0  ? st.other[block_index(i, n, st.repeat, st.period)]
                                         : st.other[i];
        v = st.chain_operand == 0 ? arith<float>(st.binary, v, o) : arith<float>(st.binary, o, v);
      }
      if (k + 1 == c.count) {
        static_cast<float*>(y)[i] = v;
      } else {
        v = round_as(v, st.rounding);
        if (st.keep) st.keep[i] = v;
      }
    }
  }
}

}  // namespace

Walk coalesced(const Walk& w) {
  Walk c;
  for (int k = 0; k < 4; ++k) c.base[k] = w.base[k];
  for (int d = 0; d < w.rank; ++d) {
    if (w.counts[d] == 1) continue;
    bool merge = c.rank > 0;
    for (int k = 0; k < 4 && merge; ++k) merge = c.strides[k][c.rank - 1] == w.strides[k][d] * w.counts[d];
    if (merge) {
      c.counts[c.rank - 1] *= w.counts[d];
      for (int k = 0; k < 4; ++k) c.strides[k][c.rank - 1] = w.strides[k][d];
      continue;
    }
    c.counts[c.rank] = w.counts[d];
    for (int k = 0; k < 4; ++k) c.strides[k][c.rank] = w.strides[k][d];
    ++c.rank;
  }
  if (c.rank == 0) {
    c.rank = 1;
    c.counts[0] = 1;
  }
  return c;
}

void strided_copy(const void* src, void* dst, int bytes, const Walk& given, Stream s) {
  const Walk walk = coalesced(given);
  const i64 n = walk_numel(walk);
  if (n == 0) return;
  by_size(bytes, [&](auto t) {
    using T = decltype(t);
    strided_copy_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(static_cast<const T*>(src), static_cast<T*>(dst),
                                                                      walk, n);
  });
  check_launch("strided_copy");
}

void gather_map(const void* src, void* dst, int bytes, const std::int64_t* map, std::int64_t n, const void* fill,
                Stream s) {
  if (n == 0) return;
  by_size(bytes, [&](auto t) {
    using T = decltype(t);
    T f{};
    if (fill) std::memcpy(&f, fill, sizeof(T));
    gather_map_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(static_cast<const T*>(src), static_cast<T*>(dst),
                                                                    map, n, f);
  });
  check_launch("gather_map");
}

void gather_separable(const void* src, void* dst, int bytes, const SeparableGather& g, const std::int64_t* tables,
                      const void* fill, Stream s) {
  i64 n = 1;
  for (int d = 0; d < g.rank; ++d) n *= g.counts[d];
  if (n == 0) return;
  by_size(bytes, [&](auto t) {
    using T = decltype(t);
    T f{};
    if (fill) std::memcpy(&f, fill, sizeof(T));
    gather_separable_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(static_cast<const T*>(src),
                                                                          static_cast<T*>(dst), g, tables, n, f);
  });
  check_launch("gather_separable");
}

void gather_axis(const void* src, const void* indices, bool indices64, void* dst, int bytes, std::int64_t outer,
                 std::int64_t axis, std::int64_t inner, std::int64_t count, Stream s) {
  const i64 n = outer * count * inner;
  if (n == 0) return;
  by_size(bytes, [&](auto t) {
    using T = decltype(t);
    gather_axis_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(static_cast<const T*>(src), indices, indices64,
                                                                     static_cast<T*>(dst), axis, inner, count, n);
  });
  check_launch("gather_axis");
}

void unary(Unary op, Elem elem, const void* x, void* y, std::int64_t n, float p0, float p1, Stream s) {
  if (n == 0) return;
  if (op == Unary::kNot) {
    not_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(static_cast<const bool*>(x), static_cast<bool*>(y), n);
  } else if (elem == Elem::kF32) {
    unary_f32_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(op, static_cast<const float*>(x),
                                                                   static_cast<float*>(y), n, p0, p1);
  } else if (elem == Elem::kI32) {
    unary_int_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(
        op, static_cast<const std::int32_t*>(x), static_cast<std::int32_t*>(y), n, std::int32_t(p0), std::int32_t(p1));
  } else if (elem == Elem::kI64) {
    unary_int_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(op, static_cast<const i64*>(x), static_cast<i64*>(y),
                                                                   n, i64(p0), i64(p1));
  } else {
    throw std::logic_error("CUDA unary: element type not supported");
  }
  check_launch("unary");
}

void binary(Binary op, Elem elem, const void* a, const void* b, void* y, const Walk& given, Stream s) {
  const Walk walk = coalesced(given);
  const i64 n = walk_numel(walk);
  if (n == 0) return;
  auto go = [&](auto t) {
    using T = decltype(t);
    binary_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(op, static_cast<const T*>(a), static_cast<const T*>(b),
                                                                y, walk, n);
  };
  switch (elem) {
    case Elem::kF32: go(float{}); break;
    case Elem::kF64: go(double{}); break;
    case Elem::kI32: go(std::int32_t{}); break;
    case Elem::kI64: go(i64{}); break;
    case Elem::kI8: go(std::int8_t{}); break;
    case Elem::kU8: go(std::uint8_t{}); break;
    case Elem::kBool: go(bool{}); break;
    default: throw std::logic_error("CUDA binary: element type not supported");
  }
  check_launch("binary");
}

void where(const void* cond, const void* x, const void* y, void* out, int bytes, const Walk& given, Stream s) {
  const Walk walk = coalesced(given);
  const i64 n = walk_numel(walk);
  if (n == 0) return;
  by_size(bytes, [&](auto t) {
    using T = decltype(t);
    where_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(static_cast<const bool*>(cond), static_cast<const T*>(x),
                                                               static_cast<const T*>(y), static_cast<T*>(out), walk, n);
  });
  check_launch("where");
}

void cast(Elem from, Elem to, const void* x, void* y, std::int64_t n, Stream s) {
  if (n == 0) return;
  by_elem(from, [&](auto f) {
    using F = decltype(f);
    by_elem(to, [&](auto t) {
      using T = decltype(t);
      cast_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(static_cast<const F*>(x), static_cast<T*>(y), n);
    });
  });
  check_launch("cast");
}

void round_float16(float* x, std::int64_t n, Stream s) {
  if (n == 0) return;
  round_f16_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(x, n);
  check_launch("round_float16");
}

void round_bfloat16(float* x, std::int64_t n, Stream s) {
  if (n == 0) return;
  round_bf16_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(x, n);
  check_launch("round_bfloat16");
}

void softmax(const float* x, float* y, std::int64_t outer, std::int64_t n, std::int64_t inner, bool log, Stream s) {
  if (outer * n * inner == 0) return;
  if (inner == 1) {
    if (outer > 0x7fffffff) throw std::logic_error("CUDA softmax: too many rows");
    softmax_rows_kernel<<<unsigned(outer), kThreads, 0, stream_of(s)>>>(x, y, n, log);
  } else {
    softmax_cols_kernel<<<blocks_for(outer * inner), kThreads, 0, stream_of(s)>>>(x, y, outer, n, inner, log);
  }
  check_launch("softmax");
}

namespace {
// Segments a row of normalize_rows is split into: enough blocks for the device's SMs (a few hundred
// at least) while each segment keeps >= 4096 elements; 1 (a block a row) for many or short rows.
i64 norm_segments(i64 rows, i64 n) {
  if (rows <= 0 || rows > 65535) return 1;
  const i64 want = (512 + rows - 1) / rows, most = n / 4096;
  return std::max<i64>(1, std::min<i64>({want, most, 1024}));
}
}  // namespace

std::size_t normalize_rows_scratch_bytes(std::int64_t rows, std::int64_t n) {
  const i64 segs = norm_segments(rows, n);
  return segs > 1 ? std::size_t(rows * segs * 3) * sizeof(double) : 0;
}

void normalize_rows(const float* x, float* y, std::int64_t rows, std::int64_t n, double epsilon, const float* scale,
                    const float* bias, std::int64_t channels, std::int64_t channel_inner, float* mean, float* inv_std,
                    void* scratch, Stream s) {
  if (rows <= 0 || n <= 0) return;
  if (rows > 0x7fffffff) throw std::logic_error("CUDA normalize_rows: too many rows");
  channels = channels < 1 ? 1 : channels;
  channel_inner = channel_inner < 1 ? 1 : channel_inner;
  const i64 segs = norm_segments(rows, n);
  if (segs == 1) {
    normalize_rows_kernel<<<unsigned(rows), kThreads, 0, stream_of(s)>>>(x, y, n, epsilon, scale, bias, channels,
                                                                         channel_inner, mean, inv_std);
    check_launch("normalize_rows");
    return;
  }
  if (!scratch) throw std::logic_error("CUDA normalize_rows: no scratch for segmented rows");
  double* part = static_cast<double*>(scratch);
  double* part2 = part + rows * segs;
  const i64 seg = (n + segs - 1) / segs;
  const dim3 grid{unsigned(segs), unsigned(rows)};
  norm_segment_sums_kernel<<<grid, kThreads, 0, stream_of(s)>>>(x, n, seg, part);
  norm_segment_centred_kernel<<<grid, kThreads, 0, stream_of(s)>>>(x, n, seg, part, part2);
  norm_segment_apply_kernel<<<grid, kThreads, 0, stream_of(s)>>>(x, y, rows, n, seg, epsilon, scale, bias, channels,
                                                                 channel_inner, part, part2, mean, inv_std);
  check_launch("normalize_rows (segments)");
}

void batch_norm(const float* x, float* y, std::int64_t outer, std::int64_t channels, std::int64_t inner,
                const double* scale, const double* bias, const double* mean, const double* var, double epsilon,
                Stream s) {
  const i64 n = outer * channels * inner;
  if (n == 0) return;
  batch_norm_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(x, y, channels, inner, scale, bias, mean, var,
                                                                  epsilon, n);
  check_launch("batch_norm");
}

void reduce_rows(Reduce op, const float* x, float* y, std::int64_t rows, std::int64_t n, Stream s) {
  if (rows <= 0) return;
  if (rows > 0x7fffffff) throw std::logic_error("CUDA reduce_rows: too many rows");
  reduce_rows_kernel<<<unsigned(rows), kThreads, 0, stream_of(s)>>>(op, x, y, n);
  check_launch("reduce_rows");
}

namespace {
// im2col_images_kernel's rows and grid (a block a row, at most 2^20 blocks looping over the rest).
struct Im2colLaunch {
  i64 rows;
  unsigned blocks;
};
Im2colLaunch im2col_launch(const Conv2d& p, i64 images) {
  if (p.oh * p.ow > INT32_MAX) throw std::logic_error("CUDA im2col: output plane beyond int32");
  const i64 rows = p.oh * p.ow == 0 ? 0 : images * p.c * p.kh * p.kw;
  return {rows, unsigned(std::min<i64>(std::max<i64>(rows, 1), i64(1) << 20))};
}
}  // namespace

void im2col_images(const float* x, float* col, const Conv2d& p, std::int64_t images, Stream s) {
  const Im2colLaunch l = im2col_launch(p, images);
  if (l.rows == 0) return;
  im2col_images_kernel<<<l.blocks, kThreads, 0, stream_of(s)>>>(x, col, p, l.rows);
  check_launch("im2col_images");
}

void to_16bit(const float* x, void* y, std::int64_t n, bool bf16, Stream s) {
  if (n == 0) return;
  if (bf16) to_16bit_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(x, static_cast<__nv_bfloat16*>(y), n);
  else to_16bit_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(x, static_cast<__half*>(y), n);
  check_launch("to_16bit");
}

void im2col_images_16bit(const float* x, void* col, const Conv2d& p, std::int64_t images, bool bf16, Stream s) {
  const Im2colLaunch l = im2col_launch(p, images);
  if (l.rows == 0) return;
  if (bf16)
    im2col_images_kernel<<<l.blocks, kThreads, 0, stream_of(s)>>>(x, static_cast<__nv_bfloat16*>(col), p, l.rows);
  else
    im2col_images_kernel<<<l.blocks, kThreads, 0, stream_of(s)>>>(x, static_cast<__half*>(col), p, l.rows);
  check_launch("im2col_images_16bit");
}

void conv2d_direct(const float* x, const float* w, const float* bias, float* y, const Conv2d& p, Stream s) {
  const i64 n = p.n * p.m * p.oh * p.ow;
  if (n == 0) return;
  conv2d_direct_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(x, w, bias, y, p, n);
  check_launch("conv2d_direct");
}

void add_channel_bias(float* y, const float* bias, std::int64_t outer, std::int64_t channels, std::int64_t inner,
                      Stream s) {
  const i64 n = outer * channels * inner;
  if (n == 0) return;
  add_channel_bias_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(y, bias, channels, inner, n);
  check_launch("add_channel_bias");
}

void pool2d(const float* x, float* y, const Pool2d& p, Stream s) {
  const i64 n = p.planes * p.oh * p.ow;
  if (n == 0) return;
  pool2d_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(x, y, p, n);
  check_launch("pool2d");
}

void resize_axis(const float* x, float* y, std::int64_t outer, std::int64_t in, std::int64_t out, std::int64_t inner,
                 int taps, const std::int64_t* index, const double* weight, const std::uint8_t* extrapolate,
                 double extrapolation_value, Stream s) {
  const i64 n = outer * out * inner;
  if (n == 0) return;
  resize_axis_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(x, y, in, out, inner, taps, index, weight,
                                                                   extrapolate, extrapolation_value, n);
  check_launch("resize_axis");
}

namespace {
// The current device's opt-in shared memory per block, 0 where it cannot be read.
int shared_memory_optin() {
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return optin;
}
}  // namespace

bool attention_supported(const AttentionShape& s) {
  if (s.head_dim <= 0 || s.head_dim % 4 || s.head_dim > kAttMaxDim || s.v_dim <= 0 || s.v_dim % 4 ||
      s.v_dim > kAttMaxDim || s.kv_len <= 0 || s.q_len <= 0 || s.batch <= 0 || s.batch > 65535 ||
      (s.q_len + kAttRows - 1) / kAttRows > INT32_MAX)
    return false;
  const int optin = shared_memory_optin();
  return optin > 0 && attention_shared_bytes(s.head_dim, s.v_dim) <= std::size_t(optin);
}

void attention(const AttentionShape& s, const float* q, const float* kt, const float* v, float* out, Stream st) {
  if (s.batch <= 0 || s.q_len <= 0 || s.v_dim <= 0) return;
  if (!attention_supported(s)) throw std::logic_error("CUDA attention: unsupported shape");
  const AttentionArgs a{s.q_len, s.kv_len, int(s.head_dim), int(s.v_dim), s.scale_kind, s.scale,
                        s.round_scores, s.round_scaled, s.round_probs};
  const std::size_t bytes = attention_shared_bytes(s.head_dim, s.v_dim);
  const dim3 grid(unsigned((s.q_len + kAttRows - 1) / kAttRows), unsigned(s.batch));
  auto launch = [&](auto kernel) {
    if (bytes > 48 * 1024 &&
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) != cudaSuccess)
      check_launch("attention (shared memory)");
    kernel<<<grid, kAttThreads, bytes, stream_of(st)>>>(a, q, kt, v, out);
  };
  const bool two = s.round_probs != RoundTo::kNone;
  if (s.v_dim <= 64) two ? launch(attention_kernel<1, true>) : launch(attention_kernel<1, false>);
  else if (s.v_dim <= 128) two ? launch(attention_kernel<2, true>) : launch(attention_kernel<2, false>);
  else two ? launch(attention_kernel<4, true>) : launch(attention_kernel<4, false>);
  check_launch("attention");
}

bool attention16_supported(const AttentionShape& s) {
  if ((s.round_probs != RoundTo::kFp16 && s.round_probs != RoundTo::kBf16) || s.inputs_exact != s.round_probs ||
      s.round_scores != RoundTo::kNone || s.round_scaled != RoundTo::kNone ||
      s.head_dim <= 0 || s.head_dim > kTcMaxDim || s.v_dim <= 0 || s.v_dim > kTcMaxDim || s.kv_len <= 0 ||
      s.q_len <= 0 || s.batch <= 0 || s.batch > 65535 || (s.q_len + kTcRows - 1) / kTcRows > INT32_MAX)
    return false;
  const int optin = shared_memory_optin();
  return optin > 0 && tc_layout(s.q_len, s.kv_len, int(s.head_dim), int(s.v_dim)).total <= unsigned(optin);
}

namespace {
// The padded copies' element counts: Q, K^T, V.
struct TcCopies {
  i64 q, k, v;
};
TcCopies tc_copies(const AttentionShape& s) {
  const TcLayout t = tc_layout(s.q_len, s.kv_len, int(s.head_dim), int(s.v_dim));
  return {s.batch * t.Lp * t.dp, s.batch * t.dp * t.Lkp, s.batch * t.Lkp * t.dvp};
}
i64 tc_aligned(i64 elements) { return (elements * 2 + 255) / 256 * 256; }
}  // namespace

std::size_t attention16_scratch_bytes(const AttentionShape& s) {
  const TcCopies c = tc_copies(s);
  return std::size_t(tc_aligned(c.q) + tc_aligned(c.k) + tc_aligned(c.v));
}

void attention16(const AttentionShape& s, const float* q, const float* kt, const float* v, float* out, void* scratch,
                 Stream st) {
  if (s.batch <= 0 || s.q_len <= 0 || s.v_dim <= 0) return;
  if (!attention16_supported(s)) throw std::logic_error("CUDA attention16: unsupported shape");
  // The scale as a product (a Div's by the reciprocal).
  const float scale = s.scale_kind == ScoreScale::kMul ? s.scale : s.scale_kind == ScoreScale::kDiv ? 1.0f / s.scale : 1.0f;
  const AttentionArgs a{s.q_len, s.kv_len, int(s.head_dim), int(s.v_dim), ScoreScale::kMul, scale,
                        RoundTo::kNone, RoundTo::kNone, s.round_probs};
  const TcLayout t = tc_layout(s.q_len, s.kv_len, a.d, a.dv);
  const TcCopies c = tc_copies(s);
  char* base = static_cast<char*>(scratch);
  const dim3 grid(unsigned(t.Lp / kTcRows), unsigned(s.batch));
  auto dispatch = [&](auto zero) {
    using T = decltype(zero);
    T* qh = reinterpret_cast<T*>(base);
    T* kh = reinterpret_cast<T*>(base + tc_aligned(c.q));
    T* vh = reinterpret_cast<T*>(base + tc_aligned(c.q) + tc_aligned(c.k));
    tc_pad_kernel<<<blocks_for(c.q), kThreads, 0, stream_of(st)>>>(q, qh, s.q_len, s.head_dim, t.Lp, t.dp, c.q);
    tc_pad_kernel<<<blocks_for(c.k), kThreads, 0, stream_of(st)>>>(kt, kh, s.head_dim, s.kv_len, t.dp, t.Lkp, c.k);
    tc_pad_kernel<<<blocks_for(c.v), kThreads, 0, stream_of(st)>>>(v, vh, s.kv_len, s.v_dim, t.Lkp, t.dvp, c.v);
    check_launch("attention16 (copies)");
    auto launch = [&](auto kernel) {
      if (t.total > 48 * 1024 &&
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(t.total)) != cudaSuccess)
        check_launch("attention16 (shared memory)");
      kernel<<<grid, kTcThreads, t.total, stream_of(st)>>>(a, qh, kh, vh, out);
    };
    const int tiles = t.dvp / 16;
    if (tiles <= 3) launch(attention16_kernel<T, 3>);
    else if (tiles <= 5) launch(attention16_kernel<T, 5>);
    else if (tiles <= 8) launch(attention16_kernel<T, 8>);
    else if (tiles <= 10) launch(attention16_kernel<T, 10>);
    else launch(attention16_kernel<T, 16>);
  };
  if (s.round_probs == RoundTo::kFp16) dispatch(__half{});
  else dispatch(__nv_bfloat16{});
  check_launch("attention16");
}

void attention_probs(const AttentionShape& a, const float* scores, void* probs, std::int64_t rows, Stream st) {
  if (rows <= 0 || a.kv_len <= 0) return;
  if (rows > 0x7fffffff) throw std::logic_error("CUDA attention_probs: too many rows");
  const AttentionArgs args{a.q_len, a.kv_len, int(a.head_dim), int(a.v_dim), a.scale_kind, a.scale,
                           a.round_scores, a.round_scaled, a.round_probs};
  const unsigned grid = unsigned(rows);
  if (a.round_probs == RoundTo::kFp16)
    attention_probs_kernel<<<grid, kThreads, 0, stream_of(st)>>>(scores, static_cast<__half*>(probs), a.kv_len, args);
  else if (a.round_probs == RoundTo::kBf16)
    attention_probs_kernel<<<grid, kThreads, 0, stream_of(st)>>>(scores, static_cast<__nv_bfloat16*>(probs),
                                                                  a.kv_len, args);
  else
    attention_probs_kernel<<<grid, kThreads, 0, stream_of(st)>>>(scores, static_cast<float*>(probs), a.kv_len, args);
  check_launch("attention_probs");
}

void scale(const float* x, float* y, std::int64_t n, bool divide, float c, Stream s) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(x, y, n, divide, c);
  check_launch("scale");
}

void elementwise_chain(const Chain& c, const float* x, void* y, std::int64_t n, Stream s) {
  if (n == 0) return;
  if (c.count < 1 || c.count > kMaxChainSteps) throw std::logic_error("CUDA elementwise chain: stage count");
  chain_kernel<<<blocks_for(n), kThreads, 0, stream_of(s)>>>(c, x, y, n);
  check_launch("elementwise_chain");
}

}  // namespace qeval::kernels::cuda
