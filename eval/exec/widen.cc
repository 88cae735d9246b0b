#include "eval/exec/widen.h"

#include <cstdint>

namespace qeval::eval {

namespace {

// ONNX TensorProto.DataType codes.
constexpr std::int64_t kOnnxFloat = 1, kOnnxFloat16 = 10, kOnnxBFloat16 = 16;

bool narrow(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }
bool narrow_code(std::int64_t code) { return code == kOnnxFloat16 || code == kOnnxBFloat16; }

// The node attributes that name a narrow float type as an ONNX type code.
bool names_a_type(const Node& n, const std::string& attribute) {
  if (attribute == "to") return n.op_type == "Cast";
  return attribute == "dtype" && (n.op_type == "EyeLike" || n.op_type.rfind("Random", 0) == 0);
}

}  // namespace

bool declares_narrow_floats(const Graph& g) {
  for (const auto& [_, t] : g.initializers)
    if (narrow(t.dtype())) return true;
  for (const auto* values : {&g.inputs, &g.outputs})
    for (const ValueInfo& v : *values)
      if (narrow(v.dtype)) return true;
  for (const Node& n : g.nodes)
    for (const auto& [name, a] : n.attributes) {
      if (a.kind == Attribute::Kind::kInt && names_a_type(n, name) && narrow_code(a.i)) return true;
      if (a.kind == Attribute::Kind::kTensor && narrow(a.t.dtype())) return true;
    }
  return false;
}

Graph widened_to_float32(const Graph& g) {
  Graph out = g;
  for (auto& [_, t] : out.initializers)
    if (narrow(t.dtype())) t = widened_to_float32(t);
  for (auto* values : {&out.inputs, &out.outputs})
    for (ValueInfo& v : *values)
      if (narrow(v.dtype)) v.dtype = DType::kFloat32;
  for (Node& n : out.nodes)
    for (auto& [name, a] : n.attributes) {
      if (a.kind == Attribute::Kind::kInt && names_a_type(n, name) && narrow_code(a.i)) a.i = kOnnxFloat;
      if (a.kind == Attribute::Kind::kTensor && narrow(a.t.dtype())) a.t = widened_to_float32(a.t);
    }
  return out;
}

}  // namespace qeval::eval
