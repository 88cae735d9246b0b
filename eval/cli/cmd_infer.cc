// qeval infer (one ONNX model, .npy in and out) and qeval inspect (describe a model).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "base/exit_codes.h"
#include "eval/cli/command.h"
#include "eval/run/infer.h"

namespace qeval::cli {
namespace {

struct InferArgs {
  std::string model, inputs, outputs = "qeval-infer", precision = "fp32", dump;
  std::vector<std::string> shapes;
  bool float_qdq = false;
  int repeat = 0;
};

int run_infer(const InferArgs& a) {
  eval::InferOptions options;
  options.model = a.model;
  options.inputs_dir = a.inputs;
  options.outputs_dir = a.outputs;
  options.precision = *eval::precision_from_name(a.precision);  // CLI11 checked the name
  for (const auto& s : a.shapes) options.shapes.insert(eval::parse_shape_option(s));
  if (!a.dump.empty()) options.dump_dir = a.dump;
  options.integer_qdq = !a.float_qdq;
  options.repeat = a.repeat;
  auto r = eval::run_infer(options);
  fmt::print("qeval infer: {} ({} precision, {}) ran in {:.1f} ms\n", a.model, a.precision, r.device, r.elapsed_ms);
  fmt::print("  activations: {:.1f} MB of buffers at the peak, {:.1f} MB alive at once\n",
             r.peak_activation_bytes / 1e6, r.live_activation_bytes / 1e6);
  if (!r.repeat_ms.empty()) {
    std::vector<double> sorted = r.repeat_ms;
    std::sort(sorted.begin(), sorted.end());
    fmt::print("  --repeat {}: median {:.2f} ms, min {:.2f} ms, max {:.2f} ms\n", sorted.size(),
               sorted[sorted.size() / 2], sorted.front(), sorted.back());
  }
  if (!r.host_nodes.empty()) {
    fmt::print("  {} nodes ran on the CPU ({} has no kernel for them):\n", r.host_nodes.size(), r.device);
    for (const auto& h : r.host_nodes) fmt::print("    {}\n", h);
  }
  if (!r.fused.empty())
    fmt::print("  int8 kernels (Q/DQ fusion) for {} nodes: {}\n", r.fused.size(), fmt::join(r.fused, ", "));
  for (const auto& out : r.outputs)
    fmt::print("  output {} {} -> {}/{}\n", out.name, shape_to_string(out.shape), a.outputs, out.file);
  fmt::print("  {}/outputs.json maps output names to files\n", a.outputs);
  if (r.dumped) fmt::print("  --dump-all: {} tensors in {} (index.json maps names to files)\n", r.dumped, a.dump);
  return base::kExitPass;
}

Runner add_infer(CLI::App& app) {
  auto a = std::make_shared<InferArgs>();
  auto* cmd =
      app.add_subcommand("infer",
                         "Run one ONNX model through qeval's own kernels: inputs are <input name>.npy files in\n"
                         "--inputs, outputs are written as <output name>.npy in --out (characters outside\n"
                         "[A-Za-z0-9_.-] in names become '_'; names that then collide get __2, __3, ... in the\n"
                         "graph's order; outputs.json maps names to files: docs/infer.md). --dump-all also writes\n"
                         "every intermediate tensor (Polygraphy's 'mark all', without changing the computation)\n"
                         "plus an index.json.\n"
                         "Exit: 0 ran, 2 bad model or inputs.");
  cmd->add_option("--model", a->model, "the .onnx file (external weights beside it)")->required();
  cmd->add_option("--inputs", a->inputs, "folder of <input name>.npy")->required();
  auto* out = cmd->add_option("--out", a->outputs, "folder for <output name>.npy (default qeval-infer)");
  add_old_spelling(cmd, out, "--outputs", a->outputs);
  cmd->add_option(
         "--precision", a->precision,
         "fp32 (default); fp16 or bf16: a deployment (BatchNormalization folded, values rounded where fused kernels "
         "store them, FP32 accumulation); fp16-strict or bf16-strict: every op's output rounded (docs/precision.md)")
      ->check(CLI::IsMember(eval::precision_names()));
  cmd->add_option("--shape", a->shapes, "NAME=D0,D1,...: reshape that input's array (repeatable)");
  cmd->add_option("--dump-all", a->dump, "folder for every intermediate tensor (.npy)");
  cmd->add_option("--repeat", a->repeat,
                  "run N more times after the first and print the median, min and max time (the first run "
                  "plans the model, packs weights and, on a GPU, uploads them)")
      ->check(whole_number_at_least(0));
  cmd->add_flag("--float-qdq", a->float_qdq,
                "run Q/DQ graphs as written (DequantizeLinear, then float Conv/MatMul/Gemm) instead of "
                "fusing them into int8 x int8 -> int32 kernels (docs/quantized-graphs.md)");
  return [a](const Context&) { return run_infer(*a); };
}

Runner add_inspect(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("inspect",
                                 "Describe an ONNX model: inputs, outputs, opsets, op histogram, unsupported ops, "
                                 "parameters. Exit: 0 all ops supported, 1 some are not, 2 unreadable model.");
  auto* model = cmd->add_option("--model", *path, "the .onnx file");
  // The old positional form (`qeval inspect m.onnx`), kept for a release.
  auto* positional =
      cmd->add_option("model_file", *path, "deprecated: use --model")->group("Deprecated spellings (still accepted)");
  positional->each([](const std::string&) { print_deprecation("inspect", "the positional model", "--model"); });
  positional->excludes(model);
  return [path](const Context&) {
    if (path->empty()) throw InputError("inspect: --model is required (the .onnx file to describe)");
    bool supported = false;
    fmt::print("{}", eval::inspect_model(*path, &supported));
    return supported ? base::kExitPass : base::kExitGateFailed;
  };
}

const bool kInferRegistered = register_command(20, add_infer);
const bool kInspectRegistered = register_command(21, add_inspect);

}  // namespace
}  // namespace qeval::cli
