// The qeval command line: subcommands, exit codes (0 pass, 1 gate failed, 2 bad input, 3 internal).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <tbb/global_control.h>

#include <malloc.h>

#include <cstdio>
#include <ctime>
#include <iostream>
#include <memory>

#include "eval/compare_images.h"
#include "eval/exit_codes.h"
#include "eval/infer.h"
#include "eval/progress.h"
#include "kernels/error.h"
#include "qeval/version.h"
#include "reports/compare_report.h"

namespace {

using namespace qeval;

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string join_args(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.find_first_of(" \t\"'") != std::string::npos) a = "'" + a + "'";
    s += (i ? " " : "") + a;
  }
  return s;
}

void print_compare_summary(const reports::CompareImagesReport& r, const std::string& out_dir) {
  const std::size_t errors = r.count_errors();
  fmt::print("qeval compare-images: {} pairs, {} compared, {} could not be compared ({:.2f} s)\n",
             r.pairs.size(), r.pairs.size() - errors, errors, r.elapsed_s);
  fmt::print("  {:<13}{:>6}{:>11}{:>11}{:>11}{:>11}{:>11}\n", "metric", "pairs", "mean", "min",
             "p5", "median", "max");
  for (const auto& s : r.summary) {
    if (s.count == 0) {
      fmt::print("  {:<13}{:>6}   {}\n", s.metric, 0,
                 s.unbounded ? "all identical" : "not applicable");
      continue;
    }
    const char* spec = s.metric.find("ssim") != std::string::npos ? "{:>11.5f}" : "{:>11.3f}";
    fmt::print("  {:<13}{:>6}", s.metric, s.count);
    for (double v : {s.mean, s.min, s.p5, s.median, s.max}) fmt::print(fmt::runtime(spec), v);
    fmt::print("\n");
  }
  if (!r.worst.empty()) {
    fmt::print("  worst pairs:");
    for (std::size_t i = 0; i < r.worst.size(); ++i)
      fmt::print("{} {} ({})", i ? ";" : "", r.worst[i].name, r.worst[i].caption);
    fmt::print("\n");
  }
  for (const auto& p : r.pairs)
    if (!p.ok()) fmt::print("  error: {}: {}\n", p.name, p.error);
  std::size_t passed = 0;
  for (const auto& c : r.gate.checks) passed += c.passed;
  fmt::print("gate: {} ({} of {} checks passed; {})\n", r.gate.passed ? "PASSED" : "FAILED", passed,
             r.gate.checks.size(), r.gate.source);
  for (const auto& c : r.gate.checks)
    fmt::print("  [{}] {}: {}\n", c.passed ? "pass" : "FAIL", c.name, c.detail);
  fmt::print("report: {0}/report.json, {0}/report.html, {0}/junit.xml\n", out_dir);
}

struct CompareArgs {
  std::string ref, test, out, gate, ssim = "wang", alpha = "ignore";
  double peak = 0;
  int worst = 4;
};

int run_compare(const CompareArgs& a, const std::string& command_line) {
  eval::CompareImagesOptions options;
  options.ref_dir = a.ref;
  options.test_dir = a.test;
  auto convention = metrics::parse_ssim_convention(a.ssim);
  if (!convention)
    throw InputError("--ssim: unknown convention '" + a.ssim +
                     "' (expected wang, matlab or skimage-default)");
  options.ssim_convention = *convention;
  options.alpha = a.alpha == "compare" ? eval::AlphaMode::kCompare : eval::AlphaMode::kIgnore;
  if (a.peak > 0) options.peak = a.peak;
  options.worst = a.worst;
  eval::Gate gate = a.gate.empty() ? eval::Gate{} : eval::load_gate(a.gate);

  auto report = eval::run_compare_images(options, gate, eval::stderr_is_terminal());
  report.created_utc = utc_now();
  report.command_line = command_line;
  if (!a.gate.empty()) report.config.emplace_back("gate", a.gate);
  reports::write_compare_images_report(report, a.out);
  print_compare_summary(report, a.out);
  return report.gate.passed ? eval::kExitPass : eval::kExitGateFailed;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qeval: accuracy and image-quality evaluation for quantized diffusion and vision "
               "models.\n\nExit codes: 0 pass, 1 gate failed, 2 bad input or usage, 3 internal "
               "error.",
               "qeval"};
  app.set_version_flag("--version", std::string("qeval ") + QEVAL_VERSION);
  app.require_subcommand(1);
  app.fallthrough();  // global options (--threads) are accepted after the verb too
  int threads = 0;
  app.add_option("--threads", threads, "worker threads (default: all cores)")
      ->check(CLI::NonNegativeNumber);

  CompareArgs compare;
  auto* cmp = app.add_subcommand(
      "compare-images",
      "Compare a folder of test images (e.g. INT8/FP8 pipeline outputs) with a folder of\n"
      "reference images (e.g. FP16 outputs), paired by relative path: PSNR, PSNR on luma, SSIM,\n"
      "MS-SSIM per pair, summary statistics, an optional gate; writes report.json, report.html\n"
      "and junit.xml under --out. Reads 8/16-bit PNG and JPEG.\n"
      "Exit: 0 gate passed, 1 gate failed (or a pair could not be compared), 2 bad input.");
  cmp->add_option("--ref", compare.ref, "folder of reference images")->required();
  cmp->add_option("--test", compare.test, "folder of test images (same relative paths)")->required();
  cmp->add_option("--out", compare.out, "folder for report.json, report.html, junit.xml")->required();
  cmp->add_option("--gate", compare.gate,
                  "gate JSON: thresholds on mean/min/percentiles and per pair (docs/gate.md); "
                  "without it the run fails only on pairs that could not be compared");
  cmp->add_option("--ssim", compare.ssim, "SSIM convention: wang (default), matlab, skimage-default")
      ->check(CLI::IsMember({"wang", "matlab", "skimage-default"}));
  cmp->add_option("--alpha", compare.alpha,
                  "alpha channels: ignore (default, noted per pair) or compare (as a channel)")
      ->check(CLI::IsMember({"ignore", "compare"}));
  cmp->add_option("--peak", compare.peak,
                  "peak signal value for PSNR/SSIM (default: 255 for 8-bit, 65535 for 16-bit)")
      ->check(CLI::PositiveNumber);
  cmp->add_option("--worst", compare.worst, "worst pairs shown side by side in the HTML (default 4)")
      ->check(CLI::NonNegativeNumber);

  eval::InferOptions infer;
  std::string infer_model, infer_inputs, infer_outputs, infer_precision = "fp32", infer_dump;
  std::vector<std::string> infer_shapes;
  auto* inf = app.add_subcommand(
      "infer",
      "Run one ONNX model through qeval's own kernels: inputs are <input name>.npy files in\n"
      "--inputs, outputs are written as <output name>.npy in --outputs (characters outside\n"
      "[A-Za-z0-9_.-] in names become '_'). --dump-all also writes every intermediate tensor\n"
      "(Polygraphy's 'mark all', without changing the computation) plus an index.json.\n"
      "Exit: 0 ran, 2 bad model or inputs.");
  inf->add_option("--model", infer_model, "the .onnx file (external weights beside it)")->required();
  inf->add_option("--inputs", infer_inputs, "folder of <input name>.npy")->required();
  inf->add_option("--outputs", infer_outputs, "folder for <output name>.npy")->required();
  inf->add_option("--precision", infer_precision,
                  "fp32 (default), fp16 or bf16: values rounded to the format after every op, FP32 accumulation")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  inf->add_option("--shape", infer_shapes, "NAME=D0,D1,...: reshape that input's array (repeatable)");
  inf->add_option("--dump-all", infer_dump, "folder for every intermediate tensor (.npy)");

  std::string inspect_path;
  auto* ins = app.add_subcommand(
      "inspect", "Describe an ONNX model: inputs, outputs, opsets, op histogram, unsupported ops, "
                 "parameters. Exit: 0 all ops supported, 1 some are not, 2 unreadable model.");
  ins->add_option("model", inspect_path, "the .onnx file")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);  // prints help/version (code 0) or the usage error
    return code == 0 ? eval::kExitPass : eval::kExitBadInput;
  }

  // Image-sized buffers are allocated and freed for every pair. glibc's default (a threshold that
  // rises to 32 MiB) serves them from the heap, which fragments: resident memory grew by ~50 MB
  // per 1024x1024 pair. A fixed threshold maps each one and returns it when freed.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);

  std::unique_ptr<tbb::global_control> limit;
  if (threads > 0)
    limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                  static_cast<std::size_t>(threads));
  try {
    if (cmp->parsed()) return run_compare(compare, join_args(argc, argv));
    if (inf->parsed()) {
      infer.model = infer_model;
      infer.inputs_dir = infer_inputs;
      infer.outputs_dir = infer_outputs;
      infer.precision = infer_precision == "fp16"   ? eval::Precision::kFp16
                        : infer_precision == "bf16" ? eval::Precision::kBf16
                                                    : eval::Precision::kFp32;
      for (const auto& s : infer_shapes) infer.shapes.insert(eval::parse_shape_option(s));
      if (!infer_dump.empty()) infer.dump_dir = infer_dump;
      auto r = eval::run_infer(infer);
      fmt::print("qeval infer: {} ({} precision) ran in {:.1f} ms\n", infer_model, infer_precision, r.elapsed_ms);
      for (const auto& [name, shape] : r.outputs)
        fmt::print("  output {} {} -> {}/{}.npy\n", name, shape_to_string(shape), infer_outputs,
                   eval::tensor_file_name(name));
      if (r.dumped) fmt::print("  --dump-all: {} tensors in {} (index.json maps names to files)\n", r.dumped, infer_dump);
      return eval::kExitPass;
    }
    if (ins->parsed()) {
      bool supported = false;
      fmt::print("{}", eval::inspect_model(inspect_path, &supported));
      return supported ? eval::kExitPass : eval::kExitGateFailed;
    }
  } catch (const InputError& e) {
    std::fprintf(stderr, "qeval: error: %s\n", e.what());
    return eval::kExitBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qeval: internal error: %s\n", e.what());
    return eval::kExitInternal;
  }
  return eval::kExitInternal;
}
