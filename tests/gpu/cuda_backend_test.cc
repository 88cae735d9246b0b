// The CUDA backend below the executor: device memory, rounding, and every node of the ONNX node
// tests compiled on the device and compared with the CPU op (rel-L2 <= 1e-5 for floats, exact for
// integers and bools, the same bits on a second run). Skips, saying why, without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include <cuda_runtime.h>

#include "eval/exec/cuda/cuda_backend.h"
#include "gpu/gpu_test_util.h"
#include "eval/exec/graph.h"
#include "eval/exec/onnx_import.h"
#include "eval/exec/plan.h"
#include "eval/exec/session.h"
#include "eval/onnx_builder.h"
#include "kernels/error.h"
#include "kernels/numeric.h"

namespace qeval::eval {
namespace {

namespace fs = std::filesystem;
const fs::path kNodeTests = "/usr/share/libonnx-testdata/data/node";

std::string bytes_of(const Tensor& t) { return std::string(reinterpret_cast<const char*>(t.raw()), t.nbytes()); }

// "" when `got` matches `want`: floats by relative L2 over the finite values (non-finite ones
// must be the same class at the same places), everything else exactly.
std::string compare(const Tensor& want, const Tensor& got, double tolerance = 1e-5) {
  if (want.dtype() != got.dtype() || want.shape() != got.shape()) return "type or shape differs";
  if (want.dtype() != DType::kFloat32 && want.dtype() != DType::kFloat64)
    return bytes_of(want) == bytes_of(got) ? "" : "values differ (exact comparison)";
  auto at = [](const Tensor& t, std::int64_t i) {
    return t.dtype() == DType::kFloat32 ? double(t.data<float>()[i]) : t.data<double>()[i];
  };
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double w = at(want, i), g = at(got, i);
    if (!std::isfinite(w) || !std::isfinite(g)) {
      if (std::isnan(w) && std::isnan(g)) continue;
      if (w == g) continue;
      return "element " + std::to_string(i) + " is " + std::to_string(g) + ", expected " + std::to_string(w);
    }
    num += (w - g) * (w - g);
    den += w * w;
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (rel > tolerance) return "relative L2 " + std::to_string(rel) + " > " + std::to_string(tolerance);
  return "";
}

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Tensor float_tensor(const Shape& shape, std::uint32_t seed) {
  Tensor t(DType::kFloat32, shape);
  const auto v = random_floats(std::size_t(t.numel()), seed);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

// ---- (a) device memory --------------------------------------------------------------------

TEST(CudaMemory, RoundTripsBytesZeroesNewTensorsAndRefusesHostAccess) {
  QEVAL_CUDA_OR_SKIP(backend);
  const auto mem = backend->memory();
  ASSERT_NE(mem, nullptr);
  EXPECT_EQ(mem->name(), "cuda:0");
  const Tensor host = float_tensor({3, 1000}, 1);
  const Tensor dev = host.to_device(mem);
  ASSERT_TRUE(dev.on_device());
  EXPECT_THROW((void)dev.raw(), std::logic_error);
  const Tensor copy = dev.to_device(mem);  // device to device
  EXPECT_EQ(bytes_of(copy.to_host()), bytes_of(host));
  const Tensor zero(DType::kInt64, {777}, mem);
  const Tensor back = zero.to_host();
  EXPECT_TRUE(std::all_of(back.data<std::int64_t>(), back.data<std::int64_t>() + 777, [](auto v) { return v == 0; }));
}

// ---- (d) asking for a device that is not there --------------------------------------------

TEST(CudaBackend, ADeviceOutOfRangeIsAnInputErrorNamingIt) {
  try {
    (void)make_cuda_backend(99);
    FAIL() << "make_cuda_backend(99) returned a backend";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cuda:99"), std::string::npos) << m;
    EXPECT_TRUE(m.find("no CUDA device") != std::string::npos || m.find("out of range") != std::string::npos) << m;
  }
}

// ---- rounding -------------------------------------------------------------------------------

TEST(CudaBackend, RoundingIsBitIdenticalToTheCpuRounding) {
  QEVAL_CUDA_OR_SKIP(backend);
  std::vector<std::uint32_t> bits;
  for (std::uint32_t h = 0; h < 65536; ++h) bits.push_back(h << 16);  // every bf16 code
  std::mt19937 rng(7);
  for (int i = 0; i < 1 << 20; ++i) bits.push_back(rng());
  for (std::uint32_t b : {0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffbfffffu, 0x00000001u, 0x477fefffu, 0x477ff000u,
                          0x33000000u, 0x33000001u, 0x387fc000u})
    bits.push_back(b);
  Tensor x(DType::kFloat32, {std::int64_t(bits.size())});
  std::memcpy(x.raw(), bits.data(), bits.size() * 4);
  for (Rounding r : {Rounding::kFp16, Rounding::kBf16}) {
    Tensor want = x;
    apply_rounding(want, r);
    Tensor dev = x.to_device(backend->memory());
    backend->round(dev, r);
    const Tensor got = dev.to_host();
    EXPECT_EQ(bytes_of(got), bytes_of(want)) << (r == Rounding::kFp16 ? "fp16" : "bf16");
  }
}

// ---- (b) every ONNX node test, node by node ----------------------------------------------------

struct NodeRun {
  int compiled = 0, declined = 0, folded = 0, failed = 0, nondeterministic = 0;
  std::map<std::string, int> reasons;
  std::vector<std::string> failures;
};

Tensor as_type(Tensor t, DType want) {
  if (t.dtype() == DType::kUInt16 && want == DType::kBFloat16) t.reuse_as(DType::kBFloat16, t.shape());
  return t;
}

// Runs the nodes of one test's first data set on the CPU ops, and each node the backend compiles
// also on the device from the same inputs.
void run_node_test(Backend& backend, const fs::path& dir, NodeRun& r) {
  const std::string test = dir.filename().string();
  Graph graph;
  try {
    graph = load_onnx(dir / "model.onnx");
  } catch (const InputError&) {
    return;  // an op qeval lacks (the CPU conformance test lists these)
  }
  fs::path set = dir / "test_data_set_0";
  if (!fs::exists(set)) return;
  std::map<std::string, std::shared_ptr<const Tensor>> values;
  std::map<std::string, ValueMeta> metas;
  for (const auto& [name, t] : graph.initializers) {
    auto v = std::make_shared<const Tensor>(to_storage(t));
    metas[name] = ValueMeta{v->dtype(), t.dtype(), v->shape(), v};
    values[name] = v;
  }
  // Parameters fed as graph inputs (input >= 1 of a node: shapes, axes, scales, indices) are plan
  // constants, as a model's small int inputs are; data inputs are runtime values.
  std::set<std::string> parameter_inputs;
  for (const auto& n : graph.nodes)
    for (std::size_t i = 1; i < n.inputs.size(); ++i) parameter_inputs.insert(n.inputs[i]);
  for (std::size_t i = 0; i < graph.inputs.size(); ++i) {
    fs::path p = set / ("input_" + std::to_string(i) + ".pb");
    if (!fs::exists(p)) continue;
    const auto& info = graph.inputs[i];
    auto v = std::make_shared<const Tensor>(to_storage(as_type(read_tensor_pb(p), info.dtype)));
    const bool parameter = parameter_inputs.count(info.name) && v->dtype() != DType::kFloat32;
    metas[info.name] = ValueMeta{v->dtype(), info.dtype, v->shape(), parameter ? v : nullptr};
    values[info.name] = v;
  }
  for (const Node& node : graph.nodes) {
    const OpSchema* schema = find_op(node.domain, node.op_type, node.opset);
    if (!schema) return;
    std::unique_ptr<Op> op;
    std::vector<const ValueMeta*> in_metas;
    std::vector<const Tensor*> host_in;
    bool all_constant = true;
    for (const auto& name : node.inputs) {
      if (name.empty() || !metas.count(name)) {
        in_metas.push_back(nullptr);
        host_in.push_back(nullptr);
        continue;
      }
      in_metas.push_back(&metas.at(name));
      host_in.push_back(values.at(name).get());
      if (!metas.at(name).value) all_constant = false;
    }
    std::vector<ValueMeta> out_metas;
    std::vector<Tensor> cpu_out;
    try {
      op = schema->make(node);
      out_metas = op->infer(in_metas);
      for (const auto& m : out_metas) cpu_out.emplace_back(m.dtype, m.shape);
      std::vector<Tensor*> outs;
      for (auto& t : cpu_out) outs.push_back(&t);
      op->run(host_in, outs);
    } catch (const std::exception&) {
      return;  // the CPU op refuses these inputs (an error test); nothing to compare
    }
    for (std::size_t o = 0; o < node.outputs.size() && o < cpu_out.size(); ++o) {
      if (node.outputs[o].empty()) continue;
      auto v = std::make_shared<const Tensor>(cpu_out[o]);
      values[node.outputs[o]] = v;
      ValueMeta m = out_metas[o];
      if (all_constant) m.value = v;
      metas[node.outputs[o]] = m;
    }
    if (all_constant) {
      ++r.folded;  // the plan folds it on the CPU
      continue;
    }
    std::string why;
    std::unique_ptr<StepKernel> k;
    try {
      const std::vector<Rounding> fp32(in_metas.size(), Rounding::kNone);
      k = backend.compile(node, *op, in_metas, fp32, out_metas, why);
    } catch (const std::exception& e) {
      why = std::string("threw: ") + e.what();
    }
    if (!k) {
      ++r.declined;
      ++r.reasons[node.op_type + ": " + why.substr(0, 90)];
      continue;
    }
    ++r.compiled;
    const auto mem = backend.memory();
    std::vector<Tensor> dev_in_store;
    dev_in_store.reserve(host_in.size());
    std::vector<const Tensor*> dev_in;
    for (const Tensor* t : host_in) {
      if (!t) {
        dev_in.push_back(nullptr);
        continue;
      }
      dev_in_store.push_back(t->to_device(mem));
      dev_in.push_back(&dev_in_store.back());
    }
    std::string problem;
    std::vector<std::string> first_bits;
    for (int attempt = 0; attempt < 2 && problem.empty(); ++attempt) {
      std::vector<Tensor> dev_out;
      dev_out.reserve(out_metas.size());
      std::vector<Tensor*> outs;
      for (std::size_t o = 0; o < out_metas.size(); ++o) {
        if (o < node.outputs.size() && !node.outputs[o].empty()) {
          dev_out.emplace_back(out_metas[o].dtype, out_metas[o].shape, mem);
          outs.push_back(&dev_out.back());
        } else {
          outs.push_back(nullptr);
        }
      }
      try {
        k->run(dev_in, outs);
        for (std::size_t o = 0; o < outs.size(); ++o) {
          if (!outs[o]) continue;
          const Tensor got = outs[o]->to_host();
          if (attempt == 0) {
            first_bits.push_back(bytes_of(got));
            const std::string c = compare(cpu_out[o], got);
            if (!c.empty()) problem = "output " + std::to_string(o) + ": " + c;
          } else if (bytes_of(got) != first_bits[std::min(o, first_bits.size() - 1)]) {
            ++r.nondeterministic;
            problem = "output " + std::to_string(o) + " differs between two runs";
          }
        }
      } catch (const std::exception& e) {
        problem = std::string("threw: ") + e.what();
      }
    }
    if (!problem.empty()) {
      ++r.failed;
      r.failures.push_back(test + " node '" + node.name + "' (" + node.op_type + "): " + problem);
    }
  }
}

TEST(CudaConformance, EveryCompiledNodeOfTheOnnxNodeTestsMatchesTheCpuOp) {
  QEVAL_CUDA_OR_SKIP(backend);
  if (!fs::exists(kNodeTests)) GTEST_SKIP() << kNodeTests << " missing: install libonnx-testdata";
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(kNodeTests))
    if (e.is_directory()) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  NodeRun r;
  for (const auto& dir : dirs) run_node_test(*backend, dir, r);
  std::vector<std::pair<int, std::string>> reasons;
  for (const auto& [why, n] : r.reasons) reasons.emplace_back(n, why);
  std::sort(reasons.rbegin(), reasons.rend());
  std::printf(
      "CUDA node tests: %d nodes ran on the device (%d failed, %d not bit-deterministic), %d declined, %d "
      "folded on the CPU\n",
      r.compiled, r.failed, r.nondeterministic, r.declined, r.folded);
  std::printf("top reasons for declining:\n");
  for (std::size_t i = 0; i < reasons.size() && i < 25; ++i)
    std::printf("  %4d  %s\n", reasons[i].first, reasons[i].second.c_str());
  for (const auto& f : r.failures) ADD_FAILURE() << f;
  EXPECT_GE(r.compiled, 300);  // guards against a runner that compiles nothing
}

// ---- (c) larger shapes: agreement with the CPU and the same bits on every run -------------------

struct Case {
  std::string op_type;
  std::vector<Shape> shapes;
  std::map<std::string, Attribute> attributes = {};
};

// FP32 nodes, and the products again with operands exact in fp16 and in bf16 (compile() told so:
// tensor cores, FP32 accumulation; weights as constants, converted once and reused): against the
// CPU's FP32 arithmetic on the same rounded operands, rel-L2 <= 1e-5, the same bits every run.
TEST(CudaBackend, LargerNodesMatchTheCpuAndGiveTheSameBitsEveryRun) {
  QEVAL_CUDA_OR_SKIP(backend);
  const std::vector<Case> cases = {
      {"MatMul", {{2, 64, 384}, {384, 320}}},
      {"MatMul", {{2, 8, 77, 64}, {2, 8, 64, 77}}},
      {"MatMul", {{2, 8, 77, 40}, {40, 77}}},
      {"Gemm", {{64, 96}, {80, 96}, {80}}, {{"transB", Attribute::of_int(1)}}},
      {"Conv", {{2, 32, 33, 33}, {48, 32, 3, 3}, {48}}},
      {"Conv", {{1, 64, 16, 16}, {128, 64, 1, 1}, {128}}},
      {"Conv",
       {{2, 20, 17, 17}, {24, 20, 3, 3}, {24}},
       {{"strides", Attribute::of_ints({2, 2})}, {"pads", Attribute::of_ints({1, 1, 1, 1})}}},
      {"Softmax", {{8, 4, 1000}}},
      {"ReduceMean", {{4, 4096, 8}}},
      {"Sigmoid", {{1 << 20}}},
      {"Add", {{2, 320, 32, 32}, {320, 1, 1}}},
      // Few long rows: each split over several blocks (GroupNorm's form at SD's 64x64 latent).
      {"InstanceNormalization", {{2, 32, 40960}, {32}, {32}}},
      {"LayerNormalization", {{2, 4, 65536}, {65536}, {65536}}, {{"axis", Attribute::of_int(-1)}}},
      // Strided walks whose axes merge (and one that stays rank 4).
      {"Transpose", {{2, 4096, 8, 40}}, {{"perm", Attribute::of_ints({0, 2, 1, 3})}}},
      {"Add", {{2, 4096, 320}, {320}}},
      {"Mul", {{2, 8, 77, 40}, {2, 1, 77, 1}}},
  };
  const auto mem = backend->memory();
  std::uint32_t seed = 100;
  for (Rounding format : {Rounding::kNone, Rounding::kFp16, Rounding::kBf16})
  for (const auto& c : cases) {
    const bool product = c.op_type == "MatMul" || c.op_type == "Gemm" || c.op_type == "Conv";
    if (format != Rounding::kNone && !product) continue;
    SCOPED_TRACE(format == Rounding::kNone ? "fp32" : (format == Rounding::kFp16 ? "fp16 operands" : "bf16 operands"));
    Node node;
    node.name = c.op_type + "_large";
    node.op_type = c.op_type;
    node.opset = 17;
    node.attributes = c.attributes;
    for (std::size_t i = 0; i < c.shapes.size(); ++i) node.inputs.push_back("in" + std::to_string(i));
    node.outputs = {"out"};
    const OpSchema* schema = find_op("", c.op_type, 17);
    ASSERT_NE(schema, nullptr) << c.op_type;
    auto op = schema->make(node);
    std::vector<Tensor> host;
    std::vector<ValueMeta> metas;
    for (const auto& s : c.shapes) {
      host.push_back(float_tensor(s, seed++));
      apply_rounding(host.back(), format);
      metas.push_back(ValueMeta{DType::kFloat32, DType::kFloat32, s, nullptr});
    }
    // The operands after the first are weights: constants (at fp32, runtime values as before).
    if (format != Rounding::kNone)
      for (std::size_t i = 1; i < host.size(); ++i) metas[i].value = std::make_shared<const Tensor>(host[i]);
    std::vector<const ValueMeta*> in_metas;
    std::vector<const Tensor*> host_in;
    for (std::size_t i = 0; i < host.size(); ++i) in_metas.push_back(&metas[i]), host_in.push_back(&host[i]);
    const auto out_metas = op->infer(in_metas);
    Tensor want(out_metas[0].dtype, out_metas[0].shape);
    Tensor* want_out[] = {&want};
    op->run(host_in, want_out);
    std::string why;
    const std::vector<Rounding> exact(host.size(), format);
    auto k = backend->compile(node, *op, in_metas, exact, out_metas, why);
    ASSERT_NE(k, nullptr) << c.op_type << ": " << why;
    std::vector<Tensor> dev;
    for (const auto& h : host) dev.push_back(h.to_device(mem));
    std::vector<const Tensor*> dev_in;
    for (const auto& d : dev) dev_in.push_back(&d);
    std::string first;
    for (int run = 0; run < 3; ++run) {
      Tensor got(out_metas[0].dtype, out_metas[0].shape, mem);
      Tensor* outs[] = {&got};
      k->run(dev_in, outs);
      const Tensor back = got.to_host();
      if (run == 0) {
        first = bytes_of(back);
        EXPECT_EQ(compare(want, back), "") << c.op_type << " " << shape_to_string(c.shapes[0]);
      } else {
        EXPECT_EQ(bytes_of(back), first) << c.op_type << ": run " << run << " gave other bits";
      }
    }
  }
}

// Sessions given one SharedConstants (the evaluator's workers) share their weights' device copies:
// a second session over the same graph costs its activations only, a session with its own
// constants another copy of the weight.
TEST(CudaBackend, SessionsSharingConstantsShareTheWeightsDeviceCopies) {
  QEVAL_CUDA_OR_SKIP(backend);
  const std::int64_t k = 1024, n = 8192;  // a 32 MiB weight
  testing::OnnxBuilder b;
  b.input("x", onnx::TensorProto::FLOAT, {4, k}).output("y", onnx::TensorProto::FLOAT);
  b.initializer("w", random_floats(std::size_t(k * n), 7), {k, n});
  b.node("MatMul", {"x", "w"}, {"y"}, "mm");
  const Graph g = b.graph();
  const std::map<std::string, Tensor> in = {{"x", float_tensor({4, k}, 8)}};
  auto free_bytes = [] {
    std::size_t free = 0, total = 0;
    EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
    return double(free);
  };
  const double weight = double(k * n * 4);
  SessionOptions shared;
  shared.backend = backend;
  shared.constants = std::make_shared<SharedConstants>();
  Session first(g, shared);
  const Tensor y = first.run(in).at("y");
  const double before = free_bytes();
  Session second(g, shared);
  EXPECT_TRUE(gpu_test::same_bits(y, second.run(in).at("y")));
  const double after_shared = free_bytes();
  SessionOptions own = shared;
  own.constants = std::make_shared<SharedConstants>();
  Session third(g, own);
  EXPECT_TRUE(gpu_test::same_bits(y, third.run(in).at("y")));
  const double after_own = free_bytes();
  EXPECT_LT(before - after_shared, 0.5 * weight) << "the second session copied the weight again";
  EXPECT_GE(after_shared - after_own, weight) << "a session with its own constants should hold its own copy";
}

}  // namespace
}  // namespace qeval::eval
