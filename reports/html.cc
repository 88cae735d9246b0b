// Shared HTML pieces (see html.h).
#include "reports/html.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/files.h"
#include "base/utf8.h"
#include "reports/heatmap.h"
#include "reports/metric_format.h"

namespace qeval::reports::html {

std::string base64(std::string_view bytes) {
  static const char* kTable = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  auto byte = [&](std::size_t k) { return static_cast<unsigned>(static_cast<unsigned char>(bytes[k])); };
  for (; i + 3 <= bytes.size(); i += 3) {
    unsigned v = byte(i) << 16 | byte(i + 1) << 8 | byte(i + 2);
    out += kTable[v >> 18 & 63];
    out += kTable[v >> 12 & 63];
    out += kTable[v >> 6 & 63];
    out += kTable[v & 63];
  }
  if (std::size_t rest = bytes.size() - i; rest > 0) {
    unsigned v = byte(i) << 16 | (rest == 2 ? byte(i + 1) << 8 : 0u);
    out += kTable[v >> 18 & 63];
    out += kTable[v >> 12 & 63];
    out += rest == 2 ? kTable[v >> 6 & 63] : '=';
    out += '=';
  }
  return out;
}

std::string esc(std::string_view raw) {
  // Bytes that are not UTF-8 (a file name) and control characters (which XML forbids: JUnit uses
  // this too) are shown as \xHH.
  const std::string s = base::escape_invalid_utf8(raw);
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      case '\t':
      case '\n':
      case '\r': out += c; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F)
          out += fmt::format("\\x{:02X}", static_cast<unsigned char>(c));
        else out += c;
    }
  }
  return out;
}

std::string png_data_uri(const std::vector<std::uint8_t>& png) {
  return "data:image/png;base64," + base64(std::string_view(reinterpret_cast<const char*>(png.data()), png.size()));
}

namespace {

constexpr std::string_view kCss = R"(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
main{max-width:1880px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px}
.sub{color:#5b6475;font-size:13px}
.verdict{border-radius:8px;padding:16px 20px;margin:16px 0;color:#fff;font-size:18px;font-weight:600}
.verdict small{display:block;font-weight:400;font-size:14px;opacity:.92}
.pass{background:#1f7a3f} .fail{background:#b3261e}
.verdict code{background:rgba(255,255,255,.18);color:#fff}
table{border-collapse:collapse;width:100%;background:#fff;font-size:13px;border:1px solid #dde1e7}
th,td{padding:5px 7px;border-bottom:1px solid #e6e9ee;text-align:left;vertical-align:top}
th{background:#eef1f5;font-weight:600;cursor:default;overflow-wrap:break-word} th.name{overflow-wrap:anywhere}
td{overflow-wrap:break-word} td code,td.name{overflow-wrap:anywhere} td:first-child{min-width:6em}
table.sortable th{cursor:pointer} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.bad td{background:#fdecea} tr.err td{background:#fff4e0}
.ok{color:#1f7a3f;font-weight:600} .no{color:#b3261e;font-weight:600} .nmv{color:#5b6475;font-style:italic} tr.nm td{color:#5b6475}
.strip{background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:12px;margin:12px 0}
.strip .imgs{display:flex;gap:10px;flex-wrap:wrap}
.strip figure{margin:0} .strip img{max-width:360px;image-rendering:pixelated;border:1px solid #ccd}
.strip figcaption{font-size:12px;color:#5b6475}
code{background:#eef1f5;padding:1px 4px;border-radius:3px}
.legend{display:inline-block;width:160px;height:10px;vertical-align:middle;border:1px solid #ccd}
#report-errors{display:none;background:#fdecea;border:1px solid #b3261e;color:#b3261e;padding:8px 12px;margin:12px 0;white-space:pre-wrap}
)";

constexpr std::string_view kErrorHookJs =
    "window.addEventListener('error',function(e){var b=document.getElementById('report-errors');"
    "if(!b)return;b.style.display='block';b.textContent+='report script error: '+e.message+"
    "' (line '+e.lineno+')\\n';});";

constexpr std::string_view kSortJs = R"(
document.querySelectorAll('table.sortable').forEach(t=>{
 t.querySelectorAll('th').forEach((th,i)=>th.addEventListener('click',()=>{
  const tb=t.tBodies[0],rows=[...tb.rows],asc=th.dataset.asc!=='1';th.dataset.asc=asc?'1':'0';
  const key=r=>{const c=r.cells[i];const v=c.dataset.v;return v!==undefined?(v===''?NaN:+v):c.textContent};
  rows.sort((a,b)=>{const x=key(a),y=key(b);
   if(typeof x==='number'&&typeof y==='number'){if(isNaN(x))return 1;if(isNaN(y))return -1;return asc?x-y:y-x}
   return asc?String(x).localeCompare(y):String(y).localeCompare(x)});
  rows.forEach(r=>tb.appendChild(r));}));});
)";

}  // namespace

std::string page_begin(std::string_view title, std::string_view extra_css) {
  std::string h =
      "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>";
  h += esc(title);
  h += "</title><style>";
  h += kCss;
  h += extra_css;
  h += "</style><script>";
  h += kErrorHookJs;
  h += "</script></head><body><main><div id=\"report-errors\"></div>";
  return h;
}

std::string page_end(std::string_view extra_js) {
  std::string h = "<script>";
  h += kSortJs;
  h += extra_js;
  h += "</script><script>document.body.dataset.rendered='1';</script></main></body></html>\n";
  return h;
}

std::string fmt_value(std::string_view metric, std::optional<double> v) {
  if (!v || std::isnan(*v)) return "&ndash;";
  // A per-output key "<output>.<metric>": the output's name (any characters) says nothing of the format.
  if (auto dot = metric.rfind('.'); dot != std::string_view::npos) metric = metric.substr(dot + 1);
  if (std::isinf(*v)) return *v > 0 ? "&infin;" : "&minus;&infin;";
  return format_metric(metric, *v);
}

std::string sort_value(std::optional<double> v) {
  if (!v || std::isnan(*v)) return "";
  if (std::isinf(*v)) return *v > 0 ? "1e308" : "-1e308";
  return fmt::format("{}", *v);
}

std::string legend_gradient() {
  std::string stops;
  for (int i = 0; i <= 8; ++i) {
    std::uint8_t c[3];
    ramp_color(float(i) / 8.0f, c);
    stops += fmt::format("{}rgb({},{},{})", i ? "," : "", c[0], c[1], c[2]);
  }
  return "background:linear-gradient(90deg," + stops + ")";
}

std::string scale_legend(double scale, int ticks, std::string_view unit) {
  constexpr int W = 200, x0 = 8, H = 30;
  std::string stops;
  for (int i = 0; i <= 8; ++i) {
    std::uint8_t c[3];
    ramp_color(float(i) / 8.0f, c);
    stops += fmt::format("<stop offset=\"{}%\" stop-color=\"rgb({},{},{})\"/>", i * 100 / 8, c[0], c[1], c[2]);
  }
  std::string svg = fmt::format(
      "<svg class=\"scale-legend\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\" "
      "aria-label=\"colour scale 0 to {:g} {}\"><defs><linearGradient id=\"ramp{:g}\">{}</linearGradient></defs>"
      "<rect x=\"{}\" y=\"2\" width=\"{}\" height=\"10\" fill=\"url(#ramp{:g})\" stroke=\"#ccd\"/>",
      W + 2 * x0 + 60, H, W + 2 * x0 + 60, H, scale, esc(unit), scale, stops, x0, W, scale);
  for (int k = 0; k <= ticks; ++k) {
    const double x = x0 + double(W) * k / ticks, v = scale * k / ticks;
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"12\" y2=\"16\" stroke=\"#5b6475\"/>"
        "<text x=\"{0:.1f}\" y=\"27\" font-size=\"10\" fill=\"#5b6475\" text-anchor=\"middle\">{1}{2:g}</text>",
        x, k == ticks ? "&ge;" : "", v);
  }
  svg +=
      fmt::format("<text x=\"{}\" y=\"11\" font-size=\"10\" fill=\"#5b6475\">{}</text></svg>", x0 + W + 8, esc(unit));
  return svg;
}

std::string difference_scale_legend() {
  const double x8 = kDifferenceScale255 / kAmplifiedGain;
  return fmt::format(
      "<span class=\"gain-x1\">{}</span><span class=\"gain-x8\" hidden>{}</span> (8-bit levels; brighter is a "
      "larger difference) <button type=\"button\" class=\"gain-toggle\" aria-pressed=\"false\" "
      "data-x1=\"amplified view: x{:g}\" data-x8=\"fixed scale: x1\">amplified view: x{:g}</button>",
      scale_legend(kDifferenceScale255, 4, "of 255"),
      scale_legend(x8, 4, fmt::format("of 255 (x{:g})", kAmplifiedGain)), kAmplifiedGain, kAmplifiedGain);
}

std::string difference_img(std::string_view alt, const std::string& src, const std::string& src_x8) {
  std::string h = "<img loading=\"lazy\" alt=\"" + esc(alt) + "\" src=\"" + src + "\"";
  if (!src_x8.empty()) h += " data-x1=\"" + src + "\" data-x8=\"" + src_x8 + "\"";
  return h + ">";
}

std::string difference_caption(const std::string& text, const std::string& text_x8) {
  return "<figcaption class=\"diff-cap\" data-x1=\"" + esc(text) + "\" data-x8=\"" + esc(text_x8) + "\">" + text +
         "</figcaption>";
}

// Swaps every difference heatmap, its caption and the legend between the fixed scale and the
// amplified view (data-x1 / data-x8).
const std::string_view kGainToggleJs = R"(
document.querySelectorAll('.gain-toggle').forEach(b=>b.addEventListener('click',()=>{
 const on=b.getAttribute('aria-pressed')!=='true',k=on?'x8':'x1';
 document.querySelectorAll('.gain-toggle').forEach(x=>{x.setAttribute('aria-pressed',String(on));x.textContent=x.dataset[on?'x8':'x1'];});
 document.querySelectorAll('img[data-x8]').forEach(i=>{i.src=i.dataset[k];});
 document.querySelectorAll('figcaption.diff-cap').forEach(c=>{c.innerHTML=c.dataset[k];});
 document.querySelectorAll('.gain-x1').forEach(e=>{e.hidden=on;});
 document.querySelectorAll('.gain-x8').forEach(e=>{e.hidden=!on;});}));
)";

std::string ramp_js_array() {
  std::string a = "[";
  for (int i = 0; i <= 8; ++i) {
    std::uint8_t c[3];
    ramp_color(float(i) / 8.0f, c);
    a += fmt::format("{}[{},{},{}]", i ? "," : "", c[0], c[1], c[2]);
  }
  return a + "]";
}

std::string verdict_banner(bool passed, std::string_view details, std::string_view title) {
  return fmt::format("<div class=\"verdict {}\">{}<small>{}</small></div>", passed ? "pass" : "fail",
                     title.empty() ? std::string_view(passed ? "PASS" : "FAIL") : title, details);
}

std::string gate_table(const GateSection& gate, bool by_variant) {
  std::string h = "<table><thead><tr>";
  if (by_variant) h += "<th>variant</th>";
  h += "<th>check</th><th>threshold</th><th>value</th><th>verdict</th><th>why</th></tr></thead><tbody>";
  for (const auto& c : gate.checks) {
    h += fmt::format("<tr class=\"{}\">", !c.measured ? "nm" : c.passed ? "" : "bad");
    if (by_variant) h += "<td>" + esc(c.variant) + "</td>";
    h += fmt::format(
        "<td class=\"name\">{}</td><td class=\"num\">{} {}</td><td class=\"num\">{}</td>"
        "<td class=\"{}\">{}</td><td>{}</td></tr>",
        esc(c.name), esc(c.op), fmt_value(c.metric, c.threshold), fmt_value(c.metric, c.value),
        !c.measured ? "nmv"
        : c.passed  ? "ok"
                    : "no",
        !c.measured ? "not measured"
        : c.passed  ? "pass"
                    : "FAIL",
        esc(c.detail));
  }
  if (gate.checks.empty()) h += fmt::format("<tr><td colspan=\"{}\">no checks</td></tr>", by_variant ? 6 : 5);
  return h + "</tbody></table>";
}

const std::string_view kChartCss = R"(
.charts{display:flex;flex-wrap:wrap;gap:12px} figure.chart{margin:0;background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:6px}
figure.chart figcaption{font-size:12px;color:#1d2330;max-width:540px}
svg .ax{stroke:#889} svg .grid{stroke:#eef1f5} svg .tk{font-size:10px;fill:#5b6475} svg .ct{font-size:12px;font-weight:600;fill:#1d2330}
svg .pl{font-size:11px;fill:#1d2330}
.key{display:inline-block;width:10px;height:10px;margin:0 4px 0 8px;border-radius:2px}
)";

std::string scatter_chart(std::string_view title, std::string_view x_label, std::string_view y_label,
                          const std::vector<ScatterPoint>& points, bool x_percent) {
  constexpr double W = 560, H = 300, left = 72, right = 110, top = 26, bottom = 40;
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
  std::string left_out;
  for (const auto& p : points) {
    if (!std::isfinite(p.x) || !std::isfinite(p.y)) {
      left_out += (left_out.empty() ? "" : ", ") + esc(p.label);
      continue;
    }
    xlo = std::min(xlo, p.x), xhi = std::max(xhi, p.x), ylo = std::min(ylo, p.y), yhi = std::max(yhi, p.y);
  }
  std::string svg = fmt::format(
      "<figure class=\"chart\"><svg width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "role=\"img\"><text x=\"{}\" y=\"16\" class=\"ct\">{}</text>",
      W, H, W, H, left, esc(title));
  if (std::isfinite(xlo)) {
    if (x_percent) {
      xlo = 0, xhi = 1;  // shares: the whole 0..100% axis
    } else {
      if (xhi - xlo < 1e-12) xlo -= 1, xhi += 1;
      const double xpad = 0.05 * (xhi - xlo);
      xlo -= xpad, xhi += xpad;
    }
    if (yhi - ylo < 1e-12) ylo -= 1, yhi += 1;
    const double ypad = 0.08 * (yhi - ylo);
    ylo -= ypad, yhi += ypad;
    auto X = [&](double v) { return left + (W - left - right) * (v - xlo) / (xhi - xlo); };
    auto Y = [&](double v) { return top + (H - top - bottom) * (1.0 - (v - ylo) / (yhi - ylo)); };
    svg += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" class=\"ax\"/>"
        "<line x1=\"{0}\" y1=\"{2}\" x2=\"{3}\" y2=\"{2}\" class=\"ax\"/>",
        left, top, H - bottom, W - right);
    for (int k = 0; k <= 4; ++k) {
      const double v = ylo + (yhi - ylo) * k / 4.0, u = xlo + (xhi - xlo) * k / 4.0;
      svg += fmt::format(
          "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" class=\"grid\"/>"
          "<text x=\"{}\" y=\"{:.1f}\" class=\"tk\" text-anchor=\"end\">{:.3g}</text>",
          left, Y(v), W - right, Y(v), left - 4, Y(v) + 4, v);
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" class=\"tk\" text-anchor=\"middle\">{}</text>", X(u),
                         H - bottom + 14, x_percent ? fmt::format("{:.0f}%", 100 * u) : fmt::format("{:.3g}", u));
    }
    svg += fmt::format(
        "<text x=\"{}\" y=\"{}\" class=\"tk\" text-anchor=\"middle\">{}</text>"
        "<text x=\"14\" y=\"{}\" class=\"tk\" transform=\"rotate(-90 14 {})\" "
        "text-anchor=\"middle\">{}</text>",
        left + (W - left - right) / 2, H - 6, esc(x_label), top + (H - top - bottom) / 2, top + (H - top - bottom) / 2,
        esc(y_label));
    // Labels: beside the point, else above, below or to its left, else further down, so that no
    // two overlap (points of equal shares sit on each other: their names must not).
    struct Box {
      double x0, y0, x1, y1;
    };
    std::vector<Box> placed;
    for (const auto& p : points)
      if (std::isfinite(p.x) && std::isfinite(p.y)) placed.push_back({X(p.x) - 5, Y(p.y) - 5, X(p.x) + 5, Y(p.y) + 5});
    auto free = [&](const Box& b) {
      return std::none_of(placed.begin(), placed.end(),
                          [&](const Box& o) { return b.x0 < o.x1 && o.x0 < b.x1 && b.y0 < o.y1 && o.y0 < b.y1; });
    };
    for (const auto& p : points) {
      if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
      const double px = X(p.x), py = Y(p.y), w = 6.2 * double(p.label.size()) + 2;
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"5\" fill=\"{}\"><title>{}</title></circle>", px, py,
                         esc(p.color), esc(p.tooltip));
      // Candidate baselines (x of the text start, y of the baseline).
      std::vector<std::pair<double, double>> spots = {{px + 8, py + 4},      {px + 8, py - 8},
                                                      {px + 8, py + 16},     {px - 8 - w, py + 4},
                                                      {px - w / 2, py - 10}, {px - w / 2, py + 18}};
      for (int k = 1; k <= 8; ++k)
        spots.emplace_back(px + 8, py + 4 + 12.0 * k), spots.emplace_back(px + 8, py + 4 - 12.0 * k);
      std::pair<double, double> at = spots[0];
      for (const auto& s : spots) {
        const Box b{s.first, s.second - 10, s.first + w, s.second + 2};
        if (b.x0 >= 0 && b.x1 <= W && b.y0 >= 0 && b.y1 <= H && free(b)) {
          at = s;
          break;
        }
      }
      placed.push_back({at.first, at.second - 10, at.first + w, at.second + 2});
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"pl\">{}</text>", at.first, at.second, esc(p.label));
    }
  }
  svg += "</svg><figcaption>";
  if (!left_out.empty()) svg += "not plotted (no value): " + left_out;
  return svg + "</figcaption></figure>";
}

}  // namespace qeval::reports::html
