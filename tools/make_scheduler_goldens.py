#!/usr/bin/python3
"""Golden tables for qeval's DDIM and Euler discrete schedulers and its seeded noise: diffusers' formulas re-implemented in numpy."""

# Usage (from the repository root): /usr/bin/python3 tools/make_scheduler_goldens.py [--out tests/data/tiny_sd]
#
# diffusers is not installed here, so DDIMScheduler and EulerDiscreteScheduler (diffusers 0.2x-0.3x,
# src/diffusers/schedulers/scheduling_ddim.py and scheduling_euler_discrete.py) are re-implemented
# below, line for line where it matters:
#   __init__       betas = linspace(beta_start, beta_end, T) ("linear") or linspace(sqrt(start),
#                  sqrt(end), T) ** 2 ("scaled_linear"); alphas_cumprod = cumprod(1 - betas);
#                  DDIM final_alpha_cumprod = 1 if set_alpha_to_one else alphas_cumprod[0].
#   set_timesteps  "linspace": linspace(0, T - 1, N) (DDIM: .round() to int; Euler: float32);
#                  "leading": arange(N) * (T // N) + steps_offset; "trailing": round(arange(T, 0,
#                  -T / N)) - 1. Euler: sigmas = interp(timesteps, arange(T), sqrt((1 - a) / a)),
#                  then 0, as float32; init_noise_sigma = max sigma ("linspace", "trailing") or
#                  sqrt(max sigma^2 + 1) ("leading").
#   step           DDIM (eta 0): prev_t = t - T // N; x0 and eps from the prediction type
#                  (epsilon / v_prediction / sample), optional clip of x0, prev = sqrt(a_prev) x0 +
#                  sqrt(1 - a_prev) eps. Euler (s_churn 0): x0 from the prediction type, derivative
#                  = (x - x0) / sigma, prev = x + derivative * (sigma_next - sigma).
#                  scale_model_input (Euler): x / sqrt(sigma^2 + 1).
# Deliberate differences, the same in qeval (eval/pipelines/scheduler.cc):
#   - the tables are float64 (diffusers builds them with torch float32); "diffusers_float32_gap"
#     records how far diffusers' float32 tables are from these (max relative difference);
#   - "trailing" keeps N timesteps where numpy's arange gives N + 1 (N = 61, 103, ... for T = 1000,
#     the extra one being -1).
# Steps run in float32 with each scalar coefficient rounded to float32 once, as a tensor op with a
# float32 0-d tensor does.
#
# Writes scheduler_goldens.json (cases: config, steps, timesteps, alphas / sigmas, init noise
# sigma, and one step's output for fixed inputs at a few step indices) and noise_seed<S>.npy
# (tools/tiny_sd_pipeline.py's seeded_noise, the bit-exact target of eval/pipelines/noise.cc).

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenes  # noqa: E402
import tiny_sd_pipeline as P  # noqa: E402

NOISE_SEEDS = [0, 1, 42, 2 ** 63 + 5]
NOISE_SHAPES = {0: (1, 4, 16, 16), 1: (1, 4, 16, 16), 42: (2, 3, 5), 2 ** 63 + 5: (1, 4, 16, 16)}

SD = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
          prediction_type="epsilon", timestep_spacing="leading", steps_offset=1, set_alpha_to_one=False,
          clip_sample=False, clip_sample_range=1.0)


def betas_of(c, dtype=np.float64):
    T = c["num_train_timesteps"]
    if c["beta_schedule"] == "linear":
        return np.linspace(c["beta_start"], c["beta_end"], T, dtype=np.float64).astype(dtype)
    return np.linspace(c["beta_start"] ** 0.5, c["beta_end"] ** 0.5, T, dtype=np.float64).astype(dtype) ** 2


def alphas_cumprod_of(c, dtype=np.float64):
    return np.cumprod(dtype(1.0) - betas_of(c, dtype), dtype=dtype)


def spaced(c, n, euler):
    T = c["num_train_timesteps"]
    s = c["timestep_spacing"]
    if s == "linspace":
        t = np.linspace(0, T - 1, n)
        return (t.astype(np.float32) if euler else t.round().astype(np.int64))[::-1].copy()
    if s == "leading":
        ratio = T // n
        t = (np.arange(0, n) * ratio).round()[::-1].copy()
        return (t.astype(np.float32) if euler else t.astype(np.int64)) + c["steps_offset"]
    if s == "trailing":
        t = np.round(np.arange(T, 0, -T / n))[:n]  # numpy gives n + 1 values for some n: keep n
        return (t.astype(np.float32) if euler else t.astype(np.int64)) - 1
    raise ValueError(s)


def ddim_tables(c, n, dtype=np.float64):
    ac = alphas_cumprod_of(c, dtype)
    ts = spaced(c, n, euler=False)
    ratio = c["num_train_timesteps"] // n
    final = dtype(1.0) if c["set_alpha_to_one"] else ac[0]
    a_t = np.array([ac[t] for t in ts], dtype=np.float64)
    a_prev = np.array([ac[t - ratio] if t - ratio >= 0 else final for t in ts], dtype=np.float64)
    return ts, a_t, a_prev


def euler_tables(c, n, dtype=np.float64):
    ac = alphas_cumprod_of(c, dtype)
    ts = spaced(c, n, euler=True)
    full = np.sqrt((1 - ac) / ac).astype(np.float64)
    sig = np.concatenate([np.interp(ts.astype(np.float64), np.arange(0, len(full)), full), [0.0]]).astype(np.float32)
    mx = float(sig.max())
    init = mx if c["timestep_spacing"] in ("linspace", "trailing") else math.sqrt(mx * mx + 1)
    return ts, sig, init


def f32(x):
    return np.float32(x)


def ddim_step(c, a_t, a_prev, m, x):
    sa, sb = f32(math.sqrt(a_t)), f32(math.sqrt(1 - a_t))
    if c["prediction_type"] == "epsilon":
        x0, eps = (x - sb * m) / sa, m
    elif c["prediction_type"] == "sample":
        x0 = m
        eps = (x - sa * x0) / sb
    else:
        x0 = sa * x - sb * m
        eps = sa * m + sb * x
    if c["clip_sample"]:
        r = f32(c["clip_sample_range"])
        x0 = np.clip(x0, -r, r)
    return f32(math.sqrt(a_prev)) * x0 + f32(math.sqrt(1 - a_prev)) * eps


def euler_step(c, sigma, sigma_next, m, x):
    s = f32(sigma)
    s2p1 = s * s + f32(1)
    if c["prediction_type"] == "epsilon":
        x0 = x - s * m
    elif c["prediction_type"] == "sample":
        x0 = m
    else:
        x0 = m * f32(-s / np.sqrt(s2p1)) + x / s2p1
    d = (x - x0) / s
    return x + d * (f32(sigma_next) - s)


CASES = [  # (scheduler, overrides of SD, steps)
    ("ddim", {}, 20), ("ddim", {}, 10), ("ddim", {}, 50), ("ddim", {}, 1),
    ("ddim", {"timestep_spacing": "trailing", "steps_offset": 0}, 20),
    ("ddim", {"timestep_spacing": "trailing", "steps_offset": 0}, 16),
    ("ddim", {"timestep_spacing": "trailing", "steps_offset": 0}, 61),
    ("ddim", {"timestep_spacing": "linspace", "steps_offset": 0}, 20),
    ("ddim", {"timestep_spacing": "linspace", "steps_offset": 0}, 7),
    ("ddim", {"set_alpha_to_one": True}, 20),
    ("ddim", {"prediction_type": "v_prediction", "timestep_spacing": "trailing", "steps_offset": 0}, 25),
    ("ddim", {"prediction_type": "sample", "clip_sample": True, "clip_sample_range": 1.5}, 20),
    ("ddim", {"beta_schedule": "linear", "beta_start": 0.0001, "beta_end": 0.02, "steps_offset": 0}, 20),
    ("euler", {"timestep_spacing": "linspace", "steps_offset": 0}, 20),
    ("euler", {"timestep_spacing": "linspace", "steps_offset": 0}, 7),
    ("euler", {"timestep_spacing": "linspace", "steps_offset": 0}, 1),
    ("euler", {}, 20),
    ("euler", {"timestep_spacing": "trailing", "steps_offset": 0}, 30),
    ("euler", {"timestep_spacing": "trailing", "steps_offset": 0, "prediction_type": "v_prediction"}, 20),
    ("euler", {"prediction_type": "sample"}, 10),
    ("euler", {"beta_schedule": "linear", "beta_start": 0.0001, "beta_end": 0.02, "num_train_timesteps": 500,
               "timestep_spacing": "linspace", "steps_offset": 0}, 12),
]


def max_rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-30)))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=os.path.join(scenes.REPO, "tests", "data", "tiny_sd"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)

    # Fixed step inputs: seeded noise as the sample and the model output.
    x = P.seeded_noise(11, (1, 4, 4, 4)) * np.float32(3.0)
    m = P.seeded_noise(12, (1, 4, 4, 4))
    cases = []
    gap = {"alphas_cumprod": 0.0, "euler_sigmas": 0.0}
    for sched, over, n in CASES:
        c = dict(SD, type=sched, **over)
        case = {"config": c, "steps": n, "step_indices": sorted({0, n // 2, n - 1})}
        ac = alphas_cumprod_of(c)
        ac32 = alphas_cumprod_of(c, np.float32)
        gap["alphas_cumprod"] = max(gap["alphas_cumprod"], max_rel(ac32, ac))
        case["alphas_cumprod_probe"] = {str(i): float(ac[i]) for i in (0, 1, len(ac) // 2, len(ac) - 1)}
        outs = []
        if sched == "ddim":
            ts, a_t, a_prev = ddim_tables(c, n)
            case.update(timesteps=[float(t) for t in ts], alpha_t=a_t.tolist(), alpha_prev=a_prev.tolist(),
                        init_noise_sigma=1.0)
            for i in case["step_indices"]:
                outs.append(ddim_step(c, a_t[i], a_prev[i], m, x))
        else:
            ts, sig, init = euler_tables(c, n)
            _, sig32, _ = euler_tables(c, n, np.float32)
            gap["euler_sigmas"] = max(gap["euler_sigmas"], max_rel(sig32[:-1], sig[:-1]))
            case.update(timesteps=[float(t) for t in ts], sigmas=[float(s) for s in sig], init_noise_sigma=init,
                        model_input=[(x / f32(np.sqrt(sig[i] * sig[i] + f32(1)))).ravel().tolist()
                                     for i in case["step_indices"]])
            for i in case["step_indices"]:
                outs.append(euler_step(c, sig[i], sig[i + 1], m, x))
        case["step_outputs"] = [o.astype(np.float32).ravel().tolist() for o in outs]
        cases.append(case)
    doc = {"generator": "tools/make_scheduler_goldens.py", "sample": x.ravel().tolist(),
           "model_output": m.ravel().tolist(), "shape": list(x.shape), "diffusers_float32_gap": gap,
           "cases": cases}
    with open(os.path.join(a.out, "scheduler_goldens.json"), "w") as f:
        json.dump(doc, f, indent=None, separators=(",", ":"))
        f.write("\n")
    for seed in NOISE_SEEDS:
        np.save(os.path.join(a.out, "noise_seed%d.npy" % seed), P.seeded_noise(seed, NOISE_SHAPES[seed]))
    print("diffusers' float32 tables vs float64: max relative difference", gap)
    print("wrote %d cases and %d noise files to %s" % (len(cases), len(NOISE_SEEDS), a.out))


if __name__ == "__main__":
    main()
