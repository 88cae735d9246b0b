#!/usr/bin/python3
"""Prompt-following check: does an image show each object its scene caption names (color, shape, position)?"""

# Used to score tiny-sd's generated images (tools/train_tiny_sd.py, tools/export_tiny_sd.py); the
# C++ test of the FP32 pipeline is to apply the same rules (docs/scenes.md, "Prompt-following
# check"). An object counts as present when:
#   1. pixels are labelled by their nearest palette entry (the 8 object colors and the 16
#      background tones, Euclidean RGB); a pixel is "color c" when its nearest entry is object
#      color c and lies within MAX_COLOR_DISTANCE of it;
#   2. the 8-connected components of color-c pixels with at least MIN_AREA pixels are candidates;
#      the candidate is the largest one whose centroid lies in the named cell of the 3x3 grid;
#   3. its shape is the best-matching template. The object's soft coverage is estimated per pixel
#      as the projection of the pixel's color onto the segment from the local background (median
#      of the pixels on a frame 2 pixels outside the component's bounding box) to color c, clipped
#      to [0, 1], and zeroed on pixels of other object colors. Templates are the generator's
#      coverage (share of the 16 samples inside) of each shape centred on the bounding box's
#      centre give or take half a pixel (offsets -4, 0, 4 sub-pixel units on each axis), for
#      radii 0.85, 0.92, 1, 1.07, 1.15 times half the box's larger side (rounded to sub-pixel
#      units). The score is the soft IoU sum(min) / sum(max) over the box grown by 2 pixels; the
#      best shape must be the named one with a score >= MIN_IOU.
# Size words are not checked. On the generator's own images every object passes (--selftest: 300
# scenes, 100%).
#
# Usage: /usr/bin/python3 tools/scene_check.py --selftest [N]
#        /usr/bin/python3 tools/scene_check.py --goldens     # tests/data/scenes/check/ (C++ port's test)

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenes  # noqa: E402

MAX_COLOR_DISTANCE = 90.0
MIN_AREA = 10
MIN_IOU = 0.5

PALETTE = np.array(scenes.OBJECT_RGB + [t for c in range(len(scenes.COLORS)) for t in scenes.background_tones(c)],
                   dtype=np.float64)


def color_labels(img):
    """[H, W] int: object color index 0..7 for object-colored pixels, -1 elsewhere."""
    d = np.linalg.norm(img.astype(np.float64)[:, :, None, :] - PALETTE[None, None], axis=-1)
    nearest = d.argmin(axis=-1)
    ok = (nearest < len(scenes.COLORS)) & (d.min(axis=-1) <= MAX_COLOR_DISTANCE)
    return np.where(ok, nearest, -1)


def components(mask):
    """8-connected components of a boolean mask: list of (ys, xs) index arrays (thin rings hold by corners)."""
    h, w = mask.shape
    seen = np.zeros_like(mask, dtype=bool)
    out = []
    for y0, x0 in zip(*np.nonzero(mask)):
        if seen[y0, x0]:
            continue
        stack, ys, xs = [(y0, x0)], [], []
        seen[y0, x0] = True
        while stack:
            y, x = stack.pop()
            ys.append(y)
            xs.append(x)
            for yy, xx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1),
                           (y - 1, x - 1), (y - 1, x + 1), (y + 1, x - 1), (y + 1, x + 1)):
                if 0 <= yy < h and 0 <= xx < w and mask[yy, xx] and not seen[yy, xx]:
                    seen[yy, xx] = True
                    stack.append((yy, xx))
        out.append((np.array(ys), np.array(xs)))
    return out


def coverage(shape, x0, y0, w, h, cx, cy, r):
    """[h, w] share of samples inside a shape (window at pixel x0, y0), by the generator's rules."""
    k = scenes.SUB // 2
    sx, sy = np.arange(w * k, dtype=np.int64), np.arange(h * k, dtype=np.int64)
    px = scenes.SUB * (x0 + sx // k) + 2 * (sx % k) + 1
    py = scenes.SUB * (y0 + sy // k) + 2 * (sy % k) + 1
    inside = scenes.inside(shape, px[None, :] - cx, py[:, None] - cy, r)
    return inside.reshape(h, k, w, k).mean(axis=(1, 3))


def object_alpha(img, comp_mask, color):
    """Soft coverage of the object: each pixel's position between the local background and the color."""
    ring = np.zeros_like(comp_mask)
    ys, xs = np.nonzero(comp_mask)
    y0, y1 = max(0, ys.min() - 2), min(comp_mask.shape[0], ys.max() + 3)
    x0, x1 = max(0, xs.min() - 2), min(comp_mask.shape[1], xs.max() + 3)
    ring[y0:y1, x0:x1] = True
    inner = np.zeros_like(comp_mask)
    inner[max(0, y0 + 1):y1 - 1, max(0, x0 + 1):x1 - 1] = True
    border = ring & ~inner
    px = img.astype(np.float64)
    bg = np.median(px[border], axis=0) if border.any() else PALETTE[len(scenes.COLORS)]
    c = np.array(scenes.OBJECT_RGB[color], dtype=np.float64)
    d = c - bg
    alpha = ((px - bg) @ d) / max(1.0, d @ d)
    return np.clip(alpha, 0.0, 1.0)


def classify_shape(comp_mask, alpha):
    """(best shape index, its soft IoU) for one component and the object's soft coverage.

    Templates are centred on the component's bounding-box centre give or take half a pixel, with
    radii 0.85 to 1.15 times half the box's larger side; soft IoU = sum(min) / sum(max) over a
    window 2 pixels larger than the box."""
    ys, xs = np.nonzero(comp_mask)
    x0, x1, y0, y1 = xs.min(), xs.max() + 1, ys.min(), ys.max() + 1
    wx0, wy0 = max(0, x0 - 2), max(0, y0 - 2)
    wx1, wy1 = min(comp_mask.shape[1], x1 + 2), min(comp_mask.shape[0], y1 + 2)
    window = alpha[wy0:wy1, wx0:wx1]
    cx0, cy0 = (x0 + x1) * scenes.SUB // 2, (y0 + y1) * scenes.SUB // 2
    half = max(x1 - x0, y1 - y0) * scenes.SUB / 2.0
    best = (-1, 0.0)
    for shape in range(len(scenes.SHAPES)):
        for f in (0.85, 0.92, 1.0, 1.07, 1.15):
            for dy in (-4, 0, 4):
                for dx in (-4, 0, 4):
                    t = coverage(shape, wx0, wy0, wx1 - wx0, wy1 - wy0, cx0 + dx, cy0 + dy, int(round(half * f)))
                    iou = np.minimum(t, window).sum() / max(1e-9, np.maximum(t, window).sum())
                    if iou > best[1]:
                        best = (shape, iou)
    return best


def check_object_result(img, labels, obj):
    """(passed, shape index found or -1 when no region, its soft IoU) for obj ({shape, color, cell})."""
    size = labels.shape[0]
    found = None
    for ys, xs in components(labels == obj["color"]):
        if len(ys) < MIN_AREA:
            continue
        cell = 3 * min(2, int(ys.mean() * 3 // size)) + min(2, int(xs.mean() * 3 // size))
        if cell == obj["cell"] and (found is None or len(ys) > len(found[0])):
            found = (ys, xs)
    if found is None:
        return False, -1, 0.0
    m = np.zeros(labels.shape, dtype=bool)
    m[found] = True
    # Soft coverage around the component, but not on pixels of other object colors.
    alpha = np.where((labels == -1) | m, object_alpha(img, m, obj["color"]), 0.0)
    shape, iou = classify_shape(m, alpha)
    return shape == obj["shape"] and iou >= MIN_IOU, shape, float(iou)


def check_object(img, labels, obj):
    """Whether the labelled image shows obj ({shape, color, cell}), and what was found, in words."""
    ok, shape, iou = check_object_result(img, labels, obj)
    if shape < 0:
        return False, "no %s region in the cell" % scenes.COLORS[obj["color"]]
    return ok, "%s (IoU %.2f)" % (scenes.SHAPES[shape], iou)


def check_image(img, caption):
    """[(object phrase, passed, detail)] for every object the caption names."""
    objects, _, _ = scenes.parse_caption(caption)
    labels = color_labels(img)
    out = []
    for o in objects:
        ok, detail = check_object(img, labels, o)
        out.append((scenes.object_phrase(dict(o, size=1)), ok, detail))
    return out


def write_goldens():
    """tests/data/scenes/check/: the first 16 tiny-sd samples of models/tiny-sd/samples.png (first 16
    tiny_eval prompts) as PNGs and this checker's verdicts, for the C++ port's test."""
    grid = scenes.read_png_rgb8(os.path.join(scenes.REPO, "models", "tiny-sd", "samples.png"))
    prompts = scenes.read_prompts(os.path.join(scenes.REPO, "prompts", "tiny_eval.txt"))[:16]
    out_dir = os.path.join(scenes.GOLDEN_DIR, "check")
    os.makedirs(out_dir, exist_ok=True)
    lines = ["# file\tcaption\tper object: passed(0/1),shape found(-1: none),soft IoU;..."]
    for i, caption in enumerate(prompts):
        r, c = divmod(i, 8)
        img = grid[2 + r * 66:2 + r * 66 + 64, 2 + c * 66:2 + c * 66 + 64]
        name = "tiny_sd_%02d.png" % i
        scenes.write_png(os.path.join(out_dir, name), img)
        labels = color_labels(img)
        objects, _, _ = scenes.parse_caption(caption)
        res = [check_object_result(img, labels, o) for o in objects]
        lines.append("%s\t%s\t%s" % (name, caption, ";".join("%d,%d,%.9f" % (ok, shape, iou) for ok, shape, iou in res)))
    with open(os.path.join(out_dir, "check.tsv"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %d images and verdicts to %s" % (len(prompts), out_dir))


def score(images, captions):
    """(share of objects found, share of prompts with every object found, per-prompt results)."""
    results = [check_image(i, c) for i, c in zip(images, captions)]
    objs = [ok for r in results for _, ok, _ in r]
    return float(np.mean(objs)), float(np.mean([all(ok for _, ok, _ in r) for r in results])), results


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--selftest", type=int, nargs="?", const=300, help="score N generator scenes (expect 100%%)")
    ap.add_argument("--goldens", action="store_true", help="write tests/data/scenes/check/ from models/tiny-sd/samples.png")
    a = ap.parse_args()
    if a.goldens:
        write_goldens()
        return 0
    if a.selftest:
        imgs, caps = [], []
        for i in range(a.selftest):
            s = scenes.generate_scene(2024, i)
            imgs.append(s["image"])
            caps.append(s["caption"])
        obj, prompt, results = score(imgs, caps)
        for c, r in zip(caps, results):
            for phrase, ok, detail in r:
                if not ok:
                    print("FAIL", c, "|", phrase, "->", detail)
        print("generator scenes: %.1f%% of objects, %.1f%% of prompts" % (100 * obj, 100 * prompt))
        return 0
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
