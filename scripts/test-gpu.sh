#!/bin/bash
# The CUDA backend's tests on a machine with a GPU (CI has none: there they skip, saying why).
#   scripts/test-gpu.sh [build-dir]     (default: build)
# Runs qeval_gpu_tests (ctest label `gpu`) and prints a summary: how many tests passed, were
# skipped (and why) or failed, and the node-test counts of the CUDA conformance run.
set -uo pipefail
build=${1:-build}
bin=$build/tests/qeval_gpu_tests
[ -x "$bin" ] || bin=$build/qeval_gpu_tests
if [ ! -x "$bin" ]; then
  echo "test-gpu: no qeval_gpu_tests under $build (configure with QEVAL_CUDA=ON or AUTO and nvcc present)" >&2
  exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
log=$(mktemp)
"$bin" "${@:2}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
echo
echo "== test-gpu summary =="
grep -E "^\[  (PASSED|FAILED|SKIPPED) \] [0-9]+ test" "$log"
grep -E "^no CUDA device" "$log" | sort -u | head -1
grep -E "^CUDA node tests:" "$log"
# Model-level GPU tests (the executor on the device) join here once they exist.
rm -f "$log"
exit $rc
