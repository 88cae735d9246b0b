// Graph -> ONNX ModelProto.
#include "eval/exec/onnx_export.h"

#include <onnx/onnx_pb.h>

#include <functional>
#include <limits>
#include <string_view>
#include <utility>

#include "base/files.h"
#include "eval/exec/onnx_import.h"
#include "kernels/error.h"

namespace qeval::eval {

namespace {

// Name, type and dimensions; the values are raw data (fill_tensor) or external data (save_onnx).
void fill_tensor_header(onnx::TensorProto* p, const std::string& name, const Tensor& t) {
  p->set_name(name);
  p->set_data_type(onnx_type_of(t.dtype()));
  for (auto d : t.shape()) p->add_dims(d);
}

void fill_tensor(onnx::TensorProto* p, const std::string& name, const Tensor& t) {
  fill_tensor_header(p, name, t);
  p->set_raw_data(reinterpret_cast<const char*>(t.raw()), t.nbytes());  // little-endian host
}

void fill_value_info(onnx::ValueInfoProto* v, const ValueInfo& info) {
  v->set_name(info.name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx_type_of(info.dtype));
  if (!info.has_shape) return;
  auto* shape = tt->mutable_shape();
  for (std::size_t i = 0; i < info.dims.size(); ++i) {
    auto* d = shape->add_dim();
    if (info.dims[i] >= 0) d->set_dim_value(info.dims[i]);
    else if (i < info.dim_params.size() && !info.dim_params[i].empty()) d->set_dim_param(info.dim_params[i]);
  }
}

void fill_attribute(onnx::AttributeProto* p, const std::string& name, const Attribute& a, const Node& node) {
  p->set_name(name);
  switch (a.kind) {
    case Attribute::Kind::kInt:
      p->set_type(onnx::AttributeProto::INT);
      p->set_i(a.i);
      break;
    case Attribute::Kind::kFloat:
      p->set_type(onnx::AttributeProto::FLOAT);
      p->set_f(a.f);
      break;
    case Attribute::Kind::kString:
      p->set_type(onnx::AttributeProto::STRING);
      p->set_s(a.s);
      break;
    case Attribute::Kind::kInts:
      p->set_type(onnx::AttributeProto::INTS);
      for (auto v : a.ints) p->add_ints(v);
      break;
    case Attribute::Kind::kFloats:
      p->set_type(onnx::AttributeProto::FLOATS);
      for (auto v : a.floats) p->add_floats(v);
      break;
    case Attribute::Kind::kStrings:
      p->set_type(onnx::AttributeProto::STRINGS);
      for (const auto& v : a.strings) p->add_strings(v);
      break;
    case Attribute::Kind::kTensor:
      p->set_type(onnx::AttributeProto::TENSOR);
      fill_tensor(p->mutable_t(), "", a.t);
      break;
    case Attribute::Kind::kUnsupported:
      throw UnsupportedError(node.describe() + ": attribute '" + name +
                             "' is of a kind qeval does not keep (graph or sparse tensor); cannot export");
  }
}

// Offsets of external data: page-aligned, so a reader may map each tensor in place.
constexpr std::uint64_t kExternalAlignment = 4096;

// The ModelProto of `g`; `external` (may be null) writes an initializer elsewhere and fills its
// proto's external_data instead of raw_data, returning false to have it inline.
using ExternalWriter = std::function<bool(const Tensor&, onnx::TensorProto*)>;

std::string serialize(const Graph& g, const ExportOptions& options, const ExternalWriter& external) {
  onnx::ModelProto model;
  int default_opset = 0;
  for (const auto& [domain, version] : g.opsets) {
    auto* op = model.add_opset_import();
    op->set_domain(domain);
    op->set_version(version);
    if (domain.empty()) default_opset = version;
  }
  model.set_ir_version(default_opset >= 19 ? 9 : 8);
  model.set_producer_name(options.producer);
  auto* graph = model.mutable_graph();
  graph->set_name(options.graph_name);
  for (const auto& in : g.inputs) fill_value_info(graph->add_input(), in);
  for (const auto& out : g.outputs) fill_value_info(graph->add_output(), out);
  // Initializers in name order: the file is the same for the same graph.
  std::vector<const std::string*> names;
  for (const auto& [name, t] : g.initializers) names.push_back(&name);
  std::sort(names.begin(), names.end(), [](const auto* a, const auto* b) { return *a < *b; });
  for (const auto* name : names) {
    const Tensor& t = g.initializers.at(*name);
    onnx::TensorProto* p = graph->add_initializer();
    if (external && external(t, p)) fill_tensor_header(p, *name, t);
    else fill_tensor(p, *name, t);
  }
  for (const auto& n : g.nodes) {
    auto* p = graph->add_node();
    p->set_name(n.name);
    p->set_op_type(n.op_type);
    if (!n.domain.empty()) p->set_domain(n.domain);
    for (const auto& i : n.inputs) p->add_input(i);
    for (const auto& o : n.outputs) p->add_output(o);
    for (const auto& [name, a] : n.attributes) fill_attribute(p->add_attribute(), name, a, n);
  }
  const std::size_t size = model.ByteSizeLong();
  if (size > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    throw InputError(g.source + ": the exported model would be " + std::to_string(size) +
                     " bytes, over protobuf's 2 GiB limit" +
                     (external ? std::string(" even with its initializers in external data")
                               : std::string(" (save_onnx writes such a graph's weights as external data)")));
  std::string bytes;
  model.SerializeToString(&bytes);
  return bytes;
}

}  // namespace

std::string serialize_onnx(const Graph& g, const ExportOptions& options) { return serialize(g, options, nullptr); }

void save_onnx(const Graph& graph, const std::filesystem::path& path, const ExportOptions& options) {
  std::uint64_t initializer_bytes = 0;
  for (const auto& [name, t] : graph.initializers) initializer_bytes += t.nbytes();
  if (initializer_bytes < options.external_from_bytes) {
    base::write_file_atomic(path, serialize_onnx(graph, options));
    return;
  }
  const std::string data_name = path.filename().string() + ".data";
  base::AtomicFileWriter data(path.parent_path() / data_name);
  std::uint64_t offset = 0;
  const std::string zeros(kExternalAlignment, '\0');
  const std::string model = serialize(graph, options, [&](const Tensor& t, onnx::TensorProto* p) {
    if (t.nbytes() < options.external_min_bytes) return false;
    const std::uint64_t pad = (kExternalAlignment - offset % kExternalAlignment) % kExternalAlignment;
    data.write(std::string_view(zeros.data(), pad));
    offset += pad;
    data.write(std::string_view(reinterpret_cast<const char*>(t.raw()), t.nbytes()));  // little-endian host
    p->set_data_location(onnx::TensorProto::EXTERNAL);
    const std::pair<const char*, std::string> entries[] = {
        {"location", data_name}, {"offset", std::to_string(offset)}, {"length", std::to_string(t.nbytes())}};
    for (const auto& [key, value] : entries) {
      auto* e = p->add_external_data();
      e->set_key(key);
      e->set_value(value);
    }
    offset += t.nbytes();
    return true;
  });
  data.commit();  // before the model that names it
  base::write_file_atomic(path, model);
}

}  // namespace qeval::eval
