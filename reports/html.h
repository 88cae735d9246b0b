// Pieces shared by the HTML reports (compare-images, qeval run): escaping, page frame, CSS, the
// table-sorting script, data: URIs, number formatting, the verdict banner and the gate table.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "reports/compare_report_model.h"

namespace qeval::reports::html {

std::string esc(std::string_view s);
// RFC 4648 base64, for data: URIs.
std::string base64(std::string_view bytes);
std::string png_data_uri(const std::vector<std::uint8_t>& png);

// "<!DOCTYPE html>...<body><main>" with the shared CSS plus `extra_css`, and a script that records
// any script error in a visible #report-errors box (so a broken report says so, and a headless
// browser test can read it from the DOM).
std::string page_begin(std::string_view title, std::string_view extra_css = {});
// The table-sorting script, `extra_js`, and a last script that sets <body data-rendered="1">.
std::string page_end(std::string_view extra_js = {});

// A value formatted for its metric: PSNR/SQNR 2 decimals, SSIM-like 5, otherwise 4 significant
// digits; "&ndash;" for none, "&infin;" for +inf.
std::string fmt_value(std::string_view metric, std::optional<double> v);
// The data-v attribute value that table sorting uses ("" sorts last).
std::string sort_value(std::optional<double> v);
// CSS background for a legend swatch of the heatmap ramp.
std::string legend_gradient();
// A labelled legend of a heatmap on a fixed scale (inline SVG): the ramp from 0 to `scale` with
// ticks every `scale / ticks`, the last "≥ scale", and `unit` after it (e.g. "of 255").
std::string scale_legend(double scale, int ticks, std::string_view unit);
// The ramp as a JS array of [r,g,b] anchors (9, evenly spaced), for canvas heatmaps.
std::string ramp_js_array();

// The difference heatmaps' one fixed scale (kDifferenceScale255 of 255) and their amplified view
// (kAmplifiedGain): both legends (the amplified one hidden) and a button that swaps every
// `difference_img` and `difference_caption` to the amplified form and back. Needs kGainToggleJs
// in page_end. Without a script the fixed scale shows.
std::string difference_scale_legend();
// An <img> of a difference heatmap: `src` on the fixed scale, `src_x8` amplified ("" = none).
std::string difference_img(std::string_view alt, const std::string& src, const std::string& src_x8);
// A caption whose text becomes `text_x8` in the amplified view (both HTML).
std::string difference_caption(const std::string& text, const std::string& text_x8);
extern const std::string_view kGainToggleJs;

// The coloured PASS/FAIL banner (green/red by `passed`, the gate's verdict); `details` is HTML;
// `title` replaces the "PASS"/"FAIL" heading (HTML) where more must be said.
std::string verdict_banner(bool passed, std::string_view details, std::string_view title = {});
// Every gate check: threshold, value, verdict and the statistics behind it. With `by_variant`, a
// variant column first.
std::string gate_table(const GateSection& gate, bool by_variant);

// CSS for chart figures (scatter_chart): add it to page_begin's extra_css.
extern const std::string_view kChartCss;

struct ScatterPoint {
  std::string label;  // written next to the point
  double x = 0, y = 0;
  std::string color;
  std::string tooltip;  // plain text
};
// An inline SVG scatter plot (no script, no network): axes with ticks, each point labelled. x
// values are shown as percentages with `x_percent` (x in 0..1, axis from 0 to 100%). Points with a
// non-finite coordinate are left out and listed under the chart.
std::string scatter_chart(std::string_view title, std::string_view x_label, std::string_view y_label,
                          const std::vector<ScatterPoint>& points, bool x_percent);

}  // namespace qeval::reports::html
