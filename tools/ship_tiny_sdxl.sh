#!/bin/bash
# Ships a trained tiny-sdxl: export, references of the shipped model, samples.png, and the model card's figures.
#
# Usage (from the repository root, here: Debian's Python with torch 1.13 and onnx 1.12, tools/ort installed):
#   tools/ship_tiny_sdxl.sh CKPT [SEEDS]
# CKPT: a folder of tools/train_tiny_sdxl.py (vae.pt, text_ema.pt, text2_ema.pt, unet_ema.pt, train_log.json,
# samples.png). SEEDS (default 1): noise seeds per prompt of the CPU prompt-following score written to
# export_info.json (tools/export_tiny_sdxl.py --seeds; about a minute per seed here).
# Writes models/tiny-sdxl/ (the Optimum SDXL folder, export_info.json, samples.png; MODEL_CARD.md is left alone)
# and tests/data/tiny_sdxl/reference/ (tools/make_tiny_sdxl_reference.py on the shipped weights: the references
# the SDXL tests can move to), then prints each {{PLACEHOLDER}} of models/tiny-sdxl/MODEL_CARD.md with its value.
set -euo pipefail
ckpt=${1:?usage: tools/ship_tiny_sdxl.sh CKPT [SEEDS]}
seeds=${2:-1}
cd "$(dirname "$0")/.."
for f in vae.pt text_ema.pt text2_ema.pt unet_ema.pt train_log.json; do
  [ -f "$ckpt/$f" ] || { echo "ship_tiny_sdxl.sh: $ckpt/$f is missing" >&2; exit 2; }
done
py=/usr/bin/python3
out=models/tiny-sdxl
ref=tests/data/tiny_sdxl/reference
$py tools/export_tiny_sdxl.py --ckpt "$ckpt" --out "$out" --seeds "$seeds"
if [ -f "$ckpt/samples.png" ]; then cp "$ckpt/samples.png" "$out/samples.png"; else echo "note: no $ckpt/samples.png (train with --eval)"; fi
$py tools/make_tiny_sdxl_reference.py --ckpt "$ckpt" --out "$ref"
rm -f "$ref"/*.png
$py - "$ckpt" "$out" <<'PY'
import json, os, re, sys
ckpt, out = sys.argv[1:3]
log = json.load(open(os.path.join(ckpt, "train_log.json")))
info = json.load(open(os.path.join(out, "export_info.json")))
res = log.get("eval", {}).get("results", {})
def pct(key, what):
    return "%.1f" % (100 * res[key][what]) if key in res else "(not evaluated)"
best = log.get("eval", {}).get("best", "euler_20_g5.0")
m = re.match(r"euler_(\d+)_g([\d.]+)", best)
u, v, d = log["unet"], log["vae"], log["data"]
figures = {
    "DEVICE": log["device"], "TORCH": log["torch"], "GENERATOR_VERSION": log["generator_version"],
    "POOL_LAST": d["pool"] - 1, "SKIPPED": d["skipped_eval_captions"], "HOLDOUT": d["holdout"],
    "VAE_STEPS": v.get("steps"), "VAE_PSNR": "%.1f" % v["holdout_psnr_db_sample"],
    "SCALING_FACTOR": "%.5f" % v["scaling_factor"],
    "UNET_STEPS": u["steps"], "UNET_SECONDS": u["seconds"], "UNET_LOSS": "%.4f" % u["final_loss"],
    "UNET_HOLDOUT_LOSS": "%.4f" % u["holdout_loss_ema"], "TOTAL_SECONDS": log.get("total_seconds"),
    "E20G5_OBJ": pct("euler_20_g5.0", "objects"), "E20G5_PRM": pct("euler_20_g5.0", "prompts"),
    "E20G75_OBJ": pct("euler_20_g7.5", "objects"), "E20G75_PRM": pct("euler_20_g7.5", "prompts"),
    "E30G5_OBJ": pct("euler_30_g5.0", "objects"), "E30G5_PRM": pct("euler_30_g5.0", "prompts"),
    "EVAL_BEST_STEPS": m.group(1) if m else best, "EVAL_BEST_GUIDANCE": m.group(2) if m else best,
    "ONNX_MB": "%.2f" % (info["onnx_bytes"] / 1e6), "VAE_K": "%g" % info["vae_overflow"]["k"],
    "VAE_TRUNK_MAX": "%.3g" % info["vae_overflow"]["trunk_max_abs_exported"],
    "VAE_SCALED_REL_L2": "%.1e" % info["vae_overflow"]["output_rel_l2_scaled_vs_unscaled"],
}
card = open(os.path.join(out, "MODEL_CARD.md")).read()
for name in sorted(set(re.findall(r"{{(\w+)}}", card))):
    print("{{%s}} = %s" % (name, figures.get(name, "(unknown: fill in by hand)")))
for h in log.get("history", []):
    if "unet" in h:
        print("earlier run: %d UNet steps, loss %.4f" % (h["unet"]["steps"], h["unet"]["final_loss"]))
if "prompt_following" in info:
    print("CPU FP32 score (export_info.json): objects drawn %.1f%% over %d seed(s)" % (
        100 * info["prompt_following"]["objects_mean"], len(info["prompt_following"]["per_seed_objects_prompts"])))
PY
