// Tensor error metrics against numpy float64 values (tools/make_image_goldens.py).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "metrics/tensor_error.h"
#include "test_util.h"

namespace qeval::metrics {
namespace {

void expect_rel(const nlohmann::json& expected, std::optional<double> actual, double rel, const std::string& what) {
  if (expected.is_null()) {
    EXPECT_FALSE(actual.has_value()) << what;
    return;
  }
  ASSERT_TRUE(actual.has_value()) << what;
  double e = expected.get<double>();
  EXPECT_NEAR(*actual, e, rel * std::max(1.0, std::abs(e))) << what;
}

TEST(TensorError, MatchesNumpyFloat64) {
  auto golden = testing::read_json(testing::data_dir() / "metrics" / "tensor_error_golden.json");
  ASSERT_GE(golden["cases"].size(), 5u);
  for (const auto& c : golden["cases"]) {
    const std::string name = c["name"];
    std::vector<float> ref, test;
    for (const auto& v : c["ref"]) ref.push_back(v.get<float>());
    for (const auto& v : c["test"]) test.push_back(v.get<float>());
    ASSERT_EQ(ref.size(), test.size()) << name;
    TensorError e = tensor_error(ref.data(), test.data(), std::int64_t(ref.size()));
    EXPECT_EQ(e.count, std::int64_t(ref.size()));
    expect_rel(c["mse"], e.mse, 1e-12, name + " mse");
    expect_rel(c["sqnr_db"], e.sqnr_db, 1e-10, name + " sqnr");
    expect_rel(c["cosine"], e.cosine, 1e-12, name + " cosine");
    expect_rel(c["max_abs"], e.max_abs, 0, name + " max_abs");
    expect_rel(c["rel_l2"], e.rel_l2, 1e-12, name + " rel_l2");
    EXPECT_EQ(e.identical(), c["sqnr_db"].is_null()) << name;
  }
}

TEST(TensorError, NonFiniteValuesAreLocatedNotAveraged) {
  std::vector<float> ref(100, 1.0f), test(100, 1.0f);
  test[37] = std::numeric_limits<float>::quiet_NaN();
  test[80] = std::numeric_limits<float>::infinity();
  ref[90] = -std::numeric_limits<float>::infinity();
  test[5] = 1.5f;
  TensorError e = tensor_error(ref.data(), test.data(), 100);
  EXPECT_EQ(e.first_nonfinite, 37);
  EXPECT_EQ(e.nonfinite_test, 2);
  EXPECT_EQ(e.nonfinite_ref, 1);
  EXPECT_EQ(e.count, 97);
  // The test is NaN/Inf where the reference is finite (37, 80): diverged, so the error is
  // unbounded rather than the 0.25 / 97 of the values that stayed finite.
  EXPECT_EQ(e.diverged, 2);
  EXPECT_EQ(e.max_abs, std::numeric_limits<double>::infinity());
  EXPECT_EQ(e.mse, std::numeric_limits<double>::infinity());
  EXPECT_EQ(e.sqnr_db, -std::numeric_limits<double>::infinity());
  EXPECT_FALSE(e.identical());
  // Non-finite values of the reference alone (an attention mask's -inf) are located and left out.
  test[37] = test[80] = 1.0f;
  e = tensor_error(ref.data(), test.data(), 100);
  EXPECT_EQ(e.first_nonfinite, 90);
  EXPECT_EQ(e.diverged, 0);
  EXPECT_EQ(e.count, 99);
  EXPECT_DOUBLE_EQ(e.max_abs, 0.5);
  EXPECT_DOUBLE_EQ(e.mse, 0.25 / 99);
}

TEST(TensorError, ZeroReferenceHasNoRelativeMetrics) {
  std::vector<float> zeros(16, 0.0f), ones(16, 1.0f);
  TensorError e = tensor_error(zeros.data(), ones.data(), 16);
  EXPECT_FALSE(e.sqnr_db.has_value());
  EXPECT_FALSE(e.rel_l2.has_value());
  EXPECT_FALSE(e.cosine.has_value());
  EXPECT_DOUBLE_EQ(e.mse, 1.0);
  TensorError z = tensor_error(zeros.data(), zeros.data(), 16);
  EXPECT_TRUE(z.identical());
  EXPECT_EQ(z.cosine, 1.0);
}

TEST(TensorError, ShapeMismatchIsAnError) {
  Tensor a(DType::kFloat32, {2, 3}), b(DType::kFloat32, {3, 2});
  EXPECT_THROW(tensor_error(a, b), std::invalid_argument);
}

}  // namespace
}  // namespace qeval::metrics
