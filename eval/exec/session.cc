// The session: ops made once per graph, weights in storage form, plans cached per input shapes, the
// two ways to run (Session::run, Session::Execution), and extract_subgraph.
#include "eval/exec/session.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <unordered_map>

#include <tbb/parallel_for.h>
#include <unistd.h>

#include "base/mapped_file.h"
#include "eval/exec/deploy_fold.h"
#include "eval/exec/plan.h"
#include "eval/exec/pool.h"
#include "eval/exec/spill.h"
#include "kernels/error.h"
#include "kernels/numeric.h"

namespace qeval::eval {

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::kFp32: return "fp32";
    case Precision::kFp16: return "fp16";
    case Precision::kBf16: return "bf16";
    case Precision::kFp16Strict: return "fp16-strict";
    case Precision::kBf16Strict: return "bf16-strict";
  }
  return "?";
}

namespace {
constexpr Precision kPrecisions[] = {Precision::kFp32, Precision::kFp16, Precision::kBf16, Precision::kFp16Strict,
                                     Precision::kBf16Strict};
}  // namespace

const std::vector<std::string>& precision_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (Precision p : kPrecisions) n.emplace_back(precision_name(p));
    return n;
  }();
  return names;
}

std::optional<Precision> precision_from_name(std::string_view name) {
  for (Precision p : kPrecisions)
    if (precision_name(p) == name) return p;
  return std::nullopt;
}

namespace {

// Converted copies of mapped weights at least this large go to a temporary file (Session::Session).

// `nodes` in the order `order` names them, when it names each once and every node then comes after
// the producers of its inputs; else left as they are.
void reorder_nodes(std::vector<Node>& nodes, const std::vector<std::string>& order) {
  std::unordered_map<std::string, std::size_t> place;
  place.reserve(order.size());
  for (std::size_t k = 0; k < order.size(); ++k) place.emplace(order[k], k);
  std::vector<std::pair<std::size_t, std::size_t>> by_place;  // (place, index in nodes)
  by_place.reserve(nodes.size());
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    auto it = place.find(nodes[i].name);
    if (it == place.end()) return;
    by_place.emplace_back(it->second, i);
  }
  std::sort(by_place.begin(), by_place.end());
  for (std::size_t k = 1; k < by_place.size(); ++k)
    if (by_place[k].first == by_place[k - 1].first) return;  // a name twice
  std::unordered_map<std::string, std::size_t> made_at;      // value -> position of its producer
  for (std::size_t k = 0; k < by_place.size(); ++k)
    for (const auto& o : nodes[by_place[k].second].outputs)
      if (!o.empty()) made_at[o] = k;
  for (std::size_t k = 0; k < by_place.size(); ++k)
    for (const auto& in : nodes[by_place[k].second].inputs)
      if (auto it = in.empty() ? made_at.end() : made_at.find(in); it != made_at.end() && it->second >= k) return;
  std::vector<Node> sorted;
  sorted.reserve(nodes.size());
  for (const auto& [k, i] : by_place) sorted.push_back(std::move(nodes[i]));
  nodes = std::move(sorted);
}

}  // namespace

bool profiling_steps() {
  static const bool on = [] {
    const char* v = std::getenv("QEVAL_PROFILE_STEPS");
    return v && *v && std::string_view(v) != "0";
  }();
  return on;
}

bool tracing_memory() {
  static const bool on = [] {
    const char* v = std::getenv("QEVAL_PROFILE_MEMORY");
    return v && *v && std::string_view(v) != "0";
  }();
  return on;
}

void trace_memory(const std::string& model, const Node& node) {
  static std::atomic<long> last_mb{0};
  long pages = 0, resident = 0, shared = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld %ld", &pages, &resident, &shared) != 3) resident = shared = 0;
    std::fclose(f);
  }
  const long mb = (resident - shared) * (::sysconf(_SC_PAGESIZE) / 1024) / 1024;
  long seen = last_mb.load();
  if (mb >= seen + 256 || mb + 1024 <= seen) {
    last_mb.store(mb);
    std::fprintf(stderr, "QEVAL_PROFILE_MEMORY %ld MB not file-backed (%+ld) after %s in %s\n", mb, mb - seen,
                 node.describe().c_str(), model.c_str());
  }
}

void Session::add_profile(const std::string& kind, std::chrono::steady_clock::time_point since) {
  if (!profiling_steps()) return;
  auto& [count, ms] = profile_[kind];
  ++count;
  ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

Session::Session(const Graph& graph, SessionOptions options)
    : graph_(graph),
      options_(options),
      pool_(options.pool ? options.pool : std::make_shared<BufferPool>()),
      backend_(options.backend ? options.backend : default_backend()),
      device_(backend_->memory()) {
  auto started = std::chrono::steady_clock::now();
  if (options_.integer_qdq) {
    quant::QdqFusion fusion = quant::fuse_qdq(graph);
    nodes_ = std::move(fusion.nodes);
    fused_ = std::move(fusion.fused);
  } else {
    nodes_ = graph.nodes;
  }
  if (options_.node_order) reorder_nodes(nodes_, *options_.node_order);
  if (options_.precision == Precision::kFp16 || options_.precision == Precision::kBf16) {
    DeploymentFold fold = fold_for_deployment(graph, nodes_);
    nodes_ = std::move(fold.nodes);
    folded_weights_ = std::move(fold.weights);
  }
  ops_.reserve(nodes_.size());
  for (const auto& node : nodes_) {
    const OpSchema* schema = find_op(node.domain, node.op_type, node.opset);
    if (!schema)
      throw InputError(graph.source + ": " + node.describe() + ": " +
                       unsupported_reason(node.domain, node.op_type, node.opset));
    ops_.push_back(schema->make(node));
    ops_.back()->share_constants(options_.constants.get());
    for (std::size_t i : ops_.back()->constant_inputs())
      if (node.has_input(i)) constant_graph_inputs_.insert(node.inputs[i]);
  }
  add_profile("setup: graph", started);
  started = std::chrono::steady_clock::now();
  for (const auto& [name, t] : folded_weights_)
    weights_.emplace(name, std::make_shared<const Tensor>(
                               rounded(t, rounding_for(DType::kFloat32, DType::kFloat32, options_.precision))));
  // Initializers that need a converted copy (a wider storage type or rounding), made in parallel.
  struct Converted {
    const std::string* name;
    const Tensor* tensor;
    Rounding rounding;
  };
  std::vector<Converted> converted;
  for (const auto& [name, t] : graph.initializers) {
    const Rounding r = rounding_for(storage_type(t.dtype()), t.dtype(), options_.precision);
    if (storage_type(t.dtype()) == t.dtype() && (r == Rounding::kNone || t.dtype() != DType::kFloat32))
      weights_.emplace(name, std::shared_ptr<const Tensor>(&t, [](const Tensor*) {}));
    else
      converted.push_back({&name, &t, r});
  }
  // On the CPU a mapped weight's copy goes to a temporary file, mapped back: once packed, its pages
  // leave memory as the mapped weight's did (docs/infer.md "Weights in memory"). So does a widened
  // copy (float16/bfloat16 to float32) of any weight: an FP16 export's tensors at unaligned offsets
  // are copied out of the mapping, and their float32 copies were twice the file in memory. A device
  // backend uploads it once: writing it out and reading it back cost seconds per full-size model.
  const bool spill = !device_;
  std::vector<std::shared_ptr<const Tensor>> made(converted.size());
  tbb::parallel_for(std::size_t(0), converted.size(), [&](std::size_t k) {
    const Tensor& t = *converted[k].tensor;
    const Rounding r = converted[k].rounding;
    auto convert = [r, spill](const Tensor& source) {
      Tensor storage = to_storage(source);
      apply_rounding(storage, r);
      const bool widened = storage.dtype() != source.dtype();
      return spill && (source.is_borrowed() || widened) ? spilled(std::move(storage)) : storage;
    };
    made[k] = options_.constants ? options_.constants->get<Tensor>(
                                       std::shared_ptr<const Tensor>(&t, [](const Tensor*) {}),
                                       "storage, rounding " + std::to_string(int(r)), convert)
                                 : std::make_shared<const Tensor>(convert(t));
    t.release_pages();  // a mapped weight: its converted copy replaces it here
  });
  for (std::size_t k = 0; k < converted.size(); ++k) weights_.emplace(*converted[k].name, std::move(made[k]));
  if (device_ && options_.constants)
    for (const auto& [name, t] : graph.initializers) shared_weights_.insert(weights_.at(name).get());
  add_profile("setup: weights", started);
}

std::shared_ptr<const Tensor> Session::device_copy(const std::shared_ptr<const Tensor>& c) {
  auto upload = [this](const Tensor& t) { return t.to_device(device_); };
  if (!shared_weights_.contains(c.get())) return std::make_shared<const Tensor>(upload(*c));
  // Keyed by the device's memory too: one SharedConstants may serve sessions on several devices.
  const std::string key = "device copy " + std::to_string(reinterpret_cast<std::uintptr_t>(device_.get()));
  return options_.constants->get<Tensor>(c, key, upload);
}

// The plans (a device backend's kernels among them) go before the backend they were made by.
Session::~Session() {
  plans_.clear();
  if (profile_.empty()) return;
  std::vector<std::pair<double, std::string>> rows;
  double total = 0;
  for (const auto& [kind, v] : profile_) {
    rows.emplace_back(v.second, kind);
    total += v.second;
  }
  std::sort(rows.rbegin(), rows.rend());
  std::fprintf(stderr, "QEVAL_PROFILE_STEPS %s on %s: %.1f ms (steps, and the host outside them)\n", graph_.source.c_str(),
               std::string(backend_->name()).c_str(), total);
  for (const auto& [ms, kind] : rows)
    std::fprintf(stderr, "  %-28s %6zu steps %10.2f ms %5.1f%%\n", kind.c_str(), profile_[kind].first, ms,
                 total > 0 ? 100 * ms / total : 0.0);
}

std::shared_ptr<BufferPool> Session::make_pool() { return std::make_shared<BufferPool>(); }
std::shared_ptr<BufferPool> make_bounded_pool() { return std::make_shared<BufferPool>(true); }

void trim_free_host_buffers(BufferPool& pool, std::size_t max_free_bytes) {
  if (pool.free_bytes() > max_free_bytes) pool.clear_host();
}

std::size_t Session::pool_allocated_bytes(const BufferPool& pool) { return pool.allocated_bytes(); }

std::vector<HostStep> Session::host_steps(const std::map<std::string, Shape>& input_shapes) {
  return plan_for(input_shapes, {}).host_steps;
}

void Session::drop_retained() {
  for (auto& [key, plan] : plans_) {
    for (Tensor& t : plan->retained) pool_->give(std::move(t));
    plan->retained = {};
  }
}

std::map<std::string, Tensor> Session::run(const std::map<std::string, Tensor>& inputs, Observer* observer) {
  return Execution(*this, inputs, observer, false).finish();
}

std::map<std::string, Tensor> Session::run(const std::map<std::string, const Tensor*>& inputs, Observer* observer) {
  return Execution(*this, inputs, observer, false).finish();
}

Graph extract_subgraph(const Graph& graph, std::span<const std::size_t> nodes,
                       const std::map<std::string, DType>& input_types) {
  Graph sub;
  sub.source = graph.source + " (nodes";
  sub.opsets = graph.opsets;
  std::set<std::string> produced, inputs;
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    if (nodes[k] >= graph.nodes.size() || (k > 0 && nodes[k] <= nodes[k - 1]))
      throw std::invalid_argument("extract_subgraph: node indices must be ascending and below " +
                                  std::to_string(graph.nodes.size()));
    const Node& n = graph.nodes[nodes[k]];
    sub.source += (k ? ", " : " ") + n.name;
    for (const auto& v : n.inputs) {
      if (v.empty() || produced.count(v) || inputs.count(v) || sub.initializers.count(v)) continue;
      if (auto it = graph.initializers.find(v); it != graph.initializers.end()) {
        sub.initializers.emplace(v, it->second);
        continue;
      }
      inputs.insert(v);
      ValueInfo in;
      in.name = v;
      auto t = input_types.find(v);
      in.dtype = t == input_types.end() ? DType::kFloat32 : t->second;
      sub.inputs.push_back(std::move(in));
    }
    for (const auto& v : n.outputs)
      if (!v.empty()) {
        produced.insert(v);
        ValueInfo out;
        out.name = v;
        sub.outputs.push_back(std::move(out));
      }
    sub.nodes.push_back(n);
  }
  sub.source += ")";
  return sub;
}

}  // namespace qeval::eval
