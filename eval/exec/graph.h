// The graph IR every variant shares: nodes in topological order, initializers, value types.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/tensor.h"

namespace qeval::eval {

struct Attribute {
  enum class Kind { kInt, kFloat, kString, kInts, kFloats, kStrings, kTensor, kUnsupported };
  Kind kind = Kind::kUnsupported;
  std::int64_t i = 0;
  float f = 0;
  std::string s;
  std::vector<std::int64_t> ints;
  std::vector<float> floats;
  std::vector<std::string> strings;
  Tensor t;

  static Attribute of_int(std::int64_t v) {
    Attribute a;
    a.kind = Kind::kInt;
    a.i = v;
    return a;
  }
  static Attribute of_float(float v) {
    Attribute a;
    a.kind = Kind::kFloat;
    a.f = v;
    return a;
  }
  static Attribute of_string(std::string v) {
    Attribute a;
    a.kind = Kind::kString;
    a.s = std::move(v);
    return a;
  }
  static Attribute of_ints(std::vector<std::int64_t> v) {
    Attribute a;
    a.kind = Kind::kInts;
    a.ints = std::move(v);
    return a;
  }
};

struct Node {
  std::string name;  // never empty: unnamed nodes get "<op_type>_<index>"
  std::string op_type;
  std::string domain;                // "" is the default ONNX domain (ai.onnx)
  int opset = 0;                     // the model's opset version for this node's domain
  std::vector<std::string> inputs;   // "" marks an omitted optional input
  std::vector<std::string> outputs;  // "" marks an omitted optional output
  std::map<std::string, Attribute> attributes;

  bool has(const std::string& attr) const { return attributes.count(attr) > 0; }
  // Typed attribute access; a present attribute of the wrong kind throws InputError naming the
  // node, the attribute and the expected kind.
  std::int64_t get_int(const std::string& attr, const std::int64_t& fallback) const;
  float get_float(const std::string& attr, const float& fallback) const;
  std::string get_string(const std::string& attr, const std::string& fallback) const;
  std::vector<std::int64_t> get_ints(const std::string& attr, const std::vector<std::int64_t>& fallback = {}) const;
  std::vector<float> get_floats(const std::string& attr, const std::vector<float>& fallback = {}) const;
  const Tensor* get_tensor(const std::string& attr) const;  // nullptr when absent
  // "node 'conv1' (Conv)": the prefix of every error about this node.
  std::string describe() const;
  // Number of inputs actually given (trailing omitted ones dropped).
  std::size_t input_count() const;
  bool has_input(std::size_t i) const { return i < inputs.size() && !inputs[i].empty(); }
  // Reshape, Transpose, Squeeze, Unsqueeze, Flatten, Identity: the output holds the first input's
  // values (reordered by a Transpose), none changed.
  bool moves_data_only() const;
};

// A graph input or output as the model declares it. Dimensions: >= 0 fixed, -1 symbolic/unknown
// (`dim_params` holds the symbol name, or "" when the dimension is simply unknown).
struct ValueInfo {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> dims;
  std::vector<std::string> dim_params;
  bool has_shape = false;
};

// The entry of `values` (a graph's inputs or outputs) named `name`, or nullptr.
inline const ValueInfo* find_value(const std::vector<ValueInfo>& values, const std::string& name) {
  for (const auto& v : values)
    if (v.name == name) return &v;
  return nullptr;
}

struct Graph {
  std::string source;                 // file name, for messages
  std::map<std::string, int> opsets;  // domain -> version ("" = ai.onnx)
  std::vector<ValueInfo> inputs;      // runtime inputs (initializers excluded)
  std::vector<ValueInfo> outputs;
  std::unordered_map<std::string, Tensor> initializers;  // includes Constant node outputs
  std::vector<Node> nodes;                               // topologically sorted
  std::int64_t parameter_count() const;
};

}  // namespace qeval::eval
