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
import subprocess
import tempfile

import numpy as np
from PIL import Image, ImageDraw, ImageFont

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(REPO, "third_party", "models", "ppocr")
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


CASES = {
    # Detection: two lines of text on a light page, 96 x 256 (multiples of 32, as PaddleOCR resizes).
    "ppocr_det": ("ch_PP-OCRv4_det_infer.onnx",
                  lambda: to_input(render(256, 96, [(12, 10, "qeval 2026", (20, 20, 20)),
                                                    (12, 52, "INT8 vs FP16", (40, 30, 120))], 28),
                                   [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])),
    # Recognition: one text line, 48 x 160 (height 48 as the v4 recognizer expects).
    "ppocr_rec": ("ch_PP-OCRv4_rec_infer.onnx",
                  lambda: to_input(render(160, 48, [(6, 8, "Hello 42", (10, 10, 10))], 28), [0.5] * 3, [0.5] * 3)),
    # Angle classifier: a text line, 48 x 192.
    "ppocr_cls": ("ch_ppocr_mobile_v2.0_cls_infer.onnx",
                  lambda: to_input(render(192, 48, [(6, 8, "quantized", (10, 10, 10))], 28), [0.5] * 3, [0.5] * 3)),
}


def save(path, a):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.save(path, a)


def main():
    for case, (model, make) in CASES.items():
        folder = os.path.join(OUT, case)
        save(os.path.join(folder, "inputs", "x.npy"), make())
        subprocess.run(["node", ORT, os.path.join(MODELS, model), os.path.join(folder, "inputs"),
                        os.path.join(folder, "outputs")], check=True)
        for f in sorted(os.listdir(os.path.join(folder, "outputs"))):
            y = np.load(os.path.join(folder, "outputs", f))
            print(f"{case}: {f} {y.shape} min {y.min():.4g} max {y.max():.4g} mean {y.mean():.4g}")


if __name__ == "__main__":
    main()
