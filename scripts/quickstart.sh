#!/usr/bin/env bash
# Quick start, command 1: install dependencies, build, and run the main job on shipped data.
# Until `qeval run` exists the main job is `qeval compare-images` on the sample pairs in samples/.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh
set +e
./build/qeval compare-images --ref samples/ref --test samples/test --out out/samples \
  --gate samples/gate.json
code=$?
set -e
echo
echo "Open out/samples/report.html in a browser; out/samples/report.json is the machine-readable report."
exit $code
