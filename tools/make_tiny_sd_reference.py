#!/usr/bin/python3
"""Writes the reference data the C++ txt2img pipeline is tested against: scheduler tables, seeded noise, and tiny-sd images from the PyTorch pipeline."""

# Usage (from the repository root, Debian's Python with torch 1.13):
#   /usr/bin/python3 tools/make_tiny_sd_reference.py --ckpt .ckpt/run2 [--out tests/data/tiny_sd]
#
# --ckpt holds the checkpoints models/tiny-sd/ was exported from (tools/export_tiny_sd.py); the
# PyTorch modules computing the references are those of tools/tiny_sd_model.py, whose exports
# ONNX Runtime and qeval reproduce to ~1e-7 relative L2. Writes:
#   schedulers.json   alphas_cumprod (1000, float64); per step count N in 10, 20, 50: DDIM ("leading",
#                     steps_offset 1) timesteps with alpha_t / alpha_prev, Euler ("linspace")
#                     timesteps, sigmas and init_noise_sigma (formulas: tools/tiny_sd_pipeline.py)
#   noise_seed<S>.npy seeded_noise(S, [1, 4, 16, 16]) for a few seeds, float32 (bit-exact target)
#   ref<K>.json       prompt, seed, scheduler, steps, guidance, token ids
#   ref<K>_latent.npy the final latent (before 1 / scaling_factor), float32 [1, 4, 16, 16]
#   ref<K>_image.npy  the VAE decoder's output, float32 [1, 3, 64, 64] on [-1, 1]
#   ref<K>.png        the 8-bit image (round(clamp(x / 2 + 0.5, 0, 1) * 255))

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_tiny_sd as E  # noqa: E402
import scenes  # noqa: E402
import tiny_sd_pipeline as P  # noqa: E402
import train_tokenizer as T  # noqa: E402

NOISE_SEEDS = [0, 1, 42, 2 ** 63 + 5]
REFERENCES = [  # (prompt, seed, scheduler, steps, guidance)
    ("a large green ring on the right on a gradient orange background", 7, "ddim", 20, 5.0),
    ("a small red circle at the top left and a blue square in the center on a striped yellow background", 3,
     "euler", 20, 5.0),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--out", default=os.path.join(scenes.REPO, "tests", "data", "tiny_sd"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    log, vae, text, unet = E.load(a.ckpt)
    tok = T.ClipTokenizer.load(os.path.join(scenes.REPO, "models", "tiny-sd", "tokenizer"))
    scaling = log["vae"]["scaling_factor"]

    ac = P.alphas_cumprod()
    tables = {"alphas_cumprod": ac.tolist(), "ddim": {}, "euler": {}}
    for n in (10, 20, 50):
        ts = P.ddim_timesteps(n)
        ratio = P.NUM_TRAIN_TIMESTEPS // n
        tables["ddim"][str(n)] = {"timesteps": ts.tolist(), "alpha_t": [ac[t] for t in ts],
                                  "alpha_prev": [ac[t - ratio] if t - ratio >= 0 else ac[0] for t in ts]}
        t, s = P.euler_sigmas(n)
        tables["euler"][str(n)] = {"timesteps": t.tolist(), "sigmas": s.tolist(), "init_noise_sigma": s[0]}
    with open(os.path.join(a.out, "schedulers.json"), "w") as f:
        json.dump(tables, f)
    for seed in NOISE_SEEDS:
        np.save(os.path.join(a.out, "noise_seed%d.npy" % seed), P.seeded_noise(seed, (1, 4, 16, 16)))

    for k, (prompt, seed, sched, steps, guidance) in enumerate(REFERENCES):
        captured = {}

        def decode(z):
            captured["latent"] = (z * np.float32(scaling)).numpy()
            img = vae.decode(z)
            captured["image"] = img.numpy()
            return img

        img = P.generate(text, unet, decode, tok, [prompt], [seed], scaling, steps=steps, guidance=guidance,
                         scheduler=sched)
        np.save(os.path.join(a.out, "ref%d_latent.npy" % k), captured["latent"].astype(np.float32))
        np.save(os.path.join(a.out, "ref%d_image.npy" % k), captured["image"].astype(np.float32))
        scenes.write_png(os.path.join(a.out, "ref%d.png" % k), img[0])
        with open(os.path.join(a.out, "ref%d.json" % k), "w") as f:
            json.dump({"prompt": prompt, "seed": seed, "scheduler": sched, "steps": steps, "guidance_scale": guidance,
                       "negative_prompt": "", "scaling_factor": scaling, "input_ids": tok.encode(prompt),
                       "model": "models/tiny-sd (exported from %s)" % os.path.basename(os.path.normpath(a.ckpt))},
                      f, indent=1)
        print("ref%d: %s seed %d %s %d steps g %.1f -> %s" % (k, prompt, seed, sched, steps, guidance,
                                                              [ok for _, ok, _ in __import__("scene_check").check_image(img[0], prompt)]))
    print("wrote %s" % a.out)


if __name__ == "__main__":
    main()
