// Non-finite values never pass silently: a variant that is NaN/Inf where the reference is finite
// gets unbounded statistics, fails every gate check over it unless the gate allows it, and
// activations keep NaN instead of hiding it (issue: verdicts on real models).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "datasets/npy.h"
#include "eval/exec/session.h"
#include "eval/onnx_builder.h"
#include "eval/run/gate.h"
#include "metrics/activation_stats.h"
#include "metrics/tensor_error.h"
#include "test_util.h"

namespace qeval {
namespace {

namespace fs = std::filesystem;
constexpr double kInf = std::numeric_limits<double>::infinity();

// 48 reference values and a test copy with 26 of them +Inf (the reproduction in the issue).
std::pair<std::vector<float>, std::vector<float>> diverged_pair() {
  std::vector<float> ref(48), test(48);
  for (int i = 0; i < 48; ++i) ref[i] = test[i] = 0.5f + 0.01f * float(i);
  for (int i = 0; i < 26; ++i) test[std::size_t(i) * 48 / 26] = std::numeric_limits<float>::infinity();
  return {ref, test};
}

TEST(NonFinite, ATestInfWhereTheReferenceIsFiniteMakesEveryStatisticUnbounded) {
  auto [ref, test] = diverged_pair();
  const auto e = metrics::tensor_error(ref.data(), test.data(), 48);
  EXPECT_EQ(e.diverged, 26);
  EXPECT_EQ(e.nonfinite_test, 26);
  ASSERT_TRUE(e.sqnr_db);
  EXPECT_EQ(*e.sqnr_db, -kInf);
  EXPECT_EQ(e.max_abs, kInf);
  ASSERT_TRUE(e.rel_l2);
  EXPECT_EQ(*e.rel_l2, kInf);
  EXPECT_FALSE(e.cosine);  // undefined, never 1.0 over the 22 finite values
  EXPECT_FALSE(e.identical());

  // Pooled, and merged into a pool of clean calls, it stays unbounded.
  metrics::ErrorStats clean, pooled;
  clean.add(metrics::tensor_error(ref.data(), ref.data(), 48), 48);
  EXPECT_EQ(*clean.sqnr_db(), kInf);
  pooled.add(e, 48);
  clean.merge(pooled);
  for (const auto* s : {&pooled, &clean}) {
    EXPECT_TRUE(s->diverged());
    EXPECT_EQ(*s->sqnr_db(), -kInf);
    EXPECT_EQ(*s->rel_l2(), kInf);
    EXPECT_FALSE(s->cosine());
  }
}

TEST(NonFinite, NonFiniteOnBothSidesIsNotDivergence) {
  // An attention mask's -inf in the reference and the variant alike: excluded, not a failure.
  std::vector<float> ref = {1, 2, -std::numeric_limits<float>::infinity(), 4};
  std::vector<float> test = {1, 2.001f, -std::numeric_limits<float>::infinity(), 4};
  const auto e = metrics::tensor_error(ref.data(), test.data(), 4);
  EXPECT_EQ(e.diverged, 0);
  EXPECT_EQ(e.count, 3);
  ASSERT_TRUE(e.sqnr_db);
  EXPECT_TRUE(std::isfinite(*e.sqnr_db));
  EXPECT_TRUE(std::isfinite(e.max_abs));
  // The streamed statistics pass gives tensor_error's verdict on a diverged tensor too.
  auto [r2, t2] = diverged_pair();
  metrics::ActivationStats act;
  metrics::ErrorStats err;
  metrics::ActivationStats ref_act;
  const auto energy = ref_act.add(r2.data(), 48);
  ASSERT_TRUE(energy);
  const auto added = metrics::add_with_error(act, err, t2.data(), r2.data(), *energy, 48);
  EXPECT_EQ(added.diverged, 26);
  EXPECT_EQ(*err.sqnr_db(), -kInf);
}

eval::GateSample sample(const std::string& name, double sqnr, double max_abs, std::uint64_t nonfinite) {
  eval::GateSample s;
  s.name = name;
  s.values["output_sqnr_db"] = sqnr;
  s.values["output_max_abs"] = max_abs;
  s.nonfinite = nonfinite;
  return s;
}

TEST(NonFinite, AGateFailsEveryCheckOverADivergedSampleUnlessItAllowsNonFinite) {
  const std::string checks = R"("checks": [{"metric": "output_sqnr_db", "stat": "mean", "min": 40},
                                           {"metric": "output_max_abs", "stat": "max", "max": 100}])";
  // Scores as the old code gave them (62.6 dB over the finite values): only the count tells.
  const std::vector<eval::GateSample> samples = {sample("a", 70, 0.01, 0), sample("b", 62.6, 0.02, 26)};
  const auto strict =
      eval::evaluate_gate(eval::parse_gate("{" + checks + "}", "g.json", eval::GateMetrics::kRun), samples);
  EXPECT_FALSE(strict.section.passed);
  for (const auto& row : strict.section.checks)
    if (row.metric == "output_sqnr_db" || row.metric == "output_max_abs") {
      EXPECT_FALSE(row.passed) << row.name;
      EXPECT_NE(row.detail.find("NaN/Inf where the reference is finite"), std::string::npos) << row.detail;
    }
  ASSERT_EQ(strict.failed_checks.size(), 2u);
  EXPECT_TRUE(strict.failed_checks[0].empty());
  EXPECT_EQ(strict.failed_checks[1].size(), 1u);

  const auto allowed = eval::evaluate_gate(
      eval::parse_gate("{" + checks + R"(, "allow_nonfinite": true})", "g.json", eval::GateMetrics::kRun), samples);
  EXPECT_TRUE(allowed.section.passed);
  // Even a gate with no checks at all fails on a diverged sample: an output that went NaN is
  // never a pass by default.
  EXPECT_FALSE(eval::evaluate_gate(eval::parse_gate("{}", "g.json"), samples).section.passed);
  EXPECT_TRUE(eval::evaluate_gate(eval::parse_gate("{}", "g.json"), {samples[0]}).section.passed);
  EXPECT_THROW(eval::parse_gate(R"({"allow_nonfinite": 1})", "g.json"), InputError);
}

float run_unary(const std::string& op, float x, int opset = 17) {
  testing::OnnxBuilder b(opset);
  b.input("x", onnx::TensorProto::FLOAT, {1}).output("y", onnx::TensorProto::FLOAT, {1});
  b.node(op, {"x"}, {"y"}, "n");
  const eval::Graph g = b.graph();  // the session keeps a reference
  eval::Session s(g);
  return s.run({{"x", testing::floats({1}, {x})}}).at("y").data<float>()[0];
}

TEST(NonFinite, ActivationsKeepNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const char* op : {"Relu", "HardSigmoid", "HardSwish", "Sigmoid", "LeakyRelu", "Tanh", "Elu"})
    EXPECT_TRUE(std::isnan(run_unary(op, nan))) << op;
  // The values ONNX defines are unchanged.
  EXPECT_EQ(run_unary("Relu", -2.0f), 0.0f);
  EXPECT_FALSE(std::signbit(run_unary("Relu", -0.0f)));
  EXPECT_EQ(run_unary("Relu", 3.0f), 3.0f);
  EXPECT_EQ(run_unary("HardSigmoid", 10.0f), 1.0f);
  EXPECT_EQ(run_unary("HardSigmoid", -10.0f), 0.0f);
  EXPECT_EQ(run_unary("HardSwish", 4.0f), 4.0f);
}

// The single-model `qeval run` of the issue: a variant export whose output is +Inf at 26 of 48
// values used to score 62.6 dB with cosine 1 and pass `output_sqnr_db >= 40, output_max_abs <= 100`.
TEST(NonFinite, ARunWhoseVariantOutputGoesInfFailsItsGateAndSaysSo) {
  testing::ScratchDir dir("nonfinite-run");
  auto [ref, test] = diverged_pair();
  // y = x / w: w = 1 in the reference, 0 where the variant is to be +Inf (x > 0 there).
  auto model = [&](const std::string& file, bool zeros) {
    std::vector<float> w(48, 1.0f);
    if (zeros)
      for (std::size_t i = 0; i < 48; ++i) w[i] = std::isinf(test[i]) ? 0.0f : 1.0f + 1e-6f * float(i % 3);
    testing::OnnxBuilder b;
    b.input("x", onnx::TensorProto::FLOAT, {1, 48}).output("y", onnx::TensorProto::FLOAT, {1, 48});
    b.initializer("w", w, {1, 48});
    b.node("Div", {"x", "w"}, {"y"}, "div");
    const auto bytes = b.bytes();
    testing::write_text(dir, file, std::string(bytes.begin(), bytes.end()));
    return dir / file;
  };
  const fs::path a = model("ref.onnx", false), v = model("variant.onnx", true);
  fs::create_directories(dir / "inputs" / "s0");
  datasets::write_npy(dir / "inputs" / "s0" / "x.npy", testing::floats({1, 48}, ref));
  const auto config =
      testing::write_text(dir, "c.json",
                          R"({"pipeline": ")" + a.string() + R"(", "inputs": ")" + (dir / "inputs").string() + R"(",
    "variants": [{"name": "fp32"}, {"name": "broken", "onnx": ")" +
                              v.string() + R"("}]})");
  const auto gate = testing::write_text(dir, "g.json", R"({"checks": [
      {"metric": "output_sqnr_db", "stat": "mean", "min": 40}, {"metric": "output_max_abs", "stat": "max", "max": 100}]})");
  const auto r = testing::run_qeval("run --config " + config.string() + " --gate " + gate.string() + " --out " +
                                    (dir / "out").string());
  EXPECT_EQ(r.code, 1) << r.out;
  const auto j = testing::read_json(dir / "out/report.json");
  const auto& m = j["samples"][0]["results"][1]["metrics"];
  EXPECT_EQ(m["output_nonfinite"], 26) << m.dump();
  EXPECT_EQ(m["output_sqnr_db"], "-inf") << m.dump();
  EXPECT_EQ(m["output_max_abs"], "inf") << m.dump();
  EXPECT_TRUE(m["output_cosine"].is_null()) << m.dump();
  EXPECT_FALSE(j["gate"]["passed"].get<bool>());
}

}  // namespace
}  // namespace qeval
