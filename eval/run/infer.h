// `qeval infer`: one ONNX model on .npy inputs through qeval's executor, outputs as .npy.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/file_names.h"
#include "eval/exec/graph.h"
#include "eval/exec/session.h"

namespace qeval::eval {

struct InferOptions {
  std::filesystem::path model, inputs_dir, outputs_dir;
  Precision precision = Precision::kFp32;
  // --shape NAME=D0,D1,...: the input file is reshaped to this shape (same element count).
  std::map<std::string, Shape> shapes;
  std::optional<std::filesystem::path> dump_dir;  // --dump-all: every node output as .npy
  bool integer_qdq = true;                        // false (--float-qdq): no Q/DQ fusion, DQ then float ops
  int repeat = 0;  // --repeat: runs after the first, timed (the first plans, packs and uploads weights)
};

struct InferResult {
  struct Output {
    std::string name;
    Shape shape;
    std::string file;  // in outputs_dir: FileNamer's stem + ".npy" (base/file_names.h)
  };
  std::vector<Output> outputs;     // in the graph's order
  std::size_t dumped = 0;          // tensors written by --dump-all
  double elapsed_ms = 0;           // the run itself, without I/O
  std::vector<double> repeat_ms;   // each --repeat run, in order
  std::vector<std::string> fused;  // nodes run on int8 kernels (Q/DQ fusion)
  std::string device;              // the backend's name ("cpu", "cuda:0")
  // The first run's activation buffers at their peak (pool capacity included) and the largest set
  // of values alive at once (Session::last_peak_activation_bytes / last_live_activation_bytes).
  std::size_t peak_activation_bytes = 0, live_activation_bytes = 0;
  // On a device backend: the nodes that ran on the CPU and why ("Softmax 'sm': no CUDA kernel ...").
  std::vector<std::string> host_nodes;
};

// Inputs are read from <stem>.npy and outputs written as <stem>.npy, stems given by one FileNamer
// per folder in the graph's order (base/file_names.h: "a/b" -> a_b.npy, then "a:b" -> a_b__2.npy);
// outputs.json in outputs_dir maps every output name to its file. Throws InputError on a missing
// input file, a wrong input name, type or shape, and the model's own load errors.
InferResult run_infer(const InferOptions& options);

// Parses "NAME=D0,D1,..." (the --shape option); throws InputError on a malformed value.
std::pair<std::string, Shape> parse_shape_option(const std::string& text);

// `qeval inspect`: a human-readable description of a model (inputs, outputs, opsets, op
// histogram, unsupported ops, parameters, the nodes Q/DQ fusion runs on int8 kernels).
std::string inspect_model(const std::filesystem::path& model, bool* all_supported);

}  // namespace qeval::eval
