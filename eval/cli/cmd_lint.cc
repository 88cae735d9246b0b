// qeval lint: what a TensorRT build of a Q/DQ ONNX model will trip over (docs/lint.md).
#include <fmt/format.h>

#include "base/exit_codes.h"
#include "base/files.h"
#include "eval/cli/command.h"
#include "eval/exec/onnx_import.h"
#include "eval/quant/lint.h"
#include "eval/run/infer.h"

namespace qeval::cli {
namespace {

struct LintArgs {
  std::string model, target, json;
  std::vector<std::string> shapes;
};

int run_lint(const LintArgs& a) {
  eval::quant::LintOptions options;
  if (!a.target.empty()) options.target_sm = eval::quant::parse_target(a.target);
  for (const auto& s : a.shapes) options.input_shapes.insert(eval::parse_shape_option(s));
  eval::ImportOptions import;
  import.require_supported_ops = false;  // TensorRT plugins and ops qeval cannot run are still linted
  const eval::Graph graph = eval::load_onnx(a.model, import);
  const auto report = eval::quant::lint_graph(graph, options);
  fmt::print("{}", report.to_text());
  if (!a.json.empty()) {
    base::write_file_atomic(a.json, report.to_json().dump(1) + "\n");
    fmt::print("report: {}\n", a.json);
  }
  return report.count(eval::quant::Severity::kError) > 0 ? base::kExitGateFailed : base::kExitPass;
}

Runner add_lint(CLI::App& app) {
  auto a = std::make_shared<LintArgs>();
  auto* cmd = app.add_subcommand(
      "lint",
      "Check a Q/DQ ONNX model against what TensorRT accepts and fuses: zero points, per-channel axes,\n"
      "quantized types, FP8 on the target GPU, Q/DQ placements that leave a Conv/MatMul/Gemm unfused,\n"
      "INT8 attention its fused MHA kernel does not take; then how many Conv/MatMul/Gemm nodes end up\n"
      "quantized and why the others stay in high precision (docs/lint.md).\n"
      "Exit: 0 no error-level finding, 1 some, 2 unreadable model or bad arguments.");
  cmd->add_option("--model", a->model, "the Q/DQ .onnx file")->required();
  cmd->add_option("--target", a->target, "GPU the engine is built for: sm75, sm80, sm86, sm89 or sm90")
      ->check(CLI::IsMember({"sm75", "sm80", "sm86", "sm89", "sm90"}));
  cmd->add_option("--shape", a->shapes,
                  "NAME=D0,D1,...: shape of a dynamic input, for the attention checks (repeatable)");
  cmd->add_option("--json", a->json, "also write the findings and the summary as JSON here");
  return [a](const Context&) { return run_lint(*a); };
}

const bool kRegistered = register_command(45, add_lint);

}  // namespace
}  // namespace qeval::cli
