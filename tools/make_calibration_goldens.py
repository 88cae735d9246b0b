#!/usr/bin/python3
"""Golden values for qeval's calibrators (metrics/calibration.*), from a numpy/scipy
reimplementation of the reference algorithms:

- |x| histogram with a width fixed by the first batch and grown by appending bins
  (pytorch-quantization HistogramCalibrator);
- entropy amax: pytorch-quantization's _compute_amax_entropy (TensorRT's KL calibration: 128
  quantized bins, start_bin 128, P clipped with outliers folded into the last bin, scipy entropy);
- MSE amax: pytorch-quantization's _compute_amax_mse (bin centres, narrow-range int8 fake quant);
- per-step amax reduction of ModelOpt's diffusion PercentileCalibrator (collect methods
  min-mean, mean-max, global_min, min-max over the first int(total_step * percentile) steps;
  min-mean uses the per-step mean, see metrics/calibration.h).

Writes tests/data/calibration/batch{0,1,2}.npy and golden.json. Run: /usr/bin/python3 tools/make_calibration_goldens.py
"""
import json
import os
from collections import Counter

import numpy as np
from scipy.stats import entropy

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "calibration")


class AbsHistogram:
    def __init__(self, num_bins):
        self.num_bins = num_bins
        self.width = 0.0
        self.counts = None

    def collect(self, x):
        a = np.abs(x.astype(np.float64))
        m = a.max()
        if self.width == 0.0:
            self.width = m / self.num_bins
            self.counts = np.zeros(self.num_bins)
        if m > len(self.counts) * self.width:
            bins = int(np.ceil(m / self.width))
            self.counts = np.concatenate([self.counts, np.zeros(bins - len(self.counts))])
        last = len(self.counts) - 1
        idx = np.minimum(np.floor(a / self.width), last).astype(np.int64)
        self.counts += np.bincount(idx, minlength=len(self.counts))

    def edges(self):
        return np.arange(len(self.counts) + 1) * self.width


def entropy_amax(calib_hist, calib_bin_edges, num_bits=8, stride=1, start_bin=128):
    bins = calib_hist.copy()
    bins[0] = bins[1]
    total_data = np.sum(bins)
    divergences = []
    nbins = 1 << (num_bits - 1)
    new_density_counts = np.zeros(nbins, dtype=np.float64)
    for i in range(start_bin, len(bins) + 1, stride):
        new_density_counts.fill(0)
        space = np.linspace(0, i, num=nbins + 1)
        digitized_space = np.digitize(range(i), space) - 1
        digitized_space[bins[:i] == 0] = -1
        for idx, digitized in enumerate(digitized_space):
            if digitized != -1:
                new_density_counts[digitized] += bins[idx]
        counter = Counter(digitized_space)
        for key, val in counter.items():
            if key != -1:
                new_density_counts[key] = new_density_counts[key] / val
        new_density = np.zeros(i, dtype=np.float64)
        for idx, digitized in enumerate(digitized_space):
            if digitized != -1:
                new_density[idx] = new_density_counts[digitized]
        reference_density = np.array(bins[: len(digitized_space)])
        reference_density[-1] += np.sum(bins[i:])
        assert round(np.sum(reference_density)) == round(total_data)
        divergences.append(entropy(reference_density, new_density))
    divergences = np.array(divergences)
    last_argmin = len(divergences) - 1 - np.argmin(divergences[::-1])
    return float(calib_bin_edges[last_argmin * stride + start_bin])


def mse_amax(calib_hist, calib_bin_edges, stride=1, start_bin=128):
    counts = calib_hist.astype(np.float64)
    centers = (calib_bin_edges[1:] + calib_bin_edges[:-1]) / 2
    mses, arguments = [], []
    for i in range(start_bin, len(centers), stride):
        amax = centers[i]
        scale = 127.0 / amax
        quant = np.clip(np.round(centers * scale), -127, 127) / scale
        mses.append(np.sum((quant - centers) ** 2 * counts))
        arguments.append(i)
    return float(centers[arguments[int(np.argmin(mses))]])


def percentile_amax(amax_calls, total_step, percentile, method):
    """amax_calls[c][t]: the amax of call c at step t."""
    data = {}
    for call in amax_calls:
        for t, v in enumerate(call):
            data.setdefault(t, []).append(v)
    up_lim = max(1, int(total_step * percentile))
    if method == "min-mean":
        vals = [np.mean(data[t]) for t in range(up_lim)]
    elif method == "global_min":
        vals = [np.min(data[t]) for t in range(up_lim)]
    else:
        vals = [np.max(data[t]) for t in range(up_lim)]
    return float(np.mean(vals) if method == "mean-max" else np.min(vals))


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20240605)
    # Heavy-tailed activations with a few outliers; the second and third batches grow the range.
    batches = [
        rng.laplace(0, 1.0, 6000).astype(np.float32),
        np.concatenate([rng.laplace(0, 1.2, 6000), [9.5, -11.25]]).astype(np.float32),
        np.concatenate([rng.normal(0, 2.0, 6000), [14.0]]).astype(np.float32),
    ]
    for i, b in enumerate(batches):
        np.save(os.path.join(OUT, f"batch{i}.npy"), b)
    hist = AbsHistogram(2048)
    for b in batches:
        hist.collect(b)
    edges = hist.edges()
    golden = {
        "histogram": {
            "bins": len(hist.counts),
            "width": hist.width,
            "total": float(hist.counts.sum()),
            "weighted_index_sum": float(np.sum(hist.counts * np.arange(len(hist.counts)))),
        },
        "entropy": {
            "default": entropy_amax(hist.counts, edges),
            "stride4_start256": entropy_amax(hist.counts, edges, stride=4, start_bin=256),
        },
        "mse": {
            "default": mse_amax(hist.counts, edges),
            "stride3_start64": mse_amax(hist.counts, edges, stride=3, start_bin=64),
        },
    }
    # Per-step amax: 4 calibration calls x 10 steps, amax decaying over the denoising steps.
    calls = (rng.uniform(0.5, 1.5, (4, 10)) * np.linspace(3.0, 1.0, 10)).round(6)
    golden["steps"] = {"amax": calls.tolist(), "total_step": 10, "cases": []}
    for method in ["min-mean", "mean-max", "global_min", "min-max"]:
        for p in [1.0, 0.8, 0.5, 0.05]:
            golden["steps"]["cases"].append(
                {"method": method, "percentile": p, "amax": percentile_amax(calls, 10, p, method)})
    with open(os.path.join(OUT, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(json.dumps({k: golden[k] for k in ["histogram", "entropy", "mse"]}, indent=1))


if __name__ == "__main__":
    main()
