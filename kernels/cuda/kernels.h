// qeval's CUDA kernels behind a plain C++ API (device pointers, sizes and strides in elements, a
// stream as an opaque pointer): no CUDA header needed to call them. Every kernel is deterministic
// (no atomics; reductions in a fixed order) and computes in the CPU kernels' formulas (double
// moments for norms, the same erf/sigmoid polynomials). Errors of a launch throw std::runtime_error.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/attention.h"

namespace qeval::kernels::cuda {

using Stream = void*;  // a cudaStream_t
inline constexpr int kMaxRank = 8;

// Element types the kernels know (storage types of the executor).
enum class Elem : std::uint8_t { kF32, kF64, kI8, kU8, kI16, kU16, kI32, kU32, kI64, kU64, kBool };

// An n-d walk over a dense `counts` array: operand k reads element base[k] + sum(i_d * strides[k][d]).
// Strides may be 0 (broadcast) or negative. Up to 4 operands (the output included where it is
// strided).
struct Walk {
  int rank = 0;
  std::int64_t counts[kMaxRank] = {};
  std::int64_t strides[4][kMaxRank] = {};
  std::int64_t base[4] = {};
};

// The same walk with size-1 axes dropped and adjacent axes merged where every operand steps through
// them as through one: the same offsets for every index, fewer divisions per element. The walking
// kernels below run the coalesced form of the walk they are given.
Walk coalesced(const Walk& w);

// dst[walk operand 1] = src[walk operand 0] for every index of the walk; elements of `bytes`.
void strided_copy(const void* src, void* dst, int bytes, const Walk& walk, Stream s);
// dst[i] = map[i] >= 0 ? src[map[i]] : *fill (fill: `bytes` of host memory), i < n.
void gather_map(const void* src, void* dst, int bytes, const std::int64_t* map, std::int64_t n, const void* fill,
                Stream s);
// dst[i] = src[base + sum_d tables[offsets[d] + i_d]] (i_d: i's coordinate on axis d of a dense
// `counts` array), or *fill (`bytes` of host memory) where some such table entry is INT64_MIN: a
// separable index map (kernels/index_map.h) with its tables in device memory.
struct SeparableGather {
  int rank = 0;
  std::int64_t counts[kMaxRank] = {};
  std::int64_t offsets[kMaxRank] = {};
  std::int64_t base = 0;
};
void gather_separable(const void* src, void* dst, int bytes, const SeparableGather& g, const std::int64_t* tables,
                      const void* fill, Stream s);
// Gather along an axis: dst[o, j, i] = src[o, idx[j], i] (src [outer, axis, inner], dst [outer,
// count, inner]); negative indices count from the end; an index out of range gives zero bytes
// (the plan checks constant indices; runtime ones cannot throw on the device).
void gather_axis(const void* src, const void* indices, bool indices64, void* dst, int bytes, std::int64_t outer,
                 std::int64_t axis, std::int64_t inner, std::int64_t count, Stream s);

enum class Unary : std::uint8_t {
  kNeg,
  kAbs,
  kSqrt,
  kExp,
  kLog,
  kErf,
  kTanh,
  kSigmoid,
  kRelu,
  kReciprocal,
  kFloor,
  kCeil,
  kRound,
  kSign,
  kSin,
  kCos,
  kSoftplus,
  kSoftsign,
  kLeakyRelu,
  kElu,
  kHardSigmoid,
  kHardSwish,
  kGeluErf,
  kGeluTanh,
  kClip,
  kNot,
};
// y[i] = f(x[i]) in float (p0, p1: the op's parameters: LeakyRelu/Elu alpha, HardSigmoid alpha and
// beta, Clip min and max). kNot takes bools, kNeg/kAbs/kRelu/kSign also int32/int64 (elem).
void unary(Unary op, Elem elem, const void* x, void* y, std::int64_t n, float p0, float p1, Stream s);

enum class Binary : std::uint8_t {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kPow,
  kMax,
  kMin,
  kMod,
  kEqual,
  kGreater,
  kLess,
  kGreaterOrEqual,
  kLessOrEqual,
  kAnd,
  kOr,
  kXor,
};
// y = f(a, b) over the walk's counts (operand 0: a, 1: b; y dense). Arithmetic on kF32, kF64,
// kI32, kI64 (integer Div truncates; a zero divisor gives 0); comparisons write bools.
void binary(Binary op, Elem elem, const void* a, const void* b, void* y, const Walk& walk, Stream s);
// out = cond ? x : y over the walk (operands 0: cond, 1: x, 2: y; out dense), elements of `bytes`.
void where(const void* cond, const void* x, const void* y, void* out, int bytes, const Walk& walk, Stream s);
// Element type conversion as C++'s static_cast (bool: != 0).
void cast(Elem from, Elem to, const void* x, void* y, std::int64_t n, Stream s);
// In place, bit-identical to qeval::round_to_float16 / round_to_bfloat16 (NaN and Inf kept).
void round_float16(float* x, std::int64_t n, Stream s);
void round_bfloat16(float* x, std::int64_t n, Stream s);

// Softmax (or log-softmax) of x viewed as [outer, n, inner] along n.
void softmax(const float* x, float* y, std::int64_t outer, std::int64_t n, std::int64_t inner, bool log, Stream s);
// Rows of n normalised by their moments (double): y = (x - mean) / sqrt(var + eps) * scale + bias,
// scale/bias (nullable) indexed by (flat index / channel_inner) % channels. mean/inv_std: `rows`
// values each, nullable (LayerNormalization's optional outputs, float). Few long rows are split
// over several blocks each (sums per segment, combined in order: the same bits every run, not
// always those of a block a row); `scratch`: normalize_rows_scratch_bytes(rows, n) of device
// memory (0: none needed, may be null).
std::size_t normalize_rows_scratch_bytes(std::int64_t rows, std::int64_t n);
void normalize_rows(const float* x, float* y, std::int64_t rows, std::int64_t n, double epsilon, const float* scale,
                    const float* bias, std::int64_t channels, std::int64_t channel_inner, float* mean, float* inv_std,
                    void* scratch, Stream s);
// Inference batch norm over [outer, channels, inner] with double parameters on the device.
void batch_norm(const float* x, float* y, std::int64_t outer, std::int64_t channels, std::int64_t inner,
                const double* scale, const double* bias, const double* mean, const double* var, double epsilon,
                Stream s);

enum class Reduce : std::uint8_t { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kSumSquare, kLogSum, kLogSumExp };
// y[r] = reduce(x[r * n .. r * n + n)) for r < rows, accumulated in double (max/min in float,
// NaN propagating); n == 0 gives the reduction's identity.
void reduce_rows(Reduce op, const float* x, float* y, std::int64_t rows, std::int64_t n, Stream s);

// Convolution pieces.
struct Conv2d {
  std::int64_t n, c, h, w;  // input
  std::int64_t m, oh, ow;   // output channels and size
  std::int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  std::int64_t group;
};
// im2col of `images` consecutive images [c, h, w] of x (all channels) into col [images][c * kh *
// kw][oh * ow]: one launch for a batch.
void im2col_images(const float* x, float* col, const Conv2d& p, std::int64_t images, Stream s);
// 16-bit operands for tensor-core GEMMs: float values that are exact in fp16 (`bf16` false) or
// bf16 (true), written as those 16-bit formats (nothing is rounded: the plan already rounded them).
void to_16bit(const float* x, void* y, std::int64_t n, bool bf16, Stream s);
// im2col_images into 16-bit columns (the values exact in that format, as above).
void im2col_images_16bit(const float* x, void* col, const Conv2d& p, std::int64_t images, bool bf16, Stream s);
// Direct convolution (grouped / depthwise): one thread per output, float accumulation in tap order.
void conv2d_direct(const float* x, const float* w, const float* bias, float* y, const Conv2d& p, Stream s);
// y[o, c, i] += bias[c] over [outer, channels, inner].
void add_channel_bias(float* y, const float* bias, std::int64_t outer, std::int64_t channels, std::int64_t inner,
                      Stream s);

// 2-D max / average pooling of [n*c, h, w] (pads begin ph/pw; the output size is the plan's).
struct Pool2d {
  std::int64_t planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
  std::int64_t pad_h_end, pad_w_end;
  bool max, count_include_pad;
};
void pool2d(const float* x, float* y, const Pool2d& p, Stream s);

// One axis of a separable resize of x viewed as [outer, in, inner] into [outer, out, inner]:
// y[o, j, i] = extrapolate[j] ? value : sum_t weight[j * taps + t] * x[o, index[j * taps + t], i]
// (weights and the sum in double, as kernels::resize).
void resize_axis(const float* x, float* y, std::int64_t outer, std::int64_t in, std::int64_t out, std::int64_t inner,
                 int taps, const std::int64_t* index, const double* weight, const std::uint8_t* extrapolate,
                 double extrapolation_value, Stream s);

// ---- quantization (kernels/cuda/quant.cu) ---------------------------------------------------------

// Which scale / zero point element i uses: (i / inner) % channels (channels 1: the one for all).
struct QuantAxis {
  std::int64_t channels = 1, inner = 1;
};
enum class QuantTo : std::uint8_t { kInt8, kUInt8, kFloat8E4M3FN };  // float8: the value stored as float
// QuantizeLinear: y[i] = saturate(round_half_even(x[i] / scale) + zero_point) for int8/uint8
// (kernels/numeric.h quantize_to: NaN gives the zero point), round_to_float8_e4m3fn(x[i] / scale,
// saturate) for float8 (zero point 0). A float division, as the CPU's. zero_point nullable (0).
void quantize_linear(const float* x, void* y, std::int64_t n, const float* scale, const std::int32_t* zero_point,
                     QuantAxis a, QuantTo to, bool saturate, Stream s);
// DequantizeLinear: y[i] = float(x[i] - zero_point) * scale of kI8, kU8 or kI32 values; x[i] * scale
// of kF32 ones (float8 values stored as float; no zero point).
void dequantize_linear(Elem elem, const void* x, float* y, std::int64_t n, const float* scale,
                       const std::int32_t* zero_point, QuantAxis a, Stream s);
// 8-bit values in int8 form: uint8 v becomes v - 128 (v ^ 0x80; the caller lowers its zero point by
// 128), int8 is copied.
void to_int8(const void* x, bool from_uint8, std::int8_t* y, std::int64_t n, Stream s);
// im2col of `images` 8-bit images [c, h, w] into rows [images][oh * ow][c * kh * kw] in int8 form:
// each output position's window contiguous (both operands of the product run along k); padding
// reads `pad` (the activation's zero point, so that it contributes 0).
void im2col_int8_rows(const void* x, bool from_uint8, std::int8_t* rows, const Conv2d& p, std::int64_t images,
                      std::int8_t pad, Stream s);
// c (column-major m x n, leading dimension ldc) = exact int32 sums over kk < k of a[i * k + kk] *
// b[j * k + kk]: m rows of a, n rows of b (the "TN" form). Any sizes and alignment; the plain kernel
// the backend uses where cuBLAS declines an int8 product.
void int8_gemm_tn(const std::int8_t* a, const std::int8_t* b, std::int32_t* c, std::int64_t m, std::int64_t n,
                  std::int64_t k, std::int64_t ldc, Stream s);
// In place: c[i] (int32) becomes the float (float(c[i] + add[ch]) * scale[ch]) + bias[ch], ch by the
// axis; add and bias nullable. kernels::Int8Epilogue's steps and rounding (no FMA).
void int8_epilogue(std::int32_t* c, std::int64_t n, const std::int32_t* add, const float* scale, const float* bias,
                   QuantAxis a, Stream s);

// ---- fused kernels (eval/exec's attention and elementwise-chain groups) ------------------------------

// Whether attention() takes this shape on the current device: head_dim and v_dim multiples of 4 up
// to 256, kv_len > 0, batch <= 65535, the tiles within the device's shared memory.
bool attention_supported(const AttentionShape& s);
// kernels::attention's contract on the device (q [batch, q_len, head_dim], kt [batch, head_dim,
// kv_len], v [batch, kv_len, v_dim], out [batch, q_len, v_dim], dense): the scores scaled and
// rounded as the unfused ops round them, softmax rows, the product with V, without ever storing the
// scores. FP32 with fused multiply-adds in the products, in a fixed order (the same bits every run). With round_probs the
// probabilities are normalised and rounded before the product, as the unfused Softmax's output is.
void attention(const AttentionShape& s, const float* q, const float* kt, const float* v, float* out, Stream st);
// attention() as deployments' flash-attention kernels compute it, for Q, K^T and V exact in the
// 16-bit format the probabilities are rounded to (round_probs == inputs_exact, fp16 or bf16; scores
// and scaled scores not rounded): both products on tensor cores with FP32 sums (their order, not
// attention()'s), the scale as a product (by the reciprocal for kDiv), exponentials by the hardware's
// exp2 approximation (~2^-22 relative), each row's maximum and sum in a first walk over the keys,
// the probabilities (times the sum's reciprocal) rounded to the format times V in a second. The
// scores never reach global memory; the same bits every run. head_dim and v_dim up to 256 (any,
// padded to 16).
// `scratch`: attention16_scratch_bytes of device memory (16-bit copies of Q, K^T and V padded to
// whole tiles, ~2 bytes an input element).
bool attention16_supported(const AttentionShape& s);
std::size_t attention16_scratch_bytes(const AttentionShape& s);
void attention16(const AttentionShape& s, const float* q, const float* kt, const float* v, float* out, void* scratch,
                 Stream st);
// The probabilities of attention's stored scores (`rows` rows of kv_len, dense): each score
// rounded, scaled and rounded as the shape says, the row's softmax (kc::softmax's order and
// formula), rounded to round_probs and stored in that format (fp16 / bf16: 2 bytes an element,
// exact), else as float (probs may then be scores). The middle of attention as two GEMMs.
void attention_probs(const AttentionShape& a, const float* scores, void* probs, std::int64_t rows, Stream st);
// y[i] = x[i] * c, or x[i] / c (divide): the elementwise Mul / Div by a scalar.
void scale(const float* x, float* y, std::int64_t n, bool divide, float c, Stream s);

// One stage of an elementwise chain: a unary op, a binary op with its other operand (a scalar, a
// tensor of the chain's shape, or a block broadcast as other[(i / repeat) % period]), or a
// terminal per-tensor 8-bit quantizer (p0 the scale). `rounding`: of the stage's output (not the
// last stage's); `keep`: where the stage's output goes too (observed runs), null: nowhere.
struct ChainStep {
  enum Kind : std::uint8_t { kUnary, kBinary, kQuantizeInt8, kQuantizeUInt8 };
  Kind kind = kUnary;
  Unary unary = Unary::kNeg;
  Binary binary = Binary::kAdd;
  std::uint8_t chain_operand = 0;  // binary: which operand is the running value
  RoundTo rounding = RoundTo::kNone;
  bool other_scalar = false;
  float p0 = 0, p1 = 0;
  std::int32_t zero_point = 0;
  const float* other = nullptr;
  std::int64_t period = 0, repeat = 1;
  float* keep = nullptr;
};
inline constexpr int kMaxChainSteps = 12;
struct Chain {
  int count = 0;
  ChainStep steps[kMaxChainSteps];
};
// y (float32, or int8/uint8 after a quantizer) = the chain applied to x, n elements, one pass; each
// stage computes as unary()/binary() do (the same bits as the nodes run one by one).
void elementwise_chain(const Chain& c, const float* x, void* y, std::int64_t n, Stream s);

}  // namespace qeval::kernels::cuda
