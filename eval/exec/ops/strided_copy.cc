// The strided copy behind Transpose, Slice, Expand and Tile (eval/exec/ops/tensor_common.h).
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "eval/exec/ops/tensor_common.h"

namespace qeval::eval::tensor_ops {

namespace {

// Drops unit dimensions and merges dimensions that are contiguous in the source, so the inner
// loop (a memcpy where the source is contiguous) runs as long as possible.
void simplify(StridedView& v) {
  Shape c;
  std::vector<std::int64_t> s;
  for (std::size_t d = 0; d < v.counts.size(); ++d) {
    if (v.counts[d] == 1) continue;
    if (!c.empty() && s.back() == v.strides[d] * v.counts[d]) {
      c.back() *= v.counts[d];
      s.back() = v.strides[d];
      continue;
    }
    c.push_back(v.counts[d]);
    s.push_back(v.strides[d]);
  }
  v.counts = std::move(c);
  v.strides = std::move(s);
}

// A contiguous run: runs of 16 to 64 bytes (attention heads of 4 to 16 floats moved by a
// Transpose) as two fixed-size moves that may overlap, instead of a libc call per run.
inline void copy_run(void* dst, const void* src, std::size_t bytes) {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  if (bytes >= 32 && bytes <= 64) {
    std::memcpy(d, s, 32);
    std::memcpy(d + bytes - 32, s + bytes - 32, 32);
  } else if (bytes >= 16 && bytes < 32) {
    std::memcpy(d, s, 16);
    std::memcpy(d + bytes - 16, s + bytes - 16, 16);
  } else {
    std::memcpy(d, s, bytes);
  }
}

template <class T>
void copy_rows(const T* src, T* dst, const StridedView& v) {
  const int r = int(v.counts.size());
  const std::int64_t n = v.counts.back(), is = v.strides.back();
  const std::int64_t rows = shape_numel(v.counts) / n;
  parallel_items(rows, n, [&](std::int64_t b, std::int64_t e) {
    std::vector<std::int64_t> idx(std::size_t(std::max(r - 1, 0)), 0);
    std::int64_t off = 0;
    for (std::int64_t rem = b, d = r - 2; d >= 0; --d) {
      idx[std::size_t(d)] = rem % v.counts[std::size_t(d)];
      rem /= v.counts[std::size_t(d)];
      off += idx[std::size_t(d)] * v.strides[std::size_t(d)];
    }
    for (std::int64_t row = b; row < e; ++row) {
      T* out = dst + row * n;
      const T* in = src + off;
      if (is == 1) copy_run(out, in, std::size_t(n) * sizeof(T));
      else if (is == 0) std::fill(out, out + n, *in);
      else
        for (std::int64_t j = 0; j < n; ++j) out[j] = in[j * is];
      for (int d = r - 2; d >= 0; --d) {
        const std::size_t du = std::size_t(d);
        off += v.strides[du];
        if (++idx[du] < v.counts[du]) break;
        off -= v.strides[du] * v.counts[du];
        idx[du] = 0;
      }
    }
  });
}

// Transpose-like views (the destination's inner dimension is strided in the source, and another
// dimension t is contiguous there): 64x64 tiles keep both sides in cache, and 8x8 blocks go
// through a local array the compiler keeps in registers, so power-of-two source strides (which
// map every column of a tile to one cache set) do not thrash L1.
template <class T>
void copy_tiled(const T* src, T* dst, const StridedView& v, int t) {
  constexpr std::int64_t kTile = 64, kBlock = 8;
  const int r = int(v.counts.size());
  const auto dst_st = dense_strides(v.counts);
  std::vector<std::int64_t> oc, os, od;  // the other dimensions: counts, source and dest strides
  for (int d = 0; d < r - 1; ++d)
    if (d != t) {
      oc.push_back(v.counts[std::size_t(d)]);
      os.push_back(v.strides[std::size_t(d)]);
      od.push_back(dst_st[std::size_t(d)]);
    }
  const std::int64_t nt = v.counts[std::size_t(t)], nc = v.counts.back(), sc = v.strides.back();
  const std::int64_t dt = dst_st[std::size_t(t)];
  const std::int64_t tblocks = (nt + kTile - 1) / kTile;
  const std::int64_t outer = shape_numel(oc);
  parallel_items(outer * tblocks, kTile * nc, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t task = b; task < e; ++task) {
      std::int64_t o = task / tblocks, so = 0, dof = 0;
      const std::int64_t i0 = (task % tblocks) * kTile, i1 = std::min(nt, i0 + kTile);
      for (int d = int(oc.size()) - 1; d >= 0; --d) {
        const std::int64_t k = o % oc[std::size_t(d)];
        o /= oc[std::size_t(d)];
        so += k * os[std::size_t(d)];
        dof += k * od[std::size_t(d)];
      }
      const T* in = src + so;
      T* out = dst + dof;
      for (std::int64_t c0 = 0; c0 < nc; c0 += kTile) {
        const std::int64_t c1 = std::min(nc, c0 + kTile);
        for (std::int64_t i = i0; i < i1; i += kBlock)
          for (std::int64_t c = c0; c < c1; c += kBlock) {
            if (i + kBlock <= i1 && c + kBlock <= c1) {
              T block[kBlock][kBlock];
              for (std::int64_t cc = 0; cc < kBlock; ++cc)
                for (std::int64_t ii = 0; ii < kBlock; ++ii) block[ii][cc] = in[(c + cc) * sc + i + ii];
              for (std::int64_t ii = 0; ii < kBlock; ++ii)
                for (std::int64_t cc = 0; cc < kBlock; ++cc) out[(i + ii) * dt + c + cc] = block[ii][cc];
            } else {
              for (std::int64_t ii = i; ii < std::min(i1, i + kBlock); ++ii)
                for (std::int64_t cc = c; cc < std::min(c1, c + kBlock); ++cc) out[ii * dt + cc] = in[cc * sc + ii];
            }
          }
      }
    }
  });
}

}  // namespace

void copy_view(const std::byte* src, std::byte* dst, std::size_t es, StridedView v) {
  if (shape_numel(v.counts) == 0) return;
  simplify(v);
  src += v.base * std::int64_t(es);
  if (v.counts.empty()) {
    std::memcpy(dst, src, es);
    return;
  }
  with_element_size(es, [&](auto tag) {
    using T = decltype(tag);
    const T* s = reinterpret_cast<const T*>(src);
    T* d = reinterpret_cast<T*>(dst);
    const int r = int(v.counts.size());
    int t = -1;
    for (int k = r - 2; k >= 0 && t < 0; --k)
      if (v.strides[std::size_t(k)] == 1) t = k;
    if (v.strides.back() != 1 && v.strides.back() != 0 && t >= 0 && v.counts[std::size_t(t)] >= 8 &&
        v.counts.back() >= 8)
      copy_tiled(s, d, v, t);
    else copy_rows(s, d, v);
  });
}

}  // namespace qeval::eval::tensor_ops
