#!/usr/bin/env bash
# The default `qeval run` (tiny-sd: fp32 reference vs fp16, int8-l3, fp8-l4; 8 prompts x 20 steps):
# cold (empty calibration cache) and warm, what each kind of observation costs, peak memory, and
# 1 against 2 threads. Wall time, CPU time (user + sys) and peak resident memory per case, from
# /usr/bin/time. On a shared machine compare CPU seconds; wall seconds only mean something idle.
# Usage: [PAIRS=5] bench/run_qeval_run.sh [build-dir] [count=8]
#   count < 8 shortens every case; the 1- and 2-thread cases use 4 prompts.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
COUNT=${2:-8}
QEVAL=$(realpath "$BUILD/qeval")
WORK=$(mktemp -d /tmp/qeval-bench-run.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export XDG_CACHE_HOME=$WORK/cache  # the calibration cache: empty for the cold case

# The default run as a config file, with the observation switched piece by piece.
config() {  # $1 file, $2 observe JSON
  cat > "$1" <<EOF
{"pipeline": "$PWD/models/tiny-sd", "count": $COUNT, "gate": "$PWD/models/tiny-sd/gate.json",
 "calibration": {"count": 32},
 "variants": [{"name": "fp32"}, {"name": "fp16", "precision": "fp16"},
              {"name": "int8-l3", "precision": "fp16", "recipe": "$PWD/recipes/int8-level3.json"},
              {"name": "fp8-l4", "precision": "fp16", "recipe": "$PWD/recipes/fp8-level4.json"}],
 "observe": $2}
EOF
}
config "$WORK/full.json" '{}'
config "$WORK/stats.json" '{"local_error": false, "teacher_forced": false}'
config "$WORK/local.json" '{"local_error": true, "teacher_forced": false}'
config "$WORK/none.json" '{"layers": false, "teacher_forced": false}'
# The default run's composition (teacher forcing on) with and without the layer observers.
config "$WORK/stats-tf.json" '{"local_error": false}'
config "$WORK/none-tf.json" '{"layers": false}'

printf "%-44s %8s %8s %8s\n" "case ($COUNT prompts, load $(cut -d' ' -f1 /proc/loadavg))" "wall s" "CPU s" "peak MB"
measure() {  # $1 label, rest: qeval arguments
  local label=$1; shift
  /usr/bin/time -f "%e %U %S %M" -o "$WORK/time" "$QEVAL" "$@" > "$WORK/stdout" 2> "$WORK/stderr" || true
  grep -q "qeval run:" "$WORK/stdout" || { echo "$label: qeval failed:"; cat "$WORK/stderr"; exit 1; }
  read -r wall user sys rss < <(tail -n 1 "$WORK/time")  # after "Command exited with ..." if the gate failed
  awk -v l="$label" -v w="$wall" -v u="$user" -v s="$sys" -v m="$rss" 'BEGIN { printf "%-44s %8.1f %8.1f %8.0f\n", l, w, u + s, m / 1024 }'
}
measure "cold: calibration + full observation" run --config "$WORK/full.json" --out "$WORK/o1"
measure "warm: full observation (the default)" run --config "$WORK/full.json" --out "$WORK/o2"
cp "$WORK/stdout" "$WORK/default.txt"
measure "warm: no observation" run --config "$WORK/none.json" --out "$WORK/o3"
measure "warm: layer statistics only" run --config "$WORK/stats.json" --out "$WORK/o4"
measure "warm: layer statistics + local error" run --config "$WORK/local.json" --out "$WORK/o5"
measure "warm: the default again (result cache)" run --config "$WORK/full.json" --out "$WORK/o2"
# What per-layer observation costs: runs without and with the layer observers (drift statistics and
# accumulated error), alternated PAIRS times (the machine is noisy), both without teacher forcing
# and with it (as the default run has it). Local error is a
# re-execution of every node, not an observer: its cost is the "statistics + local error" case.
PAIRS=${PAIRS:-5}  # alternations: the host's noise needs more than three
for i in $(seq 1 "$PAIRS"); do
  measure "overhead $i: no observation" run --config "$WORK/none.json" --out "$WORK/p$i-none"
  measure "overhead $i: layer statistics only" run --config "$WORK/stats.json" --out "$WORK/p$i-stats"
  measure "overhead $i: teacher forcing, no observation" run --config "$WORK/none-tf.json" --out "$WORK/p$i-none-tf"
  measure "overhead $i: teacher forcing, layer statistics" run --config "$WORK/stats-tf.json" --out "$WORK/p$i-stats-tf"
done | tee "$WORK/pairs"
# Per kind: the median of the pairs' CPU ratios, and the ratio of the fastest runs (noise only adds
# time, so the fastest runs are the steadier figure on a shared host).
awk 'function median(a, n,   i, j, t, b) { for (i = 1; i <= n; ++i) b[i] = a[i]
                                           for (i = 1; i <= n; ++i) for (j = i + 1; j <= n; ++j) if (b[j] < b[i]) { t = b[i]; b[i] = b[j]; b[j] = t }
                                           return n % 2 ? b[(n + 1) / 2] : (b[n / 2] + b[n / 2 + 1]) / 2 }
     function minimum(a, n,   i, m) { m = a[1]; for (i = 2; i <= n; ++i) if (a[i] < m) m = a[i]; return m }
     /: no observation/ { n[++i] = $(NF-1) } /: layer statistics only/ { s[++j] = $(NF-1) }
     /teacher forcing, no observation/ { tn[++k] = $(NF-1) } /teacher forcing, layer statistics/ { ts[++l] = $(NF-1) }
     END { for (p = 1; p <= i; ++p) { r[p] = s[p] / n[p]; tr[p] = ts[p] / tn[p] }
           printf "layer statistics over none, CPU, %d pairs: without teacher forcing median %.2fx, fastest runs %.2fx\n",
                  i, median(r, i), minimum(s, j) / minimum(n, i)
           printf "                                          with teacher forcing (the default) median %.2fx, fastest runs %.2fx\n",
                  median(tr, k), minimum(ts, l) / minimum(tn, k) }' "$WORK/pairs"
T=4
measure "warm, $T prompts, 1 thread" --threads 1 run --config "$WORK/full.json" --count "$T" --out "$WORK/t1"
measure "warm, $T prompts, 2 threads" --threads 2 run --config "$WORK/full.json" --count "$T" --out "$WORK/t2"
echo
echo "the default run's summary:"
cat "$WORK/default.txt"
