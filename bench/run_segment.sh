#!/usr/bin/env bash
# tiny-sam: one image encode + one prompt decode, qeval's executor against ONNX Runtime on the same
# graphs (models/tiny-sam), same thread count, same run. Usage: bench/run_segment.sh [build-dir] [threads=2]
# Needs: (cd tools/ort && npm ci --ignore-scripts); bench_executor built (ninja -C build bench_executor).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
THREADS=${2:-2}
OUT=$BUILD/bench-results/segment
mkdir -p "$OUT/encoder" "$OUT/decoder"
# Inputs: held-out scene 0 as the pipeline prepares it, its ONNX Runtime embeddings, one positive
# point plus the padding point (tests/data/segmentation/tiny_sam, tools/make_tiny_sam_reference.py).
/usr/bin/python3 - "$OUT" <<'PY'
import sys, numpy as np
out, ref = sys.argv[1], "tests/data/segmentation/tiny_sam"
np.save(out + "/encoder/image.npy", np.load(ref + "/image_s0.npy"))
np.save(out + "/decoder/image_embeddings.npy", np.load(ref + "/embeddings.npy")[:1])
np.save(out + "/decoder/point_coords.npy", np.array([[[30, 52], [0, 0]]], np.float32))
np.save(out + "/decoder/point_labels.npy", np.array([[1, -1]], np.float32))
PY
printf "%-16s %10s %10s %8s\n" model qeval_ms ort_ms ratio
total_q=0; total_o=0
for part in encoder:image_encoder decoder:mask_decoder; do
  dir=${part%%:*}; model=models/tiny-sam/${part##*:}.onnx
  q=$("$BUILD/bench/bench_executor" "$model" "$OUT/$dir" 200 "$THREADS")
  o=$(node tools/ort/bench.js "$model" "$OUT/$dir" 200 "$THREADS")
  read -r qm om < <(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["median_ms"], json.loads(sys.argv[2])["median_ms"])' "$q" "$o")
  printf "%-16s %10.2f %10.2f %8.2f\n" "${part##*:}" "$qm" "$om" "$(echo "$qm / $om" | bc -l)"
  total_q=$(echo "$total_q + $qm" | bc -l); total_o=$(echo "$total_o + $om" | bc -l)
done
printf "%-16s %10.2f %10.2f %8.2f\n" "encode+decode" "$total_q" "$total_o" "$(echo "$total_q / $total_o" | bc -l)"
