#!/usr/bin/env bash
# Quick start, command 2: install dependencies if missing, build, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh
cd build
ctest --output-on-failure --parallel "$(nproc)" --timeout 300
