#!/usr/bin/python3
"""Writes ONNX Runtime reference outputs of the shipped tiny-sam graphs (tests/data/segmentation/tiny_sam/) for the C++ segmentation pipeline test."""

# Usage (from the repository root; needs numpy and tools/ort installed: cd tools/ort && npm ci --ignore-scripts):
#   /usr/bin/python3 tools/make_tiny_sam_reference.py
#
# For a few held-out scenes (stream 0x5EED5A) and point prompts (positive, negative, several
# points), runs models/tiny-sam/image_encoder.onnx and mask_decoder.onnx with ONNX Runtime (CPU,
# graph optimizations off, one thread: tools/ort/run_reference.js) on inputs prepared exactly as
# docs/segment.md says: RGB 0..255 as float32, (v - pixel_mean) / pixel_std in float32, points in
# pixels, a padding point (0, 0) with label -1 appended. Writes:
#   image_s<index>.npy       float32 [1, 3, 64, 64]: the encoder input of the first scene
#   embeddings.npy           float32 [scenes, 64, 16, 16]
#   logits.npy               float32 [prompts, 64, 64]: mask 0's logits per prompt
#   iou_predictions.npy      float32 [prompts, 4]
#   cases.json               the scenes and prompts (points as the pipeline takes them)

import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenes  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(REPO, "models", "tiny-sam")
OUT = os.path.join(REPO, "tests", "data", "segmentation", "tiny_sam")
ORT_RUNNER = os.path.join(REPO, "tools", "ort", "run_reference.js")
SEED = 0x5EED5A
SCENES = [0, 1, 7]


def run_ort(model, inputs):
    d = tempfile.mkdtemp()
    try:
        os.makedirs(os.path.join(d, "in"))
        for name, arr in inputs.items():
            np.save(os.path.join(d, "in", name + ".npy"), arr)
        subprocess.run(["node", ORT_RUNNER, model, os.path.join(d, "in"), os.path.join(d, "out")], check=True,
                       stdout=subprocess.DEVNULL)
        return {f[:-4]: np.load(os.path.join(d, "out", f)) for f in os.listdir(os.path.join(d, "out"))}
    finally:
        shutil.rmtree(d)


def main():
    with open(os.path.join(MODEL, "pipeline.json")) as f:
        cfg = json.load(f)
    mean = np.array(cfg["image"]["pixel_mean"], np.float32).reshape(1, 3, 1, 1)
    std = np.array(cfg["image"]["pixel_std"], np.float32).reshape(1, 3, 1, 1)
    os.makedirs(OUT, exist_ok=True)

    cases = {"generator": "tools/make_tiny_sam_reference.py", "seed": SEED, "scenes": SCENES, "prompts": []}
    embeddings = []
    logits, ious = [], []
    for si, index in enumerate(SCENES):
        s = scenes.generate_scene(SEED, index)
        x = (s["image"][None].transpose(0, 3, 1, 2).astype(np.float32) - mean) / std
        if si == 0:
            np.save(os.path.join(OUT, "image_s%d.npy" % index), x)
        emb = run_ort(os.path.join(MODEL, "image_encoder.onnx"), {"image": x})["image_embeddings"]
        embeddings.append(emb[0])
        pts = [p for p in scenes.object_points(s["masks"]) if p[0] >= 0]
        prompts = [[[pts[0][0], pts[0][1], 1]]]
        if len(pts) > 1:
            prompts.append([[pts[1][0], pts[1][1], 1], [pts[0][0], pts[0][1], 0]])
        else:  # a positive point and a negative one in a corner of the background
            prompts.append([[pts[0][0], pts[0][1], 1], [2, 61, 0]])
        for points in prompts:
            coords = np.array([[[p[0], p[1]] for p in points] + [[0, 0]]], np.float32)
            labels = np.array([[p[2] for p in points] + [-1]], np.float32)
            out = run_ort(os.path.join(MODEL, "mask_decoder.onnx"),
                          {"image_embeddings": emb, "point_coords": coords, "point_labels": labels})
            logits.append(out["masks"][0, 0])
            ious.append(out["iou_predictions"][0])
            cases["prompts"].append({"scene": index, "embedding": si, "points": points})
    np.save(os.path.join(OUT, "embeddings.npy"), np.stack(embeddings).astype(np.float32))
    np.save(os.path.join(OUT, "logits.npy"), np.stack(logits).astype(np.float32))
    np.save(os.path.join(OUT, "iou_predictions.npy"), np.stack(ious).astype(np.float32))
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")
    print("%d scenes, %d prompts -> %s" % (len(SCENES), len(logits), os.path.relpath(OUT, REPO)))


if __name__ == "__main__":
    main()
