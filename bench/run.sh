#!/usr/bin/env bash
# Runs the image-metric benchmarks and their peers in one go and prints the ratios recorded in
# bench/README.md. Usage: bench/run.sh [build-dir]   (needs scripts/setup.sh --tools for the peers)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
PY=/usr/bin/python3
OUT=$BUILD/bench-results
mkdir -p "$OUT"

echo "== Google Benchmark: qeval metrics and the OpenCV SSIM peer (10 repetitions, medians)"
"$BUILD/bench/bench_metrics" --benchmark_repetitions=10 --benchmark_report_aggregates_only=true \
  --benchmark_out="$OUT/metrics.json" --benchmark_out_format=json >/dev/null 2>&1
echo "== scikit-image peer (5 runs, median)"
$PY bench/peers/ssim_skimage.py 5 > "$OUT/skimage.json"

echo "== compare-images on 64 pairs of 1024x1024 RGB PNGs, 1 thread vs 2"
if [ ! -d "$OUT/pairs64/ref" ]; then $PY bench/peers/make_pairs.py "$OUT/pairs64" 64; fi
time_run() {  # median wall time of 3 runs, seconds
  for i in 1 2 3; do
    /usr/bin/time -f "%e" "$BUILD/qeval" --threads "$1" compare-images --ref "$OUT/pairs64/ref" \
      --test "$OUT/pairs64/test" --out "$OUT/pairs64-report" 2>&1 >/dev/null | tail -1
  done | sort -n | sed -n 2p
}
T1=$(time_run 1)
T2=$(time_run 2)
echo "{\"threads_1_s\": $T1, \"threads_2_s\": $T2}" > "$OUT/scaling.json"

$PY - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
bm = json.load(open(f"{out}/metrics.json"))
med = {b["run_name"].split("/")[0]: b["real_time"] for b in bm["benchmarks"] if b.get("aggregate_name") == "median"}
sk = json.load(open(f"{out}/skimage.json"))
sc = json.load(open(f"{out}/scaling.json"))
ssim = med["BM_SsimWang_1024_rgb"]
print(f"SSIM wang 1024x1024 RGB, median       : {ssim:8.2f} ms")
print(f"OpenCV GaussianBlur SSIM (C++), median : {med['BM_OpenCvSsim_1024_rgb']:8.2f} ms  -> qeval {med['BM_OpenCvSsim_1024_rgb'] / ssim:5.1f}x faster")
print(f"scikit-image SSIM, median              : {sk['median_ms']:8.2f} ms  -> qeval {sk['median_ms'] / ssim:5.1f}x faster")
print(f"qeval SSIM reference (double, scalar)  : {med['BM_SsimWangReference_1024_rgb']:8.2f} ms")
print(f"MS-SSIM 1024x1024 RGB, median          : {med['BM_MsSsim_1024_rgb']:8.2f} ms")
psnr, read = med["BM_Psnr_1024_rgb"], med["BM_ReadBothBuffers_1024_rgb"]
print(f"PSNR 1024x1024 RGB (24 MiB read)       : {psnr:8.3f} ms  ({read / psnr * 100:4.0f}% of a plain read of both buffers: {read:.3f} ms)")
print(f"compare-images 64 pairs 1024^2: 1 thread {sc['threads_1_s']:.2f} s, 2 threads {sc['threads_2_s']:.2f} s -> {sc['threads_1_s'] / sc['threads_2_s']:.2f}x")
PYEOF
