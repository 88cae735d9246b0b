// int8 convolution: im2col + int8 GEMM per group, the depthwise path (kernels/int8_depthwise), the
// naive definition.
#include "kernels/int8_conv.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "kernels/int8_depthwise.h"
#include "kernels/scratch.h"
#include "kernels/threads.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512F__)
#include <immintrin.h>
#define QEVAL_INT8_CONV_AVX512 1
#if defined(__AVX512VBMI__)
#define QEVAL_INT8_CONV_VBMI 1
#endif
#endif

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
  const std::int64_t wp = pg.dims[2], left = g.pb[2], rows_in = g.in[0] * g.in[1];
  const std::int64_t plane = pg.plane(), width = g.in[2];
  storage.resize(std::size_t(cg * plane));
  std::int8_t* const out = storage.data();
  const unsigned char pad = static_cast<unsigned char>(pad_value);
  if (width >= 64) {
    // Long rows: each byte written once, the borders by memset.
    const std::int64_t right = wp - left - width;
    std::int8_t* dst = out;
    for (std::int64_t c = 0; c < cg; ++c)
      for (std::int64_t z = 0; z < pg.dims[0]; ++z)
        for (std::int64_t y = 0; y < pg.dims[1]; ++y, dst += wp) {
          const std::int64_t id = z - g.pb[0], ih = y - g.pb[1];
          if (id < 0 || id >= g.in[0] || ih < 0 || ih >= g.in[1]) {
            std::memset(dst, pad, std::size_t(wp));
            continue;
          }
          std::memset(dst, pad, std::size_t(left));
          std::memcpy(dst + left, xg + ((c * g.in[0] + id) * g.in[1] + ih) * width, std::size_t(width));
          std::memset(dst + left + width, pad, std::size_t(right));
        }
    pg.data = storage.data();
    return pg;
  }
  // Short rows: the whole group filled with the pad value by one memset, then the input rows
  // copied in with inline moves: tiny-sd's 16- and 8-byte rows cost three libc calls each when
  // every row's borders were set on their own (a quarter of the int8 conv's time outside the GEMM).
  std::memset(out, pad, storage.size());
  // Where input row (id, ih) starts in a padded plane.
  const std::int64_t first = (g.pb[0] * pg.dims[1] + g.pb[1]) * wp + left;
  for (std::int64_t c = 0; c < cg; ++c) {
    const std::int8_t* src = xg + c * rows_in * width;
    std::int8_t* dst = out + c * plane + first;
    for (std::int64_t id = 0; id < g.in[0]; ++id, dst += pg.dims[1] * wp)
      for (std::int64_t ih = 0; ih < g.in[1]; ++ih, src += width) copy_bytes(dst + ih * wp, src, width);
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

#if QEVAL_INT8_CONV_VBMI
// Up to 64 consecutive im2col columns whose sources lie within 128 bytes of one another in the
// padded plane: one vpermi2b over two (masked) 64-byte loads gathers them, wherever the row breaks
// and whatever the stride. Short output rows (tiny-sd's 16 and 8 positions) otherwise cost a run
// copy per 8 or 16 bytes.
struct Im2colChunk {
  alignas(64) std::uint8_t index[64];  // column t's byte: index[t] of the 128 loaded from src
  std::int64_t offset, src;            // the first column (within the task's rows) and its source
  int len, span;                       // columns; bytes loaded (last source - src + 1)
  __mmask64 load0, load1, store;       // the bytes of the two loads and of the store (from span, len)
};

// The chunks of a task's runs (the same for every im2col row: only the tap's base moves).
void im2col_chunks(const std::vector<Im2colRun>& runs, std::int64_t s, std::vector<Im2colChunk>& chunks) {
  chunks.clear();
  for (const Im2colRun& run : runs)
    for (std::int64_t u = 0; u < run.len; ++u) {
      const std::int64_t src = run.src + u * s;
      if (chunks.empty() || chunks.back().len == 64 || src - chunks.back().src >= 128) {
        chunks.emplace_back();
        Im2colChunk& c = chunks.back();
        c.offset = run.offset + u;
        c.src = src;
        c.len = 0;
      }
      Im2colChunk& c = chunks.back();
      c.index[c.len++] = std::uint8_t(src - c.src);
      c.span = int(src - c.src) + 1;
    }
  auto low_bits = [](int n) { return n >= 64 ? ~__mmask64(0) : n <= 0 ? __mmask64(0) : (__mmask64(1) << n) - 1; };
  for (Im2colChunk& c : chunks) {
    c.load0 = low_bits(c.span);
    c.load1 = low_bits(c.span - 64);
    c.store = low_bits(c.len);
  }
}

// Worth it where a chunk replaces two runs or more (output rows of at most ~32 columns); longer
// rows copy runs (PP-OCRv4 det's 40-column rows were slower chunked).
bool use_chunks(const std::vector<Im2colRun>& runs, const std::vector<Im2colChunk>& chunks) {
  return chunks.size() * 2 <= runs.size();
}

void im2col_row_chunks(const std::int8_t* base, const std::vector<Im2colChunk>& chunks, std::int8_t* dst) {
  for (const Im2colChunk& c : chunks) {
    const __m512i lo = _mm512_maskz_loadu_epi8(c.load0, base + c.src);
    const __m512i hi = _mm512_maskz_loadu_epi8(c.load1, base + c.src + 64);
    _mm512_mask_storeu_epi8(dst + c.offset, c.store, _mm512_permutex2var_epi8(lo, _mm512_load_si512(c.index), hi));
  }
}
#endif

// Where tap (c, kd, kh, kw) of the first output position sits in the padded group.
inline const std::int8_t* tap_base(const Geometry3& g, const PaddedGroup& pg, const Im2colTap& tap) {
  return pg.data + tap.c * pg.plane() + (tap.kd * g.d[0] * pg.dims[1] + tap.kh * g.d[1]) * pg.dims[2] + tap.kw * g.d[2];
}

// Row (c, kd, kh, kw) of the im2col matrix of one channel group over a task's runs, into dst.
void im2col_row(const Geometry3& g, const PaddedGroup& pg, const Im2colTap& tap, const std::vector<Im2colRun>& runs,
                std::int8_t* dst) {
  const std::int8_t* base = tap_base(g, pg, tap);
  const std::int64_t s = g.s[2];
  if (s == 1) {
    for (const Im2colRun& run : runs) copy_bytes(dst + run.offset, base + run.src, run.len);
#if QEVAL_INT8_CONV_AVX512
  } else if (s == 2) {
    // Every other byte: 32 16-bit words, truncated to their low bytes. The last element is copied
    // on its own, so that no word reads the byte past it (it may be past the buffer).
    for (const Im2colRun& run : runs) {
      const std::int8_t* src = base + run.src;
      std::int8_t* d = dst + run.offset;
      const std::int64_t vec = run.len - 1;
      for (std::int64_t u = 0; u < vec; u += 32) {
        const std::int64_t n = std::min<std::int64_t>(32, vec - u);
        const __mmask32 mask = n == 32 ? __mmask32(0xffffffffu) : __mmask32((1u << n) - 1);
        const __m512i words = _mm512_maskz_loadu_epi16(mask, src + 2 * u);
        _mm256_mask_storeu_epi8(d + u, mask, _mm512_maskz_cvtepi16_epi8(mask, words));
      }
      d[vec] = src[2 * vec];
    }
#endif
  } else {
    for (const Im2colRun& run : runs) {
      const std::int8_t* src = base + run.src;
      std::int8_t* d = dst + run.offset;
      for (std::int64_t u = 0; u < run.len; ++u) d[u] = src[u * s];
    }
  }
}

// Four rows of `panels` x kInt8NR bytes (one k group's four k values over consecutive columns)
// into k group `group` of `panels` consecutive panels of a packed B, the first at `panel0` (panels
// `panel_bytes` apart): column c's four bytes become one 4-byte lane. Column sums are not touched.
void interleave_group(const std::int8_t* r0, const std::int8_t* r1, const std::int8_t* r2, const std::int8_t* r3,
                      std::int64_t panels, std::int8_t* panel0, std::int64_t panel_bytes, std::int64_t group) {
  std::int8_t* d0 = panel0 + group * kInt8NR * 4;
  for (std::int64_t pi = 0; pi < panels; ++pi) {
    const std::int64_t o = pi * kInt8NR;
    std::int8_t* d = d0 + pi * panel_bytes;
#if QEVAL_INT8_CONV_AVX512
    static_assert(kInt8NR == 32);
    // Within each 128-bit lane: bytes of rows 0/1 and 2/3 paired, then the pairs paired: lane 0
    // holds columns 0-3 / 4-7 / 8-11 / 12-15 of the four unpacks, lane 1 columns 16-31 likewise.
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + o));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + o));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r2 + o));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r3 + o));
    const __m256i ab_lo = _mm256_unpacklo_epi8(a, b), ab_hi = _mm256_unpackhi_epi8(a, b);
    const __m256i ce_lo = _mm256_unpacklo_epi8(c, e), ce_hi = _mm256_unpackhi_epi8(c, e);
    const __m256i x0 = _mm256_unpacklo_epi16(ab_lo, ce_lo), x1 = _mm256_unpackhi_epi16(ab_lo, ce_lo);
    const __m256i x2 = _mm256_unpacklo_epi16(ab_hi, ce_hi), x3 = _mm256_unpackhi_epi16(ab_hi, ce_hi);
    __m256i* out = reinterpret_cast<__m256i*>(d);
    _mm256_store_si256(out + 0, _mm256_permute2x128_si256(x0, x1, 0x20));
    _mm256_store_si256(out + 1, _mm256_permute2x128_si256(x2, x3, 0x20));
    _mm256_store_si256(out + 2, _mm256_permute2x128_si256(x0, x1, 0x31));
    _mm256_store_si256(out + 3, _mm256_permute2x128_si256(x2, x3, 0x31));
#else
    std::uint32_t* __restrict du = reinterpret_cast<std::uint32_t*>(d);
    for (int t = 0; t < kInt8NR; ++t)
      du[t] = std::uint32_t(std::uint8_t(r0[o + t])) | std::uint32_t(std::uint8_t(r1[o + t])) << 8 |
              std::uint32_t(std::uint8_t(r2[o + t])) << 16 | std::uint32_t(std::uint8_t(r3[o + t])) << 24;
#endif
  }
}

// The column sums of panels [p0, p1) of a packed B (columns past n included: their bytes are 0).
void packed_column_sums(PackedInt8B& b, std::int64_t p0, std::int64_t p1) {
  const std::int64_t groups = b.k_groups();
  std::int32_t* sums = b.mutable_col_sums();
  for (std::int64_t pi = p0; pi < p1; ++pi) {
    const std::int8_t* src = b.mutable_panel(pi * kInt8NR);
#if QEVAL_INT8_CONV_AVX512
    // vpdpbusd with unsigned ones: each int32 lane gains the sum of its 4 signed bytes.
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    for (std::int64_t q = 0; q < groups; ++q, src += kInt8NR * 4) {
      s0 = _mm512_dpbusd_epi32(s0, ones, _mm512_load_si512(src));
      s1 = _mm512_dpbusd_epi32(s1, ones, _mm512_load_si512(src + 64));
    }
    _mm512_storeu_si512(sums + pi * kInt8NR, s0);
    _mm512_storeu_si512(sums + pi * kInt8NR + 16, s1);
#else
    std::int32_t acc[kInt8NR] = {};
    for (std::int64_t q = 0; q < groups; ++q, src += kInt8NR * 4)
      for (int t = 0; t < kInt8NR; ++t)
        acc[t] += std::int32_t(src[4 * t]) + std::int32_t(src[4 * t + 1]) + std::int32_t(src[4 * t + 2]) +
                  std::int32_t(src[4 * t + 3]);
    std::copy_n(acc, kInt8NR, sums + pi * kInt8NR);
#endif
  }
}

#if QEVAL_INT8_CONV_VBMI
// im2col and the 4-byte interleave of the packed B in one byte permutation (VBMI), for inputs whose
// padded rows are short (tiny-sd's 16x16 and 8x8 latents): the 64 bytes of one k group (4 taps) over
// 16 columns, column t's taps in lane t, all come from within 128 bytes of the padded group, or
// from two such windows where the group's taps cross into the next channel's plane. One or two
// vpermi2b then write a half panel's k group, and vpdpbusd against ones sums its columns on the
// way. The permutation indices depend only on the columns' pattern (16 columns = one output row
// of 16, two of 8, ...: a block has one or two patterns) and on the group's place in the period
// of taps (kernel size / gcd(kernel size, 4) groups, after which the taps repeat one plane shift
// further), so a few tables serve every (columns, group) pair. The bytes and sums are those of
// the row-by-row im2col and interleave: columns past n and taps past k are 0.
struct WindowEntry {
  alignas(64) std::uint8_t index_a[64];
  alignas(64) std::uint8_t index_b[64];
  std::int64_t start_a = 0, start_b = 0;  // window starts relative to the group's first element
  __mmask64 keep_a = 0, keep_b = 0;       // output bytes taken from window a / b (others 0)
  __mmask64 load_a0 = 0, load_a1 = 0, load_b0 = 0, load_b1 = 0;
  bool two = false;
};

// Column pattern of a 16-column chunk: sources relative to its first column, and how many are
// columns of the block (the rest are past n).
struct ChunkPattern {
  std::int64_t rel[16];
  int valid;
  bool operator==(const ChunkPattern& o) const { return valid == o.valid && std::equal(rel, rel + valid, o.rel); }
};

inline __mmask64 byte_span(std::int64_t from, std::int64_t to) {  // bits [from, to) of 64, clipped
  from = std::clamp<std::int64_t>(from, 0, 64);
  to = std::clamp<std::int64_t>(to, 0, 64);
  if (to <= from) return 0;
  const __mmask64 upto = to >= 64 ? ~__mmask64(0) : (__mmask64(1) << to) - 1;
  return upto & ~((__mmask64(1) << from) - 1);
}

// The entry of one column pattern and one group whose 4 tap offsets (relative to its first tap;
// -1: past k) are `taps`; false where the bytes do not fit two 128-byte windows.
bool window_entry(const ChunkPattern& cp, const std::int64_t taps[4], WindowEntry& e) {
  std::int64_t off[64];
  bool live[64];
  std::int64_t lo = INT64_MAX;
  for (int t = 0; t < 16; ++t)
    for (int r = 0; r < 4; ++r) {
      const int b = t * 4 + r;
      live[b] = t < cp.valid && taps[r] >= 0;
      off[b] = live[b] ? cp.rel[t] + taps[r] : 0;
      if (live[b]) lo = std::min(lo, off[b]);
    }
  e = WindowEntry{};
  if (lo == INT64_MAX) return true;  // nothing live: a zero half panel
  std::int64_t lo_b = INT64_MAX, hi_a = lo, hi_b = 0;
  for (int b = 0; b < 64; ++b) {
    if (!live[b]) continue;
    if (off[b] - lo < 128) hi_a = std::max(hi_a, off[b]);
    else lo_b = std::min(lo_b, off[b]);
  }
  e.start_a = lo;
  e.two = lo_b != INT64_MAX;
  if (e.two) e.start_b = lo_b;
  for (int b = 0; b < 64; ++b) {
    e.index_a[b] = e.index_b[b] = 0;
    if (!live[b]) continue;
    if (off[b] - lo < 128) {
      e.index_a[b] = std::uint8_t(off[b] - lo);
      e.keep_a |= __mmask64(1) << b;
    } else {
      if (off[b] - lo_b >= 128) return false;
      e.index_b[b] = std::uint8_t(off[b] - lo_b);
      e.keep_b |= __mmask64(1) << b;
      hi_b = std::max(hi_b, off[b]);
    }
  }
  const std::int64_t span_a = hi_a - lo + 1;
  e.load_a0 = byte_span(0, span_a);
  e.load_a1 = byte_span(0, span_a - 64);
  if (e.two) {
    const std::int64_t span_b = hi_b - lo_b + 1;
    e.load_b0 = byte_span(0, span_b);
    e.load_b1 = byte_span(0, span_b - 64);
  }
  return true;
}

// pack_im2col's result by windows; false (nothing written) where some group's bytes do not fit two
// windows (wide rows: the caller copies runs instead).
bool pack_im2col_windows(const Geometry3& g, const PaddedGroup& pg, std::int64_t k, const std::vector<Im2colRun>& runs,
                         std::int64_t n, std::int64_t p0, PackedInt8B& out) {
  const std::int64_t kprod = g.k_size(), groups = out.k_groups();
  // Taps repeat after `period` groups, `shift` bytes (whole planes) further on.
  const std::int64_t period = kprod / std::gcd(kprod, std::int64_t(4));
  const std::int64_t shift = period * 4 / kprod * pg.plane();
  auto tap_offset = [&](std::int64_t q) {
    const std::int64_t kw = q % g.k[2], kh = (q / g.k[2]) % g.k[1], kd = (q / (g.k[2] * g.k[1])) % g.k[0];
    const std::int64_t c = q / kprod;
    return c * pg.plane() + (kd * g.d[0] * pg.dims[1] + kh * g.d[1]) * pg.dims[2] + kw * g.d[2];
  };
  thread_local std::vector<std::int64_t> colsrc;
  colsrc.clear();
  for (const Im2colRun& run : runs)
    for (std::int64_t u = 0; u < run.len; ++u) colsrc.push_back(run.src + u * g.s[2]);
  const std::int64_t panels = (n + kInt8NR - 1) / kInt8NR, chunks = panels * 2;
  // Column patterns, and each chunk's.
  thread_local std::vector<ChunkPattern> patterns;
  thread_local std::vector<int> chunk_pattern;
  patterns.clear();
  chunk_pattern.assign(std::size_t(chunks), -1);
  for (std::int64_t h = 0; h < chunks; ++h) {
    ChunkPattern cp{};
    cp.valid = int(std::clamp<std::int64_t>(n - h * 16, 0, 16));
    if (cp.valid == 0) continue;
    for (int t = 0; t < cp.valid; ++t) cp.rel[t] = colsrc[std::size_t(h * 16 + t)] - colsrc[std::size_t(h * 16)];
    auto it = std::find(patterns.begin(), patterns.end(), cp);
    chunk_pattern[std::size_t(h)] = int(it - patterns.begin());
    if (it == patterns.end()) patterns.push_back(cp);
  }
  // Entries per pattern: the period's groups, then (k not a multiple of 4) the last group's.
  const bool tail = k % 4 != 0;
  const std::int64_t per = std::min(period, groups) + (tail ? 1 : 0);
  thread_local std::vector<WindowEntry> entries;
  entries.resize(patterns.size() * std::size_t(per));
  for (std::size_t pi = 0; pi < patterns.size(); ++pi)
    for (std::int64_t i = 0; i < per; ++i) {
      const std::int64_t q = tail && i == per - 1 ? groups - 1 : i;
      std::int64_t taps[4];
      for (int r = 0; r < 4; ++r) taps[r] = 4 * q + r < k ? tap_offset(4 * q + r) - tap_offset(4 * q) : -1;
      if (!window_entry(patterns[pi], taps, entries[pi * std::size_t(per) + std::size_t(i)])) return false;
    }
  // Where each group of the first period starts (relative to its column's (0, 0, 0) tap).
  thread_local std::vector<std::int64_t> group_base;
  group_base.resize(std::size_t(period));
  for (std::int64_t i = 0; i < period; ++i) group_base[std::size_t(i)] = tap_offset(4 * i);
  const __m512i ones = _mm512_set1_epi8(1);
  std::int32_t* sums = out.mutable_col_sums() + p0 * kInt8NR;
  for (std::int64_t h = 0; h < chunks; ++h) {
    std::int8_t* dst = out.mutable_panel((p0 + h / 2) * kInt8NR) + (h % 2) * 64;
    const int pat = chunk_pattern[std::size_t(h)];
    if (pat < 0) {
      for (std::int64_t q = 0; q < groups; ++q) _mm512_store_si512(dst + q * kInt8NR * 4, _mm512_setzero_si512());
      _mm512_storeu_si512(sums + h * 16, _mm512_setzero_si512());
      continue;
    }
    const WindowEntry* pe = entries.data() + std::size_t(pat) * std::size_t(per);
    const std::int8_t* first = pg.data + colsrc[std::size_t(h * 16)];
    __m512i acc = _mm512_setzero_si512();
    // One k group's half panel from its entry (its fields in registers: the stores through int8
    // pointers would otherwise make the compiler reload them every group): window a, and b where
    // the taps cross planes.
    // Groups q_begin, q_begin + period, ... before q_end.
    auto run = [&](const WindowEntry& entry, std::int64_t q_begin, std::int64_t q_end, auto two) {
      const __m512i index_a = _mm512_load_si512(entry.index_a), index_b = _mm512_load_si512(entry.index_b);
      const __mmask64 keep_a = entry.keep_a, keep_b = entry.keep_b, a0 = entry.load_a0, a1 = entry.load_a1;
      const __mmask64 b0 = entry.load_b0, b1 = entry.load_b1;
      const std::int8_t* src = first + group_base[std::size_t(q_begin % period)] + (q_begin / period) * shift;
      const std::int8_t* const a_first = src + entry.start_a;
      const std::int8_t* const b_first = src + entry.start_b;
      for (std::int64_t q = q_begin, off = 0; q < q_end; q += period, off += shift) {
        const std::int8_t* a = a_first + off;
        __m512i v = _mm512_maskz_permutex2var_epi8(keep_a, _mm512_maskz_loadu_epi8(a0, a), index_a,
                                                   _mm512_maskz_loadu_epi8(a1, a + 64));
        if constexpr (decltype(two)::value) {
          const std::int8_t* b = b_first + off;
          v = _mm512_or_si512(v, _mm512_maskz_permutex2var_epi8(keep_b, _mm512_maskz_loadu_epi8(b0, b), index_b,
                                                                _mm512_maskz_loadu_epi8(b1, b + 64)));
        }
        _mm512_store_si512(dst + q * kInt8NR * 4, v);
        acc = _mm512_dpbusd_epi32(acc, ones, v);
      }
    };
    // By place in the period, then period by period (the sums do not depend on the order): the
    // test for a second window is made once per place, not per group (it mispredicted).
    const std::int64_t full = tail ? groups - 1 : groups;
    for (std::int64_t i = 0; i < std::min(period, full); ++i) {
      if (pe[i].two) run(pe[i], i, full, std::true_type{});
      else run(pe[i], i, full, std::false_type{});
    }
    if (tail) run(pe[per - 1], groups - 1, groups, std::true_type{});  // the last group: k past its end
    _mm512_storeu_si512(sums + h * 16, acc);
  }
  return true;
}
#endif

// Columns [j_begin, j_end) of the im2col matrix of one channel group ([cg * kernel, out
// positions]; the group's input padded once by the caller) written straight into the int8 GEMM's
// packed B layout with its column sums, every byte of them: out holds the block of columns from
// block_begin (j_begin - block_begin a multiple of kInt8NR; reset without clearing). Per k group
// four im2col rows over the columns (plain copies of runs), interleaved into the 4-byte lanes of
// each panel. On the calling thread.
void pack_im2col(const Geometry3& g, const PaddedGroup& padded, std::int64_t k, std::int64_t block_begin,
                 std::int64_t j_begin, std::int64_t j_end, PackedInt8B& out) {
  const std::int64_t n = j_end - j_begin, p0 = (j_begin - block_begin) / kInt8NR;
  const std::int64_t panels = (n + kInt8NR - 1) / kInt8NR, width = panels * kInt8NR;
  thread_local std::vector<std::int8_t> rows_buffer;
  if (rows_buffer.size() < std::size_t(4 * width)) rows_buffer.resize(std::size_t(4 * width));
  std::int8_t* rows[4] = {rows_buffer.data(), rows_buffer.data() + width, rows_buffer.data() + 2 * width,
                          rows_buffer.data() + 3 * width};
  for (std::int8_t* r : rows) std::memset(r + n, 0, std::size_t(width - n));  // columns past n stay 0
  thread_local std::vector<Im2colRun> runs;
  im2col_runs(g, padded, j_begin, j_end, runs);
#if QEVAL_INT8_CONV_VBMI
  // Only output rows of at most 32 columns can give a chunk two runs or more; longer ones do not
  // pay for listing every column (PP-OCRv4 det's im2col was 10% slower doing it per block).
  if (g.out[2] <= 32 && pack_im2col_windows(g, padded, k, runs, n, p0, out)) return;
  thread_local std::vector<Im2colChunk> chunks;
  bool chunked = false;
  if (g.out[2] <= 32) {
    im2col_chunks(runs, g.s[2], chunks);
    chunked = use_chunks(runs, chunks);
  }
#endif
  const std::int64_t panel_bytes = out.k_groups() * kInt8NR * 4;
  Im2colTap tap{0, 0, 0, 0};  // row q's tap, advanced row by row (no divisions per row)
  for (std::int64_t q0 = 0; q0 < k; q0 += 4) {
    for (int r = 0; r < 4; ++r) {
      if (q0 + r < k) {
#if QEVAL_INT8_CONV_VBMI
        if (chunked) im2col_row_chunks(tap_base(g, padded, tap), chunks, rows[r]);
        else im2col_row(g, padded, tap, runs, rows[r]);
#else
        im2col_row(g, padded, tap, runs, rows[r]);
#endif
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
    interleave_group(rows[0], rows[1], rows[2], rows[3], panels, out.mutable_panel(p0 * kInt8NR), panel_bytes, q0 / 4);
  }
  packed_column_sums(out, p0, p0 + panels);
}

// Columns [j_begin, j_end) of x ([k, ld] int8, a 1x1 conv's input read in place) packed into out
// (the block from block_begin, as pack_im2col) with their column sums: four rows of x
// interleaved per k group, whole panels straight from x, the last partial panel and k past the end
// through zero-padded rows.
void pack_rows(const std::int8_t* x, std::int64_t ld, std::int64_t k, std::int64_t block_begin, std::int64_t j_begin,
               std::int64_t j_end, PackedInt8B& out) {
  const std::int64_t n = j_end - j_begin, full = n / kInt8NR, tail = n - full * kInt8NR;
  const std::int64_t p0 = (j_begin - block_begin) / kInt8NR;
  const std::int64_t panel_bytes = out.k_groups() * kInt8NR * 4;
  thread_local std::vector<std::int8_t> zeros;  // the rows of k past the end
  if (k % 4 && zeros.size() < std::size_t(n)) zeros.assign(std::size_t(n), 0);
  alignas(64) std::int8_t tail_rows[4][kInt8NR];
  for (std::int64_t q0 = 0; q0 < k; q0 += 4) {
    const std::int8_t* r[4];
    for (int i = 0; i < 4; ++i) r[i] = q0 + i < k ? x + (q0 + i) * ld + j_begin : zeros.data();
    if (full) interleave_group(r[0], r[1], r[2], r[3], full, out.mutable_panel(p0 * kInt8NR), panel_bytes, q0 / 4);
    if (tail) {
      for (int i = 0; i < 4; ++i) {
        std::memset(tail_rows[i], 0, kInt8NR);
        if (q0 + i < k) std::memcpy(tail_rows[i], r[i] + full * kInt8NR, std::size_t(tail));
      }
      interleave_group(tail_rows[0], tail_rows[1], tail_rows[2], tail_rows[3], 1,
                       out.mutable_panel((p0 + full) * kInt8NR), panel_bytes, q0 / 4);
    }
  }
  packed_column_sums(out, p0, p0 + full + (tail ? 1 : 0));
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

std::int64_t int8_conv_cache_block_columns(std::int64_t k, std::int64_t columns) {
  const std::int64_t bytes_per_column = (k + 3) / 4 * 4;
  const std::int64_t block = std::max<std::int64_t>(1, kInt8ConvCacheBlockBytes / bytes_per_column / kInt8NR) * kInt8NR;
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
    int8_depthwise_conv(p, x, pad_value, w.raw(), w.channel_sums(), y, window_sums, path == Int8GemmPath::kAvx512Vnni,
                        e);
    return;
  }

  // A 1x1 conv with stride 1 and no padding (begin or end: then out == in) reads x as it is: B is
  // x's [cg, positions] block, four rows interleaved per k group; otherwise im2col packs straight
  // into B. Either way B holds a block of columns at a time (int32 sums are exact: the same result
  // whatever the split), so the lent B stays small however large the image. Where there are blocks
  // enough for every thread (or one thread), a block is small enough to stay in L2 between its
  // packing and its GEMM, and one task does both (kInt8ConvCacheBlockBytes); otherwise blocks of at
  // most kInt8ConvBlockBytes go in turn, each packed by parallel tasks, then multiplied by the
  // parallel GEMM.
  const bool direct = kprod == 1 && g.pb[0] == 0 && g.pb[1] == 0 && g.pb[2] == 0 && g.s[0] == 1 && g.s[1] == 1 &&
                      g.s[2] == 1 && out_size == in_size;
  const std::int64_t threads = worker_threads();  // `--threads 1` leaves the arena as wide as the machine
  std::int64_t block = int8_conv_cache_block_columns(k, out_size);
  const bool cache_blocks = threads == 1 || (out_size + block - 1) / block >= 2 * threads;
  if (!cache_blocks) block = int8_conv_block_columns(k, out_size);
  const std::int64_t blocks = (out_size + block - 1) / block;
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
      // Columns [c0, c1) of the block from j0 into pb.
      auto pack = [&](std::int64_t j0, std::int64_t c0, std::int64_t c1, PackedInt8B& pb) {
        if (direct) pack_rows(xg, out_size, k, j0, c0, c1, pb);
        else pack_im2col(g, padded, k, j0, c0, c1, pb);
      };
      auto multiply = [&](std::int64_t j0, const PackedInt8B& pb) {
        if (e)
          int8_gemm(w.group(gi), pb, reinterpret_cast<float*>(yg + j0), out_size,
                    columns_from(e->rows_from(gi * og), j0), path);
        else int8_gemm(w.group(gi), pb, yg + j0, out_size, path);
        if (window_sums) std::copy_n(pb.col_sums(), pb.n(), window_sums + (b * p.groups + gi) * out_size + j0);
      };
      if (cache_blocks && (threads == 1 || scratch)) {
        std::optional<Lent<PackedInt8B>> lent;
        PackedInt8B* pb = scratch ? scratch : lent.emplace(0, 0).get();
        for (std::int64_t j0 = 0; j0 < out_size; j0 += block) {
          const std::int64_t j1 = std::min(out_size, j0 + block);
          pb->reset(k, j1 - j0, false);  // packing writes every byte
          pack(j0, j0, j1, *pb);
          multiply(j0, *pb);
        }
      } else if (cache_blocks) {
        tbb::parallel_for(
            tbb::blocked_range<std::int64_t>(0, blocks, 1), [&](const tbb::blocked_range<std::int64_t>& r) {
              const Lent<PackedInt8B> pb(0, 0);  // the GEMM may wait on other tasks: not a thread's buffer
              for (std::int64_t t = r.begin(); t < r.end(); ++t) {
                const std::int64_t j0 = t * block, j1 = std::min(out_size, j0 + block);
                pb->reset(k, j1 - j0, false);
                pack(j0, j0, j1, *pb);
                multiply(j0, *pb);
              }
            });
      } else {
        std::optional<Lent<PackedInt8B>> lent;
        PackedInt8B* pb = scratch ? scratch : lent.emplace(0, 0).get();
        for (std::int64_t j0 = 0; j0 < out_size; j0 += block) {
          const std::int64_t j1 = std::min(out_size, j0 + block);
          pb->reset(k, j1 - j0, false);
          // ~16 KB of rows per packing task (4 rows of 4096 columns at most).
          constexpr std::int64_t kTaskColumns = 4096;
          const std::int64_t tasks = (j1 - j0 + kTaskColumns - 1) / kTaskColumns;
          tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, tasks), [&](const tbb::blocked_range<std::int64_t>& r) {
            for (std::int64_t t = r.begin(); t < r.end(); ++t)
              pack(j0, j0 + t * kTaskColumns, std::min(j1, j0 + (t + 1) * kTaskColumns), *pb);
          });
          multiply(j0, *pb);
        }
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
