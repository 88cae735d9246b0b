// Column sizing, the stacked form of a table too wide for the output, and word wrapping.
#include "reports/text_table.h"

#include <algorithm>

namespace qeval::reports {

namespace {

std::string pad(const std::string& cell, std::size_t width, bool right) {
  if (cell.size() >= width) return cell;
  const std::string fill(width - cell.size(), ' ');
  return right ? fill + cell : cell + fill;
}

std::string rstrip(std::string s) {
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

}  // namespace

std::string wrap_line(std::string_view line, std::size_t width, std::string_view continuation) {
  if (line.size() <= width) return std::string(line) + "\n";
  std::string lead;  // a line's own indent is kept on it; continuations take `continuation`
  while (lead.size() < line.size() && line[lead.size()] == ' ') lead += ' ';
  std::string out, current = lead;
  bool first_word = true;
  std::size_t at = lead.size();
  while (at < line.size()) {
    std::size_t end = line.find(' ', at);
    if (end == std::string_view::npos) end = line.size();
    const std::string_view word = line.substr(at, end - at);
    if (!word.empty()) {
      if (!first_word && current.size() + 1 + word.size() > width) {
        out += rstrip(current) + "\n";
        current = std::string(continuation);
        first_word = true;
      }
      current += (first_word ? "" : " ") + std::string(word);
      first_word = false;
    }
    at = end + 1;
  }
  out += rstrip(current) + "\n";
  return out;
}

std::string render_text_table(const TextTable& t, std::size_t width) {
  const std::size_t n = t.columns.size();
  std::vector<std::size_t> w(n);
  for (std::size_t c = 0; c < n; ++c) w[c] = std::max(t.columns[c].min_width, t.columns[c].header.size());
  for (const auto& row : t.rows)
    for (std::size_t c = 0; c < n && c < row.size(); ++c) w[c] = std::max(w[c], row[c].size());
  std::string gap = t.gap;
  auto total_width = [&] {
    std::size_t total = t.indent.size();
    for (std::size_t c = 0; c < n; ++c) total += w[c] + (c ? gap.size() : 0);
    return total;
  };
  if (total_width() > width && gap.size() > 1) gap = " ";  // tighter columns before a block per row

  std::string out;
  if (total_width() <= width || n < 2) {
    auto line = [&](const std::vector<std::string>& cells) {
      std::string s = t.indent;
      for (std::size_t c = 0; c < n; ++c) {
        const std::string& cell = c < cells.size() ? cells[c] : std::string();
        s += (c ? gap : "") + pad(cell, w[c], t.columns[c].right);
      }
      out += rstrip(s) + "\n";
    };
    std::vector<std::string> head;
    for (const auto& col : t.columns) head.push_back(col.header);
    line(head);
    for (const auto& row : t.rows) line(row);
    return out;
  }
  // Too wide: a block per row, every cell labelled by its header.
  const std::string inner = t.indent + "  ";
  for (const auto& row : t.rows) {
    out += t.indent + (row.empty() ? std::string() : row[0]) + "\n";
    std::string items;
    for (std::size_t c = 1; c < n && c < row.size(); ++c)
      items += (items.empty() ? "" : ", ") + t.columns[c].header + ": " + row[c];
    if (!items.empty()) out += wrap_line(inner + items, width, inner + "  ");
  }
  return out;
}

}  // namespace qeval::reports
