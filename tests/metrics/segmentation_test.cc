// Segmentation metrics against the DAVIS evaluation code and numpy (tools/make_segmentation_goldens.py).
#include <gtest/gtest.h>

#include <limits>

#include "datasets/mask_io.h"
#include "datasets/npy.h"
#include "metrics/segmentation.h"
#include "test_util.h"

namespace qeval::metrics {
namespace {

std::filesystem::path golden_dir() { return testing::data_dir() / "metrics" / "segmentation"; }

Tensor mask_of(const std::vector<std::vector<int>>& rows) {
  Tensor m(DType::kUInt8, {std::int64_t(rows.size()), std::int64_t(rows[0].size())});
  std::uint8_t* p = m.data<std::uint8_t>();
  for (const auto& r : rows)
    for (int v : r) *p++ = static_cast<std::uint8_t>(v);
  return m;
}

void expect_boundary(const nlohmann::json& g, const BoundaryF& f, const std::string& what) {
  EXPECT_EQ(f.tolerance_px, g["tolerance_px"].get<int>()) << what;
  EXPECT_EQ(f.ref_boundary, g["ref_boundary"].get<std::int64_t>()) << what;
  EXPECT_EQ(f.test_boundary, g["test_boundary"].get<std::int64_t>()) << what;
  EXPECT_EQ(f.ref_matched, g["ref_matched"].get<std::int64_t>()) << what;
  EXPECT_EQ(f.test_matched, g["test_matched"].get<std::int64_t>()) << what;
  // Same integer counts and the same double operations: bit-identical to the reference.
  EXPECT_EQ(f.precision, g["precision"].get<double>()) << what;
  EXPECT_EQ(f.recall, g["recall"].get<double>()) << what;
  EXPECT_EQ(f.f, g["f"].get<double>()) << what;
}

TEST(SegmentationMetrics, MatchDavisReferenceExactly) {
  auto golden = testing::read_json(golden_dir() / "golden.json");
  ASSERT_GE(golden["cases"].size(), 15u);
  for (const auto& c : golden["cases"]) {
    const std::string name = c["name"];
    Tensor ref = datasets::load_mask(golden_dir() / c["ref"].get<std::string>());
    Tensor test = datasets::load_mask(golden_dir() / c["test"].get<std::string>());

    MaskIou iou = mask_iou(ref, test);
    EXPECT_EQ(iou.intersection, c["iou"]["intersection"].get<std::int64_t>()) << name;
    EXPECT_EQ(iou.union_count, c["iou"]["union"].get<std::int64_t>()) << name;
    EXPECT_EQ(iou.ref_area, c["iou"]["ref_area"].get<std::int64_t>()) << name;
    EXPECT_EQ(iou.test_area, c["iou"]["test_area"].get<std::int64_t>()) << name;
    EXPECT_EQ(iou.iou, c["iou"]["iou"].get<double>()) << name;

    Tensor rb = mask_boundary(ref), tb = mask_boundary(test);
    Tensor rb_golden = datasets::load_mask(golden_dir() / c["ref_boundary_map"].get<std::string>());
    Tensor tb_golden = datasets::load_mask(golden_dir() / c["test_boundary_map"].get<std::string>());
    EXPECT_TRUE(std::equal(rb.span<std::uint8_t>().begin(), rb.span<std::uint8_t>().end(),
                           rb_golden.span<std::uint8_t>().begin()))
        << name << " reference boundary map";
    EXPECT_TRUE(std::equal(tb.span<std::uint8_t>().begin(), tb.span<std::uint8_t>().end(),
                           tb_golden.span<std::uint8_t>().begin()))
        << name << " test boundary map";

    for (const auto& b : c["boundary"]) {
      const std::string what = name + " tolerance " + std::to_string(b["tolerance_px"].get<int>());
      if (b["davis_default"].get<bool>()) {
        EXPECT_EQ(davis_boundary_tolerance_px(ref.dim(0), ref.dim(1)), b["tolerance_px"].get<int>()) << name;
        expect_boundary(b, boundary_f_score(ref, test), what + " (DAVIS default)");
      } else {
        expect_boundary(b, boundary_f_score(ref, test, b["tolerance_px"].get<int>()), what);
      }
    }
  }
}

TEST(SegmentationMetrics, LogitComparisonMatchesNumpy) {
  auto g = testing::read_json(golden_dir() / "golden.json")["logits"];
  Tensor ref = datasets::read_npy(golden_dir() / g["ref"].get<std::string>());
  Tensor test = datasets::read_npy(golden_dir() / g["test"].get<std::string>());
  MaskLogitComparison c = compare_mask_logits(ref, test, g["threshold"].get<float>());
  EXPECT_EQ(c.iou.intersection, g["iou"]["intersection"].get<std::int64_t>());
  EXPECT_EQ(c.iou.union_count, g["iou"]["union"].get<std::int64_t>());
  EXPECT_EQ(c.iou.iou, g["iou"]["iou"].get<double>());
  expect_boundary(g["boundary"], c.boundary, "logits");
  EXPECT_EQ(c.flipped_pixels, g["flipped_pixels"].get<std::int64_t>());
  EXPECT_EQ(c.flipped_fraction, g["flipped_fraction"].get<double>());
  EXPECT_NEAR(c.logits.mse, g["mse"].get<double>(), 1e-12 * g["mse"].get<double>());
  EXPECT_EQ(c.logits.max_abs, g["max_abs"].get<double>());
  ASSERT_TRUE(c.logits.sqnr_db.has_value());
  EXPECT_NEAR(*c.logits.sqnr_db, g["sqnr_db"].get<double>(), 1e-10);
  EXPECT_EQ(c.logits.count, 64 * 64);
}

TEST(SegmentationMetrics, EmptyMasksAgreeAndBorderIsNoBoundary) {
  Tensor empty(DType::kUInt8, {8, 8});
  MaskIou iou = mask_iou(empty, empty);
  EXPECT_EQ(iou.union_count, 0);
  EXPECT_EQ(iou.iou, 1.0);
  BoundaryF f = boundary_f_score(empty, empty);
  EXPECT_EQ(f.f, 1.0);

  // A full mask has no boundary at all (the image border is not one): a full test mask against a
  // half one has precision 1 (nothing to be wrong about) and recall 0.
  Tensor full = mask_of(std::vector<std::vector<int>>(4, std::vector<int>(4, 1)));
  Tensor half = mask_of({{1, 1, 0, 0}, {1, 1, 0, 0}, {1, 1, 0, 0}, {1, 1, 0, 0}});
  EXPECT_EQ(mask_boundary(full).span<std::uint8_t>()[0], 0);
  BoundaryF fh = boundary_f_score(half, full, 1);
  EXPECT_EQ(fh.test_boundary, 0);
  EXPECT_EQ(fh.ref_boundary, 4);  // column 1: differs from its right neighbour
  EXPECT_EQ(fh.precision, 1.0);
  EXPECT_EQ(fh.recall, 0.0);
  EXPECT_EQ(fh.f, 0.0);
  // Bool masks read like uint8 ones.
  Tensor hb(DType::kBool, {4, 4});
  for (int i = 0; i < 16; ++i) hb.data<bool>()[i] = half.data<std::uint8_t>()[i] != 0;
  EXPECT_EQ(mask_iou(hb, half).iou, 1.0);
  EXPECT_EQ(mask_iou(half, full).iou, 0.5);
}

TEST(SegmentationMetrics, ToleranceCountsDiskOffsets) {
  // Reference boundary: a vertical line at x = 2 (column 2 differs from column 3). Test masks
  // shifted right by k move it to x = 2 + k: matched iff k <= tolerance.
  auto stripe = [](int edge) {
    std::vector<std::vector<int>> rows(12, std::vector<int>(12, 0));
    for (auto& r : rows)
      for (int x = 0; x <= edge; ++x) r[x] = 1;
    return mask_of(rows);
  };
  Tensor ref = stripe(2);
  for (int k = 0; k <= 3; ++k)
    for (int tol = 0; tol <= 3; ++tol) {
      BoundaryF f = boundary_f_score(ref, stripe(2 + k), tol);
      EXPECT_EQ(f.f, k <= tol ? 1.0 : 0.0) << "shift " << k << " tolerance " << tol;
    }
  EXPECT_EQ(davis_boundary_tolerance_px(64, 64), 1);
  EXPECT_EQ(davis_boundary_tolerance_px(480, 854), 8);
}

TEST(SegmentationMetrics, ThresholdIsStrictAndNanIsBackground) {
  Tensor logits(DType::kFloat32, {1, 4});
  float* l = logits.data<float>();
  l[0] = 0.0f;
  l[1] = 1e-30f;
  l[2] = -1.0f;
  l[3] = std::numeric_limits<float>::quiet_NaN();
  Tensor m = threshold_mask(logits, 0.0f);
  EXPECT_EQ(m.data<std::uint8_t>()[0], 0);
  EXPECT_EQ(m.data<std::uint8_t>()[1], 1);
  EXPECT_EQ(m.data<std::uint8_t>()[2], 0);
  EXPECT_EQ(m.data<std::uint8_t>()[3], 0);
}

TEST(SegmentationMetrics, RejectsMismatchedInputs) {
  Tensor a(DType::kUInt8, {4, 4}), b(DType::kUInt8, {4, 5}), f(DType::kFloat32, {4, 4});
  Tensor c(DType::kUInt8, {1, 4, 4});
  EXPECT_THROW(mask_iou(a, b), std::invalid_argument);
  EXPECT_THROW(mask_iou(a, f), std::invalid_argument);
  EXPECT_THROW(boundary_f_score(a, c), std::invalid_argument);
  EXPECT_THROW(boundary_f_score(a, a, -1), std::invalid_argument);
  EXPECT_THROW(threshold_mask(a, 0.0f), std::invalid_argument);
}

}  // namespace
}  // namespace qeval::metrics
