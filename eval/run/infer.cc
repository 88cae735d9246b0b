// infer and inspect: .npy in, executor, .npy out; and a model summary.
#include "eval/run/infer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <set>

#include "base/file_names.h"
#include "base/files.h"
#include "datasets/npy.h"
#include "eval/exec/onnx_import.h"
#include "eval/exec/qdq_fusion.h"
#include "kernels/error.h"
#include "reports/json_text.h"

namespace qeval::eval {

namespace fs = std::filesystem;

std::pair<std::string, Shape> parse_shape_option(const std::string& text) {
  const auto eq = text.rfind('=');
  if (eq == std::string::npos || eq == 0)
    throw InputError("--shape '" + text + "': expected NAME=D0,D1,... (e.g. latent=1,4,64,64)");
  Shape shape;
  std::string dims = text.substr(eq + 1);
  std::size_t pos = 0;
  while (pos <= dims.size() && !dims.empty()) {
    std::size_t comma = dims.find(',', pos);
    std::string d = dims.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    try {
      std::size_t used = 0;
      long long v = std::stoll(d, &used);
      if (used != d.size() || v < 0) throw std::invalid_argument(d);
      shape.push_back(v);
    } catch (const std::exception&) {
      throw InputError("--shape '" + text + "': '" + d + "' is not a non-negative integer");
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  // Checked here: shape_numel's overflow is an std::invalid_argument (exit 3) further on.
  if (!try_shape_numel(shape))
    throw InputError("--shape '" + text + "': " + shape_to_string(shape) + " has more elements than fit in 64 bits");
  return {text.substr(0, eq), shape};
}

namespace {

// --dump-all: every node output, as the executor holds it (float16 values as float32).
class DumpObserver final : public Observer {
 public:
  explicit DumpObserver(fs::path dir) : dir_(std::move(dir)) {}
  void on_node(const NodeEvent& e) override {
    for (std::size_t i = 0; i < e.outputs.size(); ++i) {
      if (!e.outputs[i] || i >= e.node.outputs.size()) continue;
      const std::string& name = e.node.outputs[i];
      const std::string& file = names_.stem(name);
      datasets::write_npy(dir_ / (file + ".npy"), *e.outputs[i]);
      index_.push_back({{"tensor", name},
                        {"file", file + ".npy"},
                        {"node", e.node.name},
                        {"op_type", e.node.op_type},
                        {"folded", e.folded}});
    }
  }
  std::size_t count() const { return index_.size(); }
  void write_index() const {
    base::write_file_atomic(dir_ / "index.json", reports::dump_json_utf8_safe(nlohmann::json(index_), 1) + "\n");
  }

 private:
  fs::path dir_;
  base::FileNamer names_;
  std::vector<nlohmann::json> index_;
};

void make_dir(const fs::path& dir, const char* what) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw InputError(dir.string() + ": cannot create the " + what + " folder: " + ec.message());
}

}  // namespace

InferResult run_infer(const InferOptions& options) {
  Graph graph = load_onnx(options.model);
  std::map<std::string, Tensor> inputs;
  base::FileNamer input_names;
  for (const auto& in : graph.inputs) {
    const fs::path file = options.inputs_dir / (input_names.stem(in.name) + ".npy");
    std::error_code ec;
    if (!fs::exists(file, ec))
      throw InputError(file.string() + ": missing input file for model input '" + in.name + "' (" +
                       std::string(dtype_name(in.dtype)) + ")");
    Tensor t = datasets::read_npy(file);
    if (auto s = options.shapes.find(in.name); s != options.shapes.end()) {
      if (shape_numel(s->second) != t.numel())
        throw InputError("--shape " + in.name + "=" + shape_to_string(s->second) + ": " + file.string() + " has " +
                         std::to_string(t.numel()) + " elements " + shape_to_string(t.shape()));
      t = t.reshaped(s->second);
    }
    inputs.emplace(in.name, std::move(t));
  }
  for (const auto& [name, _] : options.shapes)
    if (!inputs.count(name)) throw InputError("--shape " + name + ": the model has no input with that name");

  SessionOptions session_options;
  session_options.precision = options.precision;
  session_options.integer_qdq = options.integer_qdq;
  session_options.backend = default_backend();
  Session session(graph, session_options);
  std::unique_ptr<DumpObserver> dump;
  if (options.dump_dir) {
    make_dir(*options.dump_dir, "--dump-all");
    dump = std::make_unique<DumpObserver>(*options.dump_dir);
  }
  const auto start = std::chrono::steady_clock::now();
  auto outputs = session.run(inputs, dump.get());
  InferResult result;
  for (const auto& f : session.fused_nodes()) result.fused.push_back(f.name);
  result.elapsed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  result.peak_activation_bytes = session.last_peak_activation_bytes();
  result.live_activation_bytes = session.last_live_activation_bytes();
  for (int i = 0; i < options.repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    outputs = session.run(inputs);  // outputs come back in host memory: the device work is done
    result.repeat_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  result.device = std::string(session_options.backend->name());
  std::map<std::string, Shape> shapes;
  for (const auto& [name, t] : inputs) shapes.emplace(name, t.shape());
  for (const HostStep& h : session.host_steps(shapes)) {
    const Node& n = session.nodes()[h.node];
    result.host_nodes.push_back(n.op_type + " '" + n.name + "': " + h.why);
  }
  make_dir(options.outputs_dir, "outputs");
  base::FileNamer output_names;
  nlohmann::json index = nlohmann::json::array();
  for (const auto& out : graph.outputs) {
    const Tensor& t = outputs.at(out.name);
    const std::string file = output_names.stem(out.name) + ".npy";
    datasets::write_npy(options.outputs_dir / file, t);
    result.outputs.push_back({out.name, t.shape(), file});
    index.push_back(
        {{"tensor", out.name}, {"file", file}, {"shape", t.shape()}, {"dtype", std::string(dtype_name(t.dtype()))}});
  }
  // The name -> file mapping, since several names can share a sanitised stem.
  base::write_file_atomic(options.outputs_dir / "outputs.json",
                          reports::dump_json_utf8_safe(nlohmann::json{{"outputs", index}}, 1) + "\n");
  if (dump) {
    dump->write_index();
    result.dumped = dump->count();
  }
  return result;
}

std::string inspect_model(const fs::path& model, bool* all_supported) {
  ImportOptions options;
  options.require_supported_ops = false;
  Graph g = load_onnx(model, options);
  std::string s = fmt::format("model: {}\nopsets:", model.string());
  for (const auto& [domain, version] : g.opsets)
    s += fmt::format(" {}={}", domain.empty() ? "ai.onnx" : domain, version);
  auto dims = [](const ValueInfo& v) {
    if (!v.has_shape) return std::string("(unknown shape)");
    std::string d = "[";
    for (std::size_t i = 0; i < v.dims.size(); ++i)
      d += (i ? ", " : "") +
           (v.dims[i] >= 0 ? std::to_string(v.dims[i]) : (v.dim_params[i].empty() ? "?" : v.dim_params[i]));
    return d + "]";
  };
  s += "\ninputs:\n";
  for (const auto& in : g.inputs) s += fmt::format("  {} {} {}\n", in.name, dtype_name(in.dtype), dims(in));
  s += "outputs:\n";
  for (const auto& out : g.outputs) s += fmt::format("  {} {} {}\n", out.name, dtype_name(out.dtype), dims(out));
  std::map<std::string, int> histogram;
  std::map<std::string, std::string> unsupported;
  for (const auto& n : g.nodes) {
    const std::string key = (n.domain.empty() ? "" : n.domain + "::") + n.op_type;
    ++histogram[key];
    if (!find_op(n.domain, n.op_type, n.opset)) unsupported[key] = unsupported_reason(n.domain, n.op_type, n.opset);
  }
  s += fmt::format("nodes: {}\n", g.nodes.size());
  for (const auto& [op, count] : histogram)
    s += fmt::format("  {:<28}{:>6}{}\n", op, count, unsupported.count(op) ? "  (unsupported)" : "");
  std::int64_t bytes = 0;
  for (const auto& [name, t] : g.initializers) bytes += static_cast<std::int64_t>(t.nbytes());
  s += fmt::format("parameters: {} in {} initializers ({:.2f} MB)\n", g.parameter_count(), g.initializers.size(),
                   bytes / 1e6);
  const quant::QdqFusion fusion = quant::fuse_qdq(g);
  if (fusion.fused.empty()) {
    s += "integer execution (Q/DQ fusion): none\n";
  } else {
    s += fmt::format("integer execution (Q/DQ fusion): {} nodes run int8 x int8 -> int32\n", fusion.fused.size());
    for (const auto& f : fusion.fused)
      s += fmt::format("  {} ({}){}\n", f.name, f.op_type,
                       f.removed.empty() ? "" : fmt::format(", replaces {}", fmt::join(f.removed, ", ")));
  }
  if (unsupported.empty()) {
    s += "unsupported ops: none\n";
  } else {
    s += "unsupported ops:\n";
    for (const auto& [op, why] : unsupported) s += "  " + why + "\n";
  }
  if (all_supported) *all_supported = unsupported.empty();
  return s;
}

}  // namespace qeval::eval
