#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan; tests/fuzz/) in build-fuzz/ and runs each on
# its committed seed corpus (tests/fuzz/corpus/<target>/) for a while. Exit 1 when a target finds
# something: its input is kept in build-fuzz/fuzz-findings/ and the log says how to replay it.
#   usage: scripts/fuzz.sh [seconds per target, default 20] [target ...]   (docs/fuzzing.md)
# New inputs a run discovers go to build-fuzz/fuzz-corpus/<target>/, never into the source tree.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
shift || true
build=${QEVAL_FUZZ_BUILD:-build-fuzz}
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
command -v clang++ >/dev/null || { echo "fuzz: clang++ not found (scripts/setup.sh installs clang)" >&2; exit 2; }

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in tests/fuzz/*_fuzz.cc; do n=$(basename "$f" _fuzz.cc); targets+=("$n"); done
fi
t0=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_COMPILER=clang -DQEVAL_FUZZ=ON -DQEVAL_BUILD_BENCH=OFF "${launcher[@]}" >/dev/null
if ! ninja -C "$build" -j "$(nproc)" "${targets[@]/#/fuzz_}" > "$build/fuzz-build.log" 2>&1; then
  tail -n 40 "$build/fuzz-build.log" >&2
  echo "fuzz: the build failed ($build/fuzz-build.log)" >&2
  exit 1
fi
echo "fuzz: built ${#targets[@]} target(s) in $(( $(date +%s) - t0 )) s; running each for ${seconds} s"

# Each target on its own core; a slow input (-timeout) or an allocation past -malloc_limit_mb is a
# finding like a crash.
mkdir -p "$build/fuzz-findings" "$build/fuzz-logs"
run_one() {
  local n=$1 work="$build/fuzz-corpus/$1"
  mkdir -p "$work"
  "$build/fuzz/fuzz_$n" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=3072 -malloc_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$build/fuzz-findings/$n-" \
    "$work" "tests/fuzz/corpus/$n" > "$build/fuzz-logs/$n.log" 2>&1
}
pids=() names=()
failed=()
jobs_max=$(nproc)
for n in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do sleep 0.5; done
  run_one "$n" &
  pids+=($!) names+=("$n")
done
for i in "${!pids[@]}"; do
  n=${names[$i]}
  if wait "${pids[$i]}"; then
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/fuzz-logs/$n.log" | grep -o '[0-9]*$' || echo '?')
    cov=$(grep -o 'cov: [0-9]*' "$build/fuzz-logs/$n.log" | tail -1 | grep -o '[0-9]*' || echo '?')
    echo "fuzz: $n: $execs inputs, coverage $cov edges, no finding"
  else
    failed+=("$n")
    echo "fuzz: $n: FINDING (log $build/fuzz-logs/$n.log):" >&2
    grep -E 'ERROR|SUMMARY|terminate|what\(\)|runtime error|Test unit written' "$build/fuzz-logs/$n.log" | head -8 >&2
    echo "  replay: $build/fuzz/fuzz_$n <the file named above>" >&2
  fi
done
echo "fuzz: done in $(( $(date +%s) - t0 )) s"
[ ${#failed[@]} -eq 0 ] || { echo "fuzz: findings in: ${failed[*]}" >&2; exit 1; }
