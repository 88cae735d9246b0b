// int8 convolution: im2col + int8 GEMM per group, the depthwise path (kernels/int8_depthwise), the
// naive definition.
#include "kernels/int8_conv.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "kernels/int8_depthwise.h"
#include "kernels/scratch.h"

namespace qeval::kernels {
namespace {

using Geometry3 = ConvGeometry3;

// An int8 buffer for Lent (a padded input that must live across nested parallel loops).
struct Int8Buffer {
  std::vector<std::int8_t> values;
  std::size_t capacity_bytes() const { return values.capacity(); }
};

Geometry3 geometry(const ConvParams& p) {
  if (p.in_spatial.size() < 1 || p.in_spatial.size() > 3 || p.kernel.size() != p.in_spatial.size() ||
      p.out_spatial.size() != p.in_spatial.size())
    throw std::invalid_argument("int8_conv: 1 to 3 spatial dimensions expected");
  return conv_geometry3(p);
}

// Copies n bytes with fixed-size moves, the last one overlapping the one before: im2col copies
// many short runs (an output row's worth), and a libc call or a byte loop per run cost more than
// the copy.
inline void copy_bytes(std::int8_t* dst, const std::int8_t* src, std::int64_t n) {
  if (n >= 32) {
    for (std::int64_t i = 0; i + 32 < n; i += 32) std::memcpy(dst + i, src + i, 32);
    std::memcpy(dst + n - 32, src + n - 32, 32);
  } else if (n >= 16) {
    std::memcpy(dst, src, 16);
    std::memcpy(dst + n - 16, src + n - 16, 16);
  } else if (n >= 8) {
    std::memcpy(dst, src, 8);
    std::memcpy(dst + n - 8, src + n - 8, 8);
  } else if (n >= 4) {
    std::memcpy(dst, src, 4);
    std::memcpy(dst + n - 4, src + n - 4, 4);
  } else {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = src[i];
  }
}

// A channel group's input with its padding materialised (pad_value around each plane, as far as
// any tap reaches), so that im2col copies every run without clipping it. Without padding it is the
// input itself.
struct PaddedGroup {
  const std::int8_t* data = nullptr;
  std::int64_t dims[3] = {1, 1, 1};
  std::int64_t plane() const { return dims[0] * dims[1] * dims[2]; }
};

PaddedGroup pad_group(const Geometry3& g, const std::int8_t* xg, std::int64_t cg, std::int8_t pad_value,
                      std::vector<std::int8_t>& storage) {
  PaddedGroup pg;
  bool any = false;
  for (int i = 0; i < 3; ++i) {
    pg.dims[i] = std::max(g.pb[i] + g.in[i], (g.out[i] - 1) * g.s[i] + (g.k[i] - 1) * g.d[i] + 1);
    any |= g.pb[i] != 0 || pg.dims[i] != g.in[i];
  }
  if (!any) {
    pg.data = xg;
    return pg;
  }
  const std::int64_t wp = pg.dims[2], left = g.pb[2], right = wp - left - g.in[2];
  storage.resize(std::size_t(cg * pg.plane()));
  std::int8_t* dst = storage.data();
  const unsigned char pad = static_cast<unsigned char>(pad_value);
  for (std::int64_t c = 0; c < cg; ++c)
    for (std::int64_t z = 0; z < pg.dims[0]; ++z)
      for (std::int64_t y = 0; y < pg.dims[1]; ++y, dst += wp) {
        const std::int64_t id = z - g.pb[0], ih = y - g.pb[1];
        if (id < 0 || id >= g.in[0] || ih < 0 || ih >= g.in[1]) {
          std::memset(dst, pad, std::size_t(wp));
          continue;
        }
        std::memset(dst, pad, std::size_t(left));
        std::memcpy(dst + left, xg + ((c * g.in[0] + id) * g.in[1] + ih) * g.in[2], std::size_t(g.in[2]));
        std::memset(dst + left + g.in[2], pad, std::size_t(right));
      }
  pg.data = storage.data();
  return pg;
}

// A run of im2col columns (output positions) along one output row: they read one padded input row
// at stride s. Where it starts in a task's rows, its length, and where its first column's (0, 0, 0)
// tap sits in the padded plane.
struct Im2colRun {
  std::int64_t offset, len, src;
};

// The runs of columns [j0, j1), the same for every im2col row.
void im2col_runs(const Geometry3& g, const PaddedGroup& pg, std::int64_t j0, std::int64_t j1,
                 std::vector<Im2colRun>& runs) {
  runs.clear();
  std::int64_t ow = j0 % g.out[2], oh = (j0 / g.out[2]) % g.out[1], od = j0 / (g.out[1] * g.out[2]);
  for (std::int64_t j = j0; j < j1;) {
    const std::int64_t len = std::min(j1 - j, g.out[2] - ow);
    runs.push_back({j - j0, len, ((od * g.s[0]) * pg.dims[1] + oh * g.s[1]) * pg.dims[2] + ow * g.s[2]});
    j += len;
    ow = 0;
    if (++oh == g.out[1]) {
      oh = 0;
      ++od;
    }
  }
}

struct Im2colTap {
  std::int64_t c, kd, kh, kw;
};

// Row (c, kd, kh, kw) of the im2col matrix of one channel group over a task's runs, into dst.
void im2col_row(const Geometry3& g, const PaddedGroup& pg, const Im2colTap& tap, const std::vector<Im2colRun>& runs,
                std::int8_t* dst) {
  const std::int8_t* base =
      pg.data + tap.c * pg.plane() + (tap.kd * g.d[0] * pg.dims[1] + tap.kh * g.d[1]) * pg.dims[2] + tap.kw * g.d[2];
  const std::int64_t s = g.s[2];
  if (s == 1) {
    for (const Im2colRun& run : runs) copy_bytes(dst + run.offset, base + run.src, run.len);
  } else {
    for (const Im2colRun& run : runs) {
      const std::int8_t* src = base + run.src;
      std::int8_t* d = dst + run.offset;
      for (std::int64_t u = 0; u < run.len; ++u) d[u] = src[u * s];
    }
  }
}

// Columns [j_begin, j_end) of the im2col matrix of one channel group ([cg * kernel, out
// positions]; the group's input padded once by the caller) written straight into the int8 GEMM's
// packed B layout with its column sums, every byte of it (out was reset to k x (j_end - j_begin)
// without clearing): per k group four im2col rows over a task's columns (plain copies of runs),
// interleaved into the 4-byte lanes of each panel (a fixed-length loop GCC vectorises). Tasks are
// ranges of panels.
void pack_im2col(const Geometry3& g, const PaddedGroup& padded, std::int64_t k, std::int64_t j_begin,
                 std::int64_t j_end, PackedInt8B& out) {
  const std::int64_t n = j_end - j_begin;
  const std::int64_t panels = (n + kInt8NR - 1) / kInt8NR;
  // ~16 KB of rows per task (4 rows of 4096 columns at most).
  const std::int64_t panels_per_task = std::max<std::int64_t>(1, 4096 / kInt8NR);
  const std::int64_t tasks = (panels + panels_per_task - 1) / panels_per_task;
  const bool parallel = tasks > 1 && k * n >= (std::int64_t(1) << 16);
  auto task = [&](std::int64_t p0, std::int64_t p1) {
    const std::int64_t j0 = p0 * kInt8NR, j1 = std::min(n, p1 * kInt8NR), width = (p1 - p0) * kInt8NR;  // in the block
    thread_local std::vector<std::int8_t> rows_buffer;
    thread_local std::vector<std::int32_t> sums_buffer;
    rows_buffer.assign(std::size_t(4 * width), 0);  // columns past n stay 0
    sums_buffer.assign(std::size_t(width), 0);
    std::int8_t* rows[4] = {rows_buffer.data(), rows_buffer.data() + width, rows_buffer.data() + 2 * width,
                            rows_buffer.data() + 3 * width};
    std::int32_t* sums = sums_buffer.data();
    thread_local std::vector<Im2colRun> runs;
    im2col_runs(g, padded, j_begin + j0, j_begin + j1, runs);
    Im2colTap tap{0, 0, 0, 0};  // row q's tap, advanced row by row (no divisions per row)
    for (std::int64_t q0 = 0; q0 < k; q0 += 4) {
      for (int r = 0; r < 4; ++r) {
        if (q0 + r < k) {
          im2col_row(g, padded, tap, runs, rows[r]);
          if (++tap.kw == g.k[2]) {
            tap.kw = 0;
            if (++tap.kh == g.k[1]) {
              tap.kh = 0;
              if (++tap.kd == g.k[0]) {
                tap.kd = 0;
                ++tap.c;
              }
            }
          }
        } else {
          std::memset(rows[r], 0, std::size_t(width));  // k past the end: zero rows
        }
      }
      for (std::int64_t pi = p0; pi < p1; ++pi) {
        std::uint32_t* __restrict d =
            reinterpret_cast<std::uint32_t*>(out.mutable_panel(pi * kInt8NR)) + (q0 / 4) * kInt8NR;
        const std::int64_t o = (pi - p0) * kInt8NR;
        const std::int8_t* __restrict r0 = rows[0] + o;
        const std::int8_t* __restrict r1 = rows[1] + o;
        const std::int8_t* __restrict r2 = rows[2] + o;
        const std::int8_t* __restrict r3 = rows[3] + o;
        std::int32_t* __restrict sm = sums + o;
        for (int t = 0; t < kInt8NR; ++t) {
          d[t] = std::uint32_t(std::uint8_t(r0[t])) | std::uint32_t(std::uint8_t(r1[t])) << 8 |
                 std::uint32_t(std::uint8_t(r2[t])) << 16 | std::uint32_t(std::uint8_t(r3[t])) << 24;
          sm[t] += std::int32_t(r0[t]) + std::int32_t(r1[t]) + std::int32_t(r2[t]) + std::int32_t(r3[t]);
        }
      }
    }
    std::copy_n(sums, width, out.mutable_col_sums() + j0);
  };
  auto run = [&](std::int64_t t) { task(t * panels_per_task, std::min(panels, (t + 1) * panels_per_task)); };
  if (!parallel) {
    for (std::int64_t t = 0; t < tasks; ++t) run(t);
  } else {
    tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, tasks), [&](const auto& r) {
      for (std::int64_t t = r.begin(); t < r.end(); ++t) run(t);
    });
  }
}

}  // namespace

PackedInt8ConvWeights::PackedInt8ConvWeights(const ConvParams& p, const std::int8_t* w) {
  const std::int64_t cg = p.in_channels / p.groups, og = p.out_channels / p.groups;
  std::int64_t kprod = 1;
  for (auto k : p.kernel) kprod *= k;
  const std::int64_t k = cg * kprod;
  depthwise_ = int8_conv_is_depthwise(p);
  sums_.resize(std::size_t(p.out_channels));
  for (std::int64_t oc = 0; oc < p.out_channels; ++oc) {
    std::int32_t s = 0;
    for (std::int64_t q = 0; q < k; ++q) s += w[oc * k + q];
    sums_[std::size_t(oc)] = s;
  }
  if (depthwise_) {
    raw_.assign(w, w + p.out_channels * k);
    return;
  }
  groups_.reserve(std::size_t(p.groups));
  for (std::int64_t gi = 0; gi < p.groups; ++gi) groups_.emplace_back(og, k, w + gi * og * k, k);
}

std::int64_t int8_conv_block_columns(std::int64_t k, std::int64_t columns) {
  const std::int64_t bytes_per_column = (k + 3) / 4 * 4;
  // Whole kNcCols-wide column blocks of the GEMM (256 columns), so that its tiles are the same.
  const std::int64_t block = std::max<std::int64_t>(1, kInt8ConvBlockBytes / bytes_per_column / 256) * 256;
  return std::min(block, columns);
}

namespace {

// The epilogue for columns [j0, ...) of a larger B (column pointers advanced by j0).
Int8Epilogue columns_from(Int8Epilogue e, std::int64_t j0) {
  if (e.col_add) e.col_add += j0;
  if (e.col_scale) e.col_scale += j0;
  if (e.col_bias) e.col_bias += j0;
  return e;
}

// int8_conv with or without the epilogue e (then y holds int32 sums until they become floats).
void conv_impl(const ConvParams& p, const std::int8_t* x, std::int8_t pad_value, const PackedInt8ConvWeights& w,
               std::int32_t* y, std::int32_t* window_sums, Int8GemmPath path, PackedInt8B* scratch,
               const Int8Epilogue* e) {
  const Geometry3 g = geometry(p);
  const std::int64_t cg = p.in_channels / p.groups, og = p.out_channels / p.groups;
  const std::int64_t kprod = g.k_size(), in_size = g.in_size(), out_size = g.out_size();
  const std::int64_t k = cg * kprod;

  if (w.depthwise()) {
    int8_depthwise_conv(p, x, pad_value, w.raw(), w.channel_sums(), y, window_sums, path == Int8GemmPath::kAvx512Vnni);
    if (e)
      for (std::int64_t b = 0; b < p.batch; ++b)
        int8_epilogue(y + b * p.out_channels * out_size, p.out_channels, out_size, out_size, *e);
    return;
  }

  // A 1x1 conv with stride 1 and no padding (begin or end: then out == in) reads x as it is: B is
  // x's [cg, positions] block, packed as any matrix; otherwise im2col packs straight into B. Either
  // way B holds a block of at most kInt8ConvBlockBytes of columns at a time (int32 sums are exact:
  // the same result whatever the split), so the lent B stays small however large the image.
  const bool direct = kprod == 1 && g.pb[0] == 0 && g.pb[1] == 0 && g.pb[2] == 0 && g.s[0] == 1 && g.s[1] == 1 &&
                      g.s[2] == 1 && out_size == in_size;
  const std::int64_t block = int8_conv_block_columns(k, out_size);
  std::optional<Lent<PackedInt8B>> lent;
  if (!scratch) scratch = lent.emplace(0, 0).get();
  // The padded group lives across the block's GEMMs, which wait on other tasks: a lent buffer, not
  // a thread's (a task run meanwhile could pad another group into it).
  std::optional<Lent<Int8Buffer>> padded_storage;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t gi = 0; gi < p.groups; ++gi) {
      const std::int8_t* xg = x + (b * p.in_channels + gi * cg) * in_size;
      PaddedGroup padded;
      if (!direct) {
        if (!padded_storage) padded_storage.emplace();
        padded = pad_group(g, xg, cg, pad_value, (*padded_storage)->values);
      }
      std::int32_t* yg = y + (b * p.out_channels + gi * og) * out_size;
      for (std::int64_t j0 = 0; j0 < out_size; j0 += block) {
        const std::int64_t j1 = std::min(out_size, j0 + block);
        PackedInt8B* pb = scratch;
        if (direct) {
          pb->pack(k, j1 - j0, xg + j0, out_size);
        } else {
          pb->reset(k, j1 - j0, false);  // pack_im2col writes every byte
          pack_im2col(g, padded, k, j0, j1, *pb);
        }
        if (e)
          int8_gemm(w.group(gi), *pb, reinterpret_cast<float*>(yg + j0), out_size,
                    columns_from(e->rows_from(gi * og), j0), path);
        else int8_gemm(w.group(gi), *pb, yg + j0, out_size, path);
        if (window_sums) std::copy_n(pb->col_sums(), j1 - j0, window_sums + (b * p.groups + gi) * out_size + j0);
      }
    }
}

}  // namespace

void int8_conv(const ConvParams& p, const std::int8_t* x, std::int8_t pad_value, const PackedInt8ConvWeights& w,
               std::int32_t* y, std::int32_t* window_sums, Int8GemmPath path, PackedInt8B* scratch) {
  conv_impl(p, x, pad_value, w, y, window_sums, path, scratch, nullptr);
}

void int8_conv(const ConvParams& p, const std::int8_t* x, std::int8_t pad_value, const PackedInt8ConvWeights& w,
               float* y, const Int8Epilogue& e, Int8GemmPath path, PackedInt8B* scratch) {
  conv_impl(p, x, pad_value, w, reinterpret_cast<std::int32_t*>(y), nullptr, path, scratch, &e);
}

void int8_conv_reference(const ConvParams& p, const std::int8_t* x, std::int8_t pad_value, const std::int8_t* w,
                         std::int32_t* y) {
  const Geometry3 g = geometry(p);
  const std::int64_t cg = p.in_channels / p.groups, og = p.out_channels / p.groups;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t oc = 0; oc < p.out_channels; ++oc) {
      const std::int64_t gi = oc / og;
      for (std::int64_t od = 0; od < g.out[0]; ++od)
        for (std::int64_t oh = 0; oh < g.out[1]; ++oh)
          for (std::int64_t ow = 0; ow < g.out[2]; ++ow) {
            std::int32_t acc = 0;
            for (std::int64_t c = 0; c < cg; ++c)
              for (std::int64_t kd = 0; kd < g.k[0]; ++kd)
                for (std::int64_t kh = 0; kh < g.k[1]; ++kh)
                  for (std::int64_t kw = 0; kw < g.k[2]; ++kw) {
                    const std::int64_t id = od * g.s[0] - g.pb[0] + kd * g.d[0];
                    const std::int64_t ih = oh * g.s[1] - g.pb[1] + kh * g.d[1];
                    const std::int64_t iw = ow * g.s[2] - g.pb[2] + kw * g.d[2];
                    const bool in = id >= 0 && id < g.in[0] && ih >= 0 && ih < g.in[1] && iw >= 0 && iw < g.in[2];
                    const std::int32_t v =
                        in ? x[((b * p.in_channels + gi * cg + c) * g.in[0] + id) * g.in[1] * g.in[2] + ih * g.in[2] +
                               iw]
                           : pad_value;
                    acc += v * w[((oc * cg + c) * g.k[0] + kd) * g.k[1] * g.k[2] + kh * g.k[2] + kw];
                  }
            y[((b * p.out_channels + oc) * g.out[0] + od) * g.out[1] * g.out[2] + oh * g.out[2] + ow] = acc;
          }
    }
}

}  // namespace qeval::kernels
