#!/usr/bin/env bash
# Peak RSS of one call of a full-size random-weight model (issue 24's memory target): `qeval infer`
# against ONNX Runtime (tools/ort/bench.js: all optimizations, one warm-up + one timed run) on the
# same model and inputs, one process at a time. Peak RSS and wall from /usr/bin/time -v; the
# weights' bytes from the model's external data.
# Usage: bench/run_full_size_memory.sh MODEL_DIR [build-dir=build] [threads=2] [which="infer ort"] [qeval args...]
#   MODEL_DIR: a folder of tools/export_full_size.py (unet/, sdxl_unet/): model.onnx + model.onnx.data
# Needs: (cd tools/ort && npm ci --ignore-scripts) for "ort". Full-size models take GBs: run nothing
# else that is large meanwhile (the numbers are the peak of the whole process).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:?usage: bench/run_full_size_memory.sh MODEL_DIR [build-dir] [threads] [which] [qeval args...]}
BUILD=${2:-build}
THREADS=${3:-2}
WHICH=${4:-"infer ort"}
shift $(( $# < 4 ? $# : 4 ))
NAME=$(basename "$DIR")
case $NAME in sdxl_unet) KIND=sdxl-unet ;; unet) KIND=unet ;; *) echo "unknown model folder $DIR" >&2; exit 2 ;; esac
OUT=$BUILD/bench-results/full_size_memory/$NAME
mkdir -p "$OUT/in"
FP16=$(/usr/bin/python3 -c "import onnx,sys; m=onnx.load('$DIR/model.onnx', load_external_data=False); print(int(m.graph.input[0].type.tensor_type.elem_type == 10))")
[ -f "$OUT/in/sample.npy" ] || /usr/bin/python3 - "$OUT/in" "$KIND" "$FP16" <<'PY'
import os, sys
import numpy as np
sys.path.insert(0, "tools")
import export_full_size as E
out, kind, fp16 = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
names, _, _ = E.io_names(kind)
for n, a in zip(names, E.make_inputs(kind)):
    np.save(os.path.join(out, n + ".npy"), a.astype(np.float16) if fp16 and a.dtype == np.float32 else a)
PY
weights=$(stat -c %s "$DIR/model.onnx.data")
printf "%-52s %8.2f GB\n" "weights ($DIR/model.onnx.data)" "$(echo "$weights / 1000000000" | bc -l)"
report() {
  local kb wall
  if ! grep -q "Exit status: 0" "$2"; then
    printf "%-52s FAILED: see %s\n" "$1" "$2"
    return
  fi
  kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$2")
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$2")
  printf "%-52s %8.2f GB  %s  (%.2fx the weights)\n" "$1" "$(echo "$kb / 1000000" | bc -l)" "$wall" \
    "$(echo "$kb * 1000 / $weights" | bc -l)"
}
for w in $WHICH; do
  log=$OUT/$w.t$THREADS.log
  case $w in
    infer) /usr/bin/time -v "$BUILD/qeval" infer --model "$DIR/model.onnx" --inputs "$OUT/in" --out "$OUT/infer.out" \
             --threads "$THREADS" "$@" > "$OUT/infer.stdout" 2> "$log" || true
           report "qeval infer $*, $THREADS thread(s)" "$log" ;;
    ort) /usr/bin/time -v node tools/ort/bench.js "$DIR/model.onnx" "$OUT/in" 1 "$THREADS" > "$OUT/ort.stdout" 2> "$log" || true
         report "ONNX Runtime (all optimizations), $THREADS thread(s)" "$log" ;;
  esac
done
