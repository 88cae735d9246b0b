#!/usr/bin/env bash
# Where the time of one `qeval run` case goes against another's: records both with perf (CPU-clock
# samples: this VM has no hardware counters) and prints the per-symbol sample differences, largest
# first, then the totals per category. Check the "compute" category first: the kernels run the
# same code in both cases, so a difference there is the host's noise (it moved 5-25% between runs
# here), and the case's own cost is in the other categories ("elementwise ops" grows under
# observation: fused chains write every member's output).
# Usage: bench/perf_diff.sh [-t threads=1] [-F hz=999] [-n symbols=30] BASE CASE
#   BASE and CASE are CONFIG.json (run with build/qeval) or QEVAL_BINARY:CONFIG.json. Every run
#   gets a fresh --out; the calibration cache is the caller's (XDG_CACHE_HOME): warm it first.
set -euo pipefail
THREADS=1
HZ=999
TOP=30
while getopts "t:F:n:" opt; do
  case $opt in
    t) THREADS=$OPTARG ;;
    F) HZ=$OPTARG ;;
    n) TOP=$OPTARG ;;
    *) sed -n '2,10p' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 2 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
command -v perf > /dev/null || { echo "perf not found (Debian package linux-perf)" >&2; exit 2; }
cd "$(dirname "$0")/.."
WORK=$(mktemp -d /tmp/qeval-perf-diff.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

record() {  # $1 tag, $2 case
  local bin=build/qeval config=$2
  if [[ $2 == *:* ]]; then bin=${2%%:*}; config=${2#*:}; fi
  perf record -q -F "$HZ" -o "$WORK/$1.data" "$bin" --threads "$THREADS" run --config "$config" --out "$WORK/out-$1" \
    > "$WORK/$1.stdout" 2> "$WORK/$1.stderr" || true
  grep -q "qeval run:" "$WORK/$1.stdout" || { echo "$2: qeval failed:" >&2; cat "$WORK/$1.stderr" >&2; exit 1; }
  # "samples<TAB>symbol" per symbol
  perf report -i "$WORK/$1.data" --no-children --sort sym -F sample,sym 2> /dev/null |
    grep -v '^#' | sed -e 's/^ *//' -e '/^$/d' | awk '{ n = $1; $1 = ""; sub(/^ /, ""); s[$0] += n } END { for (k in s) print s[k] "\t" k }' > "$WORK/$1.txt"
}
record base "$1"
record case "$2"

# What a symbol is part of (first match wins).
CATEGORIES='
function category(n) {
  if (n ~ /scan_with|metrics::.*commit|add_with_error|ActivationStats::add/) return "statistics pass"
  if (n ~ /LogAbsHistogram|ExactSum|ErrorStats|ActivationStats::merge|LayerCells|LayerCell::|merge_unit|CallLog/) return "pooling and logs"
  if (n ~ /Lockstep|Capture|on_node|node_info|Observ|run_lockstep/) return "observer"
  if (n ~ /MsgPack|save_run_state|json|Json|grisu|strtod|report|Report|html|Html/) return "run state and report"
  if (n ~ /malloc|free|unlink_chunk|malloc_consolidate|_int_realloc|sysmalloc|operator new|operator delete/) return "malloc"
  if (n ~ /memmove|memcpy|memset|copy_view/) return "copies"
  if (n ~ /\[k\]/) return "kernel (page faults, I/O)"
  if (n ~ /broadcast_map|UnaryOp|ArithOp|for_each|elementwise|chain|Chain|round_to/) return "elementwise ops"
  if (n ~ /micro_kernel|kernel_vnni|moments|interleave_rows|normalize_rows|int8|gemm|Gemm|pack|conv|Conv|attention|softmax|Softmax|im2col|MatMul|matmul|dot|Fused|fused/) return "compute"
  if (n ~ /Execution|Session|State::step|Plan|BufferPool|Tensor/) return "executor"
  return "other"
}'
printf "%s: %s samples (base) vs %s: %s samples, ratio %s\n" "$1" "$(awk -F'\t' '{ s += $1 } END { print s }' "$WORK/base.txt")" \
  "$2" "$(awk -F'\t' '{ s += $1 } END { print s }' "$WORK/case.txt")" \
  "$(awk -F'\t' 'FNR == NR { a += $1; next } { b += $1 } END { printf "%.3f", b / a }' "$WORK/base.txt" "$WORK/case.txt")"
echo
printf "%8s %8s %8s  %s\n" "diff" "base" "case" "symbol (largest differences)"
awk -F'\t' 'FNR == NR { a[$2] = $1; next } { b[$2] = $1 } END { for (k in a) if (!(k in b)) b[k] = 0
            for (k in b) printf "%d\t%d\t%d\t%s\n", b[k] - a[k], a[k], b[k], k }' "$WORK/base.txt" "$WORK/case.txt" |
  sort -t$'\t' -k1,1nr | head -n "$TOP" | awk -F'\t' '{ printf "%8d %8d %8d  %s\n", $1, $2, $3, substr($4, 1, 110) }'
echo
printf "%8s %8s %8s  %s\n" "diff" "base" "case" "category"
awk -F'\t' "$CATEGORIES"'
  FNR == NR { a[category($2)] += $1; next } { b[category($2)] += $1 }
  END { for (k in a) if (!(k in b)) b[k] = 0; for (k in b) printf "%d\t%d\t%d\t%s\n", b[k] - a[k], a[k], b[k], k }' \
  "$WORK/base.txt" "$WORK/case.txt" | sort -t$'\t' -k1,1nr | awk -F'\t' '{ printf "%8d %8d %8d  %s\n", $1, $2, $3, $4 }'
