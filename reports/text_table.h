// Plain-text tables and lines for stdout summaries: sized to their content and never cut. A table
// wider than the output is printed as one block per row; a long line wraps at spaces.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace qeval::reports {

// Summaries fit this width when stdout's width is not known (a pipe, a CI log).
inline constexpr std::size_t kDefaultTextWidth = 100;

struct TextColumn {
  std::string header;
  bool right = false;  // right-aligned (numbers)
  std::size_t min_width = 0;
};

struct TextTable {
  std::vector<TextColumn> columns;
  std::vector<std::vector<std::string>> rows;  // a cell per column; the first names the row
  std::string indent;                          // before every line
  std::string gap = "  ";                      // between columns
};

// Aligned columns when every line fits `width` (with `gap`, else with one space); otherwise each row as a block: its
// first cell on a line of its own, then "header: cell" items joined by ", " and wrapped under it. Every cell appears
// whole either way. Lines end with '\n'.
std::string render_text_table(const TextTable& table, std::size_t width);

// `line` wrapped at spaces so each piece fits `width`, continuation lines indented by
// `continuation` (a word longer than the width stays whole). Each piece ends with '\n'.
std::string wrap_line(std::string_view line, std::size_t width, std::string_view continuation = "    ");

}  // namespace qeval::reports
