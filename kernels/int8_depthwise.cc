// int8 depthwise convolution: each task copies the input rows it reads once into padded rows
// (pad_value around them, so no tap is bounds-checked), then sums every output row's taps: 16
// outputs per vpdpbusd (4 taps of a kernel row each) or a portable loop.
#include "kernels/int8_depthwise.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/scratch.h"

#if defined(__AVX512VNNI__) && defined(__AVX512VBMI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#include <immintrin.h>
#define QEVAL_HAVE_DEPTHWISE_VNNI 1
#endif

namespace qeval::kernels {
namespace {

constexpr std::int64_t kLanes = 16;  // int32 outputs per 512-bit vector

// The vector kernel gives each of 16 output lanes 4 bytes (4 taps of a kernel row) picked by
// vpermb out of one 64-byte load: lane i reads bytes i * s + t * d, t < min(kw, 4).
bool vector_fits(const ConvGeometry3& g) {
  const std::int64_t taps = std::min<std::int64_t>(g.k[2], 4);
  return (kLanes - 1) * g.s[2] + (taps - 1) * g.d[2] < 64;
}

// Rows of the input plane copied with their padding: byte j of a copied row is the input's column
// j - pad_begin, or pad_value outside the input, XORed with `flip` (0x80 gives the +128 unsigned
// code vpdpbusd multiplies). Input rows are numbered id * H + ih; [lo, hi) are copied, and one row
// of pad_value follows them for taps above, below, before or after the input.
struct PaddedRows {
  const std::uint8_t* data = nullptr;
  std::int64_t stride = 0, lo = 0, hi = 0;
  const std::uint8_t* row(const ConvGeometry3& g, std::int64_t id, std::int64_t ih) const {
    if (id < 0 || id >= g.in[0] || ih < 0 || ih >= g.in[1]) return data + (hi - lo) * stride;
    return data + (id * g.in[1] + ih - lo) * stride;
  }
};

// Copies input rows [lo, hi) of plane xc (and the pad row) into buf.
void copy_rows(const ConvGeometry3& g, const std::int8_t* xc, std::int64_t lo, std::int64_t hi, std::int64_t stride,
               std::uint8_t pad, std::uint8_t flip, std::uint8_t* buf) {
  const std::int64_t left = g.pb[2], w = g.in[2];
  for (std::int64_t r = lo; r < hi; ++r) {
    std::uint8_t* __restrict dst = buf + (r - lo) * stride;
    const std::int8_t* __restrict src = xc + r * w;
    std::memset(dst, pad, std::size_t(left));
    for (std::int64_t j = 0; j < w; ++j) dst[left + j] = std::uint8_t(src[j]) ^ flip;
    std::memset(dst + left + w, pad, std::size_t(stride - left - w));
  }
  std::memset(buf + (hi - lo) * stride, pad, std::size_t(stride));
}

// One output row, portably: y[ow] = sum over the rows' taps of src[r][ow * s + t * d] * w[r][t].
template <bool kSums>
void row_portable(const std::int8_t* const* src, std::int64_t rows, const std::int8_t* wk, const ConvGeometry3& g,
                  std::int32_t* __restrict y, std::int32_t* __restrict ws) {
  const std::int64_t out_w = g.out[2], kw = g.k[2], s = g.s[2], d = g.d[2];
  std::fill_n(y, out_w, 0);
  if (kSums) std::fill_n(ws, out_w, 0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t t = 0; t < kw; ++t) {
      const std::int8_t* __restrict p = src[r] + t * d;
      const std::int32_t wt = wk[r * kw + t];
      if (s == 1) {
        for (std::int64_t ow = 0; ow < out_w; ++ow) y[ow] += std::int32_t(p[ow]) * wt;
        if (kSums)
          for (std::int64_t ow = 0; ow < out_w; ++ow) ws[ow] += p[ow];
      } else {
        for (std::int64_t ow = 0; ow < out_w; ++ow) y[ow] += std::int32_t(p[ow * s]) * wt;
        if (kSums)
          for (std::int64_t ow = 0; ow < out_w; ++ow) ws[ow] += p[ow * s];
      }
    }
}

#if QEVAL_HAVE_DEPTHWISE_VNNI
// One output row, 16 outputs at a time: for each (kernel row, group of 4 taps) a 64-byte load,
// vpermb to each lane's 4 bytes, vpdpbusd with the 4 weights. The bytes are x + 128, so the
// accumulators start at -128 x the weight sum (and the window sums at -128 x the taps): exact.
template <bool kSums>
void row_vnni(const std::uint8_t* const* src, const std::int32_t* wv, const std::int32_t* ones, std::int64_t n,
              __m512i idx, std::int64_t s, std::int32_t init, std::int32_t sums_init, std::int64_t out_w,
              std::int32_t* y, std::int32_t* ws) {
  const __m512i init_v = _mm512_set1_epi32(init), sums_init_v = _mm512_set1_epi32(sums_init);
  for (std::int64_t ow0 = 0; ow0 < out_w; ow0 += kLanes) {
    const __mmask16 m = out_w - ow0 >= kLanes ? __mmask16(0xffff) : __mmask16((1u << (out_w - ow0)) - 1);
    const std::int64_t off = ow0 * s;
    __m512i acc = init_v, sacc = sums_init_v;
    for (std::int64_t t = 0; t < n; ++t) {
      // The masked form with every lane set is plain vpermb; the unmasked intrinsic trips GCC 12's
      // -Wmaybe-uninitialized inside its header.
      const __m512i raw = _mm512_loadu_si512(src[t] + off);
      const __m512i v = _mm512_mask_permutexvar_epi8(raw, __mmask64(~0ull), idx, raw);
      acc = _mm512_dpbusd_epi32(acc, v, _mm512_set1_epi32(wv[t]));
      if (kSums) sacc = _mm512_dpbusd_epi32(sacc, v, _mm512_set1_epi32(ones[t]));
    }
    _mm512_mask_storeu_epi32(y + ow0, m, acc);
    if (kSums) _mm512_mask_storeu_epi32(ws + ow0, m, sacc);
  }
}

// Four bytes as one int32 (the vpdpbusd operand of a tap group), little-endian.
std::int32_t pack4(const std::int8_t* b, std::int64_t n) {
  std::uint32_t v = 0;
  for (std::int64_t i = 0; i < n && i < 4; ++i) v |= std::uint32_t(std::uint8_t(b[i])) << (8 * i);
  return std::int32_t(v);
}
#endif

// The epilogue for one output row: row terms of channel oc, column terms from output position j0.
Int8Epilogue finish_row(const Int8Epilogue& e, std::int64_t oc, std::int64_t j0) {
  Int8Epilogue r = e.rows_from(oc);
  if (r.col_add) r.col_add += j0;
  if (r.col_scale) r.col_scale += j0;
  if (r.col_bias) r.col_bias += j0;
  return r;
}

}  // namespace

bool int8_conv_is_depthwise(const ConvParams& p) {
  return p.groups >= 1 && p.in_channels == p.groups && p.out_channels / p.groups < 16;
}

bool int8_depthwise_vector_available() {
#if QEVAL_HAVE_DEPTHWISE_VNNI
  return true;
#else
  return false;
#endif
}

void int8_depthwise_conv(const ConvParams& p, const std::int8_t* x, std::int8_t pad_value, const std::int8_t* w,
                         const std::int32_t* channel_sums, std::int32_t* y, std::int32_t* window_sums, bool vector,
                         const Int8Epilogue* e) {
  const ConvGeometry3 g = conv_geometry3(p);
  const std::int64_t og = p.out_channels / p.groups, in_size = g.in_size(), out_size = g.out_size();
  const std::int64_t kprod = g.k_size(), rows = g.out[0] * g.out[1], out_w = g.out[2];
  const std::int64_t kernel_rows = g.k[0] * g.k[1], chunks = (g.k[2] + 3) / 4;
  if (p.batch == 0 || out_size == 0) return;
#if QEVAL_HAVE_DEPTHWISE_VNNI
  const bool use_vector = vector && vector_fits(g);
#else
  (void)channel_sums;
  const bool use_vector = false;
  (void)vector;
#endif
  // Bytes a copied row needs: the input and its begin padding, and whatever the last (partial)
  // vector or the last portable tap reads past the end.
  const std::int64_t last_block = (out_w - 1) / kLanes * kLanes;
  const std::int64_t reach = use_vector ? last_block * g.s[2] + (chunks - 1) * 4 * g.d[2] + 64
                                        : (out_w - 1) * g.s[2] + (g.k[2] - 1) * g.d[2] + 1;
  const std::int64_t stride = (std::max(reach, g.pb[2] + g.in[2]) + 63) / 64 * 64;
  const std::uint8_t flip = use_vector ? 0x80 : 0x00;
  const std::uint8_t pad = std::uint8_t(pad_value) ^ flip;

  // Tasks of ~16K outputs (all og filters of a channel): big enough to amortise the row copies.
  const std::int64_t rows_per_task = std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(1, out_w * og));
  const std::int64_t blocks = (rows + rows_per_task - 1) / rows_per_task;
  const std::int64_t planes = p.batch * p.in_channels;
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, planes * blocks), [&](const auto& range) {
    std::vector<const std::uint8_t*> src(std::size_t(kernel_rows * chunks));
    std::vector<const std::int8_t*> krow(static_cast<std::size_t>(kernel_rows));
#if QEVAL_HAVE_DEPTHWISE_VNNI
    std::vector<std::int32_t> wv(src.size()), ones(src.size());
    __m512i idx;
    {
      alignas(64) std::uint8_t b[64];
      for (int i = 0; i < 64; ++i) b[i] = std::uint8_t((i / 4) * g.s[2] + (i % 4) * g.d[2]);
      idx = _mm512_load_si512(b);  // vpermb reads the low 6 bits of each index
    }
#endif
    for (std::int64_t t = range.begin(); t < range.end(); ++t) {
      const std::int64_t plane = t / blocks, blk = t % blocks;
      const std::int64_t b = plane / p.in_channels, ic = plane % p.in_channels;
      const std::int64_t r0 = blk * rows_per_task, r1 = std::min(rows, r0 + rows_per_task);
      // The input rows these output rows read.
      std::int64_t lo = std::numeric_limits<std::int64_t>::max(), hi = 0;
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::int64_t od = r / g.out[1], oh = r % g.out[1];
        for (std::int64_t kd = 0; kd < g.k[0]; ++kd) {
          const std::int64_t id = od * g.s[0] - g.pb[0] + kd * g.d[0];
          if (id < 0 || id >= g.in[0]) continue;
          for (std::int64_t kh = 0; kh < g.k[1]; ++kh) {
            const std::int64_t ih = oh * g.s[1] - g.pb[1] + kh * g.d[1];
            if (ih < 0 || ih >= g.in[1]) continue;
            lo = std::min(lo, id * g.in[1] + ih);
            hi = std::max(hi, id * g.in[1] + ih + 1);
          }
        }
      }
      if (lo >= hi) lo = hi = 0;
      const std::size_t bytes = std::size_t((hi - lo + 1) * stride);
      auto* buf = reinterpret_cast<std::uint8_t*>(thread_scratch(ScratchSlot::kInt8Rows, (bytes + 3) / 4));
      copy_rows(g, x + plane * in_size, lo, hi, stride, pad, flip, buf);
      const PaddedRows in{buf, stride, lo, hi};

      for (std::int64_t j = 0; j < og; ++j) {
        const std::int64_t oc = ic * og + j;
        const std::int8_t* wk = w + oc * kprod;
        // Window sums are per group (= input channel): once, with the first filter.
        std::int32_t* ws = window_sums && j == 0 ? window_sums + plane * out_size : nullptr;
        std::int32_t* yc = y + (b * p.out_channels + oc) * out_size;
#if QEVAL_HAVE_DEPTHWISE_VNNI
        if (use_vector)
          for (std::int64_t kr = 0; kr < kernel_rows; ++kr)
            for (std::int64_t c = 0; c < chunks; ++c) {
              const std::int64_t n = std::min<std::int64_t>(4, g.k[2] - 4 * c);
              wv[std::size_t(kr * chunks + c)] = pack4(wk + kr * g.k[2] + 4 * c, n);
              const std::int8_t one[4] = {1, 1, 1, 1};
              ones[std::size_t(kr * chunks + c)] = pack4(one, n);
            }
#endif
        for (std::int64_t r = r0; r < r1; ++r) {
          const std::int64_t od = r / g.out[1], oh = r % g.out[1];
          for (std::int64_t kd = 0; kd < g.k[0]; ++kd)
            for (std::int64_t kh = 0; kh < g.k[1]; ++kh) {
              const std::uint8_t* row =
                  in.row(g, od * g.s[0] - g.pb[0] + kd * g.d[0], oh * g.s[1] - g.pb[1] + kh * g.d[1]);
              for (std::int64_t c = 0; c < chunks; ++c)
                src[std::size_t((kd * g.k[1] + kh) * chunks + c)] = row + 4 * c * g.d[2];
            }
          std::int32_t* yr = yc + r * out_w;
          std::int32_t* wr = ws ? ws + r * out_w : nullptr;
#if QEVAL_HAVE_DEPTHWISE_VNNI
          if (use_vector) {
            const std::int32_t init = -128 * channel_sums[oc], sums_init = std::int32_t(-128 * kprod);
            if (wr)
              row_vnni<true>(src.data(), wv.data(), ones.data(), kernel_rows * chunks, idx, g.s[2], init, sums_init,
                             out_w, yr, wr);
            else
              row_vnni<false>(src.data(), wv.data(), ones.data(), kernel_rows * chunks, idx, g.s[2], init, sums_init,
                              out_w, yr, nullptr);
            continue;
          }
#endif
          // Portable: one pointer per kernel row (chunks of 4 taps do not apply).
          for (std::int64_t kr = 0; kr < kernel_rows; ++kr)
            krow[std::size_t(kr)] = reinterpret_cast<const std::int8_t*>(src[std::size_t(kr * chunks)]);
          if (wr) row_portable<true>(krow.data(), kernel_rows, wk, g, yr, wr);
          else row_portable<false>(krow.data(), kernel_rows, wk, g, yr, nullptr);
        }
        // The rows' sums into floats while in L1 (window sums were taken from the int32 sums).
        if (e)
          for (std::int64_t r = r0; r < r1; ++r)
            int8_epilogue(yc + r * out_w, 1, out_w, out_w, finish_row(*e, oc, r * out_w));
      }
    }
  });
}

}  // namespace qeval::kernels
