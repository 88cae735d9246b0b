// Segmentation metrics between a reference and a test mask: mask IoU, the DAVIS boundary F measure,
// and the per-prompt comparison of two variants' mask logits (docs/segment.md, "Metrics").
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/tensor.h"
#include "metrics/tensor_error.h"

namespace qeval::metrics {

// Masks are [H, W] tensors of uint8 or bool; any non-zero element is foreground. Every function
// here throws std::invalid_argument on another type or rank, or when the two shapes differ.

struct MaskIou {
  std::int64_t intersection = 0;
  std::int64_t union_count = 0;
  std::int64_t ref_area = 0, test_area = 0;  // foreground pixels of each mask
  // intersection / union. Two empty masks agree perfectly: 1 (as DAVIS's J measure), so that a
  // variant that correctly predicts "nothing here" is not scored 0.
  double iou = 1.0;
};
MaskIou mask_iou(const Tensor& ref, const Tensor& test);

// DAVIS's boundary map (seg2bmap of the DAVIS 2016/2017 evaluation code): uint8 [H, W], 1 where a
// pixel differs from its right, lower or lower-right neighbour. In the last row only the right
// neighbour counts, in the last column only the lower one, and the bottom-right pixel is never a
// boundary: the image border itself is not a boundary.
Tensor mask_boundary(const Tensor& mask);

// DAVIS's default tolerance: ceil(0.008 * sqrt(H^2 + W^2)) pixels (1 px at 64x64, 8 px at 854x480).
int davis_boundary_tolerance_px(std::int64_t height, std::int64_t width);

struct BoundaryF {
  int tolerance_px = 0;
  std::int64_t ref_boundary = 0, test_boundary = 0;  // boundary pixels of each mask
  std::int64_t ref_matched = 0;                      // reference boundary pixels with a test boundary pixel in reach
  std::int64_t test_matched = 0;                     // test boundary pixels with a reference boundary pixel in reach
  double precision = 1.0, recall = 1.0, f = 1.0;
};
// The DAVIS boundary F measure (Perazzi et al. 2016, davis2017-evaluation f_boundary): a boundary
// pixel is matched when a boundary pixel of the other mask lies within the disk of radius
// `tolerance_px` around it (offsets dx^2 + dy^2 <= r^2, skimage.morphology.disk). precision =
// test_matched / test_boundary, recall = ref_matched / ref_boundary, F = 2PR / (P + R) (0 when
// P + R = 0). No test boundary: P = 1, R = 0 (or 1 when the reference has none either); no
// reference boundary but a test one: P = 0, R = 1. `tolerance_px` >= 0.
BoundaryF boundary_f_score(const Tensor& ref, const Tensor& test, int tolerance_px);
// With DAVIS's default tolerance for the masks' size.
BoundaryF boundary_f_score(const Tensor& ref, const Tensor& test);

// logits float32 [H, W] -> uint8 [H, W] mask, 1 where logit > threshold (SAM's rule; NaN is 0).
Tensor threshold_mask(const Tensor& logits, float threshold);

// What the evaluator reports for one prompt: the test variant's mask against the reference
// variant's (both thresholded from logits) and the error of the logits themselves.
struct MaskLogitComparison {
  MaskIou iou;
  BoundaryF boundary;
  TensorError logits;               // over every logit (tensor_error's definitions)
  std::int64_t flipped_pixels = 0;  // pixels whose thresholded value differs
  double flipped_fraction = 0.0;    // flipped_pixels / (H * W)
};
// ref_logits/test_logits float32 [H, W]; the default tolerance is DAVIS's for the size.
MaskLogitComparison compare_mask_logits(const Tensor& ref_logits, const Tensor& test_logits, float threshold,
                                        std::optional<int> tolerance_px = {});

}  // namespace qeval::metrics
