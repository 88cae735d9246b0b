#!/usr/bin/python3
"""Generates the golden segmentation-metric values (mask IoU, DAVIS boundary F, mask-logit comparison) in tests/data/metrics/segmentation/ for metrics/segmentation.cc."""

# Usage (from the repository root):  /usr/bin/python3 tools/make_segmentation_goldens.py
#
# Needs Debian's Python with numpy, scikit-image (0.19.x) and OpenCV (cv2), as the DAVIS
# evaluation code does. Everything is seeded: re-running writes identical files.
#
# Outputs (paths in the JSON are relative to tests/data/metrics/segmentation/):
#   masks/<case>_ref.png, masks/<case>_test.png   binary masks (8-bit gray, 0 or 255)
#   masks/<case>_ref_boundary.png, ..._test_boundary.png   DAVIS boundary maps (0 or 255)
#   logits_ref.npy, logits_test.npy               float32 [64, 64] mask logits
#   golden.json                                   the values, per case and tolerance
#
# The boundary F measure is the DAVIS 2017 evaluation code's f_measure / _seg2bmap
# (davis2017-evaluation, davis2017/metrics.py), copied below with its dilation (cv2.dilate with
# skimage.morphology.disk), no void pixels. Mask IoU is |A & B| / |A | B|, 1 for two empty masks
# (DAVIS's db_eval_iou convention).

import json
import math
import os
import sys

import cv2
import numpy as np
from skimage.morphology import binary_dilation, binary_erosion, disk

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenes  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "tests", "data", "metrics", "segmentation")


# ---- The DAVIS reference (davis2017-evaluation, metrics.py), unchanged but for np.bool -> bool ----

def seg2bmap(seg, width=None, height=None):
    seg = seg.astype(bool)
    seg[seg > 0] = 1
    assert np.atleast_3d(seg).shape[2] == 1
    width = seg.shape[1] if width is None else width
    height = seg.shape[0] if height is None else height
    h, w = seg.shape[:2]
    assert width == w and height == h
    e = np.zeros_like(seg)
    s = np.zeros_like(seg)
    se = np.zeros_like(seg)
    e[:, :-1] = seg[:, 1:]
    s[:-1, :] = seg[1:, :]
    se[:-1, :-1] = seg[1:, 1:]
    b = seg ^ e | seg ^ s | seg ^ se
    b[-1, :] = seg[-1, :] ^ e[-1, :]
    b[:, -1] = seg[:, -1] ^ s[:, -1]
    b[-1, -1] = 0
    return b


def f_measure(foreground_mask, gt_mask, bound_th=0.008):
    """DAVIS f_measure (no void pixels); returns the intermediate counts too."""
    bound_pix = bound_th if bound_th >= 1 else np.ceil(bound_th * np.linalg.norm(foreground_mask.shape))
    fg_boundary = seg2bmap(foreground_mask)
    gt_boundary = seg2bmap(gt_mask)
    fg_dil = cv2.dilate(fg_boundary.astype(np.uint8), disk(bound_pix).astype(np.uint8))
    gt_dil = cv2.dilate(gt_boundary.astype(np.uint8), disk(bound_pix).astype(np.uint8))
    gt_match = gt_boundary * fg_dil
    fg_match = fg_boundary * gt_dil
    n_fg = np.sum(fg_boundary)
    n_gt = np.sum(gt_boundary)
    if n_fg == 0 and n_gt > 0:
        precision = 1
        recall = 0
    elif n_fg > 0 and n_gt == 0:
        precision = 0
        recall = 1
    elif n_fg == 0 and n_gt == 0:
        precision = 1
        recall = 1
    else:
        precision = np.sum(fg_match) / float(n_fg)
        recall = np.sum(gt_match) / float(n_gt)
    if precision + recall == 0:
        f = 0
    else:
        f = 2 * precision * recall / (precision + recall)
    return {"tolerance_px": int(bound_pix), "ref_boundary": int(n_gt), "test_boundary": int(n_fg),
            "ref_matched": int(np.sum(gt_match)), "test_matched": int(np.sum(fg_match)),
            "precision": float(precision), "recall": float(recall), "f": float(f)}, fg_boundary, gt_boundary


def mask_iou(ref, test):
    inter = int(np.logical_and(ref, test).sum())
    union = int(np.logical_or(ref, test).sum())
    return {"intersection": inter, "union": union, "ref_area": int(ref.sum()), "test_area": int(test.sum()),
            "iou": 1.0 if union == 0 else inter / union}


# ---- Cases ----

def shifted(m, dx, dy):
    out = np.zeros_like(m)
    h, w = m.shape
    ys, xs = np.nonzero(m)
    ys, xs = ys + dy, xs + dx
    keep = (ys >= 0) & (ys < h) & (xs >= 0) & (xs < w)
    out[ys[keep], xs[keep]] = True
    return out


def blob(h, w, rng, count):
    """A union of random ellipses."""
    yy, xx = np.mgrid[0:h, 0:w]
    m = np.zeros((h, w), bool)
    for _ in range(count):
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        ry, rx = rng.uniform(h / 12, h / 4), rng.uniform(w / 12, w / 4)
        m |= ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1
    return m


def cases():
    rng = np.random.default_rng(20261123)
    out = []
    s = scenes.generate_scene(0x5EED5A, 3)
    masks = [m > 0 for m in s["masks"]]
    a = masks[0]
    out.append(("scene_identical", a, a.copy()))
    out.append(("scene_shift_1_0", a, shifted(a, 1, 0)))
    out.append(("scene_shift_2_1", a, shifted(a, 2, 1)))
    out.append(("scene_shift_5_m3", a, shifted(a, 5, -3)))
    out.append(("scene_eroded", a, binary_erosion(a, disk(1))))
    out.append(("scene_dilated", a, binary_dilation(a, disk(2))))
    other = next((m for m in masks[1:] if m.any()), shifted(a, 20, 20))
    out.append(("scene_other_object", a, other))
    out.append(("scene_vs_empty", a, np.zeros_like(a)))
    out.append(("empty_vs_scene", np.zeros_like(a), a))
    out.append(("empty_vs_empty", np.zeros((64, 64), bool), np.zeros((64, 64), bool)))
    out.append(("full_vs_full", np.ones((40, 50), bool), np.ones((40, 50), bool)))
    # Masks touching the image border (the border is not a boundary), one full, one half.
    half = np.zeros((48, 64), bool)
    half[:, :30] = True
    out.append(("full_vs_left_half", np.ones((48, 64), bool), half))
    corner = np.zeros((48, 64), bool)
    corner[40:, 50:] = True
    out.append(("left_half_vs_corner", half, corner))
    # Random noise masks (many boundary pixels) and random blobs at a larger size (tolerance 3).
    out.append(("noise_33x47", rng.random((33, 47)) < 0.4, rng.random((33, 47)) < 0.4))
    b1 = blob(180, 240, rng, 4)
    b2 = binary_dilation(shifted(b1, 2, -1), disk(1)) ^ (rng.random((180, 240)) < 0.01)
    out.append(("blobs_180x240", b1, b2))
    out.append(("blobs_180x240_unrelated", b1, blob(180, 240, rng, 3)))
    # One row / one column images.
    out.append(("row_1x20", rng.random((1, 20)) < 0.5, rng.random((1, 20)) < 0.5))
    out.append(("column_20x1", rng.random((20, 1)) < 0.5, rng.random((20, 1)) < 0.5))
    return out


def write_mask(rel, m):
    path = os.path.join(OUT, rel)
    ok = cv2.imwrite(path, (m.astype(np.uint8) * 255))
    assert ok, path
    back = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    assert back.shape == m.shape and np.array_equal(back > 0, m), path


def logit_case():
    """A smooth 64x64 logit field and a perturbed copy (as a quantized variant would give)."""
    rng = np.random.default_rng(7)
    yy, xx = np.mgrid[0:64, 0:64].astype(np.float64)
    ref = (6.0 - np.hypot(yy - 30.5, xx - 27.25) * 0.45 + 1.5 * np.sin(xx / 5.0)).astype(np.float32)
    test = (ref + rng.normal(0, 0.6, ref.shape)).astype(np.float32)
    test[3, 4] = ref[3, 4]
    np.save(os.path.join(OUT, "logits_ref.npy"), ref)
    np.save(os.path.join(OUT, "logits_test.npy"), test)
    r, t = ref > 0, test > 0
    f, _, _ = f_measure(t, r)
    d = ref.astype(np.float64) - test.astype(np.float64)
    rr = ref.astype(np.float64)
    return {"ref": "logits_ref.npy", "test": "logits_test.npy", "threshold": 0.0,
            "iou": mask_iou(r, t), "boundary": f,
            "flipped_pixels": int((r != t).sum()), "flipped_fraction": float((r != t).sum() / r.size),
            "mse": float(np.mean(d * d)), "max_abs": float(np.max(np.abs(d))),
            "sqnr_db": float(10 * math.log10(np.sum(rr * rr) / np.sum(d * d)))}


def main():
    os.makedirs(os.path.join(OUT, "masks"), exist_ok=True)
    golden = {"generator": "tools/make_segmentation_goldens.py", "cases": []}
    for name, ref, test in cases():
        ref, test = ref.astype(bool), test.astype(bool)
        write_mask("masks/%s_ref.png" % name, ref)
        write_mask("masks/%s_test.png" % name, test)
        case = {"name": name, "ref": "masks/%s_ref.png" % name, "test": "masks/%s_test.png" % name,
                "ref_boundary_map": "masks/%s_ref_boundary.png" % name,
                "test_boundary_map": "masks/%s_test_boundary.png" % name,
                "iou": mask_iou(ref, test), "boundary": []}
        for th in (0.008, 1, 2, 5):
            f, fg_b, gt_b = f_measure(test, ref, th)
            f["davis_default"] = th == 0.008
            case["boundary"].append(f)
        write_mask(case["ref_boundary_map"], gt_b)
        write_mask(case["test_boundary_map"], fg_b)
        golden["cases"].append(case)
    golden["logits"] = logit_case()
    with open(os.path.join(OUT, "golden.json"), "w") as fh:
        json.dump(golden, fh, indent=1)
        fh.write("\n")
    print("wrote %d cases to %s" % (len(golden["cases"]), OUT))


if __name__ == "__main__":
    main()
