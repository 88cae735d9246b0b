// qeval compare-images: two folders of images, paired by relative path, metrics, gate, reports.
#include <fmt/format.h>
#include <malloc.h>

#include "base/exit_codes.h"
#include "base/progress.h"
#include "base/terminal.h"
#include "eval/cli/command.h"
#include "eval/run/compare_images.h"
#include "kernels/error.h"
#include "reports/compare_report.h"
#include "reports/metric_format.h"
#include "reports/text_table.h"

namespace qeval::cli {
namespace {

void print_summary(const reports::CompareImagesReport& r, const std::string& out_dir) {
  const std::size_t width = base::stdout_columns();
  const std::size_t errors = r.count_errors();
  std::string s = fmt::format("qeval compare-images: {} pairs, {} compared, {} could not be compared ({:.2f} s)\n",
                              r.pairs.size(), r.pairs.size() - errors, errors, r.elapsed_s);
  reports::TextTable table;
  table.indent = "  ";
  table.gap = " ";
  table.columns = {{"metric", false, 12}, {"pairs", true, 5},   {"mean", true, 10}, {"min", true, 10},
                   {"p5", true, 10},      {"median", true, 10}, {"max", true, 10}};
  for (const auto& m : r.summary) {
    if (m.count == 0) {
      table.rows.push_back({m.metric, "0", m.unbounded ? "all identical" : "not applicable", "", "", "", ""});
      continue;
    }
    std::vector<std::string> row = {m.metric, std::to_string(m.count)};
    for (double v : {m.mean, m.min, m.p5, m.median, m.max}) row.push_back(reports::format_metric(m.metric, v));
    table.rows.push_back(std::move(row));
  }
  s += reports::render_text_table(table, width);
  // The lines below are never cut and not wrapped either: they name files and errors a reader
  // searches for whole.
  if (!r.worst.empty()) {
    std::string line = "  worst pairs:";
    for (std::size_t i = 0; i < r.worst.size(); ++i)
      line += fmt::format("{} {} ({})", i ? ";" : "", r.worst[i].name, r.worst[i].caption);
    s += line + "\n";
  }
  for (const auto& p : r.pairs)
    if (!p.ok()) s += fmt::format("  error: {}: {}\n", p.name, p.error);
  std::size_t passed = 0;
  for (const auto& c : r.gate.checks) passed += c.passed;
  s += fmt::format("gate: {} ({} of {} checks passed; {})\n", r.gate.passed ? "PASSED" : "FAILED", passed,
                   r.gate.checks.size(), r.gate.source);
  for (const auto& c : r.gate.checks) s += fmt::format("  [{}] {}: {}\n", c.passed ? "pass" : "FAIL", c.name, c.detail);
  s += fmt::format("report: {0}/report.json, {0}/report.html, {0}/junit.xml\n", out_dir);
  fmt::print("{}", s);
}

struct Args {
  std::string ref, test, out = "qeval-compare-images", gate, ssim = "wang", alpha = "ignore";
  double peak = 0;
  int worst = 4;
};

int run(const Args& a, const Context& ctx) {
  // Every pair allocates and frees image-sized buffers (a 256x256 pair: planes of 0.8 MB, SSIM
  // maps, MS-SSIM scales) below main's 1 MiB mmap threshold, and the rows' small allocations made
  // between them split the freed chunks: the heap grew by ~0.9 MB a pair with ~4 MB in use (600
  // pairs: 585 MB resident). Mapping every buffer of 64 KiB or more gives it back when freed, so
  // memory stays flat in the number of pairs (bench/README.md "compare-images memory").
  mallopt(M_MMAP_THRESHOLD, 256 << 10);
  eval::CompareImagesOptions options;
  options.ref_dir = a.ref;
  options.test_dir = a.test;
  auto convention = metrics::parse_ssim_convention(a.ssim);
  if (!convention)
    throw InputError("--ssim: unknown convention '" + a.ssim + "' (expected wang, matlab or skimage-default)");
  options.ssim_convention = *convention;
  options.alpha = a.alpha == "compare" ? eval::AlphaMode::kCompare : eval::AlphaMode::kIgnore;
  if (a.peak > 0) options.peak = a.peak;
  options.worst = a.worst;
  eval::Gate gate = a.gate.empty() ? eval::Gate{} : eval::load_gate(a.gate);

  auto report = eval::run_compare_images(options, gate, /*show_progress=*/true);
  report.created_utc = utc_now();
  report.command_line = ctx.command_line;
  if (!a.gate.empty()) report.config.emplace_back("gate", a.gate);
  reports::write_compare_images_report(report, a.out);
  print_summary(report, a.out);
  return report.gate.passed ? base::kExitPass : base::kExitGateFailed;
}

Runner add(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd =
      app.add_subcommand("compare-images",
                         "Compare a folder of test images (e.g. INT8/FP8 pipeline outputs) with a folder of\n"
                         "reference images (e.g. FP16 outputs), paired by relative path: PSNR, PSNR on luma, SSIM,\n"
                         "MS-SSIM per pair, summary statistics, an optional gate; writes report.json, report.html\n"
                         "and junit.xml under --out. Reads 8/16-bit PNG and JPEG.\n"
                         "Exit: 0 gate passed, 1 gate failed (or a pair could not be compared), 2 bad input.");
  cmd->add_option("--ref", a->ref, "folder of reference images")->required();
  cmd->add_option("--test", a->test, "folder of test images (same relative paths)")->required();
  cmd->add_option("--out", a->out, "folder for report.json, report.html, junit.xml (default qeval-compare-images)");
  cmd->add_option("--gate", a->gate,
                  "gate JSON: thresholds on mean/min/percentiles and per pair (docs/gate.md); "
                  "without it the run fails only on pairs that could not be compared");
  cmd->add_option("--ssim", a->ssim, "SSIM convention: wang (default), matlab, skimage-default")
      ->check(CLI::IsMember({"wang", "matlab", "skimage-default"}));
  cmd->add_option("--alpha", a->alpha, "alpha channels: ignore (default, noted per pair) or compare (as a channel)")
      ->check(CLI::IsMember({"ignore", "compare"}));
  cmd->add_option("--peak", a->peak, "peak signal value for PSNR/SSIM (default: 255 for 8-bit, 65535 for 16-bit)")
      ->check(positive_number());
  cmd->add_option("--worst", a->worst, "worst pairs shown side by side in the HTML (default 4)")
      ->check(whole_number_at_least(0));
  return [a](const Context& ctx) { return run(*a, ctx); };
}

const bool kRegistered = register_command(10, add);

}  // namespace
}  // namespace qeval::cli
