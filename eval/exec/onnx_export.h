// ONNX export: Graph -> ModelProto (the ONNX project's protobuf classes), so a graph qeval built or
// rewrote (a recipe's Q/DQ variant) can be run by ONNX Runtime or TensorRT. load_onnx(export)
// gives back the same graph.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "eval/exec/graph.h"

namespace qeval::eval {

struct ExportOptions {
  std::string producer = "qeval";
  std::string graph_name = "qeval";
  // save_onnx: a graph whose initializers hold at least this many bytes keeps those of
  // external_min_bytes or more in one external data file beside the model (ONNX's layout: TensorRT,
  // ONNX Runtime and qeval read it), as a full-size UNet must (protobuf's 2 GiB limit).
  std::uint64_t external_from_bytes = std::uint64_t(1) << 30;
  std::uint64_t external_min_bytes = 1024;
};

// Serialized ModelProto: opset imports, initializers (raw data), graph inputs/outputs with their
// declared shapes, nodes with attributes, in the graph's order. IR version 9 for opset >= 19 (the
// float8 types), 8 below. Throws UnsupportedError for attributes qeval keeps no value of
// (sub-graphs) and InputError when the model exceeds protobuf's 2 GiB limit.
std::string serialize_onnx(const Graph& graph, const ExportOptions& options = {});
// Writes serialize_onnx atomically (temporary file renamed over the target). A graph past
// options.external_from_bytes of initializers: its large ones go to `<file name>.data` in the same
// folder (each at a 4096-byte-aligned offset, written and renamed into place before the model
// that names it), the rest inline; a smaller graph leaves any old `.data` file alone.
void save_onnx(const Graph& graph, const std::filesystem::path& path, const ExportOptions& options = {});

}  // namespace qeval::eval
