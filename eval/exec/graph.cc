// Node attribute access with precise errors; graph statistics.
#include "eval/exec/graph.h"

#include "kernels/error.h"

namespace qeval::eval {

namespace {
const char* kind_name(Attribute::Kind k) {
  switch (k) {
    case Attribute::Kind::kInt: return "int";
    case Attribute::Kind::kFloat: return "float";
    case Attribute::Kind::kString: return "string";
    case Attribute::Kind::kInts: return "ints";
    case Attribute::Kind::kFloats: return "floats";
    case Attribute::Kind::kStrings: return "strings";
    case Attribute::Kind::kTensor: return "tensor";
    case Attribute::Kind::kUnsupported: return "unsupported";
  }
  return "?";
}
}  // namespace

std::string Node::describe() const { return "node '" + name + "' (" + op_type + ")"; }

bool Node::moves_data_only() const {
  return domain.empty() && (op_type == "Reshape" || op_type == "Transpose" || op_type == "Squeeze" ||
                            op_type == "Unsqueeze" || op_type == "Flatten" || op_type == "Identity");
}

std::size_t Node::input_count() const {
  std::size_t n = inputs.size();
  while (n > 0 && inputs[n - 1].empty()) --n;
  return n;
}

#define QEVAL_ATTR_GETTER(Type, Name, KindValue, Field)                                                               \
  Type Node::Name(const std::string& attr, const Type& fallback) const {                                              \
    auto it = attributes.find(attr);                                                                                  \
    if (it == attributes.end()) return fallback;                                                                      \
    if (it->second.kind != Attribute::Kind::KindValue)                                                                \
      throw InputError(describe() + ": attribute '" + attr + "' should be " + kind_name(Attribute::Kind::KindValue) + \
                       ", is " + kind_name(it->second.kind));                                                         \
    return it->second.Field;                                                                                          \
  }

QEVAL_ATTR_GETTER(std::int64_t, get_int, kInt, i)
QEVAL_ATTR_GETTER(float, get_float, kFloat, f)
QEVAL_ATTR_GETTER(std::string, get_string, kString, s)
QEVAL_ATTR_GETTER(std::vector<std::int64_t>, get_ints, kInts, ints)
QEVAL_ATTR_GETTER(std::vector<float>, get_floats, kFloats, floats)
#undef QEVAL_ATTR_GETTER

const Tensor* Node::get_tensor(const std::string& attr) const {
  auto it = attributes.find(attr);
  if (it == attributes.end()) return nullptr;
  if (it->second.kind != Attribute::Kind::kTensor)
    throw InputError(describe() + ": attribute '" + attr + "' should be a tensor");
  return &it->second.t;
}

std::int64_t Graph::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& [name, t] : initializers) n += t.numel();
  return n;
}

}  // namespace qeval::eval
