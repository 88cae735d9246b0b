#!/usr/bin/python3
"""ONNX Runtime reference outputs of the real third-party models (scripts/fetch_models.sh) on fixed inputs."""

# Usage (from the repository root):
#   scripts/fetch_models.sh                     # the models, into third_party/models/
#   (cd tools/ort && npm ci --ignore-scripts)   # ONNX Runtime for Node (tools/ort/README.md)
#   /usr/bin/python3 tools/make_real_model_references.py
#
# Writes tests/data/real_models/<case>/inputs/x.npy and outputs/<output>.npy (ONNX Runtime, CPU EP,
# graph optimizations disabled, one thread: tools/ort/run_reference.js). Inputs are rendered text
# (DejaVu Sans through PIL, deterministic) normalized the way PaddleOCR's own pre-processing does:
# detection (x / 255 - ImageNet mean) / ImageNet std; recognition and the angle classifier
# (x / 255 - 0.5) / 0.5. The models are not committed: tests find them in third_party/models/.

import os
import shutil
import subprocess
import tempfile

import numpy as np
from PIL import Image, ImageDraw, ImageFont

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(REPO, "third_party", "models")
OUT = os.path.join(REPO, "tests", "data", "real_models")
ORT = os.path.join(REPO, "tools", "ort", "run_reference.js")
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"


def render(w, h, lines, size):
    img = Image.new("RGB", (w, h), (245, 243, 238))
    d = ImageDraw.Draw(img)
    font = ImageFont.truetype(FONT, size)
    for (x, y, text, color) in lines:
        d.text((x, y), text, fill=color, font=font)
    return np.asarray(img, dtype=np.float32)  # H, W, 3 (RGB)


def to_input(img, mean, std):
    x = (img / 255.0 - np.array(mean, np.float32)) / np.array(std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None].astype(np.float32))  # 1, 3, H, W


def face(size):
    """A drawn face (skin-toned oval, eyes, brows, nose, mouth) on a grey wall: BlazeFace's input in
    NHWC on [-1, 1]. Deterministic."""
    img = Image.new("RGB", (size, size), (118, 124, 130))
    d = ImageDraw.Draw(img)
    s = size / 128.0
    box = lambda x0, y0, x1, y1: [x0 * s, y0 * s, x1 * s, y1 * s]
    d.ellipse(box(34, 22, 94, 106), fill=(224, 172, 140))
    for x in (48, 72):
        d.ellipse(box(x, 52, x + 9, 58), fill=(250, 250, 250))
        d.ellipse(box(x + 2, 53, x + 7, 58), fill=(40, 30, 25))
        d.line(box(x - 2, 46, x + 11, 45), fill=(70, 50, 40), width=max(1, int(2 * s)))
    d.polygon([(64 * s, 60 * s), (59 * s, 76 * s), (69 * s, 76 * s)], fill=(205, 150, 120))
    d.chord(box(52, 80, 76, 94), 0, 180, fill=(170, 60, 60))
    x = np.asarray(img, dtype=np.float32) / 127.5 - 1.0
    return np.ascontiguousarray(x[None])  # 1, H, W, 3


CASES = {
    # Detection: two lines of text on a light page, 96 x 256 (multiples of 32, as PaddleOCR resizes).
    "ppocr_det": ("ppocr/ch_PP-OCRv4_det_infer.onnx",
                  lambda: to_input(render(256, 96, [(12, 10, "qeval 2026", (20, 20, 20)),
                                                    (12, 52, "INT8 vs FP16", (40, 30, 120))], 28),
                                   [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])),
    # Recognition: one text line, 48 x 160 (height 48 as the v4 recognizer expects).
    "ppocr_rec": ("ppocr/ch_PP-OCRv4_rec_infer.onnx",
                  lambda: to_input(render(160, 48, [(6, 8, "Hello 42", (10, 10, 10))], 28), [0.5] * 3, [0.5] * 3)),
    # Angle classifier: a text line, 48 x 192.
    "ppocr_cls": ("ppocr/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                  lambda: to_input(render(192, 48, [(6, 8, "quantized", (10, 10, 10))], 28), [0.5] * 3, [0.5] * 3)),
    # BlazeFace (MediaPipe, front camera model, 128 x 128 NHWC): a drawn face.
    "blazeface_front": ("blazeface/face_detection_front_128x128_barracuda.onnx", lambda: face(128)),
}

# The input file of each case: x.npy, or the model's input name as tools/ort/run_reference.js reads it.
INPUT_FILE = {"blazeface_front": "input_0.npy"}


def save(path, a):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.save(path, a)


def main():
    for case, (model, make) in CASES.items():
        folder = os.path.join(OUT, case)
        shutil.rmtree(os.path.join(folder, "outputs"), ignore_errors=True)
        save(os.path.join(folder, "inputs", INPUT_FILE.get(case, "x.npy")), make())
        subprocess.run(["node", ORT, os.path.join(MODELS, model), os.path.join(folder, "inputs"),
                        os.path.join(folder, "outputs")], check=True)
        for f in sorted(os.listdir(os.path.join(folder, "outputs"))):
            y = np.load(os.path.join(folder, "outputs", f))
            print(f"{case}: {f} {y.shape} min {y.min():.4g} max {y.max():.4g} mean {y.mean():.4g}")


if __name__ == "__main__":
    main()
