#!/usr/bin/python3
"""Times scikit-image's SSIM (qeval's `wang` convention) on a 1024x1024 RGB pair; prints JSON."""

import json
import sys
import time

import numpy as np
from skimage.metrics import structural_similarity


def pair(h=1024, w=1024):
    # Same construction as bench/bench_metrics.cc (content does not change SSIM's cost).
    rng = np.random.default_rng(42)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    ref = np.empty((h, w, 3), np.uint8)
    test = np.empty((h, w, 3), np.uint8)
    for k in range(3):
        base = 128 + 80 * np.sin(0.013 * x * (k + 1)) * np.cos(0.009 * y) + 8 * rng.standard_normal((h, w))
        v = np.clip(np.round(base), 0, 255)
        ref[..., k] = v
        test[..., k] = np.clip(np.round(v + 3 * rng.standard_normal((h, w))), 0, 255)
    return ref, test


def main():
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    ref, test = pair()
    times = []
    value = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = structural_similarity(ref, test, gaussian_weights=True, sigma=1.5,
                                      use_sample_covariance=False, data_range=255, channel_axis=-1)
        times.append((time.perf_counter() - t0) * 1000)
    print(json.dumps({"peer": "scikit-image structural_similarity", "median_ms": float(np.median(times)),
                      "runs_ms": times, "ssim": float(value)}))


if __name__ == "__main__":
    main()
