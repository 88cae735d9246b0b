#!/usr/bin/env bash
# qeval's executor against ONNX Runtime on the reference models at benchmark sizes and on the
# shipped models as their pipelines call them, same thread count, same run.
# Usage: bench/run_executor.sh [build-dir] [threads=2] [repetitions=20] [benchmark ...]
# ROUNDS=n (default 3) alternates qeval and ORT n times per model and keeps each side's best median:
# on a shared machine the load comes and goes, and the best round is the closest to an idle one.
# Wall ms is the median Session::run / session.run time; CPU ms is the process CPU time per run (all
# threads), the figure other jobs on a shared machine disturb least (at 1 thread it is the work
# itself; at 2, ONNX Runtime's spinning workers add to it).
# Needs: scripts/setup.sh --tools, and (cd tools/ort && npm ci --ignore-scripts).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
THREADS=${2:-2}
REPS=${3:-20}
shift $(( $# < 3 ? $# : 3 ))
OUT=$BUILD/bench-results/executor
mkdir -p "$OUT"
/usr/bin/python3 bench/peers/make_executor_inputs.py "$OUT/inputs"
declare -A MODEL=(
  [unet_block]=tests/data/onnx/unet_block/model.onnx
  [vae_decoder_block]=tests/data/onnx/vae_decoder_block/model.onnx
  [vit_block]=tests/data/onnx/vit_block/model.onnx
  [clip_text_layer]=tests/data/onnx/clip_text_layer/model.onnx
  [tiny_sd_text_encoder]=models/tiny-sd/text_encoder.onnx
  [tiny_sd_unet]=models/tiny-sd/unet.onnx
  [tiny_sd_vae_decoder]=models/tiny-sd/vae_decoder.onnx
  [tiny_sam_image_encoder]=models/tiny-sam/image_encoder.onnx
)
ORDER=(unet_block vae_decoder_block vit_block clip_text_layer tiny_sd_text_encoder tiny_sd_unet
       tiny_sd_vae_decoder tiny_sam_image_encoder)
[ $# -gt 0 ] && ORDER=("$@")
printf "%-24s %9s %9s %6s %9s %9s %6s %10s %11s %11s\n" model qeval_ms ort_ms ratio q_cpu_ms o_cpu_ms ratio weights_MB peak_act_MB live_act_MB
for b in "${ORDER[@]}"; do
  qs=() os=()
  for r in $(seq "${ROUNDS:-3}"); do
    qs+=("$("$BUILD/bench/bench_executor" "${MODEL[$b]}" "$OUT/inputs/$b" "$REPS" "$THREADS")")
    os+=("$(node tools/ort/bench.js "${MODEL[$b]}" "$OUT/inputs/$b" "$REPS" "$THREADS")")
  done
  printf '%s\n' "${qs[@]}" "${os[@]}" | sed "s/^/$b threads=$THREADS /" >> "$OUT/raw.txt"
  /usr/bin/python3 - "$b" "${#qs[@]}" "${qs[@]}" "${os[@]}" <<'PY'
import json, sys
m, n = sys.argv[1], int(sys.argv[2])
runs = [json.loads(a) for a in sys.argv[3:]]
qs, os_ = runs[:n], runs[n:]
q = min(qs, key=lambda r: r['median_ms'])
o = min(os_, key=lambda r: r['median_ms'])
qc = min(r['cpu_ms'] for r in qs)
oc = min(r['cpu_ms'] for r in os_)
print(f"{m:<24} {q['median_ms']:9.2f} {o['median_ms']:9.2f} {q['median_ms'] / o['median_ms']:6.2f} "
      f"{qc:9.2f} {oc:9.2f} {qc / oc:6.2f} "
      f"{q['weight_bytes'] / 1e6:10.2f} {q['peak_activation_bytes'] / 1e6:11.2f} {q['live_activation_bytes'] / 1e6:11.2f}")
PY
done
