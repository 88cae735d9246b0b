#!/usr/bin/python3
"""Writes tiny-sam's point-prompt sets (datasets/point_prompts/tiny_sam_{eval,calib}.jsonl) from the synthetic scenes."""

# Usage (from the repository root):  /usr/bin/python3 tools/make_tiny_sam_prompts.py
#
# Format: docs/segment.md ("Point-prompt sets"). Needs only numpy (tools/scenes.py).
#
# tiny_sam_eval.jsonl: the held-out set of the model card (train_tiny_sam.eval_set): scenes
#   0..499 of the stream seeded 0x5EED5A (never drawn from in training), one prompt per visible
#   object: one positive point at the object's mask pixel nearest its centroid
#   (scenes.object_points / datasets::scene_object_points); reference mask = the object's mask.
# tiny_sam_calib.jsonl: calibration prompts for quantization, from the training stream (seed
#   0x5EED07, scenes 0..63, disjoint from the evaluation scenes): the same positive point per
#   object, plus, in scenes with more than one object, a negative point on the next object (so
#   that calibration also sees the background-label embedding).

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenes  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "datasets", "point_prompts")
EVAL_SEED, EVAL_SCENES = 0x5EED5A, 500    # train_tiny_sam.EVAL_SEED / EVAL_SCENES
CALIB_SEED, CALIB_SCENES = scenes.TRAIN_SEED, 64  # the training stream (0x5EED07)


def prompts(seed, count, negatives):
    lines = []
    for i in range(count):
        s = scenes.generate_scene(seed, i)
        pts = scenes.object_points(s["masks"])
        visible = [k for k, p in enumerate(pts) if p[0] >= 0]
        for k in visible:
            points = [[pts[k][0], pts[k][1], 1]]
            if negatives and len(visible) > 1:
                other = visible[(visible.index(k) + 1) % len(visible)]
                points.append([pts[other][0], pts[other][1], 0])
            lines.append({"id": "s%do%d" % (i, k), "scene": {"seed": seed, "index": i},
                          "points": points, "mask": {"object": k}})
    return lines


def write(name, lines):
    path = os.path.join(OUT, name)
    with open(path, "w") as f:
        for line in lines:
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
    print("%s: %d prompts" % (os.path.relpath(path, REPO), len(lines)))


def main():
    os.makedirs(OUT, exist_ok=True)
    write("tiny_sam_eval.jsonl", prompts(EVAL_SEED, EVAL_SCENES, negatives=False))
    write("tiny_sam_calib.jsonl", prompts(CALIB_SEED, CALIB_SCENES, negatives=True))


if __name__ == "__main__":
    main()
