// ONNX import: ModelProto (the ONNX project's own protobuf definitions) -> Graph.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include "eval/exec/graph.h"
#include "kernels/tensor.h"

namespace onnx {
class TensorProto;
}

namespace qeval::eval {

struct ImportOptions {
  // Fail at load when a node's (domain, op, opset) is not registered. Off only for `inspect`.
  bool require_supported_ops = true;
};

// Reads an .onnx file (weights beside it when stored as external data). Throws InputError with the
// file and a precise reason: not found, not an ONNX model, unsupported IR/opset, unknown data type,
// missing external data, cycles, and (by default) every unsupported node with its name, op, domain
// and opset.
Graph load_onnx(const std::filesystem::path& path, const ImportOptions& options = {});
Graph parse_onnx(std::span<const std::uint8_t> bytes, const std::string& name,
                 const std::filesystem::path& external_data_dir, const ImportOptions& options = {});

// TensorProto -> Tensor in its declared element type (float16 etc. keep their bit patterns).
Tensor tensor_from_proto(const onnx::TensorProto& proto, const std::filesystem::path& external_data_dir,
                         const std::string& context);
// Reads a serialized TensorProto file (the ONNX test-data .pb files).
Tensor read_tensor_pb(const std::filesystem::path& path);

// ONNX TensorProto.DataType <-> DType; throws InputError for types qeval does not handle (string).
DType dtype_from_onnx(int onnx_type, const std::string& context);
int onnx_type_of(DType t);

}  // namespace qeval::eval
