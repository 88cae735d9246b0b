// Builds small ONNX models in memory (through the ONNX protobuf classes) for executor tests.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstring>
#include <string>
#include <vector>

#include "eval/exec/onnx_import.h"
#include "kernels/tensor.h"

namespace qeval::testing {

class OnnxBuilder {
 public:
  explicit OnnxBuilder(int opset = 17) {
    model_.set_ir_version(8);
    auto* op = model_.add_opset_import();
    op->set_domain("");
    op->set_version(opset);
    model_.mutable_graph()->set_name("test");
  }
  // dims: -1 for a symbolic dimension named "d<i>".
  OnnxBuilder& input(const std::string& name, int elem_type, const std::vector<std::int64_t>& dims) {
    value_info(model_.mutable_graph()->add_input(), name, elem_type, dims);
    return *this;
  }
  OnnxBuilder& output(const std::string& name, int elem_type, const std::vector<std::int64_t>& dims = {}) {
    value_info(model_.mutable_graph()->add_output(), name, elem_type, dims);
    return *this;
  }
  onnx::NodeProto& node(const std::string& op, const std::vector<std::string>& inputs,
                        const std::vector<std::string>& outputs, const std::string& name = "",
                        const std::string& domain = "") {
    auto* n = model_.mutable_graph()->add_node();
    n->set_op_type(op);
    n->set_name(name);
    n->set_domain(domain);
    for (const auto& i : inputs) n->add_input(i);
    for (const auto& o : outputs) n->add_output(o);
    return *n;
  }
  OnnxBuilder& initializer(const std::string& name, const std::vector<float>& values,
                           const std::vector<std::int64_t>& dims) {
    auto* t = model_.mutable_graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (auto d : dims) t->add_dims(d);
    for (float v : values) t->add_float_data(v);
    return *this;
  }
  OnnxBuilder& initializer_i64(const std::string& name, const std::vector<std::int64_t>& values) {
    auto* t = model_.mutable_graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<std::int64_t>(values.size()));
    for (auto v : values) t->add_int64_data(v);
    return *this;
  }
  // Any element type from raw little-endian bytes (int8, float8 codes, float16 bits, ...).
  template <class T>
  OnnxBuilder& initializer_raw(const std::string& name, int elem_type, const std::vector<T>& values,
                               const std::vector<std::int64_t>& dims) {
    auto* t = model_.mutable_graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(elem_type);
    for (auto d : dims) t->add_dims(d);
    t->set_raw_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T)));
    return *this;
  }
  // Declares the opset of another domain (e.g. "trt").
  OnnxBuilder& domain(const std::string& name, int version) {
    auto* op = model_.add_opset_import();
    op->set_domain(name);
    op->set_version(version);
    return *this;
  }
  onnx::ModelProto& proto() { return model_; }
  std::vector<std::uint8_t> bytes() const {
    std::string s;
    model_.SerializeToString(&s);
    return {s.begin(), s.end()};
  }
  eval::Graph graph(const std::string& name = "test.onnx") const {
    auto b = bytes();
    return eval::parse_onnx(b, name, ".");
  }

 private:
  static void value_info(onnx::ValueInfoProto* v, const std::string& name, int elem_type,
                         const std::vector<std::int64_t>& dims) {
    v->set_name(name);
    auto* tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(elem_type);
    auto* shape = tt->mutable_shape();
    for (std::size_t i = 0; i < dims.size(); ++i) {
      auto* d = shape->add_dim();
      if (dims[i] >= 0) d->set_dim_value(dims[i]);
      else {
        std::string param = std::to_string(i);  // "d" + to_string(i) trips GCC 12's -Wrestrict
        d->set_dim_param(param.insert(0, 1, 'd'));
      }
    }
  }
  onnx::ModelProto model_;
};

inline Tensor floats(const Shape& shape, const std::vector<float>& values) {
  Tensor t(DType::kFloat32, shape);
  std::memcpy(t.raw(), values.data(), values.size() * sizeof(float));
  return t;
}

}  // namespace qeval::testing
