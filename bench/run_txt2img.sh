#!/usr/bin/env bash
# tiny-sd: one whole image (text encoder, 20 DDIM steps with classifier-free guidance as one
# batch-2 UNet call each, VAE decoder; FP32), qeval's pipeline against the same loop on ONNX
# Runtime (tools/ort/txt2img.js), same graphs, same inputs, same thread count, same run.
# Usage: bench/run_txt2img.sh [build-dir] [threads=2] [repetitions=5]
# Needs: (cd tools/ort && npm ci --ignore-scripts); ninja -C build bench_txt2img.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
THREADS=${2:-2}
REPS=${3:-5}
OUT=$BUILD/bench-results/txt2img
mkdir -p "$OUT"
q=$("$BUILD/bench/bench_txt2img" models/tiny-sd "$OUT" "$REPS" "$THREADS")
o=$(node tools/ort/txt2img.js models/tiny-sd "$OUT" "$REPS" "$THREADS")
/usr/bin/python3 - "$q" "$o" "$OUT" <<'PY'
import json, sys
import numpy as np
q, o, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
print("tiny-sd, %d steps, guidance %g, FP32, %d threads, median of %d images" % (q["steps"], q["guidance"], q["threads"], q["repetitions"]))
print("%-22s %10s %10s %10s" % ("", "qeval", "ORT", "ratio"))
for key, name in (("median_ms", "wall ms / image"), ("min_ms", "best wall ms"), ("cpu_ms", "CPU ms / image")):
    print("%-22s %10.1f %10.1f %10.2f" % (name, q[key], o[key], q[key] / o[key]))
print("qeval stages (ms): text encoder %.1f, UNet %.1f (%.2f / step), VAE decoder %.1f" % (
    q["text_encoder_ms"], q["unet_ms"], q["unet_ms"] / q["steps"], q["vae_decoder_ms"]))
a, b = np.load(out + "/qeval_image.npy"), np.load(out + "/ort_image.npy")
mse = float(np.mean((a.astype(np.float64) - b) ** 2))
la, lb = np.load(out + "/qeval_latent.npy"), np.load(out + "/ort_latent.npy")
print("same loop: image PSNR qeval vs ORT %s dB, final latent relative L2 %.1e" % (
    "inf" if mse == 0 else "%.1f" % (10 * np.log10(1 / mse)), np.linalg.norm(la - lb) / np.linalg.norm(lb)))
PY
