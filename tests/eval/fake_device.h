// A device backend whose memory is host memory behind the DeviceMemory interface (tests): values
// there refuse host access as a GPU's do, so any path that reads device bytes on the host throws,
// and every kernel is the CPU op on host copies (the CPU's bits); without fused kernels.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "eval/exec/backend.h"

namespace qeval::eval::testing_fake {

// A device whose memory is host memory behind the DeviceMemory interface: tensors there refuse
// host access like a GPU's, so any path that reads device bytes on the host throws.
class FakeMemory final : public DeviceMemory {
 public:
  std::string name() const override { return "fake:0"; }
  void* allocate(std::size_t bytes) override {
    ++allocations;
    return std::calloc(1, bytes);
  }
  void release(void* p) noexcept override {
    ++releases;
    std::free(p);
  }
  void to_device(void* dst, const void* src, std::size_t bytes) override {
    ++uploads;
    std::memcpy(dst, src, bytes);
  }
  void to_host(void* dst, const void* src, std::size_t bytes) override {
    ++downloads;
    std::memcpy(dst, src, bytes);
  }
  void copy(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  int allocations = 0, releases = 0, uploads = 0, downloads = 0;
};

// A device backend over FakeMemory: a compiled node runs the CPU op on host copies of its device
// inputs and writes its device outputs; Softmax and Transpose are declined (they run on the CPU).
class FakeDeviceBackend final : public Backend {
 public:
  // `decline`: Softmax and Transpose run on the CPU (a device backend's mixed plans); else every
  // node runs on the device.
  explicit FakeDeviceBackend(bool decline = true) : decline_(decline) {}
  std::string_view name() const override { return "fake"; }
  std::shared_ptr<DeviceMemory> memory() const override { return memory_; }
  void run(const Op& op, std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    for (const Tensor* t : in) EXPECT_TRUE(!t || !t->on_device());
    ++host_runs;
    op.run(in, out);
  }
  std::unique_ptr<StepKernel> compile(const Node& node, const Op& op, std::span<const ValueMeta* const>,
                                      std::span<const Rounding> exact, std::span<const ValueMeta>,
                                      std::string& why) override {
    exact_inputs[node.name] = std::vector<Rounding>(exact.begin(), exact.end());
    if (decline_ && (node.op_type == "Softmax" || node.op_type == "Transpose")) {
      why = "fake: no " + node.op_type + " kernel";
      return nullptr;
    }
    return std::make_unique<Kernel>(op, *this);
  }
  std::shared_ptr<FusedKernel> attention(const kernels::AttentionShape&) override { return nullptr; }
  std::shared_ptr<FusedKernel> elementwise_chain(std::vector<ChainStage>) override { return nullptr; }
  void round(Tensor& value, Rounding rounding) override {
    if (!value.on_device()) return cpu_backend()->round(value, rounding);
    Tensor host = value.to_host();
    ++own_downloads;
    cpu_backend()->round(host, rounding);
    memory_->to_device(value.device_data(), host.raw(), host.nbytes());
  }
  int host_runs = 0, device_runs = 0;
  std::map<std::string, std::vector<Rounding>> exact_inputs;  // what compile() was told, per node
  int own_downloads = 0;  // the fake's own copies (its kernels' inputs, rounding; FakeMemory counts them too)

 private:
  class Kernel final : public StepKernel {
   public:
    Kernel(const Op& op, FakeDeviceBackend& b) : op_(op), b_(b) {}
    void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
      ++b_.device_runs;
      std::vector<Tensor> host_in, host_out;
      std::vector<const Tensor*> ins;
      std::vector<Tensor*> outs;
      for (const Tensor* t : in) {
        EXPECT_TRUE(!t || t->on_device());
        host_in.push_back(t ? t->to_host() : Tensor());
        b_.own_downloads += t ? 1 : 0;
      }
      for (std::size_t i = 0; i < in.size(); ++i) ins.push_back(in[i] ? &host_in[i] : nullptr);
      for (Tensor* t : out) {
        EXPECT_TRUE(!t || t->on_device());
        host_out.push_back(t ? Tensor(t->dtype(), t->shape()) : Tensor());
      }
      for (std::size_t i = 0; i < out.size(); ++i) outs.push_back(out[i] ? &host_out[i] : nullptr);
      op_.run(ins, outs);
      for (std::size_t i = 0; i < out.size(); ++i)
        if (out[i]) b_.memory_->to_device(out[i]->device_data(), host_out[i].raw(), host_out[i].nbytes());
    }

   private:
    const Op& op_;
    FakeDeviceBackend& b_;
  };
  std::shared_ptr<FakeMemory> memory_ = std::make_shared<FakeMemory>();
  bool decline_;

 public:
  FakeMemory& fake() { return *memory_; }
};


}  // namespace qeval::eval::testing_fake
