// Mask IoU, DAVIS boundary F measure and mask-logit comparison (exact integer counts).
#include "metrics/segmentation.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace qeval::metrics {

namespace {

// The mask's elements as bytes (bool is stored as one byte 0/1 as well).
const std::uint8_t* mask_bytes(const Tensor& mask, const char* what) {
  if (mask.rank() != 2 || (mask.dtype() != DType::kUInt8 && mask.dtype() != DType::kBool))
    throw std::invalid_argument(std::string(what) + ": masks must be uint8 or bool [H, W], got " +
                                std::string(dtype_name(mask.dtype())) + " " + shape_to_string(mask.shape()));
  return reinterpret_cast<const std::uint8_t*>(mask.raw());
}

void check_same_shape(const Tensor& ref, const Tensor& test, const char* what) {
  if (ref.shape() != test.shape())
    throw std::invalid_argument(std::string(what) + ": mask shapes differ: reference " + shape_to_string(ref.shape()) +
                                " vs test " + shape_to_string(test.shape()));
}

const float* logits_data(const Tensor& logits, const char* what) {
  if (logits.rank() != 2 || logits.dtype() != DType::kFloat32)
    throw std::invalid_argument(std::string(what) + ": logits must be float32 [H, W], got " +
                                std::string(dtype_name(logits.dtype())) + " " + shape_to_string(logits.shape()));
  return logits.data<float>();
}

// Per row, prefix counts of a 0/1 map: row y, columns [a, b] hold prefix[y][b + 1] - prefix[y][a].
std::vector<std::int32_t> row_prefix_counts(const std::uint8_t* map, std::int64_t h, std::int64_t w) {
  std::vector<std::int32_t> prefix(std::size_t(h) * std::size_t(w + 1), 0);
  for (std::int64_t y = 0; y < h; ++y) {
    std::int32_t* p = prefix.data() + y * (w + 1);
    for (std::int64_t x = 0; x < w; ++x) p[x + 1] = p[x] + (map[y * w + x] != 0);
  }
  return prefix;
}

// Boundary pixels of `a` that have a boundary pixel of `b` within the disk of radius r.
std::int64_t matched_count(const std::uint8_t* a, const std::uint8_t* b, std::int64_t h, std::int64_t w, int r) {
  auto prefix = row_prefix_counts(b, h, w);
  // half[|dy|] = the largest dx with dx^2 + dy^2 <= r^2 (the disk's row half-widths, exact).
  std::vector<std::int64_t> half(std::size_t(r) + 1);
  for (std::int64_t dy = 0; dy <= r; ++dy) {
    std::int64_t dx = 0;
    while ((dx + 1) * (dx + 1) + dy * dy <= std::int64_t(r) * r) ++dx;
    half[std::size_t(dy)] = dx;
  }
  std::int64_t matched = 0;
  for (std::int64_t y = 0; y < h; ++y)
    for (std::int64_t x = 0; x < w; ++x) {
      if (!a[y * w + x]) continue;
      for (std::int64_t dy = -r; dy <= r; ++dy) {
        std::int64_t yy = y + dy;
        if (yy < 0 || yy >= h) continue;
        std::int64_t hw = half[std::size_t(std::abs(dy))];
        std::int64_t x0 = std::max<std::int64_t>(0, x - hw), x1 = std::min(w - 1, x + hw);
        const std::int32_t* p = prefix.data() + yy * (w + 1);
        if (p[x1 + 1] - p[x0] > 0) {
          ++matched;
          break;
        }
      }
    }
  return matched;
}

std::int64_t count_nonzero(const std::uint8_t* m, std::int64_t n) {
  std::int64_t c = 0;
  for (std::int64_t i = 0; i < n; ++i) c += m[i] != 0;
  return c;
}

}  // namespace

MaskIou mask_iou(const Tensor& ref, const Tensor& test) {
  const std::uint8_t* r = mask_bytes(ref, "mask_iou");
  const std::uint8_t* t = mask_bytes(test, "mask_iou");
  check_same_shape(ref, test, "mask_iou");
  MaskIou m;
  for (std::int64_t i = 0, n = ref.numel(); i < n; ++i) {
    bool a = r[i] != 0, b = t[i] != 0;
    m.ref_area += a;
    m.test_area += b;
    m.intersection += a && b;
    m.union_count += a || b;
  }
  m.iou = m.union_count == 0 ? 1.0 : double(m.intersection) / double(m.union_count);
  return m;
}

Tensor mask_boundary(const Tensor& mask) {
  const std::uint8_t* m = mask_bytes(mask, "mask_boundary");
  const std::int64_t h = mask.dim(0), w = mask.dim(1);
  Tensor out(DType::kUInt8, {h, w});
  std::uint8_t* b = out.data<std::uint8_t>();
  auto at = [&](std::int64_t y, std::int64_t x) -> bool { return m[y * w + x] != 0; };
  for (std::int64_t y = 0; y < h; ++y)
    for (std::int64_t x = 0; x < w; ++x) {
      bool v = at(y, x), edge;
      if (y + 1 < h && x + 1 < w) edge = v != at(y, x + 1) || v != at(y + 1, x) || v != at(y + 1, x + 1);
      else if (y + 1 < h)  // last column: the lower neighbour only
        edge = v != at(y + 1, x);
      else if (x + 1 < w)  // last row: the right neighbour only
        edge = v != at(y, x + 1);
      else edge = false;
      b[y * w + x] = edge ? 1 : 0;
    }
  return out;
}

int davis_boundary_tolerance_px(std::int64_t height, std::int64_t width) {
  return static_cast<int>(
      std::ceil(0.008 * std::sqrt(double(height) * double(height) + double(width) * double(width))));
}

BoundaryF boundary_f_score(const Tensor& ref, const Tensor& test, int tolerance_px) {
  mask_bytes(ref, "boundary_f_score");
  mask_bytes(test, "boundary_f_score");
  check_same_shape(ref, test, "boundary_f_score");
  if (tolerance_px < 0)
    throw std::invalid_argument("boundary_f_score: tolerance_px must be >= 0, got " + std::to_string(tolerance_px));
  const std::int64_t h = ref.dim(0), w = ref.dim(1);
  Tensor rb = mask_boundary(ref), tb = mask_boundary(test);
  const std::uint8_t* r = rb.data<std::uint8_t>();
  const std::uint8_t* t = tb.data<std::uint8_t>();
  BoundaryF f;
  f.tolerance_px = tolerance_px;
  f.ref_boundary = count_nonzero(r, h * w);
  f.test_boundary = count_nonzero(t, h * w);
  f.ref_matched = matched_count(r, t, h, w, tolerance_px);
  f.test_matched = matched_count(t, r, h, w, tolerance_px);
  if (f.test_boundary == 0 && f.ref_boundary > 0) {
    f.precision = 1.0;
    f.recall = 0.0;
  } else if (f.test_boundary > 0 && f.ref_boundary == 0) {
    f.precision = 0.0;
    f.recall = 1.0;
  } else if (f.test_boundary == 0 && f.ref_boundary == 0) {
    f.precision = f.recall = 1.0;
  } else {
    f.precision = double(f.test_matched) / double(f.test_boundary);
    f.recall = double(f.ref_matched) / double(f.ref_boundary);
  }
  f.f = f.precision + f.recall == 0.0 ? 0.0 : 2.0 * f.precision * f.recall / (f.precision + f.recall);
  return f;
}

BoundaryF boundary_f_score(const Tensor& ref, const Tensor& test) {
  mask_bytes(ref, "boundary_f_score");
  return boundary_f_score(ref, test, davis_boundary_tolerance_px(ref.dim(0), ref.dim(1)));
}

Tensor threshold_mask(const Tensor& logits, float threshold) {
  const float* l = logits_data(logits, "threshold_mask");
  Tensor out(DType::kUInt8, logits.shape());
  std::uint8_t* m = out.data<std::uint8_t>();
  for (std::int64_t i = 0, n = logits.numel(); i < n; ++i) m[i] = l[i] > threshold ? 1 : 0;
  return out;
}

MaskLogitComparison compare_mask_logits(const Tensor& ref_logits, const Tensor& test_logits, float threshold,
                                        std::optional<int> tolerance_px) {
  logits_data(ref_logits, "compare_mask_logits");
  logits_data(test_logits, "compare_mask_logits");
  check_same_shape(ref_logits, test_logits, "compare_mask_logits");
  Tensor ref = threshold_mask(ref_logits, threshold), test = threshold_mask(test_logits, threshold);
  MaskLogitComparison c;
  c.iou = mask_iou(ref, test);
  c.boundary = tolerance_px ? boundary_f_score(ref, test, *tolerance_px) : boundary_f_score(ref, test);
  c.logits = tensor_error(ref_logits, test_logits);
  c.flipped_pixels = c.iou.union_count - c.iou.intersection;
  c.flipped_fraction = ref.numel() == 0 ? 0.0 : double(c.flipped_pixels) / double(ref.numel());
  return c;
}

}  // namespace qeval::metrics
