#!/usr/bin/env bash
# ONNX Runtime reference for qeval's quantized export: calibrates tests/data/onnx/unet_block (a
# torch-exported UNet block) with recipes/int8-level3.json on its committed inputs, and runs the
# resulting Q/DQ model with ONNX Runtime (CPU, optimizations off). Writes
# tests/data/quant/unet_block_int8/{quantized.onnx,scales.json,ort_outputs/*.npy}, which
# tests/eval/quant/ort_agreement_test.cc compares qeval's execution against.
# Needs build/qeval and `cd tools/ort && npm ci --ignore-scripts`.
set -euo pipefail
cd "$(dirname "$0")/.."
out=tests/data/quant/unet_block_int8
rm -rf "$out"
build/qeval calibrate --no-cache --model tests/data/onnx/unet_block/model.onnx \
  --data tests/data/onnx/unet_block/inputs --recipe recipes/int8-level3.json --out "$out"
node tools/ort/run_reference.js "$out/quantized.onnx" tests/data/onnx/unet_block/inputs "$out/ort_outputs"
ls -la "$out" "$out/ort_outputs"
