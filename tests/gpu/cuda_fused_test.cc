// The CUDA backend's fused kernels (issue 23): attention (flash-attention style, the scores never
// stored) against the CPU's attention kernel, and elementwise chains with the bits of their nodes
// run one by one on the device; observed runs (FusedKernel::run_all) give run()'s bits and every
// member's output. Skips, saying why, without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>

#include "eval/exec/cuda/cuda_backend.h"
#include "eval/exec/cuda/device_memory.h"
#include "eval/exec/onnx_import.h"
#include "eval/exec/plan.h"
#include "eval/exec/session.h"
#include "eval/onnx_builder.h"
#include "gpu/gpu_test_util.h"
#include "gpu/unfused_backend.h"
#include "kernels/cuda/kernels.h"
#include "kernels/error.h"

namespace qeval::eval {
namespace {

using qeval::testing::OnnxBuilder;
using gpu_test::normal;
using gpu_test::rel_l2;
using gpu_test::same_bits;

double best_ms(Session& s, const std::map<std::string, Tensor>& in, int runs) {
  s.run(in);
  double best = 1e30;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    s.run(in);
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// ---- attention ------------------------------------------------------------------------------------

struct AttentionCase {
  std::int64_t batch, q_len, kv_len, head_dim, v_dim;
  kernels::ScoreScale scale_kind;
  kernels::RoundTo scores, scaled, probs;
  kernels::RoundTo exact = kernels::RoundTo::kNone;  // Q, K^T and V rounded to it (the GEMM form's 16-bit products)
};

std::string describe(const AttentionCase& c) {
  const auto r = [](kernels::RoundTo t) {
    return t == kernels::RoundTo::kNone ? "-" : (t == kernels::RoundTo::kFp16 ? "fp16" : "bf16");
  };
  return "batch " + std::to_string(c.batch) + " q " + std::to_string(c.q_len) + " kv " + std::to_string(c.kv_len) +
         " d " + std::to_string(c.head_dim) + " dv " + std::to_string(c.v_dim) + " scale " +
         std::to_string(int(c.scale_kind)) + " rounding " + r(c.scores) + "/" + r(c.scaled) + "/" + r(c.probs) +
         (c.exact != kernels::RoundTo::kNone ? std::string(" exact ") + r(c.exact) : "");
}

// The device kernel against the CPU's (output and intermediates within the tolerance), a second
// run and the observed run (run_all) with run()'s bits, every intermediate written. Both forms:
// the flash kernel (FP32 shapes it takes) and the GEMMs (inputs exact in the probabilities' 16-bit
// format: tensor cores; shapes the flash kernel does not take: FP32 cuBLAS), chunks included.
TEST(CudaFused, AttentionMatchesTheCpuKernelAndObservedRunsGiveItsBits) {
  QEVAL_CUDA_OR_SKIP(cuda);
  using kernels::RoundTo;
  using kernels::ScoreScale;
  const RoundTo no = RoundTo::kNone, h = RoundTo::kFp16, b = RoundTo::kBf16;
  const AttentionCase cases[] = {
      {2, 64, 64, 32, 16, ScoreScale::kMul, no, no, no},     // the CPU session test's shape
      {3, 70, 77, 40, 40, ScoreScale::kMul, no, no, no},     // tails: rows and keys not multiples of 64
      {2, 130, 200, 64, 64, ScoreScale::kDiv, no, no, no},   // several key tiles, a divided scale
      {1, 33, 64, 160, 160, ScoreScale::kNone, no, no, no},  // wide heads (SD 1.5's deepest level)
      {2, 96, 300, 80, 120, ScoreScale::kMul, no, no, no},   // v_dim != head_dim, 8 float4 groups
      {16, 256, 256, 40, 40, ScoreScale::kMul, no, no, h},   // fp16 deployment: probabilities rounded
      {2, 65, 129, 64, 64, ScoreScale::kMul, h, h, h},       // fp16-strict: every member rounded
      {2, 65, 129, 64, 64, ScoreScale::kDiv, b, b, b},       // bf16-strict
      // The GEMM form: fp16 deployment, fp16-strict and bf16-strict on tensor cores.
      {16, 256, 256, 40, 40, ScoreScale::kMul, no, no, h, h},
      {2, 65, 129, 64, 64, ScoreScale::kMul, h, h, h, h},
      {2, 65, 129, 64, 64, ScoreScale::kDiv, b, b, b, b},
      {3, 70, 77, 42, 42, ScoreScale::kMul, no, no, no},  // head_dim 42: FP32 GEMMs
      // Scores of 275 MB an entry: chunks of 4096 rows and of 104, entry by entry.
      {2, 4200, 16384, 8, 8, ScoreScale::kMul, no, no, h, h},
      // Tensor cores' shapes: cross-attention (77 keys) at SD 1.5's widest heads, tails, padded
      // head and value widths, the widest heads taken, bf16.
      {2, 300, 77, 160, 160, ScoreScale::kMul, no, no, h, h},
      {3, 70, 77, 40, 40, ScoreScale::kMul, no, no, h, h},
      {2, 65, 129, 42, 20, ScoreScale::kDiv, no, no, h, h},
      {1, 64, 100, 256, 256, ScoreScale::kMul, no, no, h, h},
      {2, 130, 200, 64, 64, ScoreScale::kDiv, no, no, b, b},
  };
  // 16-bit cases run in both their forms: the default (tensor cores, kernels::cuda::attention16,
  // where the scores are not rounded) and GEMMs.
  std::vector<std::pair<AttentionCase, const char*>> runs;
  for (const AttentionCase& c : cases) {
    runs.emplace_back(c, "");
    if (c.exact != no) runs.emplace_back(c, "gemm");
  }
  for (const auto& [c, form] : runs) {
    SCOPED_TRACE(describe(c) + (*form ? std::string(" form ") + form : std::string()));
    ASSERT_EQ(::setenv("QEVAL_CUDA_ATTENTION", form, 1), 0);
    kernels::AttentionShape s;
    s.batch = c.batch;
    s.q_len = c.q_len;
    s.kv_len = c.kv_len;
    s.head_dim = c.head_dim;
    s.v_dim = c.v_dim;
    s.scale_kind = c.scale_kind;
    s.scale =
        c.scale_kind == kernels::ScoreScale::kDiv ? std::sqrt(float(c.head_dim)) : 1.0f / std::sqrt(float(c.head_dim));
    s.round_scores = c.scores;
    s.round_scaled = c.scale_kind == kernels::ScoreScale::kNone ? kernels::RoundTo::kNone : c.scaled;
    s.round_probs = c.probs;
    s.inputs_exact = c.exact;
    const Rounding exact = c.exact == kernels::RoundTo::kFp16   ? Rounding::kFp16
                           : c.exact == kernels::RoundTo::kBf16 ? Rounding::kBf16
                                                                : Rounding::kNone;
    const Tensor q = rounded(normal({c.batch, c.q_len, c.head_dim}, 1, 1.5f), exact),
                 kt = rounded(normal({c.batch, c.head_dim, c.kv_len}, 2), exact);
    const Tensor v = rounded(normal({c.batch, c.kv_len, c.v_dim}, 3), exact);
    const Shape score_shape{c.batch, c.q_len, c.kv_len}, out_shape{c.batch, c.q_len, c.v_dim};
    const bool scaled = c.scale_kind != kernels::ScoreScale::kNone;
    // The CPU kernel, every member written.
    std::vector<Tensor> want;
    for (int i = 0; i < (scaled ? 3 : 2); ++i) want.emplace_back(DType::kFloat32, score_shape);
    want.emplace_back(DType::kFloat32, out_shape);
    {
      std::vector<Tensor*> outs;
      for (Tensor& t : want) outs.push_back(&t);
      const Tensor* ins[] = {&q, &kt, &v};
      cpu_backend()->attention(s)->run_all(ins, outs);
    }
    const std::shared_ptr<FusedKernel> k = cuda->attention(s);
    ASSERT_NE(k, nullptr);
    const auto mem = cuda->memory();
    const Tensor dq = q.to_device(mem), dk = kt.to_device(mem), dv = v.to_device(mem);
    const Tensor* ins[] = {&dq, &dk, &dv};
    Tensor out(DType::kFloat32, out_shape, mem), again(DType::kFloat32, out_shape, mem);
    k->run(ins, out);
    k->run(ins, again);
    std::vector<Tensor> got;
    for (const Tensor& w : want) got.emplace_back(DType::kFloat32, w.shape(), mem);
    std::vector<Tensor*> outs;
    for (Tensor& t : got) outs.push_back(&t);
    k->run_all(ins, outs);
    const Tensor o = out.to_host();
    EXPECT_TRUE(same_bits(o, again.to_host())) << "a second run gave other bits";
    EXPECT_TRUE(same_bits(o, got.back().to_host())) << "the observed run's output differs from run()'s";
    if (!*form && kernels::cuda::attention16_supported(s)) {  // the default where it applies
      Tensor direct(DType::kFloat32, out_shape, mem),
          scratch(DType::kUInt8, {std::int64_t(kernels::cuda::attention16_scratch_bytes(s))}, mem);
      CudaMemory& cm = static_cast<CudaMemory&>(*mem);
      const auto held = cm.lock();
      kernels::cuda::attention16(s, static_cast<const float*>(dq.device_data()),
                                 static_cast<const float*>(dk.device_data()),
                                 static_cast<const float*>(dv.device_data()), static_cast<float*>(direct.device_data()),
                                 scratch.device_data(), cm.stream());
      EXPECT_TRUE(same_bits(o, direct.to_host())) << "the 16-bit default is not kernels::cuda::attention16";
    }
    const bool rounded = c.scores != no || c.scaled != no || c.probs != no;
    // Rounded members: a last-bit FP32 difference can move a value by one fp16/bf16 ulp.
    const double tolerance = rounded ? 2e-3 : 1e-5;
    const double rel = rel_l2(want.back(), o);
    EXPECT_LE(rel, tolerance) << "output";
    for (std::size_t i = 0; i + 1 < want.size(); ++i)
      EXPECT_LE(rel_l2(want[i], got[i].to_host()), tolerance) << "member " << i;
    std::printf("  %-70s %-4s rel-L2 %.2e\n", describe(c).c_str(), form, rel);
  }
  ::unsetenv("QEVAL_CUDA_ATTENTION");
}

// Shapes the flash kernel does not take (head_dim not a multiple of 4, past its shared memory) run
// as GEMMs (the first test checks their values); with no keys the nodes run one by one.
TEST(CudaFused, AttentionShapesTheFlashKernelDoesNotTakeRunAsGemms) {
  QEVAL_CUDA_OR_SKIP(cuda);
  kernels::AttentionShape s;
  s.batch = 2;
  s.q_len = s.kv_len = 64;
  s.head_dim = s.v_dim = 64;
  EXPECT_NE(cuda->attention(s), nullptr);
  s.head_dim = 42;
  EXPECT_NE(cuda->attention(s), nullptr);
  s.head_dim = 512;
  EXPECT_NE(cuda->attention(s), nullptr);
  s.head_dim = 64;
  s.kv_len = 0;
  EXPECT_EQ(cuda->attention(s), nullptr);
}

// Every value an observer is shown, copied (host memory).
class Copier final : public Observer {
 public:
  void on_node(const NodeEvent& e) override {
    for (std::size_t i = 0; i < e.outputs.size(); ++i)
      if (e.outputs[i]) values[e.node.outputs[i]] = *e.outputs[i];
  }
  std::map<std::string, Tensor> values;
};

// The graph with every node output a graph output: nothing fuses, each node runs alone.
Graph every_value_an_output(const Graph& g) {
  Graph every = g;
  for (const Node& n : g.nodes)
    for (const std::string& out : n.outputs)
      if (std::none_of(every.outputs.begin(), every.outputs.end(), [&](const ValueInfo& o) { return o.name == out; })) {
        ValueInfo o;
        o.name = out;
        every.outputs.push_back(o);
      }
  return every;
}

Graph attention_graph() {
  OnnxBuilder b;
  b.input("q", onnx::TensorProto::FLOAT, {2, 4, 100, 40})
      .input("kt", onnx::TensorProto::FLOAT, {2, 4, 40, 77})
      .input("v", onnx::TensorProto::FLOAT, {2, 4, 77, 40})
      .output("y", onnx::TensorProto::FLOAT);
  b.initializer("scale", {0.158113883f}, {});
  b.node("MatMul", {"q", "kt"}, {"s"}, "qk");
  b.node("Mul", {"s", "scale"}, {"scaled"}, "scale");
  b.node("Softmax", {"scaled"}, {"p"}, "softmax");
  b.node("MatMul", {"p", "v"}, {"y"}, "pv");
  return b.graph();
}

// Through the executor on the device: fused unobserved (the scores never allocated), observed
// runs with the same output bits and each member's value with the bits of its node run alone on
// the device (the same kernels), the output within rel-L2 1e-5 of the unfused nodes'.
TEST(CudaFused, AttentionIsFusedOnTheDeviceAndObservedRunsSeeTheNodes) {
  QEVAL_CUDA_OR_SKIP(cuda);
  const Graph g = attention_graph(), every = every_value_an_output(g);  // sessions keep a reference
  const std::map<std::string, Tensor> in = {
      {"q", normal({2, 4, 100, 40}, 4)}, {"kt", normal({2, 4, 40, 77}, 5)}, {"v", normal({2, 4, 77, 40}, 6)}};
  const std::size_t scores_bytes = 2 * 4 * 100 * 77 * sizeof(float);
  for (Precision precision : {Precision::kFp32, Precision::kFp16, Precision::kFp16Strict}) {
    SCOPED_TRACE(std::string(precision_name(precision)));
    SessionOptions o{precision};
    o.backend = cuda;
    Session fused(g, o), observed(g, o), unfused(every, o);
    const Tensor y = fused.run(in).at("y");
    // Only the output is made (and, where the variant rounds its inputs, their rounded copies):
    // the scores (scores_bytes) never exist.
    std::size_t rounded_inputs = 0;
    if (precision != Precision::kFp32)
      for (const auto& [name, t] : in) rounded_inputs += t.nbytes();
    EXPECT_LE(fused.last_live_activation_bytes(), y.nbytes() + rounded_inputs) << "not fused";
    EXPECT_LT(y.nbytes(), scores_bytes);
    Copier seen;
    const Tensor yo = observed.run(in, &seen).at("y");
    EXPECT_TRUE(same_bits(y, yo)) << "observed and unobserved runs differ";
    ASSERT_EQ(seen.values.size(), 4u);
    const auto nodes = unfused.run(in);
    // The members' values are the bits of their nodes (fp16-strict: the scores' GEMM on tensor
    // cores, as the MatMul node runs it). fp16 (deployment): the scores stay FP32 inside the fused
    // step, so the graph whose every value is an output (rounded) is not the same computation.
    if (precision != Precision::kFp16) {
      for (const char* v : {"s", "scaled", "p"}) EXPECT_TRUE(same_bits(nodes.at(v), seen.values.at(v))) << v;
    }
    EXPECT_LE(rel_l2(nodes.at("y"), y), precision == Precision::kFp32 ? 1e-5 : 2e-3);
  }
}

// ---- elementwise chains ---------------------------------------------------------------------------

// GELU as torch exports it then SiLU (two chains: g feeds two ops), and a chain of broadcast
// operands ending in a per-tensor quantizer (the activation quantizer of a Q/DQ layer).
Graph gelu_silu_graph() {
  OnnxBuilder b;
  b.input("in", onnx::TensorProto::FLOAT, {4, 300, 70}).output("y", onnx::TensorProto::FLOAT);
  b.initializer("sqrt2", {1.4142135f}, {}).initializer("one", {1.0f}, {}).initializer("half", {0.5f}, {1});
  b.node("Neg", {"in"}, {"x"}, "neg");
  b.node("Div", {"x", "sqrt2"}, {"d"}, "div");
  b.node("Erf", {"d"}, {"e"}, "erf");
  b.node("Add", {"one", "e"}, {"a"}, "add");
  b.node("Mul", {"x", "a"}, {"m"}, "mul");
  b.node("Mul", {"m", "half"}, {"g"}, "mul_half");
  b.node("Sigmoid", {"g"}, {"s"}, "sigmoid");
  b.node("Mul", {"g", "s"}, {"y"}, "silu");
  return b.graph();
}

Graph quantizer_chain_graph(bool int8) {
  OnnxBuilder b;
  b.input("in", onnx::TensorProto::FLOAT, {2, 6, 20, 30})
      .output("y", int8 ? onnx::TensorProto::INT8 : onnx::TensorProto::UINT8);
  std::vector<float> s(30), c(6), m(120);
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = 0.5f + 0.03f * float(i);
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = -0.7f + 0.25f * float(i);
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = 1.5f - 0.01f * float(i);
  b.initializer("s", s, {30}).initializer("c", c, {6, 1, 1}).initializer("m", m, {1, 6, 20, 1});
  b.initializer("scale", {0.0042f}, {});
  if (int8) b.initializer_raw<std::int8_t>("zp", onnx::TensorProto::INT8, {-5}, {});
  b.node("Mul", {"in", "s"}, {"a"}, "smooth");
  b.node("Add", {"c", "a"}, {"d"}, "shift");
  b.node("Sigmoid", {"d"}, {"e"}, "sigmoid");
  b.node("Mul", {"e", "m"}, {"f"}, "gate");
  if (int8) b.node("QuantizeLinear", {"f", "scale", "zp"}, {"y"}, "q");
  else b.node("QuantizeLinear", {"f", "scale"}, {"y"}, "q");
  return b.graph();
}

// Fused on the device: the output and every observed member with the bits of the nodes run one
// by one on the device (the quantizer's there on the CPU), without the intermediates allocated.
TEST(CudaFused, ElementwiseChainsGiveTheBitsOfTheirNodes) {
  QEVAL_CUDA_OR_SKIP(cuda);
  struct Model {
    const char* name;
    Graph graph;
    std::map<std::string, Tensor> in;
    std::size_t max_live;  // bytes of the fused run's activations at most
  };
  std::vector<Model> models;
  {
    Tensor x(DType::kFloat32, {4, 300, 70});
    for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 4.0f * std::sin(float(i) * 0.013f);
    models.push_back({"gelu+silu", gelu_silu_graph(), {{"in", x}}, 2 * std::size_t(x.nbytes())});
  }
  for (bool int8 : {true, false}) {
    Tensor x(DType::kFloat32, {2, 6, 20, 30});
    for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 3.0f * std::sin(float(i) * 0.011f);
    models.push_back({int8 ? "chain+int8 quantizer" : "chain+uint8 quantizer",
                      quantizer_chain_graph(int8),
                      {{"in", x}},
                      std::size_t(x.numel())});
  }
  for (const Model& m : models) {
    for (Precision precision : {Precision::kFp32, Precision::kFp16Strict, Precision::kFp16}) {
      SCOPED_TRACE(std::string(m.name) + " " + std::string(precision_name(precision)));
      SessionOptions o{precision};
      o.backend = cuda;
      const Graph every = every_value_an_output(m.graph);  // outlives the sessions
      Session fused(m.graph, o), observed(m.graph, o), unfused(every, o);
      const Tensor y = fused.run(m.in).at("y");
      // fp16 (deployment) rounds the graph input once more: a copy of it.
      const std::size_t input_copy = precision == Precision::kFp32 ? 0 : m.in.at("in").nbytes();
      EXPECT_LE(fused.last_live_activation_bytes(), m.max_live + input_copy) << "intermediates allocated: not fused";
      Copier seen;
      const Tensor yo = observed.run(m.in, &seen).at("y");
      EXPECT_TRUE(same_bits(y, yo)) << "observed and unobserved runs differ";
      EXPECT_EQ(seen.values.size(), m.graph.nodes.size());
      if (precision == Precision::kFp16) continue;  // deployment: intermediates kept FP32 inside the kernel
      const auto nodes = unfused.run(m.in);
      EXPECT_TRUE(same_bits(nodes.at("y"), y)) << "the fused output differs from the nodes'";
      for (const auto& [name, t] : seen.values) EXPECT_TRUE(same_bits(nodes.at(name), t)) << name;
    }
  }
}

// ---- timing (not run by default: --gtest_also_run_disabled_tests) ---------------------------------

// SD 1.5's largest self-attention (64x64 latent: 4096 tokens, 8 heads of 40, batch 2), fused and
// node by node on the device (each run includes copying Q, K^T, V in and the output back).
TEST(CudaFused, DISABLED_Timings) {
  QEVAL_CUDA_OR_SKIP(cuda);
  OnnxBuilder b;
  const std::int64_t heads = 16, L = 4096, d = 40;
  b.input("q", onnx::TensorProto::FLOAT, {heads, L, d})
      .input("kt", onnx::TensorProto::FLOAT, {heads, d, L})
      .input("v", onnx::TensorProto::FLOAT, {heads, L, d})
      .output("y", onnx::TensorProto::FLOAT);
  b.initializer("scale", {0.158113883f}, {});
  b.node("MatMul", {"q", "kt"}, {"s"}, "qk");
  b.node("Mul", {"s", "scale"}, {"scaled"}, "scale");
  b.node("Softmax", {"scaled"}, {"p"}, "softmax");
  b.node("MatMul", {"p", "v"}, {"y"}, "pv");
  const Graph g = b.graph();
  const std::map<std::string, Tensor> in = {
      {"q", normal({heads, L, d}, 7)}, {"kt", normal({heads, d, L}, 8)}, {"v", normal({heads, L, d}, 9)}};
  SessionOptions o, n;
  o.backend = cuda;
  n.backend = std::make_shared<qeval::testing::Unfused>(cuda);
  Session fused(g, o), unfused(g, n);
  std::printf("attention 16 x 4096 x 4096 x 40, one run incl. copies: fused %.2f ms, nodes %.2f ms, rel-L2 %.2e\n",
              best_ms(fused, in, 5), best_ms(unfused, in, 5), rel_l2(unfused.run(in).at("y"), fused.run(in).at("y")));
  for (Precision precision : {Precision::kFp32, Precision::kFp16}) {
    SessionOptions fo{precision}, no{precision};
    fo.backend = cuda;
    no.backend = std::make_shared<qeval::testing::Unfused>(cuda);
    Session f(g, fo), u(g, no);
    std::printf("  %s: fused %.2f ms, nodes %.2f ms\n", std::string(precision_name(precision)).c_str(),
                best_ms(f, in, 5), best_ms(u, in, 5));
  }
  // The tiny-sd UNet at batch 8 (1223 nodes), fused and node by node.
  const char* src = std::getenv("QEVAL_SOURCE_DIR");
  const Graph unet = load_onnx(std::string(src && *src ? src : QEVAL_SOURCE_DIR) + "/models/tiny-sd/unet.onnx");
  Tensor t(DType::kFloat32, {8});
  for (int i = 0; i < 8; ++i) t.data<float>()[i] = 900.0f - 100.0f * float(i);
  const std::map<std::string, Tensor> uin = {
      {"sample", normal({8, 4, 16, 16}, 10)}, {"timestep", t}, {"encoder_hidden_states", normal({8, 77, 128}, 11)}};
  for (Precision precision : {Precision::kFp32, Precision::kFp16}) {
    SessionOptions fo{precision}, no{precision};
    fo.backend = cuda;
    no.backend = std::make_shared<qeval::testing::Unfused>(cuda);
    Session f(unet, fo), u(unet, no);
    std::printf("tiny-sd UNet batch 8 %s: fused %.2f ms, nodes %.2f ms (best of 20), rel-L2 %.2e\n",
                std::string(precision_name(precision)).c_str(), best_ms(f, uin, 20), best_ms(u, uin, 20),
                rel_l2(u.run(uin).at("out_sample"), f.run(uin).at("out_sample")));
  }
}

}  // namespace
}  // namespace qeval::eval
