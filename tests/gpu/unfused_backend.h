// A device backend with its fused kernels taken away: attention and elementwise-chain groups run
// node by node (the reference the GPU tests compare the fused kernels with).
#pragma once

#include <memory>
#include <utility>

#include "eval/exec/backend.h"

namespace qeval::testing {

class Unfused final : public eval::Backend {
 public:
  explicit Unfused(std::shared_ptr<eval::Backend> b) : b_(std::move(b)) {}
  std::string_view name() const override { return b_->name(); }
  void run(const eval::Op& op, std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    b_->run(op, in, out);
  }
  std::shared_ptr<DeviceMemory> memory() const override { return b_->memory(); }
  std::unique_ptr<eval::StepKernel> compile(const eval::Node& node, const eval::Op& op,
                                            std::span<const eval::ValueMeta* const> in,
                                            std::span<const eval::Rounding> exact,
                                            std::span<const eval::ValueMeta> out, std::string& why) override {
    return b_->compile(node, op, in, exact, out, why);
  }
  std::shared_ptr<eval::FusedKernel> attention(const kernels::AttentionShape&) override { return nullptr; }
  std::shared_ptr<eval::FusedKernel> elementwise_chain(std::vector<eval::ChainStage>) override { return nullptr; }
  void round(Tensor& value, eval::Rounding r) override { b_->round(value, r); }

 private:
  std::shared_ptr<eval::Backend> b_;
};

}  // namespace qeval::testing
