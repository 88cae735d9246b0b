// The executor: planning (inference, folding, liveness) and running with buffer reuse.
#include "eval/session.h"

#include <sys/sysinfo.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <functional>
#include <unordered_map>

#include "eval/deploy_fold.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
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

enum class Rounding : std::uint8_t { kNone, kFp16, kBf16 };

Rounding rounding_for(DType storage, DType declared, Precision precision) {
  if (declared == DType::kFloat16) return Rounding::kFp16;
  if (declared == DType::kBFloat16) return Rounding::kBf16;
  if (storage != DType::kFloat32) return Rounding::kNone;
  if (precision == Precision::kFp16 || precision == Precision::kFp16Strict) return Rounding::kFp16;
  if (precision == Precision::kBf16 || precision == Precision::kBf16Strict) return Rounding::kBf16;
  return Rounding::kNone;
}

void apply_rounding(Tensor& t, Rounding r) {
  if (r == Rounding::kNone || t.dtype() != DType::kFloat32) return;
  if (r == Rounding::kFp16) round_to_float16(t.data<float>(), static_cast<std::size_t>(t.numel()));
  else round_to_bfloat16(t.data<float>(), static_cast<std::size_t>(t.numel()));
}

Tensor rounded(Tensor t, Rounding r) {
  apply_rounding(t, r);
  return t;
}

// A tensor in its declared ONNX type -> storage type (narrow floats widen to float32).
Tensor to_storage(const Tensor& t) {
  const DType storage = storage_type(t.dtype());
  if (storage == t.dtype()) return t;
  if (t.dtype() == DType::kFloat16 || t.dtype() == DType::kBFloat16) return widened_to_float32(t);
  Tensor out(storage, t.shape());
  float* dst = out.data<float>();
  const std::uint8_t* b = reinterpret_cast<const std::uint8_t*>(t.raw());
  const std::size_t n = static_cast<std::size_t>(t.numel());
  for (std::size_t i = 0; i < n; ++i) {
    switch (t.dtype()) {
      case DType::kFloat8E4M3FN: dst[i] = to_float(float8_e4m3fn{b[i]}); break;
      case DType::kFloat8E5M2: dst[i] = to_float(float8_e5m2{b[i]}); break;
      case DType::kFloat8E4M3FNUZ: dst[i] = to_float(float8_e4m3fnuz{b[i]}); break;
      case DType::kFloat8E5M2FNUZ: dst[i] = to_float(float8_e5m2fnuz{b[i]}); break;
      default: throw std::logic_error("to_storage: unexpected type");
    }
  }
  return out;
}

// Storage float32 -> declared narrow float type (values are already representable).
Tensor to_declared(const Tensor& t, DType declared) {
  if (declared == t.dtype()) return t;
  Tensor out(declared, t.shape());
  const float* src = t.data<float>();
  std::uint8_t* b = reinterpret_cast<std::uint8_t*>(out.raw());
  const std::size_t n = static_cast<std::size_t>(t.numel());
  for (std::size_t i = 0; i < n; ++i) {
    switch (declared) {
      case DType::kFloat16: {
        std::uint16_t bits = to_float16(src[i]).bits;
        std::memcpy(b + 2 * i, &bits, 2);
        break;
      }
      case DType::kBFloat16: {
        std::uint16_t bits = to_bfloat16(src[i]).bits;
        std::memcpy(b + 2 * i, &bits, 2);
        break;
      }
      // Values are already representable (Cast rounded them); no saturation, so an inf that a
      // non-saturating Cast produced stays inf.
      case DType::kFloat8E4M3FN: b[i] = to_float8_e4m3fn(src[i], false).bits; break;
      case DType::kFloat8E5M2: b[i] = to_float8_e5m2(src[i], false).bits; break;
      case DType::kFloat8E4M3FNUZ: b[i] = to_float8_e4m3fnuz(src[i], false).bits; break;
      case DType::kFloat8E5M2FNUZ: b[i] = to_float8_e5m2fnuz(src[i], false).bits; break;
      default: throw std::logic_error("to_declared: unexpected type");
    }
  }
  return out;
}

// The most one tensor may take: the machine's memory and swap. A larger one cannot be allocated
// (or would be killed by the OOM killer half-way), so the plan rejects it up front, naming the node,
// instead of a std::bad_alloc from somewhere in the run (exit 3, no node named).
std::uint64_t max_tensor_bytes() {
  struct sysinfo info {};
  if (::sysinfo(&info) != 0) return std::numeric_limits<std::uint64_t>::max();
  return (std::uint64_t(info.totalram) + std::uint64_t(info.totalswap)) * info.mem_unit;
}

// "output 'y' [2, 3] float32 (24 bytes)", for errors about a node's outputs.
std::string describe_output(const std::string& name, const ValueMeta& m) {
  std::string s = "output '" + name + "' " + shape_to_string(m.shape) + " " + std::string(dtype_name(m.dtype));
  const auto n = try_shape_numel(m.shape);
  const auto bytes = n ? try_nbytes(m.dtype, *n) : std::nullopt;
  return s + (bytes ? " (" + std::to_string(*bytes) + " bytes)" : " (more elements than fit in 64 bits)");
}

[[noreturn]] void fail_over_memory(const std::string& source, const Node& node, const std::string& output,
                                   const ValueMeta& m, std::uint64_t max_bytes) {
  throw InputError(source + ": " + node.describe() + ": " + describe_output(output, m) +
                   " is more than this machine's memory (" + std::to_string(max_bytes) + " bytes)");
}

// A bad_alloc while running or folding a node: the graph asks for more memory than this machine
// has, which is the model's (or its input shapes') doing, so it is an InputError naming the node
// and what its outputs ask for (`outputs`: name and meta of each).
[[noreturn]] void fail_out_of_memory(const std::string& source, const Node& node,
                                     const std::vector<std::pair<std::string, const ValueMeta*>>& outputs) {
  std::string list;
  for (const auto& [name, meta] : outputs) list += (list.empty() ? "" : ", ") + describe_output(name, *meta);
  throw InputError(source + ": " + node.describe() + ": out of memory" +
                   (list.empty() ? std::string() : " (its " + list + ")"));
}

}  // namespace

// Reuses dead activation buffers, within a run and across runs: best fit by capacity, at most
// twice the request; among equal capacities the most recently given (still in cache). Oldest-first
// made the teacher-forced UNet calls after each observed step ~30% slower than in an unobserved
// run (the observed step leaves many same-size buffers behind; the oldest is cold).
class BufferPool {
 public:
  Tensor take(DType dtype, const Shape& shape) {
    const std::size_t need = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
    auto it = free_.lower_bound(need);
    if (it != free_.end() && it->first <= 2 * need + 4096) {
      Tensor t = std::move(it->second);
      free_.erase(it);
      t.reuse_as(dtype, shape);
      return t;
    }
    Tensor t(dtype, shape);
    allocated_ += t.capacity();
    return t;
  }
  std::size_t allocated_bytes() const { return allocated_; }
  void give(Tensor&& t) {
    // Inserted before its equals, so that take()'s lower_bound finds it first (LIFO).
    if (t.capacity() > 0) free_.emplace_hint(free_.lower_bound(t.capacity()), t.capacity(), std::move(t));
  }
  void clear() { free_.clear(); }

 private:
  std::multimap<std::size_t, Tensor> free_;
  std::size_t allocated_ = 0;
};

// Consecutive-in-effect nodes run as one kernel. A fused kernel gives the same bits as its nodes
// (tested), so observed and unobserved runs agree exactly.
class FusedKernel {
 public:
  virtual ~FusedKernel() = default;
  virtual void run(std::span<const Tensor* const> inputs, Tensor& output) = 0;
  // The same, also writing each member node's output, as the nodes would have (rounded as the
  // executor rounds them): `outputs` holds one per member in order, the last being run()'s
  // output (which the executor rounds). Observed executions run this: they see every node.
  virtual void run_all(std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs) = 0;
  // run(), handing each member's output but the last to `piece(member, offset, values, count)` in
  // consecutive pieces (multiples of Observer::kStreamPiece but the last), never written whole.
  // Only where can_stream().
  using PieceSink = std::function<void(std::size_t, std::int64_t, const float*, std::int64_t)>;
  virtual bool can_stream() const { return false; }
  virtual void run_streamed(std::span<const Tensor* const> inputs, Tensor& output, const PieceSink& piece) {
    (void)inputs, (void)output, (void)piece;
  }
};

namespace {

kernels::RoundTo round_to(Rounding r) {
  switch (r) {
    case Rounding::kFp16: return kernels::RoundTo::kFp16;
    case Rounding::kBf16: return kernels::RoundTo::kBf16;
    case Rounding::kNone: break;
  }
  return kernels::RoundTo::kNone;
}

// MatMul(Q, K^T) -> [Mul | Div by a constant scalar] -> Softmax(last axis) -> MatMul(., V).
class AttentionKernel final : public FusedKernel {
 public:
  explicit AttentionKernel(const kernels::AttentionShape& shape) : shape_(shape) {}
  void run(std::span<const Tensor* const> in, Tensor& out) override {
    kernels::attention(shape_, in[0]->data<float>(), in[1]->data<float>(), in[2]->data<float>(), out.data<float>(),
                       scratch_);
  }
  // outputs: the scores, [the scaled scores,] the probabilities, the output.
  void run_all(std::span<const Tensor* const> in, std::span<Tensor* const> outputs) override {
    const std::size_t n = outputs.size();
    kernels::AttentionIntermediates keep;
    keep.scores = outputs[0]->data<float>();
    if (n == 4) keep.scaled = outputs[1]->data<float>();
    keep.probs = outputs[n - 2]->data<float>();
    kernels::attention(shape_, in[0]->data<float>(), in[1]->data<float>(), in[2]->data<float>(),
                       outputs[n - 1]->data<float>(), scratch_, keep);
  }

 private:
  kernels::AttentionShape shape_;
  kernels::AttentionScratch scratch_;
};

// A chain of elementwise float ops, each feeding only the next, in one pass over memory: blocks of
// elements go through every op's run_elementwise (the loop its run() uses) while in L1. The chain
// may end in a per-tensor 8-bit QuantizeLinear (the activation quantizer before a Q/DQ Conv or
// MatMul), whose int8/uint8 output is then the chain's: the floats before it never reach memory.
class ElementwiseChainKernel final : public FusedKernel {
 public:
  struct Stage {
    const Op* op;
    int arity;
    int chain_operand;  // binary ops: which operand (0 or 1) is the chain's running value
    int other = -1;     // binary ops: index of the other operand among the kernel's inputs
    bool other_scalar = false;
    // The other operand broadcast over the chain's shape (a per-channel scale or bias): element i
    // reads other[(i / repeat) % period]. period 0: the other operand has the chain's shape.
    std::int64_t period = 0, repeat = 1;
    Rounding rounding = Rounding::kNone;  // of the stage's output (the last one: the executor's)
    // The terminal QuantizeLinear (op null): y = quantize_to<int8 | uint8>(x, scale, zero point),
    // the loop QuantizeLinear's run() uses for one scale.
    DType quantize = DType::kFloat32;
    float scale = 1.0f;
    std::int32_t zero_point = 0;
  };
  explicit ElementwiseChainKernel(std::vector<Stage> stages) : stages_(std::move(stages)) {}
  void run(std::span<const Tensor* const> in, Tensor& out) override {
    std::byte* y = static_cast<std::byte*>(out.raw());
    kernels::for_each_chunk(out.numel(), [&](std::int64_t c0, std::int64_t c1) {
      blocks(in, c0, c1, y, [](std::size_t, std::int64_t) -> float* { return nullptr; });
    });
  }
  void run_all(std::span<const Tensor* const> in, std::span<Tensor* const> outputs) override {
    std::byte* y = static_cast<std::byte*>(outputs.back()->raw());
    kernels::for_each_chunk(outputs.back()->numel(), [&](std::int64_t c0, std::int64_t c1) {
      blocks(in, c0, c1, y, [&](std::size_t k, std::int64_t i0) { return outputs[k]->data<float>() + i0; });
    });
  }
  // Segments in order on this thread (the pieces' order is the observer's): each segment's
  // intermediates in a scratch while in L2, handed over after the segment.
  bool can_stream() const override { return true; }
  void run_streamed(std::span<const Tensor* const> in, Tensor& out, const PieceSink& piece) override {
    constexpr std::int64_t kSegment = 16384;
    static_assert(kSegment % Observer::kStreamPiece == 0 && kSegment % kBlock == 0);
    const std::int64_t n = out.numel();
    const std::size_t members = stages_.size() - 1;
    // One scratch per thread, not per chain: a UNet has hundreds of chains in each variant's plans.
    thread_local std::vector<float> scratch;
    if (scratch.size() < members * std::size_t(kSegment)) scratch.resize(members * std::size_t(kSegment));
    std::byte* y = static_cast<std::byte*>(out.raw());
    for (std::int64_t s0 = 0; s0 < n; s0 += kSegment) {
      const std::int64_t len = std::min(kSegment, n - s0);
      blocks(in, s0, s0 + len, y,
             [&](std::size_t k, std::int64_t i0) { return scratch.data() + k * kSegment + (i0 - s0); });
      for (std::size_t k = 0; k < members; ++k) piece(k, s0, scratch.data() + k * kSegment, len);
    }
  }

 private:
  static constexpr std::int64_t kBlock = 1024;

  // other[(i / repeat) % period] for i in [i0, i0 + len), into out.
  static void broadcast_block(const float* other, std::int64_t period, std::int64_t repeat, std::int64_t i0,
                              std::int64_t len, float* out) {
    std::int64_t i = i0;
    while (i < i0 + len) {
      const std::int64_t q = (i / repeat) % period;
      // repeat 1: consecutive elements read consecutive values, copied up to the wrap; otherwise
      // a run of one value up to the next repeat boundary.
      const std::int64_t n = repeat == 1 ? std::min(period - q, i0 + len - i) : std::min(repeat - i % repeat, i0 + len - i);
      if (repeat == 1) std::memcpy(out + (i - i0), other + q, std::size_t(n) * sizeof(float));
      else std::fill_n(out + (i - i0), n, other[q]);
      i += n;
    }
  }

  // Elements [c0, c1) through every stage, a block at a time while in L1: stage k's output for the
  // block at i0 goes to inter(k, i0) (not for the last stage: the output y), or to a block buffer
  // when null.
  template <class Inter>
  void blocks(std::span<const Tensor* const> in, std::int64_t c0, std::int64_t c1, std::byte* y, const Inter& inter) {
    alignas(64) float buf[2][kBlock];
    alignas(64) float bcast[kBlock];
    for (std::int64_t i0 = c0; i0 < c1; i0 += kBlock) {
      const std::int64_t len = std::min(kBlock, c1 - i0);
      const float* cur = in[0]->data<float>() + i0;
      for (std::size_t k = 0; k < stages_.size(); ++k) {
        const Stage& st = stages_[k];
        if (st.quantize != DType::kFloat32) {  // the terminal QuantizeLinear
          if (st.quantize == DType::kInt8) quantize_block(cur, reinterpret_cast<std::int8_t*>(y) + i0, len, st);
          else quantize_block(cur, reinterpret_cast<std::uint8_t*>(y) + i0, len, st);
          break;
        }
        float* dst = reinterpret_cast<float*>(y) + i0;
        if (k + 1 < stages_.size()) {
          dst = inter(k, i0);
          if (!dst) dst = buf[k % 2];
        }
        if (st.arity == 1) {
          st.op->run_elementwise(cur, 1, nullptr, 0, dst, len);
        } else {
          const float* other = in[std::size_t(st.other)]->data<float>() + (st.other_scalar ? 0 : i0);
          std::int64_t step = st.other_scalar ? 0 : 1;
          if (st.period > 0) {
            broadcast_block(in[std::size_t(st.other)]->data<float>(), st.period, st.repeat, i0, len, bcast);
            other = bcast;
            step = 1;
          }
          if (st.chain_operand == 0) st.op->run_elementwise(cur, 1, other, step, dst, len);
          else st.op->run_elementwise(other, step, cur, 1, dst, len);
        }
        if (k + 1 < stages_.size()) {
          if (st.rounding == Rounding::kFp16) round_to_float16(dst, std::size_t(len));
          else if (st.rounding == Rounding::kBf16) round_to_bfloat16(dst, std::size_t(len));
        }
        cur = dst;
      }
    }
  }

  template <class T>
  static void quantize_block(const float* __restrict x, T* __restrict y, std::int64_t n, const Stage& st) {
    const float scale = st.scale;
    const std::int32_t zero_point = st.zero_point;
    for (std::int64_t i = 0; i < n; ++i) y[i] = quantize_to<T>(x[i], scale, zero_point);
  }

  std::vector<Stage> stages_;
};

}  // namespace

struct Session::Plan {
  struct Step {
    std::size_t node;          // for a fused step: its last node
    std::vector<int> in, out;  // value ids; -1 for omitted
    bool folded = false;
    std::vector<int> release;  // runtime values dead after this step
    std::shared_ptr<FusedKernel> fused;  // runs instead of the node's op when set
    // An observed fused step: its nodes' steps (indices into Plan::steps, in order); `out` holds
    // every member's output and run_all writes them all.
    std::vector<std::size_t> members;
    std::vector<std::size_t> member_nodes;  // their nodes (indices into Session::nodes())
    // A pure view op (Reshape and kin: the output holds the input's bytes, same type): when its
    // input dies at this step, the output takes over the input's buffer instead of a copy.
    bool view = false;
  };
  std::vector<ValueMeta> metas;
  std::vector<std::shared_ptr<const Tensor>> constants;  // per value id, null for runtime values
  std::vector<Rounding> rounding;
  std::vector<Step> steps;        // one per node: what observers see
  std::vector<Step> fused_steps;  // steps with fusable node groups replaced; empty if none
  std::vector<Step> observed_steps;  // the same groups keeping every member's output; empty if none
  // The buffers of the last execution that retained them all, reused by the next one in place
  // (the same values at the same sizes: no pool search, no new pages).
  std::vector<Tensor> retained;
  std::vector<int> input_ids, output_ids;
  std::unordered_map<std::string, int> ids;
};

Session::Session(const Graph& graph, SessionOptions options)
    : graph_(graph), options_(options), pool_(options.pool ? options.pool : std::make_shared<BufferPool>()) {
  if (options_.integer_qdq) {
    quant::QdqFusion fusion = quant::fuse_qdq(graph);
    nodes_ = std::move(fusion.nodes);
    fused_ = std::move(fusion.fused);
  } else {
    nodes_ = graph.nodes;
  }
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
    for (std::size_t i : ops_.back()->constant_inputs())
      if (node.has_input(i)) constant_graph_inputs_.insert(node.inputs[i]);
  }
  for (const auto& [name, t] : folded_weights_)
    weights_.emplace(name, std::make_shared<const Tensor>(rounded(t, rounding_for(DType::kFloat32, DType::kFloat32,
                                                                                    options_.precision))));
  for (const auto& [name, t] : graph.initializers) {
    const Rounding r = rounding_for(storage_type(t.dtype()), t.dtype(), options_.precision);
    if (storage_type(t.dtype()) == t.dtype() && (r == Rounding::kNone || t.dtype() != DType::kFloat32)) {
      weights_.emplace(name, std::shared_ptr<const Tensor>(&t, [](const Tensor*) {}));
      continue;
    }
    Tensor storage = to_storage(t);
    apply_rounding(storage, r);
    weights_.emplace(name, std::make_shared<const Tensor>(std::move(storage)));
  }
}

Session::~Session() = default;

Session::Plan& Session::plan_for(const std::map<std::string, Shape>& input_shapes,
                                 const std::map<std::string, const Tensor*>& int_values) {
  std::vector<Shape> shapes;
  std::string key;
  for (const auto& in : graph_.inputs) {
    auto it = input_shapes.find(in.name);
    if (it == input_shapes.end())
      throw InputError(graph_.source + ": input '" + in.name + "' was not given");
    shapes.push_back(it->second);
    key += shape_to_string(it->second);
    if (auto v = int_values.find(in.name); v != int_values.end())
      key.append("=").append(reinterpret_cast<const char*>(v->second->raw()), v->second->nbytes());
    key += ";";
  }
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;

  auto plan = std::make_unique<Plan>();
  Plan& p = *plan;
  auto new_value = [&](const std::string& name) {
    int id = static_cast<int>(p.metas.size());
    p.ids[name] = id;
    p.metas.emplace_back();
    p.constants.emplace_back();
    p.rounding.push_back(Rounding::kNone);
    return id;
  };
  auto set_constant = [&](int id, std::shared_ptr<const Tensor> t, DType declared) {
    p.metas[std::size_t(id)] = ValueMeta{t->dtype(), declared, t->shape(), t};
    p.constants[std::size_t(id)] = std::move(t);
  };

  for (const auto& [name, t] : graph_.initializers) set_constant(new_value(name), weights_.at(name), t.dtype());
  for (const auto& [name, t] : folded_weights_) set_constant(new_value(name), weights_.at(name), t.dtype());
  for (std::size_t i = 0; i < graph_.inputs.size(); ++i) {
    const auto& in = graph_.inputs[i];
    if (p.ids.count(in.name)) continue;
    int id = new_value(in.name);
    p.metas[std::size_t(id)] = meta_of(in.dtype, shapes[i]);
    p.rounding[std::size_t(id)] = rounding_for(storage_type(in.dtype), in.dtype, options_.precision);
    p.input_ids.push_back(id);
    if (auto v = int_values.find(in.name); v != int_values.end())
      set_constant(id, std::make_shared<const Tensor>(*v->second), in.dtype);
  }

  const std::uint64_t max_bytes = options_.max_tensor_bytes ? options_.max_tensor_bytes : max_tensor_bytes();
  for (std::size_t n = 0; n < nodes_.size(); ++n) {
    const Node& node = nodes_[n];
    Plan::Step step;
    step.node = n;
    std::vector<const ValueMeta*> in_metas;
    bool all_constant = true;
    for (const auto& name : node.inputs) {
      if (name.empty()) {
        step.in.push_back(-1);
        in_metas.push_back(nullptr);
        continue;
      }
      int id = p.ids.at(name);
      step.in.push_back(id);
      in_metas.push_back(&p.metas[std::size_t(id)]);
      all_constant &= p.constants[std::size_t(id)] != nullptr;
    }
    std::vector<ValueMeta> out_metas;
    try {
      out_metas = ops_[n]->infer(in_metas);  // may compute a value (Shape, Range)
    } catch (const std::bad_alloc&) {
      throw InputError(graph_.source + ": " + node.describe() + ": out of memory while inferring its outputs");
    } catch (const std::invalid_argument& e) {
      // shape_numel's overflow (a Reshape to [2^32, 2^32, 2^32]): the model's shapes, not a fault.
      throw InputError(graph_.source + ": " + node.describe() + ": " + e.what());
    }
    if (out_metas.size() < node.outputs.size())  // a model's mistake (fuzz_onnx_loader: Log with 2 outputs)
      throw InputError(graph_.source + ": " + node.describe() + " has " + std::to_string(node.outputs.size()) +
                       " outputs; the op gives " + std::to_string(out_metas.size()));
    bool op_gave_values = true;
    for (std::size_t o = 0; o < node.outputs.size(); ++o)
      op_gave_values &= node.outputs[o].empty() || out_metas[o].value != nullptr;
    // Sizes are checked before anything is allocated: an Expand or ConstantOfShape to [2^45]
    // must name the node, not end in a bad_alloc. An element count past int64 is always an
    // error; the memory limit applies here to values folded now, and after fusion to the values
    // a run allocates (attention scores inside a fused step never exist as a tensor).
    const bool folds_now = !op_gave_values && all_constant;
    for (std::size_t o = 0; o < node.outputs.size(); ++o) {
      if (node.outputs[o].empty()) continue;
      const ValueMeta& m = out_metas[o];
      const auto numel = try_shape_numel(m.shape);
      const auto bytes = numel ? try_nbytes(m.dtype, *numel) : std::nullopt;
      if (!bytes)
        throw InputError(graph_.source + ": " + node.describe() + ": output '" + node.outputs[o] + "' " +
                         shape_to_string(m.shape) + " has more elements than fit in 64 bits");
      if (folds_now && *bytes > max_bytes) fail_over_memory(graph_.source, node, node.outputs[o], m, max_bytes);
    }
    for (std::size_t o = 0; o < node.outputs.size(); ++o) {
      if (node.outputs[o].empty()) {
        step.out.push_back(-1);
        continue;
      }
      int id = new_value(node.outputs[o]);
      step.out.push_back(id);
      ValueMeta& m = p.metas[std::size_t(id)];
      m = out_metas[o];
      p.rounding[std::size_t(id)] = rounding_for(m.dtype, m.declared, options_.precision);
      if (m.value) p.constants[std::size_t(id)] = m.value;
    }
    if (folds_now) {
      // Constant sub-graph: compute it once now.
      std::vector<const Tensor*> ins;
      for (int id : step.in) ins.push_back(id < 0 ? nullptr : p.constants[std::size_t(id)].get());
      std::vector<Tensor> outs;
      try {
        for (int id : step.out)
          outs.emplace_back(id < 0 ? Tensor() : Tensor(p.metas[std::size_t(id)].dtype, p.metas[std::size_t(id)].shape));
        std::vector<Tensor*> out_ptrs;
        for (std::size_t o = 0; o < outs.size(); ++o) out_ptrs.push_back(step.out[o] < 0 ? nullptr : &outs[o]);
        ops_[n]->run(ins, out_ptrs);
      } catch (const std::bad_alloc&) {
        std::vector<std::pair<std::string, const ValueMeta*>> outputs;
        for (std::size_t o = 0; o < step.out.size(); ++o)
          if (step.out[o] >= 0) outputs.emplace_back(node.outputs[o], &p.metas[std::size_t(step.out[o])]);
        fail_out_of_memory(graph_.source, node, outputs);
      }
      for (std::size_t o = 0; o < outs.size(); ++o) {
        int id = step.out[o];
        if (id < 0) continue;
        apply_rounding(outs[o], p.rounding[std::size_t(id)]);
        set_constant(id, std::make_shared<const Tensor>(std::move(outs[o])), p.metas[std::size_t(id)].declared);
      }
      step.folded = true;
    } else if (op_gave_values) {
      step.folded = true;
    }
    if (!step.folded && node.domain.empty() && step.in.size() >= 1 && step.in[0] >= 0 && step.out.size() == 1 &&
        step.out[0] >= 0 &&
        (node.op_type == "Reshape" || node.op_type == "Squeeze" || node.op_type == "Unsqueeze" ||
         node.op_type == "Flatten" || node.op_type == "Identity")) {
      const ValueMeta &a = p.metas[std::size_t(step.in[0])], &b = p.metas[std::size_t(step.out[0])];
      step.view = a.dtype == b.dtype && shape_numel(a.shape) == shape_numel(b.shape);
    }
    if (!step.folded) {
      // in_metas may dangle: new_value above grew p.metas.
      for (std::size_t i = 0; i < step.in.size(); ++i)
        in_metas[i] = step.in[i] < 0 ? nullptr : &p.metas[std::size_t(step.in[i])];
      ops_[n]->prepare(in_metas);
    }
    p.steps.push_back(std::move(step));
  }

  for (const auto& out : graph_.outputs) p.output_ids.push_back(p.ids.at(out.name));
  if (options_.precision == Precision::kFp16 || options_.precision == Precision::kBf16) keep_fused_intermediates(p);
  fuse(p);
  // The values an unobserved run allocates, against the machine's memory (an observed run also
  // writes fused steps' intermediates; a failed allocation there is caught in Execution::step).
  for (const Plan::Step& st : p.fused_steps.empty() ? p.steps : p.fused_steps) {
    if (st.folded) continue;
    for (int id : st.out) {
      if (id < 0 || p.constants[std::size_t(id)]) continue;
      const ValueMeta& m = p.metas[std::size_t(id)];
      if (*try_nbytes(m.dtype, *try_shape_numel(m.shape)) <= max_bytes) continue;  // both checked above
      for (const auto& [name, value_id] : p.ids)
        if (value_id == id) fail_over_memory(graph_.source, nodes_[st.node], name, m, max_bytes);
    }
  }
  // Liveness: a runtime value dies after its last reader (graph outputs never die).
  auto assign_releases = [&](std::vector<Plan::Step>& steps) {
    std::vector<int> last_use(p.metas.size(), -1);
    for (std::size_t s = 0; s < steps.size(); ++s) {
      if (steps[s].folded) continue;
      for (int id : steps[s].in)
        if (id >= 0) last_use[std::size_t(id)] = static_cast<int>(s);
      for (int id : steps[s].out)
        if (id >= 0 && last_use[std::size_t(id)] < 0) last_use[std::size_t(id)] = static_cast<int>(s);
    }
    for (int id : p.output_ids) last_use[std::size_t(id)] = -2;
    for (std::size_t id = 0; id < last_use.size(); ++id)
      if (last_use[id] >= 0 && !p.constants[id]) steps[std::size_t(last_use[id])].release.push_back(int(id));
  };
  assign_releases(p.steps);
  if (!p.fused_steps.empty()) assign_releases(p.fused_steps);
  if (!p.observed_steps.empty()) assign_releases(p.observed_steps);

  Plan& ref = *plan;
  plans_.emplace(std::move(key), std::move(plan));
  return ref;
}

namespace {

// For each value, the steps (not folded ones) that read it, in order (P: Session::Plan).
template <class P>
std::vector<std::vector<std::size_t>> step_readers(const P& p) {
  std::vector<std::vector<std::size_t>> readers(p.metas.size());
  for (std::size_t s = 0; s < p.steps.size(); ++s)
    if (!p.steps[s].folded)
      for (int id : p.steps[s].in)
        if (id >= 0) readers[std::size_t(id)].push_back(s);
  return readers;
}

}  // namespace

// What TensorRT and ONNX Runtime's fused kernels keep in FP32 registers, never storing it in the
// reduced format (docs/precision.md): a Conv/ConvTranspose/MatMul/Gemm output read only by one
// elementwise op (the kernel's epilogue: bias, activation, residual), an elementwise op's output
// read only by the next one (pointwise fusion), and a Softmax's input (attention scores: flash
// attention keeps them in FP32 and stores only the probabilities' format). Values the model itself
// declares as float16/bfloat16 stay rounded, as do graph outputs and values read more than once.
void Session::keep_fused_intermediates(Plan& p) const {
  std::vector<std::vector<std::size_t>> readers = step_readers(p);
  for (int id : p.output_ids) readers[std::size_t(id)].push_back(p.steps.size());  // never a sole reader
  auto is = [&](std::size_t s, std::initializer_list<const char*> types) {
    const Node& n = nodes_[p.steps[s].node];
    if (!n.domain.empty() && n.domain != quant::kFusedDomain) return false;
    return std::any_of(types.begin(), types.end(), [&](const char* t) { return n.op_type == t; });
  };
  for (std::size_t s = 0; s < p.steps.size(); ++s) {
    const Plan::Step& st = p.steps[s];
    if (st.folded || st.out.size() != 1 || st.out[0] < 0) continue;
    const std::size_t v = std::size_t(st.out[0]);
    const ValueMeta& m = p.metas[v];
    if (m.dtype != DType::kFloat32 || m.declared != DType::kFloat32 || p.constants[v] || readers[v].size() != 1 ||
        readers[v][0] >= p.steps.size())
      continue;
    const std::size_t t = readers[v][0];
    const bool producer = is(s, {"Conv", "ConvTranspose", "MatMul", "Gemm"}) || ops_[st.node]->elementwise_arity() > 0;
    const bool epilogue = ops_[p.steps[t].node]->elementwise_arity() > 0;
    if ((producer && epilogue) || is(t, {"Softmax"})) p.rounding[v] = Rounding::kNone;
  }
}

void Session::fuse(Plan& p) const {
  // Readers of each value among the steps that run, and which values are graph outputs.
  const std::vector<std::vector<std::size_t>> readers = step_readers(p);
  std::vector<bool> is_output(p.metas.size(), false);
  for (int id : p.output_ids) is_output[std::size_t(id)] = true;
  // The index of the one step reading step s's single output, if that output feeds nothing else.
  auto sole_reader = [&](std::size_t s) -> std::ptrdiff_t {
    if (p.steps[s].out.size() != 1 || p.steps[s].out[0] < 0) return -1;
    const std::size_t id = std::size_t(p.steps[s].out[0]);
    if (is_output[id] || readers[id].size() != 1) return -1;
    return std::ptrdiff_t(readers[id][0]);
  };
  auto op_is = [&](std::size_t s, const char* type) {
    const Node& n = nodes_[p.steps[s].node];
    return n.domain.empty() && n.op_type == type;
  };
  auto meta = [&](int id) -> const ValueMeta& { return p.metas[std::size_t(id)]; };
  auto f32 = [&](int id) { return id >= 0 && meta(id).dtype == DType::kFloat32; };

  struct Fused {
    std::shared_ptr<FusedKernel> kernel;
    std::vector<int> inputs;
    std::vector<std::size_t> members;  // the group's steps, in order
  };
  std::vector<Fused> fused_at(p.steps.size());
  std::vector<bool> absorbed(p.steps.size(), false);
  for (std::size_t s = 0; s < p.steps.size(); ++s) {
    // MatMul(Q, K^T) -> [Mul | Div by a constant scalar] -> Softmax(last axis) -> MatMul(., V).
    if (p.steps[s].folded || absorbed[s] || !op_is(s, "MatMul") || p.steps[s].in.size() != 2) continue;
    const int scores = p.steps[s].out.empty() ? -1 : p.steps[s].out[0];
    std::ptrdiff_t next = sole_reader(s);
    if (next < 0) continue;
    kernels::AttentionShape a;
    int scaled = scores;
    std::ptrdiff_t scale_step = -1;
    if (op_is(std::size_t(next), "Mul") || op_is(std::size_t(next), "Div")) {
      const Plan::Step& st = p.steps[std::size_t(next)];
      // The scores times / divided by a constant scalar (on either side for Mul), shape kept.
      const bool mul = op_is(std::size_t(next), "Mul");
      const int c = st.in.size() != 2 ? -1 : st.in[0] == scores ? st.in[1] : (mul && st.in[1] == scores ? st.in[0] : -1);
      const Tensor* value = c >= 0 ? p.constants[std::size_t(c)].get() : nullptr;
      if (!value || value->dtype() != DType::kFloat32 || value->numel() != 1 || st.out.size() != 1 ||
          meta(st.out[0]).shape != meta(scores).shape)
        continue;
      a.scale_kind = mul ? kernels::ScoreScale::kMul : kernels::ScoreScale::kDiv;
      a.scale = value->data<float>()[0];
      a.round_scaled = round_to(p.rounding[std::size_t(st.out[0])]);
      scaled = st.out[0];
      scale_step = next;
      next = sole_reader(std::size_t(next));
      if (next < 0) continue;
    }
    // Softmax over the last axis (before opset 13 it flattens from the axis on: the same thing).
    const std::size_t sm = std::size_t(next);
    if (!op_is(sm, "Softmax") || p.steps[sm].in.empty() || p.steps[sm].in[0] != scaled) continue;
    const Node& sn = nodes_[p.steps[sm].node];
    const std::int64_t rank = std::int64_t(meta(scaled).shape.size());
    const std::int64_t axis = sn.get_int("axis", sn.opset < 13 ? 1 : -1);
    if (rank < 2 || !(axis == rank - 1 || (sn.opset >= 13 && axis == -1))) continue;
    const std::ptrdiff_t mm2 = sole_reader(sm);
    if (mm2 < 0 || !op_is(std::size_t(mm2), "MatMul") || p.steps[std::size_t(mm2)].in.size() != 2 ||
        p.steps[std::size_t(mm2)].in[0] != p.steps[sm].out[0])
      continue;
    // Q [..., L, d], K^T [..., d, Lk], V [..., Lk, dv] with one batch prefix, all float32.
    const int q = p.steps[s].in[0], kt = p.steps[s].in[1], v = p.steps[std::size_t(mm2)].in[1];
    const int out = p.steps[std::size_t(mm2)].out.empty() ? -1 : p.steps[std::size_t(mm2)].out[0];
    if (!f32(q) || !f32(kt) || !f32(v) || !f32(scores) || !f32(p.steps[sm].out[0]) || !f32(out)) continue;
    const Shape &qs = meta(q).shape, &ks = meta(kt).shape, &vs = meta(v).shape;
    const std::size_t r = qs.size();
    if (r < 2 || ks.size() != r || vs.size() != r || !std::equal(qs.begin(), qs.end() - 2, ks.begin()) ||
        !std::equal(qs.begin(), qs.end() - 2, vs.begin()) || ks[r - 2] != qs[r - 1] || vs[r - 2] != ks[r - 1])
      continue;
    a.q_len = qs[r - 2];
    a.head_dim = qs[r - 1];
    a.kv_len = ks[r - 1];
    a.v_dim = vs[r - 1];
    a.batch = 1;
    for (std::size_t i = 0; i + 2 < r; ++i) a.batch *= qs[i];
    a.round_scores = round_to(p.rounding[std::size_t(scores)]);
    a.round_probs = round_to(p.rounding[std::size_t(p.steps[sm].out[0])]);
    absorbed[s] = absorbed[sm] = absorbed[std::size_t(mm2)] = true;
    std::vector<std::size_t> members{s};
    if (scale_step >= 0) {
      absorbed[std::size_t(scale_step)] = true;
      members.push_back(std::size_t(scale_step));
    }
    members.insert(members.end(), {sm, std::size_t(mm2)});
    // The fused step stands where the second MatMul stood: Q, K^T and V all exist by then.
    fused_at[std::size_t(mm2)] = {std::make_shared<AttentionKernel>(a), {q, kt, v}, std::move(members)};
  }
  // Chains of elementwise float ops with the same output shape, each intermediate read only by the
  // next op; the other operand of a binary op is made outside the chain and is a scalar, a tensor of
  // that shape, or one that broadcasts a block of its consecutive dimensions (a per-channel scale
  // or bias). A per-tensor 8-bit QuantizeLinear with constant scale and zero point may end it.
  using ChainStage = ElementwiseChainKernel::Stage;
  auto broadcast_over = [&](const Shape& o, const Shape& shape, ChainStage& st) {
    if (o.size() > shape.size()) return false;
    const std::size_t r = shape.size(), lead = r - o.size();
    std::size_t a = r, b = r;  // the dimensions [a, b) where o is not 1
    for (std::size_t d = 0; d < o.size(); ++d) {
      if (o[d] == 1) continue;
      if (o[d] != shape[lead + d] || (b != r && b != lead + d)) return false;
      if (a == r) a = lead + d;
      b = lead + d + 1;
    }
    st.other_scalar = a == r;
    if (st.other_scalar || (a == 0 && b == r)) return true;
    st.period = 1;
    for (std::size_t d = a; d < b; ++d) st.period *= shape[d];
    for (std::size_t d = b; d < r; ++d) st.repeat *= shape[d];
    return true;
  };
  auto scalar_constant = [&](int id) -> const Tensor* {
    const Tensor* t = id >= 0 ? p.constants[std::size_t(id)].get() : nullptr;
    return t && t->numel() == 1 ? t : nullptr;
  };
  // The stage for step t if it is a per-tensor QuantizeLinear of `value` to int8/uint8 whose scale
  // (float) and zero point are constants.
  auto quantize_stage = [&](std::size_t t, int value, ChainStage& st) {
    const Plan::Step& q = p.steps[t];
    if (!op_is(t, "QuantizeLinear") || q.folded || absorbed[t] || fused_at[t].kernel || q.in.size() < 2 ||
        q.in[0] != value || q.out.size() != 1 || q.out[0] < 0)
      return false;
    const DType out = meta(q.out[0]).dtype;
    const Tensor* scale = scalar_constant(q.in[1]);
    const Tensor* zp = q.in.size() > 2 && q.in[2] >= 0 ? scalar_constant(q.in[2]) : nullptr;
    if ((out != DType::kInt8 && out != DType::kUInt8) || !scale || scale->dtype() != DType::kFloat32 ||
        (q.in.size() > 2 && q.in[2] >= 0 && (!zp || zp->dtype() != out)))
      return false;
    st.quantize = out;
    st.scale = scale->data<float>()[0];
    if (zp) st.zero_point = out == DType::kInt8 ? zp->data<std::int8_t>()[0] : zp->data<std::uint8_t>()[0];
    return std::isfinite(st.scale) && st.scale > 0.0f;
  };
  for (std::size_t s = 0; s < p.steps.size(); ++s) {
    if (absorbed[s] || fused_at[s].kernel) continue;
    auto elementwise = [&](std::size_t t) {
      const Plan::Step& st = p.steps[t];
      const int arity = ops_[st.node]->elementwise_arity();
      if (st.folded || absorbed[t] || fused_at[t].kernel || arity == 0 || st.out.size() != 1 || !f32(st.out[0]) ||
          int(st.in.size()) != arity)
        return 0;
      for (int id : st.in)
        if (!f32(id)) return 0;
      return arity;
    };
    if (!elementwise(s)) continue;
    const Shape& shape = meta(p.steps[s].out[0]).shape;
    std::vector<int> inputs;
    std::vector<ElementwiseChainKernel::Stage> stages;
    std::vector<std::size_t> members;
    // The first op: its chain input is an operand of the output's shape.
    {
      const Plan::Step& st = p.steps[s];
      ElementwiseChainKernel::Stage first{ops_[st.node].get(), elementwise(s), 0};
      const int chain = meta(st.in[0]).shape == shape ? 0 : 1;
      if (meta(st.in[std::size_t(chain)]).shape != shape) continue;
      inputs.push_back(st.in[std::size_t(chain)]);
      if (first.arity == 2) {
        const int other = st.in[std::size_t(1 - chain)];
        first.chain_operand = chain;
        if (!broadcast_over(meta(other).shape, shape, first)) continue;
        first.other = int(inputs.size());
        inputs.push_back(other);
      }
      first.rounding = p.rounding[std::size_t(st.out[0])];
      stages.push_back(first);
      members.push_back(s);
    }
    for (std::ptrdiff_t next = sole_reader(s); next >= 0; next = sole_reader(members.back())) {
      const std::size_t t = std::size_t(next);
      const Plan::Step& st = p.steps[t];
      const int value = p.steps[members.back()].out[0];
      ChainStage quantizer{nullptr, 1, 0};
      if (quantize_stage(t, value, quantizer)) {
        stages.push_back(quantizer);
        members.push_back(t);
        break;
      }
      const int arity = elementwise(t);
      if (!arity || meta(st.out[0]).shape != shape) break;
      ElementwiseChainKernel::Stage stage{ops_[st.node].get(), arity, st.in[0] == value ? 0 : 1};
      if (arity == 2) {
        const int other = st.in[std::size_t(1 - stage.chain_operand)];
        if (other == value || !broadcast_over(meta(other).shape, shape, stage)) break;
        stage.other = int(inputs.size());
        inputs.push_back(other);
      } else if (st.in[0] != value) {
        break;
      }
      stage.rounding = p.rounding[std::size_t(st.out[0])];
      stages.push_back(stage);
      members.push_back(t);
    }
    if (members.size() < 2) continue;
    for (std::size_t m : members) absorbed[m] = true;
    fused_at[members.back()] = {std::make_shared<ElementwiseChainKernel>(std::move(stages)), std::move(inputs), members};
  }

  if (std::none_of(fused_at.begin(), fused_at.end(), [](const Fused& f) { return f.kernel != nullptr; })) return;
  for (std::size_t s = 0; s < p.steps.size(); ++s) {
    if (fused_at[s].kernel) {
      // The fused step stands where the group's last node stood: its inputs all exist by then.
      Plan::Step st;
      st.node = p.steps[s].node;
      st.in = fused_at[s].inputs;
      st.out = p.steps[s].out;
      st.fused = fused_at[s].kernel;
      p.fused_steps.push_back(st);
      // Observed, it writes every member's output too (the intermediates die at the step).
      st.out.clear();
      for (std::size_t m : fused_at[s].members) st.out.push_back(p.steps[m].out[0]);
      st.members = std::move(fused_at[s].members);
      for (std::size_t m : st.members) st.member_nodes.push_back(p.steps[m].node);
      p.observed_steps.push_back(std::move(st));
    } else if (!absorbed[s]) {
      p.fused_steps.push_back(p.steps[s]);
      p.observed_steps.push_back(p.steps[s]);
    }
  }
}

std::map<std::string, ValueMeta> Session::infer_metas(const std::map<std::string, Shape>& input_shapes) {
  Plan& p = plan_for(input_shapes, {});
  std::map<std::string, ValueMeta> out;
  for (const auto& [name, id] : p.ids) out[name] = p.metas[std::size_t(id)];
  return out;
}

// One run's state: the plan, the values (slots), where it is. Session::run is
// start, step until done, finish; the evaluator interleaves the executions of
// several sessions node by node.
class Session::Execution::State {
 public:
  State(Session& s, const std::map<std::string, const Tensor*>& inputs, Observer* observer, bool retain)
      : s_(s), observer_(observer), retain_(retain) {
    // Check the inputs against the model before planning.
    std::map<std::string, Shape> shapes;
    for (const auto& in : s_.graph_.inputs) {
      auto it = inputs.find(in.name);
      if (it == inputs.end()) {
        std::string given;
        for (const auto& [k, _] : inputs) given += (given.empty() ? "" : ", ") + k;
        throw InputError(s_.graph_.source + ": missing input '" + in.name +
                         "' (given: " + (given.empty() ? "none" : given) + ")");
      }
      const Tensor& t = *it->second;
      if (t.dtype() != in.dtype)
        throw InputError(s_.graph_.source + ": input '" + in.name + "' must be " + std::string(dtype_name(in.dtype)) +
                         ", got " + std::string(dtype_name(t.dtype())));
      if (in.has_shape) {
        bool ok = in.dims.size() == t.shape().size();
        for (std::size_t d = 0; ok && d < in.dims.size(); ++d) ok = in.dims[d] < 0 || in.dims[d] == t.shape()[d];
        if (!ok) {
          std::string want = "[";
          for (std::size_t d = 0; d < in.dims.size(); ++d)
            want += (d ? ", " : "") + (in.dims[d] >= 0 ? std::to_string(in.dims[d])
                                                       : (in.dim_params[d].empty() ? "?" : in.dim_params[d]));
          throw InputError(s_.graph_.source + ": input '" + in.name + "' has shape " + shape_to_string(t.shape()) +
                           ", the model expects " + want + "]");
        }
      }
      shapes[in.name] = t.shape();
    }
    for (const auto& given : inputs) {
      const std::string& name = given.first;
      if (std::none_of(s_.graph_.inputs.begin(), s_.graph_.inputs.end(),
                       [&](const ValueInfo& v) { return v.name == name; }))
        throw InputError(s_.graph_.source + ": the model has no input named '" + name + "'");
    }

    // Small integer/bool inputs are planned as constants (shape tensors fed as
    // inputs, as the ONNX node tests do); larger ones stay runtime data.
    std::map<std::string, const Tensor*> int_values;
    for (const auto& [name, t] : inputs)
      if (((t->dtype() == DType::kInt64 || t->dtype() == DType::kInt32 || t->dtype() == DType::kBool) &&
           t->numel() <= 64) ||
          s_.constant_graph_inputs_.count(name))
        int_values[name] = t;
    p_ = &s_.plan_for(shapes, int_values);
    Plan& p = *p_;
    if (retain_) slots_ = std::move(p.retained);
    slots_.resize(p.metas.size());
    // Inputs already in storage form with nothing to round are read in place,
    // not copied.
    aliased_.assign(p.metas.size(), nullptr);
    for (std::size_t i = 0; i < s_.graph_.inputs.size(); ++i) {
      int id = p.ids.at(s_.graph_.inputs[i].name);
      if (p.constants[std::size_t(id)]) continue;
      const Tensor& given = *inputs.at(s_.graph_.inputs[i].name);
      const Rounding r = p.rounding[std::size_t(id)];
      if (storage_type(given.dtype()) == given.dtype() && (r == Rounding::kNone || given.dtype() != DType::kFloat32)) {
        aliased_[std::size_t(id)] = &given;
        continue;
      }
      Tensor& slot = slots_[std::size_t(id)];
      if (storage_type(given.dtype()) == given.dtype()) {  // float32 to round: a pooled copy
        if (!slot.reuse_as(given.dtype(), given.shape())) slot = s_.pool_->take(given.dtype(), given.shape());
        std::memcpy(slot.raw(), given.raw(), given.nbytes());
      } else {
        slot = to_storage(given);
      }
      apply_rounding(slot, r);
      // Inputs converted to storage form are activations too (their release subtracts them).
      // Retained buffers of other values count when a step takes them.
      live_ += slot.capacity();
      live_exact_ += slot.nbytes();
    }
    s_.peak_bytes_ = live_;
    s_.live_peak_bytes_ = live_exact_;
    // Observers see every node: fused groups write each member's output for them.
    const std::vector<Plan::Step>& fused = observer_ ? p.observed_steps : p.fused_steps;
    steps_ = fused.empty() ? &p.steps : &fused;
  }

  bool done() const { return next_ >= steps_->size(); }
  const Node& next_node() const { return s_.nodes_[(*steps_)[next_].node]; }
  std::size_t next_index() const { return (*steps_)[next_].node; }
  const std::vector<Node>& nodes() const { return s_.nodes_; }
  std::span<const std::size_t> next_indices() const {
    const Plan::Step& step = (*steps_)[next_];
    return step.members.empty() ? std::span<const std::size_t>(&step.node, 1) : step.member_nodes;
  }

  void step() {
    const Plan& p = *p_;
    const Plan::Step& step = (*steps_)[next_++];
    BufferPool& pool = *s_.pool_;
    if (observer_)
      for (Tensor t = observer_->spare(); t.capacity() > 0; t = observer_->spare()) pool.give(std::move(t));
    ins_.clear();
    for (int id : step.in) ins_.push_back(value(id));
    bool streamed = false;  // a chain whose intermediates went to the observer in pieces
    // A view whose input dies here takes the input's buffer (the bytes are already the output's):
    // no copy, no new buffer. Not for an observer that reads the input afterwards, nor when a
    // retaining execution keeps the input readable.
    const int in0 = step.in.empty() ? -1 : step.in[0];
    const bool take_over = step.view && (!observer_ || (!retain_ && !observer_->reads_view_inputs())) &&
                           !p.constants[std::size_t(in0)] && !aliased_[std::size_t(in0)] &&
                           slots_[std::size_t(in0)].capacity() > 0 &&
                           std::find(step.release.begin(), step.release.end(), in0) != step.release.end() &&
                           !(observer_ && observer_->holds(slots_[std::size_t(in0)]));
    if (take_over) {
      const int id = step.out[0];
      const ValueMeta& m = p.metas[std::size_t(id)];
      // Counted in the live sets already (as the input); its release now subtracts nothing.
      slots_[std::size_t(id)] = std::move(slots_[std::size_t(in0)]);
      slots_[std::size_t(id)].reuse_as(m.dtype, m.shape);
      apply_rounding(slots_[std::size_t(id)], p.rounding[std::size_t(id)]);
    } else if (!step.folded) {
      // A chain the observer takes streamed: only its last member's output is written.
      if (!step.members.empty() && step.fused->can_stream() && !retain_) {
        const std::size_t last = step.out.size() - 1;
        const ValueMeta& m = p.metas[std::size_t(step.out[last])];
        streamed = m.dtype == DType::kFloat32 &&
                   observer_->begin_stream(s_.nodes_, std::span<const std::size_t>(step.member_nodes.data(), last),
                                           m.shape);
      }
      try {
        outs_.clear();
        for (std::size_t o = 0; o < step.out.size(); ++o) {
          const int id = step.out[o];
          if (id < 0 || (streamed && o + 1 < step.out.size())) {
            outs_.push_back(nullptr);
            continue;
          }
          outs_.push_back(output_slot(id));
        }
        if (streamed) {
          step.fused->run_streamed(ins_, *outs_.back(), [&](std::size_t member, std::int64_t offset,
                                                            const float* values, std::int64_t count) {
            observer_->on_piece(member, offset, values, count);
          });
          if (!observer_->end_stream()) {  // again, writing every member
            streamed = false;
            for (std::size_t o = 0; o + 1 < step.out.size(); ++o) outs_[o] = output_slot(step.out[o]);
          }
        }
        if (streamed) {
        } else if (!step.members.empty()) {
          step.fused->run_all(ins_, outs_);  // the members' outputs but the last come rounded
        } else if (step.fused) {
          step.fused->run(ins_, *outs_[0]);
        } else {
          s_.ops_[step.node]->run(ins_, outs_);
        }
        for (std::size_t o = step.members.empty() ? 0 : step.out.size() - 1; o < step.out.size(); ++o)
          if (step.out[o] >= 0) apply_rounding(*outs_[o], p.rounding[std::size_t(step.out[o])]);
      } catch (const std::bad_alloc&) {
        // Its output buffers or an op's scratch: the graph asks for more than the machine has.
        std::vector<std::pair<std::string, const ValueMeta*>> outputs;  // a fused step's: every member's
        for (int id : step.out)
          for (const auto& [name, value_id] : p.ids)
            if (id >= 0 && value_id == id) outputs.emplace_back(name, &p.metas[std::size_t(id)]);
        fail_out_of_memory(s_.graph_.source, s_.nodes_[step.node], outputs);
      }
    }
    if (observer_) {
      auto notify = [&](const Plan::Step& st, std::span<const Tensor* const> ins) {
        out_views_.clear();
        for (int id : st.out) out_views_.push_back(value(id));
        observer_->on_node(NodeEvent{s_.nodes_[st.node], ins, out_views_, st.folded, st.node});
      };
      if (step.members.empty()) notify(step, ins_);
      for (std::size_t k = streamed ? step.members.size() - 1 : 0; k < step.members.size(); ++k) {
        // each node of the group, as if it had run alone (the streamed ones had their pieces)
        const Plan::Step& st = p.steps[step.members[k]];
        member_ins_.clear();
        for (int id : st.in) member_ins_.push_back(value(id));
        notify(st, member_ins_);
      }
    }
    if (retain_) return;  // every value stays readable until finish()
    for (int id : step.release) {
      Tensor& t = slots_[std::size_t(id)];
      live_ -= t.capacity();
      live_exact_ -= t.nbytes();
      if (observer_) observer_->on_release(t);
      pool.give(std::move(t));  // nothing when the observer took it
    }
  }

  std::map<std::string, Tensor> finish() {
    while (!done()) step();
    const Plan& p = *p_;
    std::map<std::string, Tensor> result;
    for (std::size_t i = 0; i < s_.graph_.outputs.size(); ++i) {
      int id = p.output_ids[i];
      const ValueMeta& m = p.metas[std::size_t(id)];
      const bool runtime = !p.constants[std::size_t(id)] && !aliased_[std::size_t(id)];
      const bool unique = std::count(p.output_ids.begin(), p.output_ids.end(), id) == 1;
      if (m.declared == m.dtype && runtime && unique) {
        result[s_.graph_.outputs[i].name] = std::move(slots_[std::size_t(id)]);  // handed over, no copy
        continue;
      }
      const Tensor* t = value(id);
      result[s_.graph_.outputs[i].name] = m.declared == m.dtype ? Tensor(*t) : to_declared(*t, m.declared);
    }
    if (!s_.options_.keep_buffers) {
      slots_.clear();
      s_.pool_->clear();
    } else if (retain_) {
      p_->retained = std::move(slots_);
    }
    return result;
  }

 private:
  // The slot of runtime value `id`, holding a buffer of its shape (from the pool).
  Tensor* output_slot(int id) {
    const ValueMeta& m = p_->metas[std::size_t(id)];
    Tensor& t = slots_[std::size_t(id)];
    if (!retain_ || !t.reuse_as(m.dtype, m.shape)) t = s_.pool_->take(m.dtype, m.shape);
    live_ += t.capacity();
    live_exact_ += t.nbytes();
    s_.peak_bytes_ = std::max(s_.peak_bytes_, live_);
    s_.live_peak_bytes_ = std::max(s_.live_peak_bytes_, live_exact_);
    return &t;
  }

  const Tensor* value(int id) const {
    if (id < 0) return nullptr;
    if (const auto& c = p_->constants[std::size_t(id)]) return c.get();
    if (const Tensor* a = aliased_[std::size_t(id)]) return a;
    return &slots_[std::size_t(id)];
  }

  Session& s_;
  Observer* observer_;
  bool retain_;
  Plan* p_ = nullptr;
  const std::vector<Plan::Step>* steps_ = nullptr;
  std::size_t next_ = 0;
  std::vector<Tensor> slots_;
  std::vector<const Tensor*> aliased_;
  std::size_t live_ = 0, live_exact_ = 0;
  std::vector<const Tensor*> ins_, member_ins_, out_views_;
  std::vector<Tensor*> outs_;
};

namespace {
std::map<std::string, const Tensor*> borrowed(const std::map<std::string, Tensor>& inputs) {
  std::map<std::string, const Tensor*> b;
  for (const auto& [name, t] : inputs) b.emplace(name, &t);
  return b;
}
}  // namespace

Session::Execution::Execution(Session& session, const std::map<std::string, Tensor>& inputs, Observer* observer,
                              bool retain)
    : Execution(session, borrowed(inputs), observer, retain) {}
Session::Execution::Execution(Session& session, const std::map<std::string, const Tensor*>& inputs,
                              Observer* observer, bool retain)
    : state_(std::make_unique<State>(session, inputs, observer, retain)) {}
Session::Execution::~Execution() = default;
bool Session::Execution::done() const { return state_->done(); }
const Node& Session::Execution::next_node() const { return state_->next_node(); }
std::span<const std::size_t> Session::Execution::next_indices() const { return state_->next_indices(); }
const std::vector<Node>& Session::Execution::nodes() const { return state_->nodes(); }
std::size_t Session::Execution::next_index() const { return state_->next_index(); }
void Session::Execution::step() { state_->step(); }
std::map<std::string, Tensor> Session::Execution::finish() { return state_->finish(); }

std::shared_ptr<BufferPool> Session::make_pool() { return std::make_shared<BufferPool>(); }

std::size_t Session::pool_allocated_bytes(const BufferPool& pool) { return pool.allocated_bytes(); }

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
