// Index maps of element-selecting ops (which source element each output element copies) in a
// compact form: per-axis tables instead of one int64 per element.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <vector>

namespace qeval::kernels {

// map[i] = base + sum over axes d of table[d][i_d] (i_d: output element i's coordinate on axis d),
// or -1 (a fill element) where some table[d][i_d] is kSeparableFill. What Slice, Transpose, Pad
// (every mode), Tile, Expand, nearest Resize and a Gather of constant indices give: each axis of the
// output reads one axis of the input through a table of its own.
struct SeparableMap {
  static constexpr std::int64_t kFill = std::numeric_limits<std::int64_t>::min();  // outside the source
  std::int64_t base = 0;
  std::vector<std::vector<std::int64_t>> tables;  // tables[d].size() == shape[d]
  bool has_fill = false;
  // Every table[d][j] == j * strides[d] and no fill: a strided copy starting at `base`.
  std::optional<std::vector<std::int64_t>> strides() const;
  // Without fill: each table's first entry moved into base (every table then starts at 0), the
  // form strides() reads. separable_map() returns maps in this form.
  void normalize();
};

// `map` (shape.size() axes, row-major, -1 = fill) as a SeparableMap, when it is one (checked on every
// element); nullopt otherwise, or when every element is fill. One pass over the map, parallel over
// rows of the last axis.
std::optional<SeparableMap> separable_map(const std::int64_t* map, std::span<const std::int64_t> shape);

}  // namespace qeval::kernels
