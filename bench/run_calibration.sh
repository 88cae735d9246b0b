#!/usr/bin/env bash
# Calibration time: `qeval calibrate --pipeline models/tiny-sd` (percentile recipe with SmoothQuant,
# N prompts x 20 steps) against the same collection on ONNX Runtime (tools/ort/calibrate_txt2img.js:
# same prompts, seeds, DDIM loop and observed tensors as extra UNet outputs), same run, same threads.
# Prints CPU and wall seconds of both, their ratio, and how far the peer's per-step ranges are from
# qeval's (the check that both collected the same thing).
# Usage: bench/run_calibration.sh [build-dir] [prompts=32] [threads=2] [recipe=recipes/int8-level2.5.json]
#                                 [ort-optimization=disabled (as ORT's calibrators run) | all]
# Needs: (cd tools/ort && npm ci --ignore-scripts); /usr/bin/python3 with onnx and numpy.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
N=${2:-32}
THREADS=${3:-2}
RECIPE=${4:-recipes/int8-level2.5.json}
OPT=${5:-disabled}
OUT=$BUILD/bench-results/calibration
rm -rf "$OUT"
mkdir -p "$OUT"
# qeval: the whole command (model loading, tokenizer, N x 20 steps, percentiles, SmoothQuant, export).
/usr/bin/time -f '{"wall_s": %e, "cpu_s": %U, "sys_s": %S, "max_rss_kb": %M}' -o "$OUT/qeval_time.json" \
  "$BUILD/qeval" --threads "$THREADS" calibrate --pipeline models/tiny-sd --recipe "$RECIPE" \
  --count "$N" --no-cache --out "$OUT/qeval" > "$OUT/qeval.txt"
/usr/bin/python3 bench/peers/calibration_inputs.py models/tiny-sd prompts/tiny_calib.txt "$N" \
  "$OUT/qeval/scales.json" "$OUT/peer" > "$OUT/peer_inputs.txt"
/usr/bin/time -f '{"wall_s": %e, "cpu_s": %U, "sys_s": %S, "max_rss_kb": %M}' -o "$OUT/ort_time.json" \
  node tools/ort/calibrate_txt2img.js models/tiny-sd "$OUT/peer" "$THREADS" "" "$OPT" > "$OUT/ort.json"
/usr/bin/python3 - "$OUT" <<'PY'
import json, re, sys
import numpy as np
out = sys.argv[1]
qt, ot, o = (json.load(open("%s/%s" % (out, f))) for f in ("qeval_time.json", "ort_time.json", "ort.json"))
qtext = open(out + "/qeval.txt").read()
collect = float(re.search(r"calibration: .* in ([0-9.]+) s", qtext).group(1))
print(open(out + "/peer_inputs.txt").read().strip())
print("tiny-sd calibration, %d prompts x %d steps (%d UNet calls), %d threads; peer %s (optimizations %s)" % (
    o["prompts"], o["steps"], o["unet_calls"], o["threads"], o["peer"], o["optimization"]))
print("%-34s %10s %10s %8s" % ("", "qeval", "ORT", "ratio"))
qcpu, ocpu = qt["cpu_s"] + qt["sys_s"], ot["cpu_s"] + ot["sys_s"]
print("%-34s %10.1f %10.1f %8.2f" % ("process CPU s (user + sys)", qcpu, ocpu, qcpu / ocpu))
print("%-34s %10.1f %10.1f %8.2f" % ("process wall s", qt["wall_s"], ot["wall_s"], qt["wall_s"] / ot["wall_s"]))
print("%-34s %10.1f %10.1f %8.2f" % ("collection wall s (models loaded)", collect, o["loop_wall_s"], collect / o["loop_wall_s"]))
print("  ORT loop: UNet runs %.1f s wall, statistics in JS %.1f s wall" % (o["unet_run_wall_s"], o["collect_wall_s"]))
print("%-34s %10.0f %10.0f" % ("peak resident MB", qt["max_rss_kb"] / 1024, ot["max_rss_kb"] / 1024))
s = json.load(open(out + "/qeval/scales.json"))
r = json.load(open(out + "/peer/ort_ranges.json"))
tensor_of = {tuple(n): t["tensor"] for t in json.load(open(out + "/peer/targets.json"))["targets"] for n in t["nodes"]}
worst = 0.0
for a in s["activations"]:
    q = np.array(a["step_max"], dtype=np.float64)
    p = np.array(r[tensor_of[(a["node"], a["input"])]]["step_max"], dtype=np.float64)
    worst = max(worst, float(np.max(np.abs(q - p) / np.maximum(np.abs(q), 1e-30))))
print("same collection: per-step max |x| of %d observed inputs, max relative difference qeval vs ORT %.1e" % (
    len(s["activations"]), worst))
PY
