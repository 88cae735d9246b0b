#!/usr/bin/env bash
# Peak RSS of a 1024x1024 single-model run on IMG.LY's ISNet (issue 20's memory target): ONNX
# Runtime's one inference of the FP16 export against `qeval infer` and `qeval run` (the FP16 export
# as the reference, ONNX Runtime's quint8 export as an `onnx` variant, per-layer observation with
# and without local error), at 1 and 2 threads, in one run. Peak RSS from /usr/bin/time -v.
# Usage: bench/run_isnet_memory.sh [build-dir=build] [threads="1 2"] [which="ort ort-plain infer acc local"]
# Needs: scripts/fetch_models.sh (third_party/models/isnet), (cd tools/ort && npm ci --ignore-scripts).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
THREADS=${2:-"1 2"}
WHICH=${3:-"ort ort-plain infer acc local"}
MODELS=third_party/models/isnet
OUT=$BUILD/bench-results/isnet_memory
mkdir -p "$OUT/in"
ABS_OUT=$(realpath "$OUT")
[ -f "$OUT/in/input.npy" ] || /usr/bin/python3 - "$OUT/in/input.npy" <<'PY'
import sys, numpy as np
np.save(sys.argv[1], np.random.default_rng(20).random((1, 3, 1024, 1024), dtype=np.float32))
PY
for local in true false; do
  cat > "$OUT/run_local_$local.json" <<EOF
{"pipeline": "$PWD/$MODELS/isnet_fp16.onnx", "inputs": "$ABS_OUT/in",
 "observe": {"local_error": $local},
 "variants": [{"name": "fp16-export"}, {"name": "quint8", "onnx": "$PWD/$MODELS/isnet_quint8.onnx"}]}
EOF
done
# "<label> <peak RSS GB> <wall s>" from a /usr/bin/time -v log.
report() {
  local kb wall
  if ! grep -q "Exit status: 0" "$2"; then
    printf "%-44s FAILED: see %s\n" "$1" "$2"
    return
  fi
  kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$2")
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$2")
  printf "%-44s %8.2f GB  %s\n" "$1" "$(echo "$kb / 1000000" | bc -l)" "$wall"
}
for t in $THREADS; do
  for w in $WHICH; do
    log=$OUT/$w.t$t.log
    case $w in
      ort) /usr/bin/time -v node tools/ort/bench.js "$MODELS/isnet_fp16.onnx" "$OUT/in" 1 "$t" > /dev/null 2> "$log" || true
           report "ONNX Runtime (all optimizations), $t thread(s)" "$log" ;;
      ort-plain)  # graph optimizations off, 1 thread whatever $t (tools/ort/run_reference.js)
           mkdir -p "$OUT/ort_out"
           /usr/bin/time -v node tools/ort/run_reference.js "$MODELS/isnet_fp16.onnx" "$OUT/in" "$OUT/ort_out" > /dev/null 2> "$log" || true
           report "ONNX Runtime (no optimizations), 1 thread" "$log" ;;
      infer) /usr/bin/time -v "$BUILD/qeval" infer --model "$MODELS/isnet_fp16.onnx" --inputs "$OUT/in" --out "$OUT/infer.t$t" \
               --threads "$t" > /dev/null 2> "$log" || true
             report "qeval infer, FP16 export, $t thread(s)" "$log" ;;
      acc|local)
        cfg=$OUT/run_local_$([ $w = local ] && echo true || echo false).json
        rm -rf "$OUT/run_$w.t$t"  # a run state there would be resumed, not run
        /usr/bin/time -v "$BUILD/qeval" run --config "$cfg" --out "$OUT/run_$w.t$t" --threads "$t" > /dev/null 2> "$log" || true
        report "qeval run, $([ $w = local ] && echo "accumulated + local" || echo "accumulated only"), $t thread(s)" "$log" ;;
    esac
  done
done
