#!/usr/bin/python3
"""Writes the PyTorch reference images the C++ txt2img pipeline is tested against (tiny-sd, same initial noise)."""

# Usage (from the repository root, Debian's Python with torch 1.13; ~1 min on CPU):
#   /usr/bin/python3 tools/make_tiny_sd_reference.py --ckpt .ckpt/run2 [--out tests/data/tiny_sd]
#
# --ckpt holds the checkpoints models/tiny-sd/ was exported from (tools/export_tiny_sd.py); the
# PyTorch modules computing the references are those of tools/tiny_sd_model.py, whose exports
# ONNX Runtime and qeval reproduce to ~1e-7 relative L2. The pipeline is tools/tiny_sd_pipeline.py
# (DDIM "leading" / Euler "linspace", CFG, seeded noise). Scheduler tables and the noise goldens
# are tools/make_scheduler_goldens.py's (numpy only). Writes, per reference K:
#   ref<K>.json       prompt, seed, scheduler, steps, guidance, token ids
#   ref<K>_noise.npy  the initial noise (seeded_noise(seed, [1, 4, 16, 16]), float32)
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

REFERENCES = [  # (prompt, seed, scheduler, steps, guidance)
    ("a large green ring on the right on a gradient orange background", 7, "ddim", 20, 5.0),
    ("a small red circle at the top left and a blue square in the center on a striped yellow background", 3,
     "euler", 20, 5.0),
    ("a small purple cross at the bottom left on a plain white background", 123, "ddim", 10, 7.5),
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

    for k, (prompt, seed, sched, steps, guidance) in enumerate(REFERENCES):
        captured = {}

        def decode(z):
            captured["latent"] = (z * np.float32(scaling)).numpy()
            img = vae.decode(z)
            captured["image"] = img.numpy()
            return img

        img = P.generate(text, unet, decode, tok, [prompt], [seed], scaling, steps=steps, guidance=guidance,
                         scheduler=sched)
        np.save(os.path.join(a.out, "ref%d_noise.npy" % k), P.seeded_noise(seed, (1, 4, 16, 16)))
        np.save(os.path.join(a.out, "ref%d_latent.npy" % k), captured["latent"].astype(np.float32))
        np.save(os.path.join(a.out, "ref%d_image.npy" % k), captured["image"].astype(np.float32))
        scenes.write_png(os.path.join(a.out, "ref%d.png" % k), img[0])
        with open(os.path.join(a.out, "ref%d.json" % k), "w") as f:
            spacing = {"ddim": ("leading", 1), "euler": ("linspace", 0)}[sched]  # tiny_sd_pipeline.py's
            json.dump({"prompt": prompt, "seed": seed, "scheduler": sched, "timestep_spacing": spacing[0],
                       "steps_offset": spacing[1], "steps": steps, "guidance_scale": guidance,
                       "negative_prompt": "", "scaling_factor": scaling, "input_ids": tok.encode(prompt),
                       "model": "models/tiny-sd (exported from %s)" % os.path.basename(os.path.normpath(a.ckpt))},
                      f, indent=1)
        print("ref%d: %s seed %d %s %d steps g %.1f -> %s" % (k, prompt, seed, sched, steps, guidance,
                                                              [ok for _, ok, _ in __import__("scene_check").check_image(img[0], prompt)]))
    print("wrote %s" % a.out)


if __name__ == "__main__":
    main()
