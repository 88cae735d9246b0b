// int8 convolution: im2col + int8 GEMM per group, the depthwise path (kernels/int8_depthwise), the
// naive definition.
#include "kernels/int8_conv.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "kernels/int8_depthwise.h"

namespace qeval::kernels {
namespace {

using Geometry3 = ConvGeometry3;

Geometry3 geometry(const ConvParams& p) {
  if (p.in_spatial.size() < 1 || p.in_spatial.size() > 3 || p.kernel.size() != p.in_spatial.size() ||
      p.out_spatial.size() != p.in_spatial.size())
    throw std::invalid_argument("int8_conv: 1 to 3 spatial dimensions expected");
  return conv_geometry3(p);
}

// Row q of the im2col matrix of one channel group, for the nr output positions starting at
// (od, oh, ow): the inputs they read, or pad_value. Runs along an output row share an input row;
// an in-bounds run with stride 1 is a memcpy.
void im2col_row_segment(const Geometry3& g, const std::int8_t* xg, std::int64_t q, std::int64_t od,
                        std::int64_t oh, std::int64_t ow, std::int64_t nr, std::int8_t pad_value, std::int8_t* dst) {
  const std::int64_t kprod = g.k_size();
  const std::int64_t c = q / kprod, kk = q % kprod;
  const std::int64_t kd = kk / (g.k[1] * g.k[2]), kh = (kk / g.k[2]) % g.k[1], kw = kk % g.k[2];
  const std::int8_t* xc = xg + c * g.in_size();
  for (std::int64_t t = 0; t < nr;) {
    const std::int64_t run = std::min(nr - t, g.out[2] - ow);
    const std::int64_t id = od * g.s[0] - g.pb[0] + kd * g.d[0];
    const std::int64_t ih = oh * g.s[1] - g.pb[1] + kh * g.d[1];
    if (id < 0 || id >= g.in[0] || ih < 0 || ih >= g.in[1]) {
      std::memset(dst + t, static_cast<unsigned char>(pad_value), std::size_t(run));
    } else {
      const std::int8_t* row = xc + (id * g.in[1] + ih) * g.in[2];
      const std::int64_t base = ow * g.s[2] - g.pb[2] + kw * g.d[2];
      if (g.s[2] == 1 && base >= 0 && base + run <= g.in[2]) {
        std::memcpy(dst + t, row + base, std::size_t(run));
      } else {
        for (std::int64_t u = 0; u < run; ++u) {
          const std::int64_t iw = base + u * g.s[2];
          dst[t + u] = iw >= 0 && iw < g.in[2] ? row[iw] : pad_value;
        }
      }
    }
    t += run;
    ow = 0;
    if (++oh == g.out[1]) {
      oh = 0;
      ++od;
    }
  }
}

// The im2col matrix of one channel group ([cg * kernel, out positions]) written straight into the
// int8 GEMM's packed B layout with its column sums: per panel, four im2col rows (one k group) are
// extracted and interleaved into 4-byte lanes.
void pack_im2col(const Geometry3& g, const std::int8_t* xg, std::int64_t cg, std::int8_t pad_value,
                 PackedInt8B& out) {
  const std::int64_t n = g.out_size(), k = cg * g.k_size();
  const std::int64_t panels = (n + kInt8NR - 1) / kInt8NR;
  auto panel = [&](std::int64_t pi) {
    const std::int64_t j0 = pi * kInt8NR, nr = std::min<std::int64_t>(kInt8NR, n - j0);
    const std::int64_t od = j0 / (g.out[1] * g.out[2]), oh = (j0 / g.out[2]) % g.out[1], ow = j0 % g.out[2];
    std::uint32_t* dst = reinterpret_cast<std::uint32_t*>(out.mutable_panel(j0));
    std::int32_t sums[kInt8NR] = {};
    alignas(64) std::int8_t rows[4][kInt8NR];
    for (std::int64_t q0 = 0; q0 < k; q0 += 4) {
      for (int r = 0; r < 4; ++r) {
        if (q0 + r < k) im2col_row_segment(g, xg, q0 + r, od, oh, ow, nr, pad_value, rows[r]);
        else std::memset(rows[r], 0, sizeof rows[r]);
        if (nr < kInt8NR) std::memset(rows[r] + nr, 0, std::size_t(kInt8NR - nr));
      }
      std::uint32_t* d = dst + (q0 / 4) * kInt8NR;
      for (int t = 0; t < kInt8NR; ++t) {
        d[t] = std::uint32_t(std::uint8_t(rows[0][t])) | std::uint32_t(std::uint8_t(rows[1][t])) << 8 |
               std::uint32_t(std::uint8_t(rows[2][t])) << 16 | std::uint32_t(std::uint8_t(rows[3][t])) << 24;
        sums[t] += std::int32_t(rows[0][t]) + rows[1][t] + rows[2][t] + rows[3][t];
      }
    }
    std::copy_n(sums, kInt8NR, out.mutable_col_sums() + j0);
  };
  if (k * n < (std::int64_t(1) << 16)) {
    for (std::int64_t pi = 0; pi < panels; ++pi) panel(pi);
  } else {
    tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, panels), [&](const auto& r) {
      for (std::int64_t pi = r.begin(); pi < r.end(); ++pi) panel(pi);
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

void int8_conv(const ConvParams& p, const std::int8_t* x, std::int8_t pad_value, const PackedInt8ConvWeights& w,
               std::int32_t* y, std::int32_t* window_sums, Int8GemmPath path, PackedInt8B* scratch) {
  const Geometry3 g = geometry(p);
  const std::int64_t cg = p.in_channels / p.groups, og = p.out_channels / p.groups;
  const std::int64_t kprod = g.k_size(), in_size = g.in_size(), out_size = g.out_size();
  const std::int64_t k = cg * kprod;

  if (w.depthwise())
    return int8_depthwise_conv(p, x, pad_value, w.raw(), w.channel_sums(), y, window_sums,
                               path == Int8GemmPath::kAvx512Vnni);

  // A 1x1 conv with stride 1 and no padding (begin or end: then out == in) reads x as it is: B is
  // x's [cg, positions] block, packed as any matrix; otherwise im2col packs straight into B.
  const bool direct = kprod == 1 && g.pb[0] == 0 && g.pb[1] == 0 && g.pb[2] == 0 && g.s[0] == 1 &&
                      g.s[1] == 1 && g.s[2] == 1 && out_size == in_size;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t gi = 0; gi < p.groups; ++gi) {
      const std::int8_t* xg = x + (b * p.in_channels + gi * cg) * in_size;
      std::unique_ptr<PackedInt8B> own;
      PackedInt8B* pb = scratch;
      if (direct) {
        own = std::make_unique<PackedInt8B>(k, out_size, xg, out_size);
        pb = own.get();
      } else {
        if (pb)
          pb->reset(k, out_size);
        else
          pb = (own = std::make_unique<PackedInt8B>(k, out_size)).get();
        pack_im2col(g, xg, cg, pad_value, *pb);
      }
      int8_gemm(w.group(gi), *pb, y + (b * p.out_channels + gi * og) * out_size, out_size, path);
      if (window_sums) std::copy_n(pb->col_sums(), out_size, window_sums + (b * p.groups + gi) * out_size);
    }
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
                        in ? x[((b * p.in_channels + gi * cg + c) * g.in[0] + id) * g.in[1] * g.in[2] + ih * g.in[2] + iw]
                           : pad_value;
                    acc += v * w[((oc * cg + c) * g.k[0] + kd) * g.k[1] * g.k[2] + kh * g.k[2] + kw];
                  }
            y[((b * p.out_channels + oc) * g.out[0] + od) * g.out[1] * g.out[2] + oh * g.out[2] + ow] = acc;
          }
    }
}

}  // namespace qeval::kernels
