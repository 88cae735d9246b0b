// The shipped models through the executor on the CUDA backend: the CPU's outputs within rel-L2
// 1e-5 (fp32), the same bits on every run, observed runs equal to unobserved ones, the nodes that
// fall back to the CPU listed; and `qeval run --device cuda` with the CPU run's verdicts. Skips,
// saying why, without a CUDA device. $QEVAL_SOURCE_DIR / $QEVAL_BINARY point at the checkout and
// the binary where the tests run from a copy (scripts/test-gpu.sh on the GPU machine).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/exec/cuda/cuda_backend.h"
#include "gpu/gpu_test_util.h"
#include "test_util.h"
#include "eval/exec/onnx_import.h"
#include "eval/exec/session.h"
#include "gpu/unfused_backend.h"
#include "kernels/error.h"

namespace qeval::eval {
namespace {

namespace fs = std::filesystem;
using gpu_test::normal;
using gpu_test::rel_l2;
using gpu_test::same_bits;

fs::path from_env(const char* name, const char* built) {
  const char* moved = std::getenv(name);
  return moved && *moved ? moved : built;
}
fs::path source_dir() { return from_env("QEVAL_SOURCE_DIR", QEVAL_SOURCE_DIR); }

struct Case {
  const char* model;  // under models/
  std::map<std::string, Tensor> (*inputs)();
};

std::map<std::string, Tensor> text_encoder_inputs() {
  Tensor ids(DType::kInt32, {2, 77});
  std::mt19937 rng(7);
  for (auto& v : ids.span<std::int32_t>()) v = std::int32_t(rng() % 600);
  return {{"input_ids", std::move(ids)}};
}
std::map<std::string, Tensor> unet_inputs() {
  Tensor t(DType::kFloat32, {2});
  t.data<float>()[0] = 901.0f;
  t.data<float>()[1] = 41.0f;
  return {{"sample", normal({2, 4, 16, 16}, 1)},
          {"timestep", std::move(t)},
          {"encoder_hidden_states", normal({2, 77, 128}, 2)}};
}
std::map<std::string, Tensor> vae_inputs() { return {{"latent_sample", normal({1, 4, 16, 16}, 3, 4.0f)}}; }
std::map<std::string, Tensor> sam_encoder_inputs() { return {{"image", normal({1, 3, 64, 64}, 4)}}; }
std::map<std::string, Tensor> sam_decoder_inputs() {
  Tensor coords(DType::kFloat32, {1, 2, 2}), labels(DType::kFloat32, {1, 2});
  const float c[] = {20.0f, 31.0f, 44.0f, 9.0f};
  std::memcpy(coords.data<float>(), c, sizeof c);
  labels.data<float>()[0] = 1.0f;
  labels.data<float>()[1] = 0.0f;
  return {{"image_embeddings", normal({1, 64, 16, 16}, 5)}, {"point_coords", coords}, {"point_labels", labels}};
}

const Case kCases[] = {{"tiny-sd/text_encoder.onnx", text_encoder_inputs},
                       {"tiny-sd/unet.onnx", unet_inputs},
                       {"tiny-sd/vae_decoder.onnx", vae_inputs},
                       {"tiny-sam/image_encoder.onnx", sam_encoder_inputs},
                       {"tiny-sam/mask_decoder.onnx", sam_decoder_inputs}};

// Reads every value an observer is shown (host memory), as qeval run's observers do.
class Reader final : public Observer {
 public:
  void on_node(const NodeEvent& e) override {
    for (const Tensor* t : e.outputs)
      if (t && t->dtype() == DType::kFloat32) sum += double(t->data<float>()[0]);
    ++nodes;
  }
  double sum = 0;
  int nodes = 0;
};

TEST(CudaModels, ShippedModelsMatchTheCpuAndRepeatTheirBits) {
  QEVAL_CUDA_OR_SKIP(cuda);
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.model);
    const Graph g = load_onnx(source_dir() / "models" / c.model);
    const auto inputs = c.inputs();
    for (Precision precision : {Precision::kFp32, Precision::kFp16}) {
      SCOPED_TRACE(std::string(precision_name(precision)));
      SessionOptions on_gpu{precision}, node_by_node{precision};
      on_gpu.backend = cuda;
      node_by_node.backend = std::make_shared<qeval::testing::Unfused>(cuda);
      Session cpu(g, SessionOptions{precision}), gpu(g, on_gpu), nodes(g, node_by_node);
      const auto want = cpu.run(inputs);
      const auto got = gpu.run(inputs);
      // The fused kernels (attention, elementwise chains) against the same groups node by node.
      const auto unfused = nodes.run(inputs);
      const auto again = gpu.run(inputs);
      Reader seen_cpu, seen_gpu;
      cpu.run(inputs, &seen_cpu);
      const auto observed = gpu.run(inputs, &seen_gpu);
      EXPECT_EQ(seen_gpu.nodes, seen_cpu.nodes);
      // fp32: summation order only. fp16: every op's output is rounded to fp16, so an FP32
      // difference in the last bit can move a value by one fp16 ulp (2^-11 relative) and the
      // next ops carry it on.
      const double tolerance = precision == Precision::kFp32 ? 1e-5 : 2e-3;
      for (const auto& [name, w] : want) {
        const double rel = rel_l2(w, got.at(name));
        EXPECT_LE(rel, tolerance) << name;
        const double rel_nodes = rel_l2(unfused.at(name), got.at(name));
        EXPECT_LE(rel_nodes, tolerance) << name << ": fused against node by node on the device";
        EXPECT_TRUE(same_bits(got.at(name), again.at(name))) << name << ": a second run gave other bits";
        EXPECT_TRUE(same_bits(got.at(name), observed.at(name))) << name << ": an observed run gave other bits";
        std::printf("  %-28s %-5s %-24s rel-L2 %.2e (fused vs nodes on the GPU %.2e)\n", c.model,
                    std::string(precision_name(precision)).c_str(), name.c_str(), rel, rel_nodes);
      }
      std::map<std::string, Shape> shapes;
      for (const auto& [name, t] : inputs) shapes.emplace(name, t.shape());
      const auto host = gpu.host_steps(shapes);
      std::printf("  %-28s %-5s %zu of %zu nodes on the CPU\n", c.model, std::string(precision_name(precision)).c_str(),
                  host.size(), gpu.nodes().size());
      for (const HostStep& h : host)
        std::printf("      %s '%s': %s\n", gpu.nodes()[h.node].op_type.c_str(), gpu.nodes()[h.node].name.c_str(),
                    h.why.c_str());
    }
  }
}

// testing::run_qeval with the binary $QEVAL_BINARY names, where the tests run from a copy.
testing::CliRun qeval(const std::string& args) {
  const std::string binary = from_env("QEVAL_BINARY", QEVAL_BINARY).string();
  FILE* p = popen((binary + " " + args + " 2>&1").c_str(), "r");
  testing::CliRun r;
  if (!p) return r;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The shipped default evaluation (tiny-sd, its variants and gate) and a tiny-sam one (an INT8
// recipe calibrated on the device) on the GPU and on the CPU: the same verdict per check, the
// report saying where it ran.
TEST(CudaModels, QevalRunOnTheGpuGivesTheCpuVerdicts) {
  QEVAL_CUDA_OR_SKIP(cuda);
  const fs::path out = fs::temp_directory_path() / "qeval-gpu-run";
  fs::remove_all(out);
  // Without local error the GPU run's statistics come from device scans (eval/exec/device_scan.h),
  // the values staying in device memory.
  fs::create_directories(out);
  const fs::path gate = out / "acc-gate.json", scanned = out / "scanned.json";
  std::ofstream(gate) << R"({"checks": [{"metric": "psnr_db", "stat": "mean", "min": 30}],
    "layers": [{"column": "acc_sqnr_db", "stat": "min", "min": 20}], "max_nonfinite": 0})";
  std::ofstream(scanned) << R"({"pipeline": ")" << (source_dir() / "models/tiny-sd").string()
                         << R"(", "variants": [{"name": "fp32"}, {"name": "fp16", "precision": "fp16"},
    {"name": "bf16", "precision": "bf16"}], "reference": "fp32", "observe": {"local_error": false},
    "gate": ")" << gate.string() << R"("})";
  const std::pair<const char*, std::string> runs[] = {
      {"tiny-sd", "--count 2"},
      {"tiny-sd-scanned", "--count 2 --config " + scanned.string()},
      {"tiny-sam", "--count 8 --config " + (source_dir() / "docs/examples/tiny-sam-triage.json").string()}};
  for (const auto& [name, args] : runs) {
    SCOPED_TRACE(name);
    const fs::path dir = out / name;
    const testing::CliRun cpu = qeval("run " + args + " --out " + (dir / "cpu").string());
    const testing::CliRun gpu = qeval("run --device cuda " + args + " --out " + (dir / "gpu").string());
    ASSERT_TRUE(cpu.code == 0 || cpu.code == 1) << cpu.out;
    EXPECT_EQ(gpu.code, cpu.code) << gpu.out;
    const auto a = testing::read_json(dir / "cpu" / "report.json"),
               b = testing::read_json(dir / "gpu" / "report.json");
    EXPECT_EQ(a["config"]["device"], "cpu");
    EXPECT_EQ(b["config"]["device"], "cuda:0");
    std::printf("  %s: evaluation %.2f s on the CPU, %.2f s with --device cuda\n", name,
                a["elapsed_s"].get<double>(), b["elapsed_s"].get<double>());
    if (std::string(name) == "tiny-sd") {
      // Local error (each node run alone on the reference's values; compared by scans queued on
      // the device and read back once a call): every layer the CPU measured, measured on the GPU,
      // and where the quantization error dominates the two machines' kernels, the same figure.
      const auto &ta = a["layers"]["tables"], &tb = b["layers"]["tables"];
      ASSERT_EQ(ta.size(), tb.size());
      for (std::size_t v = 0; v < ta.size(); ++v) {
        if (!ta[v]["stats"].contains("local_sqnr_db")) continue;
        const auto &la = ta[v]["stats"]["local_sqnr_db"], &lb = tb[v]["stats"]["local_sqnr_db"];
        ASSERT_EQ(la.size(), lb.size());
        std::vector<double> diffs;
        for (std::size_t i = 0; i < la.size(); ++i) {
          EXPECT_EQ(la[i].is_number(), lb[i].is_number()) << ta[v]["variant"] << " layer " << i;
          if (la[i].is_number() && lb[i].is_number() && la[i].get<double>() < 45)
            diffs.push_back(std::abs(la[i].get<double>() - lb[i].get<double>()));
        }
        if (ta[v]["variant"] == "int8-l3") {
          // Clip rates at the calibrated ranges (per channel behind SmoothQuant's pre-scales:
          // counted by the device scan) as the CPU counts them, up to elements that the two
          // machines' kernels put on either side of a threshold.
          const auto &ca = ta[v]["stats"]["clip_rate"], &cb = tb[v]["stats"]["clip_rate"];
          ASSERT_EQ(ca.size(), cb.size());
          std::size_t clipping = 0;
          for (std::size_t i = 0; i < ca.size(); ++i) {
            if (!ca[i].is_number() || ca[i].get<double>() < 1e-4) continue;
            ++clipping;
            ASSERT_TRUE(cb[i].is_number()) << "layer " << i;
            EXPECT_NEAR(cb[i].get<double>(), ca[i].get<double>(), 0.1 * ca[i].get<double>() + 1e-4) << "layer " << i;
          }
          EXPECT_GT(clipping, 0u);
          ASSERT_GT(diffs.size(), 20u);
          std::sort(diffs.begin(), diffs.end());
          std::printf("  int8-l3: %zu layers of local SQNR < 45 dB, median |cpu - gpu| %.3f dB, largest %.3f dB\n",
                      diffs.size(), diffs[diffs.size() / 2], diffs.back());
          EXPECT_LT(diffs[diffs.size() / 2], 0.5) << "median |local SQNR cpu - gpu| (dB) of int8-l3's layers";
        }
      }
    }
    ASSERT_EQ(a["gate"]["checks"].size(), b["gate"]["checks"].size());
    for (std::size_t i = 0; i < a["gate"]["checks"].size(); ++i) {
      const auto &x = a["gate"]["checks"][i], &y = b["gate"]["checks"][i];
      EXPECT_EQ(x["passed"], y["passed"]) << x.dump() << "\n" << y.dump();
      std::printf("  %-40s %-16s cpu %-14s gpu %-14s\n", x["name"].get<std::string>().c_str(),
                  x["variant"].get<std::string>().c_str(), x["value"].dump().c_str(), y["value"].dump().c_str());
    }
  }
}

}  // namespace
}  // namespace qeval::eval
