#include "kernels/index_map.h"

#include <atomic>

#include <tbb/parallel_for.h>

namespace qeval::kernels {

std::optional<std::vector<std::int64_t>> SeparableMap::strides() const {
  if (has_fill) return std::nullopt;
  std::vector<std::int64_t> s(tables.size(), 0);
  for (std::size_t d = 0; d < tables.size(); ++d) {
    const std::vector<std::int64_t>& t = tables[d];
    if (t.size() > 1) s[d] = t[1] - t[0];
    for (std::size_t j = 0; j < t.size(); ++j)
      if (t[j] != std::int64_t(j) * s[d]) return std::nullopt;
  }
  return s;
}

void SeparableMap::normalize() {
  if (has_fill) return;
  for (std::vector<std::int64_t>& t : tables) {
    if (t.empty()) continue;
    const std::int64_t first = t[0];
    base += first;
    for (std::int64_t& v : t) v -= first;
  }
}

std::optional<SeparableMap> separable_map(const std::int64_t* map, std::span<const std::int64_t> shape) {
  const std::size_t rank = shape.size();
  std::int64_t total = 1;
  for (std::int64_t n : shape) total *= n;
  if (total <= 0) return std::nullopt;
  std::int64_t anchor = 0;  // the first element that is not fill: every coordinate of it is in range
  while (anchor < total && map[anchor] < 0) ++anchor;
  if (anchor == total) return std::nullopt;
  SeparableMap s;
  s.base = map[anchor];
  if (rank == 0) return s;
  // Tables from the lines through the anchor along each axis.
  std::vector<std::int64_t> dense(rank, 1), at(rank);
  for (std::size_t d = rank - 1; d > 0; --d) dense[d - 1] = dense[d] * shape[d];
  for (std::size_t d = 0; d < rank; ++d) at[d] = anchor / dense[d] % shape[d];
  s.tables.resize(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    std::vector<std::int64_t>& t = s.tables[d];
    t.resize(std::size_t(shape[d]));
    for (std::int64_t j = 0; j < shape[d]; ++j) {
      const std::int64_t v = map[anchor + (j - at[d]) * dense[d]];
      t[std::size_t(j)] = v < 0 ? SeparableMap::kFill : v - s.base;
      s.has_fill |= v < 0;
    }
  }
  s.normalize();
  // Every element checked: rows of the last axis, each from its outer coordinates' sum.
  const std::int64_t n = shape[rank - 1], rows = total / n;
  const std::vector<std::int64_t>& last = s.tables[rank - 1];
  std::atomic<bool> ok{true};
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, rows, 256), [&](const tbb::blocked_range<std::int64_t>& r) {
    for (std::int64_t row = r.begin(); row < r.end() && ok.load(std::memory_order_relaxed); ++row) {
      std::int64_t prefix = s.base, rem = row;
      bool valid = true;
      for (std::size_t d = rank - 1; d-- > 0;) {
        const std::int64_t v = s.tables[d][std::size_t(rem % shape[d])];
        rem /= shape[d];
        if (v == SeparableMap::kFill) valid = false;
        else prefix += v;
      }
      const std::int64_t* m = map + row * n;
      bool same = true;
      for (std::int64_t j = 0; j < n; ++j) {
        const std::int64_t t = last[std::size_t(j)];
        same &= m[j] == (valid && t != SeparableMap::kFill ? prefix + t : -1);
      }
      if (!same) ok.store(false, std::memory_order_relaxed);
    }
  });
  if (!ok.load()) return std::nullopt;
  return s;
}

}  // namespace qeval::kernels
