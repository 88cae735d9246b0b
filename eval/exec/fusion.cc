// Fusion: node groups that run as one kernel with the bits of the nodes run one by one (attention,
// elementwise chains), and the values a reduced-precision deployment keeps in FP32 inside a kernel.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <unordered_map>

#include "eval/exec/plan.h"
#include "kernels/error.h"
#include "kernels/numeric.h"

namespace qeval::eval {

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
      const int c = st.in.size() != 2    ? -1
                    : st.in[0] == scores ? st.in[1]
                                         : (mul && st.in[1] == scores ? st.in[0] : -1);
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
    if (const Rounding e = exact_format(p, q, options_.precision);
        e == exact_format(p, kt, options_.precision) && e == exact_format(p, v, options_.precision))
      a.inputs_exact = round_to(e);
    std::shared_ptr<FusedKernel> kernel = backend_->attention(a);
    if (!kernel) continue;  // the backend runs the nodes one by one
    absorbed[s] = absorbed[sm] = absorbed[std::size_t(mm2)] = true;
    std::vector<std::size_t> members{s};
    if (scale_step >= 0) {
      absorbed[std::size_t(scale_step)] = true;
      members.push_back(std::size_t(scale_step));
    }
    members.insert(members.end(), {sm, std::size_t(mm2)});
    // The fused step stands where the second MatMul stood: Q, K^T and V all exist by then.
    fused_at[std::size_t(mm2)] = {std::move(kernel), {q, kt, v}, std::move(members)};
  }
  // Chains of elementwise float ops with the same output shape, each intermediate read only by the
  // next op; the other operand of a binary op is made outside the chain and is a scalar, a tensor of
  // that shape, or one that broadcasts a block of its consecutive dimensions (a per-channel scale
  // or bias). A per-tensor 8-bit QuantizeLinear with constant scale and zero point may end it.
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
          int(st.in.size()) < arity)
        return 0;
      // Inputs past the arity are parameters the op read from constants in prepare() (Clip's bounds).
      for (std::size_t i = 0; i < st.in.size(); ++i) {
        const int id = st.in[i];
        if (int(i) < arity ? !f32(id) : id >= 0 && !p.constants[std::size_t(id)]) return 0;
      }
      return arity;
    };
    if (!elementwise(s)) continue;
    const Shape& shape = meta(p.steps[s].out[0]).shape;
    std::vector<int> inputs;
    std::vector<ChainStage> stages;
    std::vector<std::size_t> members;
    // The first op: its chain input is an operand of the output's shape.
    {
      const Plan::Step& st = p.steps[s];
      ChainStage first{ops_[st.node].get(), elementwise(s), 0, &nodes_[st.node]};
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
      ChainStage quantizer{nullptr, 1, 0, &nodes_[st.node]};
      if (quantize_stage(t, value, quantizer)) {
        stages.push_back(quantizer);
        members.push_back(t);
        break;
      }
      const int arity = elementwise(t);
      if (!arity || meta(st.out[0]).shape != shape) break;
      ChainStage stage{ops_[st.node].get(), arity, st.in[0] == value ? 0 : 1, &nodes_[st.node]};
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
    std::shared_ptr<FusedKernel> kernel = backend_->elementwise_chain(std::move(stages));
    if (!kernel) continue;
    for (std::size_t m : members) absorbed[m] = true;
    fused_at[members.back()] = {std::move(kernel), std::move(inputs), members};
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

}  // namespace qeval::eval
