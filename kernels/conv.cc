// Convolution kernels: validation, im2col into GEMM panels, depthwise direct loops, col2im for
// ConvTranspose, and the naive references.
#include "kernels/conv.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/scratch.h"

namespace qeval::kernels {
namespace {

constexpr int NR = kGemmNR, KC = kGemmKC, MC = kGemmMC;

typedef float VU __attribute__((vector_size(64), aligned(4)));
constexpr int kLanes = 16;
typedef float V8 __attribute__((vector_size(32), aligned(4)));
typedef float V4 __attribute__((vector_size(16), aligned(4)));

// Copies n <= 32 floats with fixed-size moves: im2col moves many short runs, and a libc memmove
// call per run (what GCC makes of a plain loop) cost more than the copy itself.
inline void copy_run(const float* src, float* dst, std::int64_t n) {
  if (n >= 16) {
    *reinterpret_cast<VU*>(dst) = *reinterpret_cast<const VU*>(src);
    // The rest as a second, possibly overlapping, 16-float move.
    if (n > 16) *reinterpret_cast<VU*>(dst + n - 16) = *reinterpret_cast<const VU*>(src + n - 16);
    return;
  }
  if (n & 8) {
    *reinterpret_cast<V8*>(dst) = *reinterpret_cast<const V8*>(src);
    src += 8, dst += 8;
  }
  if (n & 4) {
    *reinterpret_cast<V4*>(dst) = *reinterpret_cast<const V4*>(src);
    src += 4, dst += 4;
  }
  if (n & 2) {
    dst[0] = src[0], dst[1] = src[1];
    src += 2, dst += 2;
  }
  if (n & 1) dst[0] = src[0];
}

inline void zero_run(float* dst, std::int64_t n) {
  if (n >= 16) {
    *reinterpret_cast<VU*>(dst) = VU{};
    if (n > 16) *reinterpret_cast<VU*>(dst + n - 16) = VU{};
    return;
  }
  if (n & 8) *reinterpret_cast<V8*>(dst) = V8{}, dst += 8;
  if (n & 4) *reinterpret_cast<V4*>(dst) = V4{}, dst += 4;
  if (n & 2) dst[0] = 0.0f, dst[1] = 0.0f, dst += 2;
  if (n & 1) dst[0] = 0.0f;
}

std::string dims_to_string(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

using Geom = ConvGeometry3;

void validate(const ConvParams& p, bool transpose) {
  const char* what = transpose ? "conv_transpose" : "conv";
  const std::size_t r = p.in_spatial.size();
  auto fail = [&](const std::string& m) { throw std::invalid_argument(std::string(what) + ": " + m); };
  if (r < 1 || r > 3) fail(std::to_string(r) + " spatial dimensions (1 to 3 are supported)");
  if (p.kernel.size() != r || p.strides.size() != r || p.dilations.size() != r || p.pads_begin.size() != r ||
      p.pads_end.size() != r || p.out_spatial.size() != r)
    fail("spatial parameter vectors differ in length");
  if (p.batch < 0 || p.in_channels < 1 || p.out_channels < 1 || p.groups < 1)
    fail("batch " + std::to_string(p.batch) + ", channels " + std::to_string(p.in_channels) + " -> " +
         std::to_string(p.out_channels) + ", groups " + std::to_string(p.groups));
  if (p.in_channels % p.groups || p.out_channels % p.groups)
    fail("channels " + std::to_string(p.in_channels) + " -> " + std::to_string(p.out_channels) +
         " are not divisible by groups " + std::to_string(p.groups));
  for (std::size_t i = 0; i < r; ++i)
    if (p.in_spatial[i] < 0 || p.kernel[i] < 1 || p.strides[i] < 1 || p.dilations[i] < 1 || p.pads_begin[i] < 0 ||
        p.pads_end[i] < 0 || p.out_spatial[i] < 0)
      fail("bad geometry: input " + dims_to_string(p.in_spatial) + ", kernel " + dims_to_string(p.kernel) +
           ", strides " + dims_to_string(p.strides) + ", dilations " + dims_to_string(p.dilations) + ", pads " +
           dims_to_string(p.pads_begin) + " / " + dims_to_string(p.pads_end) + ", output " +
           dims_to_string(p.out_spatial));
  if (!transpose && p.out_spatial != conv_output_spatial(p))
    fail("output " + dims_to_string(p.out_spatial) + " does not match the geometry's " +
         dims_to_string(conv_output_spatial(p)));
}

Geom geom3(const ConvParams& p) { return conv_geometry3(p); }

std::int64_t product(const std::vector<std::int64_t>& v) {
  std::int64_t n = 1;
  for (auto x : v) n *= x;
  return n;
}

// The input with its padding materialised (zeros around each channel's plane), so that im2col reads
// every tap without bounds checks. Without padding it is the input itself.
struct PaddedInput {
  const float* data = nullptr;
  std::int64_t dims[3] = {1, 1, 1};  // padded extents (depth, height, width)
  std::int64_t plane() const { return dims[0] * dims[1] * dims[2]; }
};

// Every plane (batch x input channel) of a padded input, `plane` floats each, in storage: zeros,
// then `rows(plane_out, plane_in)` copies the input's rows to their places. Parallel over planes.
template <class Rows>
const float* pad_planes(const Geom& g, const ConvParams& p, const float* x, std::int64_t plane, ConvScratch& storage,
                        const Rows& rows) {
  const std::int64_t planes = p.batch * p.in_channels;
  float* dst = storage.get(std::size_t(planes * plane));
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, planes), [&](const auto& range) {
    for (std::int64_t c = range.begin(); c < range.end(); ++c) {
      float* d = dst + c * plane;
      std::fill(d, d + plane, 0.0f);
      rows(d, x + c * g.in_size());
    }
  });
  return dst;
}

PaddedInput pad_input(const Geom& g, const ConvParams& p, const float* x, ConvScratch& storage) {
  PaddedInput in;
  const std::size_t r = p.in_spatial.size(), lead = 3 - r;
  bool any = false;
  for (std::size_t i = 0; i < 3; ++i) {
    const std::int64_t pe = i >= lead ? p.pads_end[i - lead] : 0;
    in.dims[i] = g.in[i] + g.pb[i] + pe;
    any |= g.pb[i] != 0 || pe != 0;
  }
  if (!any) {
    in.data = x;
    return in;
  }
  in.data = pad_planes(g, p, x, in.plane(), storage, [&](float* d, const float* src) {
    for (std::int64_t z = 0; z < g.in[0]; ++z)
      for (std::int64_t h = 0; h < g.in[1]; ++h)
        std::memcpy(d + ((z + g.pb[0]) * in.dims[1] + h + g.pb[1]) * in.dims[2] + g.pb[2],
                    src + (z * g.in[1] + h) * g.in[2], sizeof(float) * std::size_t(g.in[2]));
  });
  return in;
}

// Writes rows [k0, k0 + kc) and columns [c0, c0 + nc) of one group's im2col matrix straight into
// packed-B panel layout (gemm.h). Row = (input channel, kd, kh, kw); column = output position.
// Within a panel, runs of columns that share an output row read consecutive (or strided)
// positions of the padded input: a run is one copy. Row by row, each row across all panels: the
// reads then walk along the input's rows (panel by panel, each of the kc rows was a separate
// stream, and the loads stalled on L2).
void im2col_block(const Geom& g, const PaddedInput& in, const float* xg, std::int64_t k0, std::int64_t kc,
                  std::int64_t c0, std::int64_t nc, float* dst) {
  const std::int64_t kprod = g.k_size(), plane = in.plane(), row_len = in.dims[2], slice = in.dims[1] * in.dims[2];
  // Runs of columns inside one panel and one output row: lane, length, first input position.
  struct Run {
    std::int64_t lane, len, offset;
  };
  thread_local std::vector<Run> runs;
  thread_local std::vector<std::size_t> panel_runs;  // runs of panel p: [panel_runs[p], panel_runs[p + 1])
  runs.clear();
  panel_runs.clear();
  const std::int64_t s = g.s[2], panels = (nc + NR - 1) / NR;
  for (std::int64_t p0 = 0; p0 < nc; p0 += NR) {
    panel_runs.push_back(runs.size());
    const std::int64_t pn = std::min<std::int64_t>(NR, nc - p0);
    for (std::int64_t t = 0; t < pn;) {
      const std::int64_t col = c0 + p0 + t, ow = col % g.out[2], rest = col / g.out[2];
      const std::int64_t len = std::min(pn - t, g.out[2] - ow);
      const std::int64_t od = rest / g.out[1], oh = rest % g.out[1];
      runs.push_back({t, len, od * g.s[0] * slice + oh * g.s[1] * row_len + ow * s});
      t += len;
    }
  }
  panel_runs.push_back(runs.size());
  const std::int64_t last_pn = nc - (panels - 1) * NR;
  for (std::int64_t r = 0; r < kc; ++r) {
    // Where this row's tap sits relative to a column's first input position.
    const std::int64_t row = k0 + r, ci = row / kprod, rem = row % kprod;
    const std::int64_t kd = rem / (g.k[1] * g.k[2]), kh = (rem / g.k[2]) % g.k[1], kw = rem % g.k[2];
    const float* base = xg + ci * plane + kd * g.d[0] * slice + kh * g.d[1] * row_len + kw * g.d[2];
    for (std::int64_t p = 0; p < panels; ++p) {
      float* out_row = dst + p * kc * NR + r * NR;
      for (std::size_t u = panel_runs[std::size_t(p)]; u < panel_runs[std::size_t(p) + 1]; ++u) {
        const Run& run = runs[u];
        const float* src = base + run.offset;
        if (s == 1) {
          copy_run(src, out_row + run.lane, run.len);
        } else {
          for (std::int64_t v = 0; v < run.len; ++v) out_row[run.lane + v] = src[v * s];
        }
      }
    }
    // Columns past nc in the last panel must be zero: the micro-kernel reads whole panels.
    if (last_pn < NR) zero_run(dst + (panels - 1) * kc * NR + r * NR + last_pn, NR - last_pn);
  }
}

// One output channel's planes when each group has a single input channel (depthwise, or a 1-channel
// input): direct loops along output rows, padded taps skipped. Every output sums its taps in
// (kd, kh, kw) order; columns whose taps all land inside the row (with unit stride) do it 16 at a
// time in registers, the edge columns one at a time.
void depthwise_rows(const Geom& g, const float* xc, const float* wk, float bias, float* yc, std::int64_t row_begin,
                    std::int64_t row_end) {
  const std::int64_t s = g.s[2], first_off = -g.pb[2], last_off = (g.k[2] - 1) * g.d[2] - g.pb[2];
  // Interior columns [lo, hi): 0 <= ow * s + first_off and ow * s + last_off < in.
  std::int64_t lo = first_off >= 0 ? 0 : (-first_off + s - 1) / s;
  std::int64_t hi = g.in[2] - last_off <= 0 ? 0 : (g.in[2] - last_off + s - 1) / s;
  lo = std::min(lo, g.out[2]);
  hi = std::clamp(hi, lo, g.out[2]);
  if (s != 1) hi = lo;  // strided rows take the per-column path
  struct Tap {
    const float* row;  // input row of this (kd, kh)
    std::int64_t off;  // kw * dilation - pad
    float w;
  };
  std::vector<Tap> taps;
  taps.reserve(std::size_t(g.k_size()));
  for (std::int64_t row = row_begin; row < row_end; ++row) {
    const std::int64_t od = row / g.out[1], oh = row % g.out[1];
    float* y = yc + row * g.out[2];
    taps.clear();
    for (std::int64_t kd = 0; kd < g.k[0]; ++kd) {
      const std::int64_t id = od * g.s[0] + kd * g.d[0] - g.pb[0];
      if (id < 0 || id >= g.in[0]) continue;
      for (std::int64_t kh = 0; kh < g.k[1]; ++kh) {
        const std::int64_t ih = oh * g.s[1] + kh * g.d[1] - g.pb[1];
        if (ih < 0 || ih >= g.in[1]) continue;
        const float* xr = xc + (id * g.in[1] + ih) * g.in[2];
        for (std::int64_t kw = 0; kw < g.k[2]; ++kw)
          taps.push_back({xr, kw * g.d[2] - g.pb[2], wk[(kd * g.k[1] + kh) * g.k[2] + kw]});
      }
    }
    // One column, taps bounds-checked.
    auto column = [&](std::int64_t ow) {
      float acc = 0.0f;
      for (const Tap& t : taps) {
        const std::int64_t ix = ow * s + t.off;
        if (ix >= 0 && ix < g.in[2]) acc += t.w * t.row[ix];
      }
      y[ow] = acc + bias;
    };
    for (std::int64_t ow = 0; ow < lo; ++ow) column(ow);
    auto chunk = [&](std::int64_t ow) {
      VU acc = VU{};
      for (const Tap& t : taps) acc += t.w * *reinterpret_cast<const VU*>(t.row + ow + t.off);
      *reinterpret_cast<VU*>(y + ow) = acc + bias;
    };
    std::int64_t ow = lo;
    if (hi - lo >= kLanes) {
      for (; ow + kLanes <= hi; ow += kLanes) chunk(ow);
      // The remainder as one chunk overlapping the last: recomputed columns get the same values.
      if (ow < hi) chunk(hi - kLanes);
      ow = hi;
    }
    for (; ow < g.out[2]; ++ow) column(ow);
  }
}

void conv_depthwise(const ConvParams& p, const Geom& g, const float* x, const float* w, const float* bias, float* y) {
  const std::int64_t cout_g = p.out_channels / p.groups, rows = g.out[0] * g.out[1];
  const std::int64_t in_size = g.in_size(), out_size = g.out_size(), kprod = g.k_size();
  const std::int64_t planes = p.batch * p.out_channels;
  // Row blocks of ~16K outputs keep tasks big enough to amortise and small enough to balance.
  const std::int64_t rows_per_task = std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(1, g.out[2]));
  const std::int64_t blocks = (rows + rows_per_task - 1) / rows_per_task;
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, planes * blocks), [&](const auto& range) {
    for (std::int64_t t = range.begin(); t < range.end(); ++t) {
      const std::int64_t plane = t / blocks, blk = t % blocks;
      const std::int64_t n = plane / p.out_channels, oc = plane % p.out_channels, ci = oc / cout_g;
      depthwise_rows(g, x + (n * p.in_channels + ci) * in_size, w + oc * kprod, bias ? bias[oc] : 0.0f,
                     y + plane * out_size, blk * rows_per_task, std::min(rows, (blk + 1) * rows_per_task));
    }
  });
}

bool uses_depthwise(const ConvParams& p) {
  // One input channel per group: direct loops, unless many filters share that channel (a first
  // layer on a 1-channel image), where im2col + GEMM reuses each gathered input column.
  return p.in_channels / p.groups == 1 && p.out_channels / p.groups < 16;
}

void check_packed(const ConvParams& p, const PackedConvWeights& packed, std::int64_t m, std::int64_t k) {
  if (std::int64_t(packed.groups.size()) != p.groups || packed.groups[0].m() != m || packed.groups[0].k() != k)
    throw std::invalid_argument("conv: packed weights do not match the geometry");
}

// im2col + GEMM: weights packed once per group (or prepacked); tasks over (image, group, row chunk,
// column tile) each im2col their own B blocks into a private buffer and run all their k blocks.
// The im2col GEMM of every image and group over the output positions of geometry g (a band of
// output rows of the whole conv when g.out[1] is the band's), read from `padded` (the band's padded
// input rows); y holds the band's first position, its rows ldc apart.
void conv_gemm_columns(const ConvParams& p, const Geom& g, const PaddedInput& padded,
                       const std::vector<PackedA>& weights, const float* bias, float* y, std::int64_t ldc) {
  const std::int64_t cin_g = p.in_channels / p.groups, cout_g = p.out_channels / p.groups;
  const std::int64_t kdim = cin_g * g.k_size(), ncols = g.out_size();

  // Column tiles of up to 256 keep a task's B block (KC x 256 floats) and C tile in L2; narrower
  // tiles and row chunks only when there would be too few tasks for the cores. The split never
  // changes a sum: k is blocked by KC whatever the tiling.
  const std::int64_t want = 4 * std::int64_t(tbb::this_task_arena::max_concurrency());
  const std::int64_t images = p.batch * p.groups;
  std::int64_t nt = std::min<std::int64_t>(round_up(ncols, NR), 8 * NR);
  while (images * ((ncols + nt - 1) / nt) < want && nt > 2 * NR) nt = round_up(nt / 2, NR);
  const std::int64_t col_tiles = (ncols + nt - 1) / nt;
  std::int64_t mt = round_up(cout_g, MC);
  while (images * col_tiles * ((cout_g + mt - 1) / mt) < want && mt > MC) mt = round_up(mt / 2, MC);
  const std::int64_t row_chunks = (cout_g + mt - 1) / mt;

  tbb::parallel_for(
      tbb::blocked_range<std::int64_t>(0, images * row_chunks * col_tiles, 1),
      [&](const auto& range) {
        float* b_buf = thread_scratch(ScratchSlot::kConvB, std::size_t(packed_b_floats(KC, nt)));
        // float16 weight panels are widened an A block (MC rows) at a time.
        float* a_buf = std::any_of(weights.begin(), weights.end(), [](const PackedA& w) { return w.half(); })
                           ? thread_scratch(ScratchSlot::kConvA, std::size_t(MC) * KC)
                           : nullptr;
        for (std::int64_t t = range.begin(); t < range.end(); ++t) {
          const std::int64_t img = t / (row_chunks * col_tiles), rest = t % (row_chunks * col_tiles);
          const std::int64_t n = img / p.groups, grp = img % p.groups;
          const std::int64_t m0 = (rest / col_tiles) * mt, mc = std::min(mt, cout_g - m0);
          const std::int64_t c0 = (rest % col_tiles) * nt, nc = std::min(nt, ncols - c0);
          const float* xg = padded.data + (n * p.in_channels + grp * cin_g) * padded.plane();
          float* yt = y + (n * p.out_channels + grp * cout_g + m0) * ldc + c0;
          for (std::int64_t k0 = 0; k0 < kdim; k0 += KC) {
            const std::int64_t kc = std::min<std::int64_t>(KC, kdim - k0);
            im2col_block(g, padded, xg, k0, kc, c0, nc, b_buf);
            for (std::int64_t i = 0; i < mc; i += MC)
              gemm_packed_block(std::min<std::int64_t>(MC, mc - i), nc, kc,
                                weights[std::size_t(grp)].block(m0 + i, k0, std::min<std::int64_t>(MC, mc - i), a_buf),
                                b_buf, 1.0f, k0 == 0 ? 0.0f : 1.0f, yt + i * ldc, ldc);
          }
          if (bias)
            for (std::int64_t i = 0; i < mc; ++i) {
              const float b = bias[grp * cout_g + m0 + i];
              float* yr = yt + i * ldc;
              for (std::int64_t j = 0; j < nc; ++j) yr[j] += b;
            }
        }
      },
      tbb::simple_partitioner());
}

// The padded input rows [r0, r0 + rows) of every plane of a 2-D (or 1-D) conv's input (zeros outside
// the input), into storage: a band of what pad_input makes.
PaddedInput pad_band(const Geom& g, const ConvParams& p, const float* x, std::int64_t row_len, std::int64_t r0,
                     std::int64_t rows, ConvScratch& storage) {
  PaddedInput in;
  in.dims[1] = rows;
  in.dims[2] = row_len;
  in.data = pad_planes(g, p, x, in.plane(), storage, [&](float* d, const float* src) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t h = r0 + r - g.pb[1];
      if (h < 0 || h >= g.in[1]) continue;
      std::memcpy(d + r * row_len + g.pb[2], src + h * g.in[2], sizeof(float) * std::size_t(g.in[2]));
    }
  });
  return in;
}

void conv_gemm(const ConvParams& p, const Geom& g, const float* x, const float* w, const float* bias, float* y,
               const PackedConvWeights* packed, ConvScratch& scratch) {
  const std::int64_t cin_g = p.in_channels / p.groups, cout_g = p.out_channels / p.groups;
  const std::int64_t kdim = cin_g * g.k_size(), ncols = g.out_size();
  PackedConvWeights own;
  if (!packed) {
    own = pack_conv_weights(p, w);
    packed = &own;
  }
  check_packed(p, *packed, cout_g, kdim);
  const std::vector<PackedA>& weights = packed->groups;

  // A padded 2-D input past kConvPaddedBandBytes is padded a band of output rows at a time, each
  // band's GEMM run before the next is padded: the lent buffer stays bounded (ISNet's first 3x3
  // convs at 1024x1024 padded 135 MB whole). Every output sums the same products in the same order.
  const std::size_t r = p.in_spatial.size(), lead = 3 - r;
  const std::int64_t pe_h = r >= 2 ? p.pads_end[1 - lead] : 0, pe_w = p.pads_end[r - 1];
  const std::int64_t row_len = g.in[2] + g.pb[2] + pe_w, padded_rows = g.in[1] + g.pb[1] + pe_h;
  const std::int64_t planes = p.batch * p.in_channels;
  const bool padded_any = g.pb[1] != 0 || g.pb[2] != 0 || pe_h != 0 || pe_w != 0;
  const std::int64_t band_rows_in =
      kConvPaddedBandBytes / std::int64_t(sizeof(float)) / std::max<std::int64_t>(1, planes * row_len);
  const std::int64_t reach = (g.k[1] - 1) * g.d[1] + 1;  // input rows one output row reads
  if (padded_any && r <= 2 && planes * padded_rows * row_len * std::int64_t(sizeof(float)) > kConvPaddedBandBytes &&
      band_rows_in >= reach && g.out[1] > 1) {
    const std::int64_t band = std::max<std::int64_t>(1, (band_rows_in - reach) / g.s[1] + 1);
    for (std::int64_t oh0 = 0; oh0 < g.out[1]; oh0 += band) {
      const std::int64_t rows_out = std::min(band, g.out[1] - oh0);
      Geom gb = g;
      gb.out[1] = rows_out;
      const PaddedInput in = pad_band(g, p, x, row_len, oh0 * g.s[1], (rows_out - 1) * g.s[1] + reach, scratch);
      conv_gemm_columns(p, gb, in, weights, bias, y + oh0 * g.out[2], ncols);
    }
    return;
  }
  const PaddedInput padded = pad_input(g, p, x, scratch);
  conv_gemm_columns(p, g, padded, weights, bias, y, ncols);
}

}  // namespace

ConvGeometry3 conv_geometry3(const ConvParams& p) {
  ConvGeometry3 g;
  const std::size_t r = p.in_spatial.size(), lead = 3 - r;
  for (std::size_t i = 0; i < 3; ++i) {
    const bool real = i >= lead;
    const std::size_t j = real ? i - lead : 0;
    g.in[i] = real ? p.in_spatial[j] : 1;
    g.k[i] = real ? p.kernel[j] : 1;
    g.s[i] = real ? p.strides[j] : 1;
    g.d[i] = real ? p.dilations[j] : 1;
    g.pb[i] = real ? p.pads_begin[j] : 0;
    g.out[i] = real ? p.out_spatial[j] : 1;
  }
  return g;
}

std::vector<std::int64_t> conv_output_spatial(const ConvParams& p) {
  std::vector<std::int64_t> out(p.in_spatial.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::int64_t span =
        p.in_spatial[i] + p.pads_begin[i] + p.pads_end[i] - p.dilations[i] * (p.kernel[i] - 1) - 1;
    out[i] = span < 0 ? 0 : span / p.strides[i] + 1;
  }
  return out;
}

std::vector<std::int64_t> conv_transpose_output_spatial(const ConvParams& p) {
  std::vector<std::int64_t> out(p.in_spatial.size());
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] =
        p.strides[i] * (p.in_spatial[i] - 1) + p.dilations[i] * (p.kernel[i] - 1) + 1 - p.pads_begin[i] - p.pads_end[i];
  return out;
}

std::int64_t conv_input_size(const ConvParams& p) { return p.batch * p.in_channels * product(p.in_spatial); }
std::int64_t conv_output_size(const ConvParams& p) { return p.batch * p.out_channels * product(p.out_spatial); }
std::int64_t conv_weight_size(const ConvParams& p) {
  return p.out_channels * (p.in_channels / p.groups) * product(p.kernel);
}
std::int64_t conv_transpose_weight_size(const ConvParams& p) {
  return p.in_channels * (p.out_channels / p.groups) * product(p.kernel);
}
double conv_flops(const ConvParams& p) {
  return 2.0 * double(p.batch) * double(p.out_channels) * double(product(p.out_spatial)) *
         double(p.in_channels / p.groups) * double(product(p.kernel));
}

PackedConvWeights pack_conv_weights(const ConvParams& p, const float* w, PanelStorage storage) {
  PackedConvWeights packed;
  if (uses_depthwise(p)) return packed;
  const std::int64_t cin_g = p.in_channels / p.groups, cout_g = p.out_channels / p.groups;
  const std::int64_t kdim = cin_g * product(p.kernel);
  packed.groups.reserve(std::size_t(p.groups));
  for (std::int64_t grp = 0; grp < p.groups; ++grp)
    packed.groups.emplace_back(false, cout_g, kdim, w + grp * cout_g * kdim, kdim, storage);
  return packed;
}

float* ConvScratch::get(std::size_t n) {
  if (n > size) data = alloc_aligned_floats(n), size = n;
  return data.get();
}

void conv(const ConvParams& p, const float* x, const float* w, const float* bias, float* y,
          const PackedConvWeights* packed, ConvScratch* scratch) {
  validate(p, false);
  const Geom g = geom3(p);
  if (p.batch == 0 || g.out_size() == 0) return;
  if (uses_depthwise(p)) return conv_depthwise(p, g, x, w, bias, y);
  if (scratch) return conv_gemm(p, g, x, w, bias, y, packed && !packed->groups.empty() ? packed : nullptr, *scratch);
  const Lent<ConvScratch> lent;
  conv_gemm(p, g, x, w, bias, y, packed && !packed->groups.empty() ? packed : nullptr, *lent);
}

void conv_reference(const ConvParams& p, const float* x, const float* w, const float* bias, float* y) {
  validate(p, false);
  const Geom g = geom3(p);
  const std::int64_t cin_g = p.in_channels / p.groups, cout_g = p.out_channels / p.groups;
  const std::int64_t in_size = g.in_size(), out_size = g.out_size(), kprod = g.k_size();
  for (std::int64_t n = 0; n < p.batch; ++n)
    for (std::int64_t oc = 0; oc < p.out_channels; ++oc) {
      const std::int64_t grp = oc / cout_g;
      for (std::int64_t o = 0; o < out_size; ++o) {
        const std::int64_t od = o / (g.out[1] * g.out[2]), oh = (o / g.out[2]) % g.out[1], ow = o % g.out[2];
        float acc = 0.0f;
        for (std::int64_t ci = 0; ci < cin_g; ++ci) {
          const float* xc = x + (n * p.in_channels + grp * cin_g + ci) * in_size;
          const float* wk = w + (oc * cin_g + ci) * kprod;
          for (std::int64_t kd = 0; kd < g.k[0]; ++kd)
            for (std::int64_t kh = 0; kh < g.k[1]; ++kh)
              for (std::int64_t kw = 0; kw < g.k[2]; ++kw) {
                const std::int64_t id = od * g.s[0] + kd * g.d[0] - g.pb[0];
                const std::int64_t ih = oh * g.s[1] + kh * g.d[1] - g.pb[1];
                const std::int64_t iw = ow * g.s[2] + kw * g.d[2] - g.pb[2];
                const bool inside = id >= 0 && id < g.in[0] && ih >= 0 && ih < g.in[1] && iw >= 0 && iw < g.in[2];
                const float v = inside ? xc[(id * g.in[1] + ih) * g.in[2] + iw] : 0.0f;
                acc += v * wk[(kd * g.k[1] + kh) * g.k[2] + kw];
              }
        }
        y[(n * p.out_channels + oc) * out_size + o] = acc + (bias ? bias[oc] : 0.0f);
      }
    }
}

PackedConvWeights pack_conv_transpose_weights(const ConvParams& p, const float* w, PanelStorage storage) {
  PackedConvWeights packed;
  const std::int64_t cin_g = p.in_channels / p.groups, rows = p.out_channels / p.groups * product(p.kernel);
  packed.groups.reserve(std::size_t(p.groups));
  for (std::int64_t grp = 0; grp < p.groups; ++grp)
    packed.groups.emplace_back(true, rows, cin_g, w + grp * cin_g * rows, rows, storage);
  return packed;
}

void conv_transpose(const ConvParams& p, const float* x, const float* w, const float* bias, float* y,
                    const PackedConvWeights* packed, ConvScratch* scratch) {
  validate(p, true);
  const Geom g = geom3(p);
  const std::int64_t cin_g = p.in_channels / p.groups, cout_g = p.out_channels / p.groups;
  const std::int64_t in_size = g.in_size(), out_size = g.out_size(), kprod = g.k_size();
  if (p.batch == 0 || out_size == 0) return;
  if (packed) check_packed(p, *packed, cout_g * kprod, cin_g);
  // cols[(oc, k), input position] = sum over input channels of w * x: one GEMM per (image, group),
  // then each output channel gathers its kprod rows (col2im), one channel per task.
  const std::int64_t rows = cout_g * kprod;
  std::optional<Lent<ConvScratch>> lent;
  if (!scratch) scratch = lent.emplace().get();
  float* cols = scratch->get(std::size_t(rows * in_size));
  for (std::int64_t n = 0; n < p.batch; ++n)
    for (std::int64_t grp = 0; grp < p.groups; ++grp) {
      const GemmShape shape{true, false, rows, in_size, cin_g, rows, in_size, in_size};
      sgemm(shape, 1.0f, w + grp * cin_g * rows, x + (n * p.in_channels + grp * cin_g) * in_size, 0.0f, cols,
            packed ? &packed->groups[std::size_t(grp)] : nullptr);
      tbb::parallel_for(std::int64_t(0), cout_g, [&](std::int64_t oc) {
        float* yc = y + (n * p.out_channels + grp * cout_g + oc) * out_size;
        std::fill(yc, yc + out_size, bias ? bias[grp * cout_g + oc] : 0.0f);
        for (std::int64_t kd = 0; kd < g.k[0]; ++kd)
          for (std::int64_t kh = 0; kh < g.k[1]; ++kh)
            for (std::int64_t kw = 0; kw < g.k[2]; ++kw) {
              const float* crow = cols + (oc * kprod + (kd * g.k[1] + kh) * g.k[2] + kw) * in_size;
              const std::int64_t off = kw * g.d[2] - g.pb[2], s = g.s[2];
              // Input columns whose output lands inside the row: 0 <= iw * s + off < out.
              const std::int64_t lo = off >= 0 ? 0 : (-off + s - 1) / s;
              const std::int64_t hi = std::min(g.in[2], g.out[2] - off <= 0 ? 0 : (g.out[2] - off + s - 1) / s);
              for (std::int64_t id = 0; id < g.in[0]; ++id) {
                const std::int64_t od = id * g.s[0] + kd * g.d[0] - g.pb[0];
                if (od < 0 || od >= g.out[0]) continue;
                for (std::int64_t ih = 0; ih < g.in[1]; ++ih) {
                  const std::int64_t oh = ih * g.s[1] + kh * g.d[1] - g.pb[1];
                  if (oh < 0 || oh >= g.out[1]) continue;
                  const float* cr = crow + (id * g.in[1] + ih) * g.in[2];
                  float* yr = yc + (od * g.out[1] + oh) * g.out[2];
                  for (std::int64_t iw = lo; iw < hi; ++iw) yr[iw * s + off] += cr[iw];
                }
              }
            }
      });
    }
}

void conv_transpose_reference(const ConvParams& p, const float* x, const float* w, const float* bias, float* y) {
  validate(p, true);
  const Geom g = geom3(p);
  const std::int64_t cin_g = p.in_channels / p.groups, cout_g = p.out_channels / p.groups;
  const std::int64_t in_size = g.in_size(), out_size = g.out_size(), kprod = g.k_size();
  for (std::int64_t n = 0; n < p.batch; ++n)
    for (std::int64_t oc = 0; oc < p.out_channels; ++oc)
      std::fill(y + (n * p.out_channels + oc) * out_size, y + (n * p.out_channels + oc + 1) * out_size,
                bias ? bias[oc] : 0.0f);
  for (std::int64_t n = 0; n < p.batch; ++n)
    for (std::int64_t ic = 0; ic < p.in_channels; ++ic) {
      const std::int64_t grp = ic / cin_g;
      for (std::int64_t i = 0; i < in_size; ++i) {
        const std::int64_t id = i / (g.in[1] * g.in[2]), ih = (i / g.in[2]) % g.in[1], iw = i % g.in[2];
        const float xv = x[(n * p.in_channels + ic) * in_size + i];
        for (std::int64_t oc = 0; oc < cout_g; ++oc)
          for (std::int64_t kd = 0; kd < g.k[0]; ++kd)
            for (std::int64_t kh = 0; kh < g.k[1]; ++kh)
              for (std::int64_t kw = 0; kw < g.k[2]; ++kw) {
                const std::int64_t od = id * g.s[0] + kd * g.d[0] - g.pb[0];
                const std::int64_t oh = ih * g.s[1] + kh * g.d[1] - g.pb[1];
                const std::int64_t ow = iw * g.s[2] + kw * g.d[2] - g.pb[2];
                if (od < 0 || od >= g.out[0] || oh < 0 || oh >= g.out[1] || ow < 0 || ow >= g.out[2]) continue;
                y[(n * p.out_channels + grp * cout_g + oc) * out_size + (od * g.out[1] + oh) * g.out[2] + ow] +=
                    xv * w[((ic * cout_g + oc) * kprod) + (kd * g.k[1] + kh) * g.k[2] + kw];
              }
      }
    }
}

}  // namespace qeval::kernels
