#!/usr/bin/env bash
# ONNX Runtime references for qeval's quantized exports: calibrates tests/data/onnx/unet_block (a
# torch-exported UNet block) with recipes/int8-level3.json and recipes/fp8-level4.json (opset 19,
# float8e4m3fn Q/DQ) on its committed inputs, and runs each Q/DQ model with ONNX Runtime (CPU,
# optimizations off). Writes tests/data/quant/unet_block_{int8,fp8}/{quantized.onnx,scales.json,
# ort_outputs/*.npy}, which tests/eval/quant/ort_agreement_test.cc compares qeval's execution against.
# Needs build/qeval and `cd tools/ort && npm ci --ignore-scripts`.
set -euo pipefail
cd "$(dirname "$0")/.."
for pair in int8:int8-level3 fp8:fp8-level4; do
  out=tests/data/quant/unet_block_${pair%%:*}
  rm -rf "$out"
  build/qeval calibrate --no-cache --model tests/data/onnx/unet_block/model.onnx \
    --data tests/data/onnx/unet_block/inputs --recipe "recipes/${pair#*:}.json" --out "$out"
  node tools/ort/run_reference.js "$out/quantized.onnx" tests/data/onnx/unet_block/inputs "$out/ort_outputs"
  ls -la "$out" "$out/ort_outputs"
done
