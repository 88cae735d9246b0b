// ONNX import: parse, convert initializers and attributes, topologically sort, check op support.
#include "eval/exec/onnx_import.h"

#include <onnx/onnx_pb.h>

#include <charconv>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "base/input_file.h"
#include "base/mapped_file.h"
#include "eval/exec/ops/op.h"
#include "kernels/error.h"

namespace qeval::eval {

namespace fs = std::filesystem;

namespace {

// A tensor whose size was checked against its data; a size the machine cannot give is still bad
// input (a model too large for this machine), not an internal error.
Tensor allocate_checked(DType dtype, const Shape& shape, std::size_t nbytes, const std::string& context) {
  try {
    return Tensor(dtype, shape);
  } catch (const std::bad_alloc&) {
    throw InputError(context + ": cannot allocate " + std::to_string(nbytes) + " bytes for shape " +
                     shape_to_string(shape) + " (not enough memory)");
  }
}

// An external-data offset or length: a plain non-negative decimal. std::stoll accepted "12abc"
// and threw std::invalid_argument (exit 3) on "abc".
std::int64_t parse_external_number(const std::string& text, const char* key, const std::string& where) {
  std::int64_t v = -1;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end || v < 0)
    throw InputError(where + ": " + key + " '" + text + "' is not a non-negative integer");
  return v;
}

// Whether `inner` lies strictly inside `folder`, both canonical: a prefix check on whole path
// components (a string prefix would let /models/a match /models/ab).
bool inside_folder(const fs::path& folder, const fs::path& inner) {
  auto f = folder.begin(), i = inner.begin();
  for (; f != folder.end(); ++f, ++i) {
    if (f->empty()) continue;  // a trailing separator's empty component
    if (i == inner.end() || *f != *i) return false;
  }
  return i != inner.end();
}

// The external data files of one model, each mapped once (weights in one file, or one file per
// tensor); nullptr for a file that could not be mapped (empty, or the system refused).
using MappedFiles = std::map<fs::path, std::shared_ptr<const base::MappedFile>>;

// Reads external data into a tensor of `dtype` and `shape` (`nbytes` bytes). The file must be a
// regular file inside the model's folder after resolving symlinks: a location is a path from a
// file nobody checked (`../../etc/passwd`, `/dev/zero`, a FIFO that blocks forever), and weights
// come back out in output tensors. Offset and length are checked against the file's size before
// the tensor is allocated. With `files`, the file is mapped (once per model) and a tensor at a
// 64-byte-aligned place borrows its bytes from the mapping (Tensor::borrowed: nothing is copied,
// pages are read when first used); others are copied out of it.
Tensor read_external_data(const onnx::TensorProto& p, const fs::path& external_dir, DType dtype, const Shape& shape,
                          std::size_t nbytes, const std::string& context, MappedFiles* files) {
  std::string location, offset_text, length_text;
  bool has_offset = false, has_length = false;
  for (const auto& kv : p.external_data()) {
    if (kv.key() == "location") location = kv.value();
    else if (kv.key() == "offset") offset_text = kv.value(), has_offset = true;
    else if (kv.key() == "length") length_text = kv.value(), has_length = true;
  }
  if (location.empty()) throw InputError(context + ": external data without a location");
  const std::string where = context + ": external data '" + location + "'";
  if (location.find('\0') != std::string::npos)  // open() would read only up to it
    throw InputError(where + ": the location holds a NUL character");
  const std::int64_t offset = has_offset ? parse_external_number(offset_text, "offset", where) : 0;
  const std::int64_t length = has_length ? parse_external_number(length_text, "length", where) : -1;
  if (length >= 0 && static_cast<std::uint64_t>(length) != nbytes)
    throw InputError(where + ": length " + std::to_string(length) + " does not match shape " + shape_to_string(shape) +
                     " (" + std::to_string(nbytes) + " bytes of " + std::string(dtype_name(dtype)) + ")");

  const fs::path rel(location);
  if (rel.has_root_name() || rel.has_root_directory())
    throw InputError(where + ": an absolute path; external data must be a file inside the model's folder");
  const fs::path dir = external_dir.empty() ? fs::path(".") : external_dir;
  std::error_code ec;
  const fs::path folder = fs::canonical(dir, ec);
  if (ec) throw InputError(where + ": the model's folder " + dir.string() + " cannot be resolved: " + ec.message());
  const fs::path file = fs::weakly_canonical(folder / rel, ec);
  if (ec) throw InputError(where + ": cannot resolve " + (folder / rel).string() + ": " + ec.message());
  if (!inside_folder(folder, file))
    throw InputError(where + ": resolves to " + file.string() + ", outside the model's folder " + folder.string() +
                     " (external data must be a file inside it)");
  const std::string display = where + ": external data file " + file.string();
  std::shared_ptr<const base::MappedFile> mapping;
  std::optional<base::RegularFile> fd;
  if (files) {
    if (auto it = files->find(file); it != files->end()) mapping = it->second;
  }
  if (!mapping) {
    // O_NOFOLLOW: the path is canonical, so a symlink here was put there since it was resolved.
    fd.emplace(base::open_regular_file(file, /*follow_symlinks=*/false, display));
    if (files) files->insert_or_assign(file, mapping = base::MappedFile::map(*fd));
  }
  const std::uint64_t size = mapping ? mapping->size() : fd->size();
  if (static_cast<std::uint64_t>(offset) > size || nbytes > size - static_cast<std::uint64_t>(offset))
    throw InputError(where + ": external data file " + file.string() + " is too short (needs " +
                     std::to_string(nbytes) + " bytes from offset " + std::to_string(offset) + ", the file has " +
                     std::to_string(size) + ")");

  if (mapping) {
    const std::byte* at = mapping->data() + offset;
    if (reinterpret_cast<std::uintptr_t>(at) % 64 == 0) return Tensor::borrowed(dtype, shape, at, mapping);
    Tensor t = allocate_checked(dtype, shape, nbytes, context);
    if (nbytes) std::memcpy(t.raw(), at, nbytes);
    mapping->release_pages(at, nbytes);
    return t;
  }
  Tensor t = allocate_checked(dtype, shape, nbytes, context);
  fd->read_at(t.raw(), nbytes, static_cast<std::uint64_t>(offset));
  return t;
}

}  // namespace

DType dtype_from_onnx(int type, const std::string& context) {
  switch (type) {
    case onnx::TensorProto::FLOAT: return DType::kFloat32;
    case onnx::TensorProto::UINT8: return DType::kUInt8;
    case onnx::TensorProto::INT8: return DType::kInt8;
    case onnx::TensorProto::UINT16: return DType::kUInt16;
    case onnx::TensorProto::INT16: return DType::kInt16;
    case onnx::TensorProto::INT32: return DType::kInt32;
    case onnx::TensorProto::INT64: return DType::kInt64;
    case onnx::TensorProto::BOOL: return DType::kBool;
    case onnx::TensorProto::FLOAT16: return DType::kFloat16;
    case onnx::TensorProto::DOUBLE: return DType::kFloat64;
    case onnx::TensorProto::UINT32: return DType::kUInt32;
    case onnx::TensorProto::UINT64: return DType::kUInt64;
    case onnx::TensorProto::BFLOAT16: return DType::kBFloat16;
    case 17: return DType::kFloat8E4M3FN;  // added in ONNX 1.14; not in this proto's enum
    case 18: return DType::kFloat8E4M3FNUZ;
    case 19: return DType::kFloat8E5M2;
    case 20: return DType::kFloat8E5M2FNUZ;
    case onnx::TensorProto::STRING: throw InputError(context + ": string tensors are not supported");
    default: throw InputError(context + ": unsupported element type " + std::to_string(type));
  }
}

int onnx_type_of(DType t) {
  switch (t) {
    case DType::kFloat32: return onnx::TensorProto::FLOAT;
    case DType::kFloat64: return onnx::TensorProto::DOUBLE;
    case DType::kFloat16: return onnx::TensorProto::FLOAT16;
    case DType::kBFloat16: return onnx::TensorProto::BFLOAT16;
    case DType::kFloat8E4M3FN: return 17;
    case DType::kFloat8E4M3FNUZ: return 18;
    case DType::kFloat8E5M2: return 19;
    case DType::kFloat8E5M2FNUZ: return 20;
    case DType::kInt8: return onnx::TensorProto::INT8;
    case DType::kUInt8: return onnx::TensorProto::UINT8;
    case DType::kInt16: return onnx::TensorProto::INT16;
    case DType::kUInt16: return onnx::TensorProto::UINT16;
    case DType::kInt32: return onnx::TensorProto::INT32;
    case DType::kUInt32: return onnx::TensorProto::UINT32;
    case DType::kInt64: return onnx::TensorProto::INT64;
    case DType::kUInt64: return onnx::TensorProto::UINT64;
    case DType::kBool: return onnx::TensorProto::BOOL;
  }
  return onnx::TensorProto::UNDEFINED;
}

namespace {

Tensor tensor_from_proto(const onnx::TensorProto& p, const fs::path& external_dir, const std::string& context,
                         MappedFiles* files) {
  const DType dtype = dtype_from_onnx(p.data_type(), context);
  Shape shape(p.dims().begin(), p.dims().end());
  for (auto d : shape)
    if (d < 0) throw InputError(context + ": negative dimension in " + shape_to_string(shape));
  // Sizes are checked against the data before anything is allocated: a shape of [2^40] over 16
  // bytes of data must be an InputError, not a bad_alloc.
  const std::optional<std::int64_t> numel = try_shape_numel(shape);
  const std::optional<std::size_t> bytes = numel ? try_nbytes(dtype, *numel) : std::nullopt;
  if (!bytes)
    throw InputError(context + ": shape " + shape_to_string(shape) + " has more elements than fit in 64 bits");
  const std::size_t nbytes = *bytes;
  const std::size_t esize = dtype_size(dtype);

  if (p.data_location() == onnx::TensorProto::EXTERNAL)
    return read_external_data(p, external_dir, dtype, shape, nbytes, context, files);
  if (p.has_raw_data()) {
    if (p.raw_data().size() != nbytes)
      throw InputError(context + ": raw_data has " + std::to_string(p.raw_data().size()) + " bytes, shape " +
                       shape_to_string(shape) + " needs " + std::to_string(nbytes));
    Tensor t = allocate_checked(dtype, shape, nbytes, context);
    if (nbytes) std::memcpy(t.raw(), p.raw_data().data(), nbytes);  // little-endian host
    return t;
  }
  // Typed fields: small types (int8..uint16, bool, float16, bfloat16, fp8) live in int32_data.
  int count = 0;
  switch (dtype) {
    case DType::kFloat32: count = p.float_data_size(); break;
    case DType::kFloat64: count = p.double_data_size(); break;
    case DType::kInt64: count = p.int64_data_size(); break;
    case DType::kUInt32:
    case DType::kUInt64: count = p.uint64_data_size(); break;
    default: count = p.int32_data_size();
  }
  if (count != *numel)
    throw InputError(context + ": has " + std::to_string(count) + " values for shape " + shape_to_string(shape));
  Tensor t = allocate_checked(dtype, shape, nbytes, context);
  switch (dtype) {
    case DType::kFloat32: std::copy(p.float_data().begin(), p.float_data().end(), t.data<float>()); break;
    case DType::kFloat64: std::copy(p.double_data().begin(), p.double_data().end(), t.data<double>()); break;
    case DType::kInt64: std::copy(p.int64_data().begin(), p.int64_data().end(), t.data<std::int64_t>()); break;
    case DType::kUInt32:
    case DType::kUInt64:
      for (int i = 0; i < p.uint64_data_size(); ++i) {
        std::uint64_t v = p.uint64_data(i);
        std::memcpy(t.raw() + std::size_t(i) * esize, &v, esize);  // little-endian: low bytes first
      }
      break;
    default:
      for (int i = 0; i < p.int32_data_size(); ++i) {
        std::int32_t v = p.int32_data(i);
        std::memcpy(t.raw() + std::size_t(i) * esize, &v, esize);
      }
  }
  return t;
}

}  // namespace

Tensor tensor_from_proto(const onnx::TensorProto& p, const fs::path& external_dir, const std::string& context) {
  return tensor_from_proto(p, external_dir, context, nullptr);
}

Tensor read_tensor_pb(const fs::path& path) {
  auto bytes = base::read_regular_file(path);
  onnx::TensorProto proto;
  if (!proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    throw InputError(path.string() + ": not a serialized onnx.TensorProto");
  return tensor_from_proto(proto, path.parent_path(), path.string());
}

namespace {

ValueInfo value_info(const onnx::ValueInfoProto& v, const std::string& context) {
  ValueInfo info;
  info.name = v.name();
  if (!v.type().has_tensor_type())
    throw InputError(context + ": value '" + v.name() + "' is not a tensor (sequences and maps are not supported)");
  const auto& tt = v.type().tensor_type();
  info.dtype = dtype_from_onnx(tt.elem_type(), context + ": value '" + v.name() + "'");
  if (tt.has_shape()) {
    info.has_shape = true;
    for (const auto& d : tt.shape().dim()) {
      info.dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
      info.dim_params.push_back(d.has_dim_param() ? d.dim_param() : "");
    }
  }
  return info;
}

Attribute convert_attribute(const onnx::AttributeProto& a, const fs::path& external_dir, const std::string& context,
                            MappedFiles* files) {
  Attribute out;
  switch (a.type()) {
    case onnx::AttributeProto::INT:
      out.kind = Attribute::Kind::kInt;
      out.i = a.i();
      break;
    case onnx::AttributeProto::FLOAT:
      out.kind = Attribute::Kind::kFloat;
      out.f = a.f();
      break;
    case onnx::AttributeProto::STRING:
      out.kind = Attribute::Kind::kString;
      out.s = a.s();
      break;
    case onnx::AttributeProto::INTS:
      out.kind = Attribute::Kind::kInts;
      out.ints.assign(a.ints().begin(), a.ints().end());
      break;
    case onnx::AttributeProto::FLOATS:
      out.kind = Attribute::Kind::kFloats;
      out.floats.assign(a.floats().begin(), a.floats().end());
      break;
    case onnx::AttributeProto::STRINGS:
      out.kind = Attribute::Kind::kStrings;
      out.strings.assign(a.strings().begin(), a.strings().end());
      break;
    case onnx::AttributeProto::TENSOR:
      out.kind = Attribute::Kind::kTensor;
      out.t = tensor_from_proto(a.t(), external_dir, context + " attribute '" + a.name() + "'", files);
      break;
    default: out.kind = Attribute::Kind::kUnsupported;  // graphs, sparse tensors: rejected by the op
  }
  return out;
}

// The value of a Constant node (any of its value* attributes).
Tensor constant_value(const Node& node) {
  if (const Tensor* t = node.get_tensor("value")) return *t;
  auto scalar_or_list = [&](const char* attr, DType dtype) -> std::optional<Tensor> {
    auto it = node.attributes.find(attr);
    if (it == node.attributes.end()) return std::nullopt;
    const Attribute& a = it->second;
    if (dtype == DType::kFloat32) {
      bool list = a.kind == Attribute::Kind::kFloats;
      Tensor t(DType::kFloat32, list ? Shape{std::int64_t(a.floats.size())} : Shape{});
      if (list) std::copy(a.floats.begin(), a.floats.end(), t.data<float>());
      else t.data<float>()[0] = a.f;
      return t;
    }
    bool list = a.kind == Attribute::Kind::kInts;
    Tensor t(DType::kInt64, list ? Shape{std::int64_t(a.ints.size())} : Shape{});
    if (list) std::copy(a.ints.begin(), a.ints.end(), t.data<std::int64_t>());
    else t.data<std::int64_t>()[0] = a.i;
    return t;
  };
  for (auto [attr, dtype] : {std::pair{"value_float", DType::kFloat32},
                             {"value_floats", DType::kFloat32},
                             {"value_int", DType::kInt64},
                             {"value_ints", DType::kInt64}})
    if (auto t = scalar_or_list(attr, dtype)) return std::move(*t);
  fail(node, "Constant without a supported value attribute (value, value_float(s), value_int(s))");
}

}  // namespace

Graph parse_onnx(std::span<const std::uint8_t> bytes, const std::string& name, const fs::path& external_dir,
                 const ImportOptions& options) {
  if (bytes.empty()) throw InputError(name + ": file is empty");
  onnx::ModelProto model;
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    throw InputError(name + ": not an ONNX model (protobuf parse failed: truncated or not a ModelProto)");
  if (!model.has_graph() || model.opset_import_size() == 0)
    throw InputError(name + ": not an ONNX model (no graph or no opset_import)");

  Graph g;
  g.source = name;
  for (const auto& op : model.opset_import()) {
    std::string domain = op.domain() == "ai.onnx" ? "" : op.domain();
    g.opsets[domain] = static_cast<int>(op.version());
  }
  const auto& graph = model.graph();

  // External data is mapped, not read: weights stay in the page cache until used (and packed).
  MappedFiles files;
  std::unordered_set<std::string> init_names;
  for (const auto& init : graph.initializer()) {
    if (!init_names.insert(init.name()).second)
      throw InputError(name + ": two initializers are named '" + init.name() + "'");
    g.initializers.emplace(init.name(),
                           tensor_from_proto(init, external_dir, name + ": initializer '" + init.name() + "'", &files));
  }
  for (const auto& in : graph.input())
    if (!init_names.count(in.name())) g.inputs.push_back(value_info(in, name));
  for (const auto& out : graph.output()) g.outputs.push_back(value_info(out, name));

  // Nodes, converted, then sorted topologically (ONNX requires it; some exporters get it wrong).
  std::vector<Node> nodes;
  nodes.reserve(static_cast<std::size_t>(graph.node_size()));
  std::unordered_set<std::string> names;
  for (int i = 0; i < graph.node_size(); ++i) {
    const auto& p = graph.node(i);
    Node n;
    n.op_type = p.op_type();
    n.domain = p.domain() == "ai.onnx" ? "" : p.domain();
    n.name = p.name().empty() || names.count(p.name()) ? n.op_type + "_" + std::to_string(i) : p.name();
    names.insert(n.name);
    auto opset = g.opsets.find(n.domain);
    if (opset == g.opsets.end())
      throw InputError(name + ": " + n.describe() + " uses domain '" + n.domain + "', which the model does not import");
    n.opset = opset->second;
    n.inputs.assign(p.input().begin(), p.input().end());
    n.outputs.assign(p.output().begin(), p.output().end());
    for (const auto& a : p.attribute())
      n.attributes.emplace(a.name(), convert_attribute(a, external_dir, name + ": " + n.describe(), &files));
    nodes.push_back(std::move(n));
  }

  // A value has one producer (ONNX graphs are in SSA form). Otherwise the last writer won
  // silently, and a node output named like a graph input or initializer hid it from some readers.
  std::unordered_set<std::string> graph_input_names;
  for (const auto& in : graph.input()) graph_input_names.insert(in.name());
  std::unordered_map<std::string, std::size_t> producer;
  for (std::size_t i = 0; i < nodes.size(); ++i)
    for (const auto& o : nodes[i].outputs) {
      if (o.empty()) continue;
      if (init_names.count(o))
        throw InputError(name + ": " + nodes[i].describe() + " writes '" + o +
                         "', which is an initializer's name (a value has one producer)");
      if (graph_input_names.count(o))
        throw InputError(name + ": " + nodes[i].describe() + " writes '" + o +
                         "', which is a graph input's name (a value has one producer)");
      auto [it, fresh] = producer.emplace(o, i);
      if (!fresh)
        throw InputError(name + ": " +
                         (it->second == i ? nodes[i].describe() + " lists output '" + o + "' twice"
                                          : nodes[it->second].describe() + " and " + nodes[i].describe() +
                                                " both produce '" + o + "' (a value has one producer)"));
    }
  std::vector<int> state(nodes.size(), 0);  // 0 new, 1 on stack, 2 done
  std::vector<std::size_t> order;
  order.reserve(nodes.size());
  for (std::size_t root = 0; root < nodes.size(); ++root) {
    if (state[root]) continue;
    std::vector<std::pair<std::size_t, std::size_t>> stack{{root, 0}};
    state[root] = 1;
    while (!stack.empty()) {
      auto& [n, next] = stack.back();
      if (next < nodes[n].inputs.size()) {
        const std::string& in = nodes[n].inputs[next++];
        auto it = producer.find(in);
        if (it == producer.end()) continue;
        if (state[it->second] == 1)
          throw InputError(name + ": the graph has a cycle through " + nodes[it->second].describe());
        if (state[it->second] == 0) {
          state[it->second] = 1;
          stack.emplace_back(it->second, 0);
        }
      } else {
        state[n] = 2;
        order.push_back(n);
        stack.pop_back();
      }
    }
  }

  std::vector<std::string> unsupported;
  for (std::size_t idx : order) {
    Node& n = nodes[idx];
    if (n.op_type == "Constant" && n.domain.empty()) {
      if (n.outputs.size() != 1) fail(n, "Constant must have one output");
      g.initializers.emplace(n.outputs[0], constant_value(n));
      continue;
    }
    if (options.require_supported_ops && !find_op(n.domain, n.op_type, n.opset))
      unsupported.push_back(n.describe() + ": " + unsupported_reason(n.domain, n.op_type, n.opset));
    g.nodes.push_back(std::move(n));
  }
  if (!unsupported.empty()) {
    std::string msg = name + ": " + std::to_string(unsupported.size()) + " unsupported node(s):";
    for (std::size_t i = 0; i < unsupported.size() && i < 20; ++i) msg += "\n  " + unsupported[i];
    if (unsupported.size() > 20) msg += "\n  ... and " + std::to_string(unsupported.size() - 20) + " more";
    throw InputError(msg);
  }

  // Every node input must come from somewhere.
  std::unordered_set<std::string> known(init_names.begin(), init_names.end());
  for (const auto& [k, _] : g.initializers) known.insert(k);
  for (const auto& in : g.inputs) known.insert(in.name);
  for (const auto& n : g.nodes) {
    for (std::size_t i = 0; i < n.inputs.size(); ++i)
      if (!n.inputs[i].empty() && !known.count(n.inputs[i]))
        fail(n, "input " + std::to_string(i) + " '" + n.inputs[i] +
                    "' is not produced by any node, initializer or graph input");
    for (const auto& o : n.outputs)
      if (!o.empty()) known.insert(o);
  }
  for (const auto& out : g.outputs)
    if (!known.count(out.name))
      throw InputError(name + ": graph output '" + out.name + "' is not produced by any node");
  return g;
}

Graph load_onnx(const fs::path& path, const ImportOptions& options) {
  auto bytes = base::read_regular_file(path);
  return parse_onnx(bytes, path.string(), path.parent_path(), options);
}

}  // namespace qeval::eval
