#!/usr/bin/env bash
# Runs `qeval run` configs (or builds) alternately and prints each one's fastest and median CPU
# time (and the median run's system time and page faults): on a shared host noise only adds
# time, so the fastest of several alternated runs is the steadier figure (medians of three moved
# +-15% here). Every run gets a fresh --out (no result cache); the calibration cache is the
# caller's (XDG_CACHE_HOME), so warm it first.
# Usage: bench/alternate.sh [-n rounds=5] [-t threads=1] CASE...
#   CASE is CONFIG.json (run with build/qeval) or QEVAL_BINARY:CONFIG.json (A/B of two builds).
set -euo pipefail
ROUNDS=5
THREADS=1
while getopts "n:t:" opt; do
  case $opt in
    n) ROUNDS=$OPTARG ;;
    t) THREADS=$OPTARG ;;
    *) sed -n '2,8p' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,8p' "$0" >&2; exit 2; }
cd "$(dirname "$0")/.."
WORK=$(mktemp -d /tmp/qeval-alternate.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

for ((r = 1; r <= ROUNDS; ++r)); do
  for i in $(seq 1 $#); do
    c=${!i}
    bin=build/qeval
    config=$c
    if [[ $c == *:* ]]; then bin=${c%%:*}; config=${c#*:}; fi
    rm -rf "$WORK/out"
    /usr/bin/time -f "%U %S %R" -o "$WORK/time" "$bin" --threads "$THREADS" run --config "$config" --out "$WORK/out" \
      > "$WORK/stdout" 2> "$WORK/stderr" || true
    grep -q "qeval run:" "$WORK/stdout" || { echo "$c: qeval failed:" >&2; cat "$WORK/stderr" >&2; exit 1; }
    echo "$i $(tail -n 1 "$WORK/time" | awk '{print $1 + $2, $2, $3}')" >> "$WORK/all"
  done
done
# System time tracks what fresh memory costs on this VM (page faults vary in price); faults: the
# median run's.
printf "%-50s %8s %8s %8s %8s  (%d rounds, %s thread(s), CPU s)\n" "case" "fastest" "median" "sys" "faults" "$ROUNDS" "$THREADS"
for i in $(seq 1 $#); do
  awk -v k="$i" '$1 == k { print $2, $3, $4 }' "$WORK/all" | sort -n |
    awk -v c="${!i}" '{ a[NR] = $1; s[NR] = $2; f[NR] = $3 } END { m = int((NR + 1) / 2)
      printf "%-50s %8.2f %8.2f %8.2f %8d\n", c, a[1], a[m], s[m], f[m] }'
done
