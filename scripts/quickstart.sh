#!/usr/bin/env bash
# Quick start, command 1: install dependencies, build, and run the main job on the shipped model:
# `qeval run` with no config = tiny-sd, fp32 reference vs fp16, int8 level 3 and fp8 level 4,
# 8 prompts x 20 steps, scales calibrated on the calibration prompts (cached), the shipped gate.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh
set +e
./build/qeval run --out qeval-run
code=$?
set -e
echo
echo "Open qeval-run/report.html in a browser; qeval-run/report.json is the machine-readable report."
exit $code
