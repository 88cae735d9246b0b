#!/usr/bin/python3
"""PyTorch on the GPU as qeval's peer: one batch-2 call of the full-size SD-1.5-like UNet (64x64 latent) and SDXL-like UNet (128x128), FP32 with TF32 off and FP16 with scaled-dot-product attention."""

# Usage (on the GPU machine, from the repository root; its python3 holds PyTorch):
#   python3 bench/gpu/torch_peer.py --out DIR [--models unet,sdxl-unet] [--runs 20] [--warmup 5]
#                                   [--widths-scale 1.0] [--seed 0]
#
# The weights and inputs are those of tools/export_full_size.py (build_model() and make_inputs(): same module
# code, same seed, built on the CPU), so qeval's output on the exported ONNX can be compared with PyTorch's:
# DIR/<model>/inputs/<input name>.npy (what `qeval infer --inputs` reads) and DIR/<model>/expected/out_sample.npy
# (PyTorch FP32, TF32 off). Timing: CUDA events around each call, after --warmup calls, median (and min) of
# --runs calls; cudnn.benchmark on (PyTorch at its best on fixed shapes), NCHW, eager (no torch.compile, no
# CUDA graphs). FP32 runs with allow_tf32 off for matmul and cuDNN and float32_matmul_precision "highest";
# both precisions use F.scaled_dot_product_attention (use_sdpa) as diffusers' AttnProcessor2_0 does. The FP16
# call converts the same weights (module.half()); its output is compared with FP32's (relative L2).
# Prints a table last and writes DIR/torch_peer.json.

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools"))
import export_full_size as E  # noqa: E402


def rel_l2(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / max(1e-30, np.linalg.norm(b)))


def time_calls(module, inputs, warmup, runs, cuda):
    """Milliseconds of each of `runs` calls (CUDA events; wall clock on the CPU), after `warmup` calls; returns
    (times, last output)."""
    with torch.no_grad():
        for _ in range(warmup):
            out = module(*inputs)
        if cuda:
            torch.cuda.synchronize()
        times = []
        for _ in range(runs):
            if not cuda:
                t0 = time.perf_counter()
                out = module(*inputs)
                times.append(1e3 * (time.perf_counter() - t0))
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = module(*inputs)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return times, out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="unet,sdxl-unet", help="comma-separated: unet, sdxl-unet")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--widths-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (FP32 only; to test the script)")
    ap.add_argument("--latent", type=int, default=None, help="latent size (default: 64; SDXL-like UNet 128)")
    a = ap.parse_args()
    cuda = a.device == "cuda"
    if a.device not in ("cuda", "cpu"):
        ap.error("--device: cuda or cpu")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("torch_peer.py: no CUDA device (PyTorch %s)" % torch.__version__)
    if a.runs < 1 or a.warmup < 1:
        ap.error("--runs and --warmup must be >= 1")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.benchmark = True
    torch.set_num_threads(os.cpu_count() or 1)
    dev = torch.device(a.device)
    props = torch.cuda.get_device_properties(dev) if cuda else None
    device_name = props.name if cuda else "CPU (%d threads)" % torch.get_num_threads()
    report = {"tool": "bench/gpu/torch_peer.py", "device": device_name,
              "sms": props.multi_processor_count if cuda else None,
              "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
              "batch": a.batch, "runs": a.runs, "warmup": a.warmup, "widths_scale": a.widths_scale, "seed": a.seed,
              "tf32": False, "cudnn_benchmark": True, "attention": "scaled_dot_product_attention", "models": {}}
    rows = []
    for name in [s.strip() for s in a.models.split(",") if s.strip()]:
        if name not in ("unet", "sdxl-unet"):
            ap.error("--models: '%s' is not unet or sdxl-unet" % name)
        t0 = time.time()
        module = E.build_model(name, a.widths_scale, a.seed)
        build_s = time.time() - t0
        module.use_sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")  # PyTorch >= 2.0
        names_in, _, _ = E.io_names(name)
        latent = None if a.latent is None else (2 * a.latent if name == "sdxl-unet" else a.latent)
        inputs = E.make_inputs(name, a.widths_scale, latent, a.batch, a.seed)
        d = os.path.join(a.out, E.DIRS[name])
        for sub in ("inputs", "expected"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        for n, x in zip(names_in, inputs):
            np.save(os.path.join(d, "inputs", n + ".npy"), x)
        entry = {"params": E.param_count(name, module), "build_s": round(build_s, 2), "sdpa": module.use_sdpa,
                 "shapes": {n: list(x.shape) for n, x in zip(names_in, inputs)}, "precisions": {}}
        module = module.to(dev)
        ref = None
        for prec, dtype in (("fp32", torch.float32), ("fp16", torch.float16))[:2 if cuda else 1]:
            module = module.to(dtype)
            xs = E.to_torch(inputs, dtype, dev)
            if cuda:
                torch.cuda.reset_peak_memory_stats(dev)
            times, out = time_calls(module, xs, a.warmup, a.runs, cuda)
            out = out.float().cpu().numpy()
            p = {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
                 "times_ms": [round(t, 3) for t in times],
                 "peak_gpu_bytes": torch.cuda.max_memory_allocated(dev) if cuda else 0,
                 "finite": bool(np.isfinite(out).all())}
            if prec == "fp32":
                ref = out
                np.save(os.path.join(d, "expected", "out_sample.npy"), out)
            else:
                p["rel_l2_vs_fp32"] = rel_l2(out, ref)
                np.save(os.path.join(d, "expected", "out_sample_fp16.npy"), out.astype(np.float16))
            entry["precisions"][prec] = p
            rows.append((name, prec, p))
            print("%s %s: median %.2f ms (min %.2f, max %.2f) over %d runs" % (
                name, prec, p["median_ms"], p["min_ms"], p["max_ms"], a.runs), flush=True)
        report["models"][name] = entry
        del module
        if cuda:
            torch.cuda.empty_cache()
    path = os.path.join(a.out, "torch_peer.json")
    with open(path + ".tmp", "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)
    print("\nPyTorch %s on %s, batch %d, median of %d calls after %d warm-up (%s):" % (
        torch.__version__, device_name, a.batch, a.runs, a.warmup, "CUDA events" if cuda else "wall clock"))
    print("%-10s %-5s %10s %10s %12s %14s" % ("model", "prec", "median ms", "min ms", "peak GB", "rel-L2 vs fp32"))
    for name, prec, p in rows:
        print("%-10s %-5s %10.2f %10.2f %12.2f %14s" % (name, prec, p["median_ms"], p["min_ms"],
                                                      p["peak_gpu_bytes"] / 1e9,
                                                      "%.2e" % p["rel_l2_vs_fp32"] if "rel_l2_vs_fp32" in p else "-"))
    print("wrote %s" % path)


if __name__ == "__main__":
    main()
