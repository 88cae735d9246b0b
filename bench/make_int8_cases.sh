#!/usr/bin/env bash
# Makes the calibrated level-3 INT8 graphs and inputs that bench/run_int8_speed.sh times (tiny-sd
# UNet and PP-OCRv4 detection, recipes/int8-level3.json) and writes its CASES file.
# Usage: bench/make_int8_cases.sh QEVAL OUT
#   QEVAL: a qeval binary (any build: the graphs do not depend on the kernels); OUT: a folder.
# Then: bench/run_int8_speed.sh ROUNDS OUT/cases BENCH_EXECUTOR...
# Needs numpy for the python that runs bench/peers/make_executor_inputs.py (/usr/bin/python3, else
# python3) and PP-OCRv4 det: third_party/models/ppocr (scripts/fetch_models.sh), or DET=its path.
set -euo pipefail
QEVAL=$(realpath "$1")
mkdir -p "$2"
OUT=$(realpath "$2")
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
py=/usr/bin/python3
"$py" -c 'import numpy' 2>/dev/null || py=python3
DET=$(realpath "${DET:-third_party/models/ppocr/ch_PP-OCRv4_det_infer.onnx}")
[ -f "$DET" ] || { echo "missing $DET (scripts/fetch_models.sh)" >&2; exit 2; }
# tiny-sd UNet inputs as txt2img calls it (batch 2, 4x16x16 latents); a 1x3x640x640 image for det,
# the same values on every host (seeded).
"$py" bench/peers/make_executor_inputs.py "$OUT/inputs"
mkdir -p "$OUT/det_in"
"$py" -c "import numpy as np; np.save('$OUT/det_in/x.npy', np.random.default_rng(20).random((1, 3, 640, 640), dtype=np.float32))"
# Level-3 INT8: tiny-sd's UNet calibrated on 2 prompts x 2 steps of its pipeline; det (opset 11,
# upgraded to 13 by calibrate) on the one image above.
"$QEVAL" --progress none calibrate --recipe recipes/int8-level3.json --pipeline models/tiny-sd --count 2 --steps 2 \
  --out "$OUT/sd_l3" --no-cache
"$QEVAL" --progress none calibrate --recipe recipes/int8-level3.json --model "$DET" --data "$OUT/det_in" \
  --out "$OUT/det_l3" --no-cache
cat > "$OUT/cases" <<EOF
sd $here/models/tiny-sd/unet.onnx $OUT/sd_l3/quantized.onnx $OUT/inputs/tiny_sd_unet
det $DET $OUT/det_l3/quantized.onnx $OUT/det_in
EOF
cat "$OUT/cases"
