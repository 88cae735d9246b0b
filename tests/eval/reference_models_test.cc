// Realistic exported models (tests/data/onnx/, made by tools/make_reference_models.py) run through
// the executor and compared with ONNX Runtime's outputs; fp16 emulation checked against fp32.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "datasets/npy.h"
#include "eval/exec/onnx_import.h"
#include "eval/exec/ops/op.h"
#include "eval/exec/session.h"
#include "kernels/error.h"
#include "test_util.h"

namespace qeval::eval {
namespace {

namespace fs = std::filesystem;

// FP32 agreement with ONNX Runtime: both compute the same graph in float32, differing only in
// summation order and transcendental implementations.
constexpr double kFp32MaxRelL2 = 1e-5;
// FP16 emulation rounds every op's output to half precision: the error grows with depth but must
// stay at the percent level for these shallow models, and must exceed float32 noise (else the
// precision option did nothing).
constexpr double kFp16MaxRelL2 = 1e-2;
constexpr double kFp16MinRelL2 = 1e-5;

fs::path models_dir() { return testing::data_dir() / "onnx"; }

// Same rule as the scripts that wrote the files: characters outside [A-Za-z0-9_.-] become '_'.
std::string safe_name(const std::string& name) {
  std::string s = name;
  for (char& c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-')) c = '_';
  return s;
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(models_dir(), ec))
    if (entry.is_directory()) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::map<std::string, Tensor> read_inputs(const Graph& graph, const fs::path& folder) {
  std::map<std::string, Tensor> inputs;
  for (const auto& in : graph.inputs)
    inputs.emplace(in.name, datasets::read_npy(folder / "inputs" / (safe_name(in.name) + ".npy")));
  return inputs;
}

struct Difference {
  double rel_l2 = 0;
  double max_abs = 0;
  std::int64_t max_abs_index = 0;
  double ref_rms = 0;
  std::int64_t nonfinite = 0;  // elements where either side is NaN/Inf

  std::string describe() const {
    std::ostringstream s;
    s << "rel L2 " << rel_l2 << ", max abs diff " << max_abs << " at flat index " << max_abs_index << ", reference rms "
      << ref_rms << ", non-finite elements " << nonfinite;
    return s.str();
  }
};

Difference difference(const Tensor& ref, const Tensor& test) {
  Difference d;
  const float* r = ref.data<float>();
  const float* t = test.data<float>();
  double err2 = 0, ref2 = 0;
  for (std::int64_t i = 0; i < ref.numel(); ++i) {
    if (!std::isfinite(r[i]) || !std::isfinite(t[i])) {
      ++d.nonfinite;
      continue;
    }
    const double e = double(t[i]) - double(r[i]);
    err2 += e * e;
    ref2 += double(r[i]) * r[i];
    if (std::abs(e) > d.max_abs) {
      d.max_abs = std::abs(e);
      d.max_abs_index = i;
    }
  }
  d.rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : (err2 > 0 ? INFINITY : 0.0);
  d.ref_rms = ref.numel() > 0 ? std::sqrt(ref2 / double(ref.numel())) : 0.0;
  if (d.nonfinite > 0) d.rel_l2 = INFINITY;
  return d;
}

class ReferenceModels : public ::testing::TestWithParam<std::string> {
 protected:
  fs::path folder() const { return models_dir() / GetParam(); }

  // Loads model.onnx; an unsupported op (or any other load error) is a failure naming the nodes,
  // followed by the distinct missing op types (load_onnx's list stops after a few nodes).
  bool load(Graph& graph) {
    try {
      graph = load_onnx(folder() / "model.onnx");
      return true;
    } catch (const InputError& e) {
      ADD_FAILURE() << GetParam() << ": load_onnx failed: " << e.what() << missing_op_types();
      return false;
    }
  }

  std::string missing_op_types() const {
    std::set<std::string> missing;
    try {
      const Graph g = load_onnx(folder() / "model.onnx", ImportOptions{.require_supported_ops = false});
      for (const auto& n : g.nodes)
        if (!find_op(n.domain, n.op_type, n.opset)) missing.insert(n.op_type);
    } catch (const InputError&) {
      return "";
    }
    std::string list;
    for (const auto& op : missing) list += (list.empty() ? "" : ", ") + op;
    return missing.empty() ? "" : "\nmissing op types: " + list;
  }
};

TEST_F(ReferenceModels, DataFoldersAreComplete) {
  const auto names = model_names();
  ASSERT_FALSE(names.empty()) << "no model folders under " << models_dir() << " (run tools/make_reference_models.py)";
  for (const auto& name : names) {
    const fs::path f = models_dir() / name;
    EXPECT_TRUE(fs::is_regular_file(f / "model.onnx")) << f;
    EXPECT_TRUE(fs::is_directory(f / "inputs")) << f;
    EXPECT_TRUE(fs::is_directory(f / "outputs")) << f;
  }
}

TEST_P(ReferenceModels, Fp32MatchesOnnxRuntime) {
  Graph graph;
  if (!load(graph)) return;
  Session session(graph);
  const auto outputs = session.run(read_inputs(graph, folder()));
  for (const auto& out : graph.outputs) {
    SCOPED_TRACE(GetParam() + " output '" + out.name + "'");
    const Tensor ort = datasets::read_npy(folder() / "outputs" / (safe_name(out.name) + ".npy"));
    ASSERT_TRUE(outputs.count(out.name)) << "the session returned no such output";
    const Tensor& got = outputs.at(out.name);
    ASSERT_EQ(shape_to_string(got.shape()), shape_to_string(ort.shape()));
    ASSERT_EQ(dtype_name(got.dtype()), dtype_name(ort.dtype()));
    if (ort.dtype() != DType::kFloat32) {
      EXPECT_EQ(datasets::serialize_npy(got), datasets::serialize_npy(ort)) << "non-float output differs";
      continue;
    }
    const Difference d = difference(ort, got);
    EXPECT_LE(d.rel_l2, kFp32MaxRelL2) << "qeval fp32 vs ONNX Runtime: " << d.describe();
    std::cout << "  " << GetParam() << " " << out.name << " fp32 vs ORT: " << d.describe() << "\n";
  }
}

TEST_P(ReferenceModels, Fp16StaysCloseToFp32) {
  Graph graph;
  if (!load(graph)) return;
  const auto inputs = read_inputs(graph, folder());
  Session fp32(graph);
  Session fp16(graph, SessionOptions{Precision::kFp16});
  const auto ref = fp32.run(inputs);
  const auto half = fp16.run(inputs);
  int float_outputs = 0;
  for (const auto& out : graph.outputs) {
    SCOPED_TRACE(GetParam() + " output '" + out.name + "'");
    const Tensor& r = ref.at(out.name);
    const Tensor& h = half.at(out.name);
    ASSERT_EQ(shape_to_string(h.shape()), shape_to_string(r.shape()));
    if (r.dtype() != DType::kFloat32) continue;
    ++float_outputs;
    const Difference d = difference(r, h);
    EXPECT_LT(d.rel_l2, kFp16MaxRelL2) << "fp16 vs fp32: " << d.describe();
    EXPECT_GT(d.rel_l2, kFp16MinRelL2) << "fp16 emulation changed (almost) nothing: " << d.describe();
    std::cout << "  " << GetParam() << " " << out.name << " fp16 vs fp32: " << d.describe() << "\n";
  }
  EXPECT_GT(float_outputs, 0);
}

// The evaluator promises the same bytes whatever the thread count; observers see the unfused nodes
// and must get the same bytes as an unobserved (fused) run. Checked at fp32 and with fp16 rounding.
TEST_P(ReferenceModels, SameBytesForOneAndTwoThreadsAndWithObservers) {
  Graph graph;
  if (!load(graph)) return;
  const auto inputs = read_inputs(graph, folder());
  struct Nothing final : Observer {
    int nodes = 0;
    void on_node(const NodeEvent&) override { ++nodes; }
  };
  for (Precision precision : {Precision::kFp32, Precision::kFp16}) {
    SCOPED_TRACE(GetParam() + " " + std::string(precision_name(precision)));
    auto run = [&](int threads, Observer* observer) {
      tbb::global_control limit(tbb::global_control::max_allowed_parallelism, std::size_t(threads));
      Session session(graph, SessionOptions{precision});
      return session.run(inputs, observer);
    };
    const auto two = run(2, nullptr);
    const auto one = run(1, nullptr);
    Nothing observer;
    const auto observed = run(2, &observer);
    EXPECT_EQ(observer.nodes, int(graph.nodes.size()));
    for (const auto& out : graph.outputs) {
      const std::vector<std::uint8_t> a = datasets::serialize_npy(two.at(out.name));
      EXPECT_TRUE(a == datasets::serialize_npy(one.at(out.name))) << out.name << ": 1 thread differs from 2";
      EXPECT_TRUE(a == datasets::serialize_npy(observed.at(out.name))) << out.name << ": observed run differs";
    }
  }
}

// Test names may hold only letters, digits and '_'.
std::string test_name(const ::testing::TestParamInfo<std::string>& param) {
  std::string s = param.param;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

// Empty prefix: the tests are named ReferenceModels.<Test>/<model folder>. The folder list is read
// when the tests are registered (RUN_ALL_TESTS), so a new folder is a new test with no code change.
INSTANTIATE_TEST_SUITE_P(, ReferenceModels, ::testing::ValuesIn(model_names()), test_name);

}  // namespace
}  // namespace qeval::eval
