#!/usr/bin/env bash
# INT8 against FP32 on whole models, 1 thread: qeval binaries (bench_executor builds, e.g. main's
# and a branch's) and ONNX Runtime on the FP32 model and its Q/DQ INT8 form, alternated ROUNDS
# times; prints each case's minimum and median CPU ms per run and the INT8/FP32 ratios.
# Usage: bench/run_int8_speed.sh ROUNDS CASES BINARY...
#   CASES: a file of lines "label fp32.onnx int8.onnx input_dir"
# The ORT peer is tools/ort/bench.js where node and onnxruntime-node are installed, else
# bench/peers/ort_bench.py (the onnxruntime wheel). THREADS (default 1) and REPS (default 20); METRIC
# (default cpu_ms: process CPU time per run; median_ms: wall time, the median of the REPS runs).
set -euo pipefail
ROUNDS=$1 CASES=$2
shift 2
THREADS=${THREADS:-1} REPS=${REPS:-20} METRIC=${METRIC:-cpu_ms}
# the figure from either peer's JSON (bench.js writes it without spaces)
metric() { grep -o "\"$METRIC\": *[0-9.]*" | sed 's/.*: *//'; }
here=$(cd "$(dirname "$0")/.." && pwd)
peer() {
  if command -v node >/dev/null && [ -d "$here/tools/ort/node_modules/onnxruntime-node" ]; then
    node "$here/tools/ort/bench.js" "$@"
  else
    /usr/bin/env python3 "$here/bench/peers/ort_bench.py" "$@"
  fi
}
raw=$(mktemp)
for r in $(seq "$ROUNDS"); do
  while read -r label f32 i8 inputs; do
    [ -z "$label" ] && continue
    for b in "$@"; do
      for kind in fp32 int8; do
        m=$f32; [ $kind = int8 ] && m=$i8
        echo "$label $kind $b $("$b" "$m" "$inputs" "$REPS" "$THREADS" | metric)" >> "$raw"
      done
    done
    for kind in fp32 int8; do
      m=$f32; [ $kind = int8 ] && m=$i8
      echo "$label $kind ort $(peer "$m" "$inputs" "$REPS" "$THREADS" | metric)" >> "$raw"
    done
  done < "$CASES"
done
sort -k1,1 -k3,3 -k2,2 -k4n "$raw" | awk '
  {k=$1" "$3" "$2; v[k]=v[k]" "$4; n[k]++}
  END {for (k in v) {split(v[k], a, " "); printf "%s min %.3f median %.3f all%s\n", k, a[1], a[int((n[k]+1)/2)], v[k]}}' | sort
echo "# INT8 vs FP32 (minimum $METRIC; > 1: INT8 faster)"
sort -k1,1 -k3,3 -k2,2 -k4n "$raw" | awk '
  {k=$1" "$3; if (!(k" "$2 in best)) best[k" "$2]=$4; keys[k]=1}
  END {for (k in keys) printf "%s fp32 %.3f int8 %.3f ratio %.3f\n", k, best[k" fp32"], best[k" int8"], best[k" fp32"]/best[k" int8"]}' | sort
rm -f "$raw"
