#!/usr/bin/python3
"""Generates tests/data/metrics/gmsd_golden.json: GMSD (Xue et al. 2014) of the image_golden.json pairs."""

# Usage (from the repository root):  /usr/bin/python3 tools/make_gmsd_goldens.py
#
# Needs Debian's Python with numpy, scipy and OpenCV. Reads the pairs tools/make_image_goldens.py
# wrote (tests/data/metrics/images/) and ports the authors' GMSD.m line by line:
#
#   T = 170; Down_step = 2;
#   dx = [1 0 -1; 1 0 -1; 1 0 -1]/3; dy = dx';
#   aveKernel = fspecial('average', 2);
#   aveY1 = conv2(Y1, aveKernel, 'same'); Y1 = aveY1(1:Down_step:end, 1:Down_step:end);  (same for Y2)
#   gradientMap1 = sqrt(conv2(Y1, dx, 'same').^2 + conv2(Y1, dy, 'same').^2);             (same for Y2)
#   quality_map = (2*gradientMap1.*gradientMap2 + T) ./ (gradientMap1.^2 + gradientMap2.^2 + T);
#   score = std2(quality_map);
#
# Y is luma on [0, 255]: 0.299 R + 0.587 G + 0.114 B for colour, the gray plane otherwise; 16-bit
# images are scaled by 255 / 65535 first. MATLAB's conv2 'same' is emulated from scipy's full
# convolution (the central part MATLAB keeps starts at floor(k/2) for a k-tap kernel, which matters
# for the even 2x2 kernel); std2 is the sample standard deviation (N - 1).

import json
import os

import cv2
import numpy as np
import scipy
import scipy.signal

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "tests", "data", "metrics")


def read_png_raw(path):
    a = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    assert a is not None, path
    if a.ndim == 3:
        a = np.ascontiguousarray(a[..., ::-1])  # BGR -> RGB
    return a


def luma_255(img, peak):
    a = img.astype(np.float64) * (255.0 / peak)
    if a.ndim == 2:
        return a
    return 0.299 * a[..., 0] + 0.587 * a[..., 1] + 0.114 * a[..., 2]


def conv2_same(a, k):
    """MATLAB conv2(a, k, 'same')."""
    full = scipy.signal.convolve2d(a, k, mode="full")
    r0, c0 = k.shape[0] // 2, k.shape[1] // 2
    return full[r0:r0 + a.shape[0], c0:c0 + a.shape[1]]


def gmsd(y1, y2):
    t = 170.0
    dx = np.array([[1, 0, -1], [1, 0, -1], [1, 0, -1]], dtype=np.float64) / 3.0
    dy = dx.T
    ave = np.ones((2, 2)) / 4.0
    y1 = conv2_same(y1, ave)[::2, ::2]
    y2 = conv2_same(y2, ave)[::2, ::2]
    g1 = np.sqrt(conv2_same(y1, dx) ** 2 + conv2_same(y1, dy) ** 2)
    g2 = np.sqrt(conv2_same(y2, dx) ** 2 + conv2_same(y2, dy) ** 2)
    q = (2 * g1 * g2 + t) / (g1 ** 2 + g2 ** 2 + t)
    return float(np.std(q, ddof=1))


def main():
    golden = json.load(open(os.path.join(DATA, "image_golden.json")))
    cases = []
    for c in golden["cases"]:
        ref = read_png_raw(os.path.join(DATA, c["ref"]))
        test = read_png_raw(os.path.join(DATA, c["test"]))
        peak = float(c["data_range"])
        cases.append({"name": c["name"], "ref": c["ref"], "test": c["test"], "data_range": c["data_range"],
                      "gmsd": gmsd(luma_255(ref, peak), luma_255(test, peak))})
    out = {"generator": "tools/make_gmsd_goldens.py", "numpy_version": np.__version__,
           "scipy_version": scipy.__version__, "cases": cases}
    path = os.path.join(DATA, "gmsd_golden.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {path}: {len(cases)} cases")


if __name__ == "__main__":
    main()
