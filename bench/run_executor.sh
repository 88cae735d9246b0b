#!/usr/bin/env bash
# qeval's executor against ONNX Runtime on the reference models at benchmark sizes, same thread
# count, same run. Usage: bench/run_executor.sh [build-dir] [threads=2]
# Needs: scripts/setup.sh --tools, and (cd tools/ort && npm ci --ignore-scripts).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
THREADS=${2:-2}
OUT=$BUILD/bench-results/executor
mkdir -p "$OUT"
/usr/bin/python3 bench/peers/make_executor_inputs.py "$OUT/inputs"
printf "%-20s %12s %12s %8s %14s %14s %14s\n" model qeval_ms ort_ms ratio weights_MB peak_act_MB live_act_MB
for model in unet_block vae_decoder_block vit_block clip_text_layer; do
  q=$("$BUILD/bench/bench_executor" "tests/data/onnx/$model/model.onnx" "$OUT/inputs/$model" 20 "$THREADS")
  o=$(node tools/ort/bench.js "tests/data/onnx/$model/model.onnx" "$OUT/inputs/$model" 20 "$THREADS")
  /usr/bin/python3 - "$model" "$q" "$o" <<'PY'
import json, sys
m, q, o = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
print(f"{m:<20} {q['median_ms']:12.2f} {o['median_ms']:12.2f} {q['median_ms'] / o['median_ms']:8.2f} "
      f"{q['weight_bytes'] / 1e6:14.2f} {q['peak_activation_bytes'] / 1e6:14.2f} {q['live_activation_bytes'] / 1e6:14.2f}")
PY
done
