// The CPU backend: nodes run their ops' kernels, fused groups qeval's attention and elementwise-chain
// kernels, rounding in place (eval/exec/backend.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <unordered_map>

#include "eval/exec/plan.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/error.h"
#include "kernels/numeric.h"
#include "kernels/quantize_block.h"

namespace qeval::eval {

namespace {

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
  // Chunks of whole tasks, in order on this thread (each task's rows in parallel inside a chunk):
  // every member's rows of a chunk in a scratch, handed over after the chunk; ~kChunkFloats a
  // member, each chunk a multiple of kStreamPiece values but the last.
  bool can_stream() const override { return true; }
  void run_streamed(std::span<const Tensor* const> in, Tensor& out, const PieceSink& piece) override {
    const std::int64_t total = shape_.batch * shape_.q_len;
    const std::size_t members = members_count();
    // One scratch per thread, not per kernel: a UNet has dozens of attentions in each variant's plans.
    thread_local std::vector<float> scratch;
    for (std::int64_t r0 = 0; r0 < total;) {
      const std::int64_t r1 = chunk_end(shape_, r0);
      const std::size_t n = std::size_t((r1 - r0) * shape_.kv_len);
      if (scratch.size() < members * n) scratch.resize(members * n);
      std::vector<float*> dst(members);
      for (std::size_t k = 0; k < members; ++k) dst[k] = scratch.data() + k * n;
      kernels::attention_rows(shape_, in[0]->data<float>(), in[1]->data<float>(), in[2]->data<float>(),
                              out.data<float>(), scratch_, intermediates(dst), r0, r1);
      for (std::size_t k = 0; k < members; ++k) piece(k, r0 * shape_.kv_len, dst[k], std::int64_t(n));
      r0 = r1;
    }
  }
  std::unique_ptr<MemberRows> member_rows() const override { return std::make_unique<Rows>(shape_); }

  // Where a chunk starting at row r0 ends: the first task boundary at least kChunkFloats values of
  // a member on whose values are a multiple of kStreamPiece (or the end).
  static std::int64_t chunk_end(const kernels::AttentionShape& s, std::int64_t r0) {
    constexpr std::int64_t kChunkFloats = std::int64_t(1) << 21;  // 8 MiB a member
    const std::int64_t total = s.batch * s.q_len, task = kernels::attention_task_rows(s);
    std::int64_t r = r0;
    do {
      const std::int64_t i = r % s.q_len;
      r = r - i + std::min(s.q_len, (i / task + 1) * task);  // the next task boundary
    } while (r < total && ((r - r0) * s.kv_len < kChunkFloats || (r - r0) * s.kv_len % PieceObserver::kStreamPiece));
    return r;
  }

 private:
  // The members: the scores, [the scaled scores,] the probabilities.
  std::size_t members_count() const { return shape_.scale_kind == kernels::ScoreScale::kNone ? 2 : 3; }
  static kernels::AttentionIntermediates intermediates(std::span<float* const> dst) {
    kernels::AttentionIntermediates keep;
    keep.scores = dst[0];
    if (dst.size() == 3) keep.scaled = dst[1];
    keep.probs = dst.back();
    return keep;
  }

  class Rows final : public MemberRows {
   public:
    explicit Rows(const kernels::AttentionShape& shape) : shape_(shape) {}
    void rows(std::span<const Tensor* const> in, std::int64_t row0, std::int64_t row1,
              std::span<float* const> dst) override {
      kernels::attention_rows(shape_, in[0]->data<float>(), in[1]->data<float>(), in[2]->data<float>(), nullptr,
                              scratch_, intermediates(dst), row0, row1);
    }
    bool boundary(std::int64_t row) const override { return kernels::attention_task_boundary(shape_, row); }

   private:
    kernels::AttentionShape shape_;
    kernels::AttentionScratch scratch_;
  };

  kernels::AttentionShape shape_;
  kernels::AttentionScratch scratch_;
};

// A chain of elementwise float ops, each feeding only the next, in one pass over memory: blocks of
// elements go through every op's run_elementwise (the loop its run() uses) while in L1. The chain
// may end in a per-tensor 8-bit QuantizeLinear (the activation quantizer before a Q/DQ Conv or
// MatMul), whose int8/uint8 output is then the chain's: the floats before it never reach memory.
class ElementwiseChainKernel final : public FusedKernel {
 public:
  using Stage = ChainStage;
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
    static_assert(kSegment % PieceObserver::kStreamPiece == 0 && kSegment % kBlock == 0);
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

  static constexpr std::int64_t kLongRun = 64;

  // The runs of [i0, i0 + len) over which other[(i / repeat) % period] is one value (repeat > 1) or
  // consecutive values (repeat 1, up to the wrap): f(offset in the block, length, index in other
  // of the run's first value). The divisions once per block.
  template <class F>
  static void for_each_broadcast_run(std::int64_t period, std::int64_t repeat, std::int64_t i0, std::int64_t len,
                                     F&& f) {
    std::int64_t q = (i0 / repeat) % period, phase = i0 % repeat;
    for (std::int64_t i = i0; i < i0 + len;) {
      const std::int64_t n = repeat == 1 ? std::min(period - q, i0 + len - i) : std::min(repeat - phase, i0 + len - i);
      f(i - i0, n, q);
      i += n;
      if (repeat == 1) {
        q += n;
      } else if ((phase += n) == repeat) {
        phase = 0;
        ++q;
      }
      if (q == period) q = 0;
    }
  }

  // other[(i / repeat) % period] for i in [i0, i0 + len), into out. The divisions once per block,
  // then the value index and the place in its run advance with the runs (a SmoothQuant scale per
  // channel of a 16x16 map is 4 runs per block, and two integer divisions per run cost as much as
  // the block's multiplications).
  static void broadcast_block(const float* other, std::int64_t period, std::int64_t repeat, std::int64_t i0,
                              std::int64_t len, float* out) {
    for_each_broadcast_run(period, repeat, i0, len, [&](std::int64_t off, std::int64_t n, std::int64_t q) {
      if (repeat == 1) std::memcpy(out + off, other + q, std::size_t(n) * sizeof(float));
      else std::fill_n(out + off, n, other[q]);
    });
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
          // quantize_to's bytes
          if (st.quantize == DType::kInt8)
            kernels::quantize_block(cur, reinterpret_cast<std::int8_t*>(y) + i0, len, st.scale, st.zero_point);
          else kernels::quantize_block(cur, reinterpret_cast<std::uint8_t*>(y) + i0, len, st.scale, st.zero_point);
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
          if (st.period > 0 && (st.repeat == 1 ? st.period : st.repeat) >= kLongRun) {
            // Long runs (a SmoothQuant scale along a 128-wide last axis, a per-channel scale over a
            // 16x16 map): the op run by run against the operand where it lies (a scalar within a
            // run of one value), nothing copied; the same elementwise results.
            for_each_broadcast_run(st.period, st.repeat, i0, len,
                                   [&](std::int64_t off, std::int64_t n, std::int64_t q) {
                                     const float* o = in[std::size_t(st.other)]->data<float>() + q;
                                     const std::int64_t o_step = st.repeat == 1 ? 1 : 0;
                                     if (st.chain_operand == 0)
                                       st.op->run_elementwise(cur + off, 1, o, o_step, dst + off, n);
                                     else st.op->run_elementwise(o, o_step, cur + off, 1, dst + off, n);
                                   });
            other = nullptr;
          } else if (st.period > 0) {
            broadcast_block(in[std::size_t(st.other)]->data<float>(), st.period, st.repeat, i0, len, bcast);
            other = bcast;
            step = 1;
          }
          if (other) {
            if (st.chain_operand == 0) st.op->run_elementwise(cur, 1, other, step, dst, len);
            else st.op->run_elementwise(other, step, cur, 1, dst, len);
          }
        }
        if (k + 1 < stages_.size()) {
          if (st.rounding == Rounding::kFp16) round_to_float16(dst, std::size_t(len));
          else if (st.rounding == Rounding::kBf16) round_to_bfloat16(dst, std::size_t(len));
        }
        cur = dst;
      }
    }
  }

  std::vector<Stage> stages_;
};

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  void run(const Op& op, std::span<const Tensor* const> inputs, std::span<Tensor* const> outputs) override {
    op.run(inputs, outputs);
  }
  std::shared_ptr<FusedKernel> attention(const kernels::AttentionShape& shape) override {
    return std::make_shared<AttentionKernel>(shape);
  }
  std::shared_ptr<FusedKernel> elementwise_chain(std::vector<ChainStage> stages) override {
    return std::make_shared<ElementwiseChainKernel>(std::move(stages));
  }
  void round(Tensor& value, Rounding rounding) override { apply_rounding(value, rounding); }
};

}  // namespace

std::shared_ptr<Backend> cpu_backend() {
  static const std::shared_ptr<Backend> cpu = std::make_shared<CpuBackend>();
  return cpu;
}

namespace {
std::shared_ptr<Backend>& chosen_backend() {
  static std::shared_ptr<Backend> chosen;
  return chosen;
}
}  // namespace

std::shared_ptr<Backend> default_backend() {
  const std::shared_ptr<Backend>& b = chosen_backend();
  return b ? b : cpu_backend();
}
void set_default_backend(std::shared_ptr<Backend> backend) { chosen_backend() = std::move(backend); }

}  // namespace qeval::eval
