#!/usr/bin/python3
"""Writes the PyTorch reference outputs the C++ SDXL pipeline is tested against: tiny-sdxl (a checkpoint or a seeded random init), two prompts, Euler, CFG."""

# Usage (from the repository root, Debian's Python with torch 1.13; about a minute on the CPU):
#   /usr/bin/python3 tools/make_tiny_sdxl_reference.py --ckpt OUT --out tests/data/tiny_sdxl      # the shipped model
#   /usr/bin/python3 tools/make_tiny_sdxl_reference.py --random-init 0 --out /work/xfer/tiny-sdxl-random/reference
#
# The modules are tools/export_tiny_sdxl.py's load() (the very weights its export writes; the VAE decoder with its
# FP16-overflow trunk scaling, as exported), the pipeline is tools/tiny_sdxl_pipeline.py (its header says every
# step). Writes, per reference K (REFERENCES below), float32 unless said:
#   ref<K>.json                prompt, negative prompt, seed, steps, guidance, input ids of both tokenizers (and of
#                              the negative prompt when encoded), timesteps, sigmas, init_noise_sigma, scaling factor
#   ref<K>_prompt_embeds.npy   [2, 77, 160]  encoder_hidden_states as the UNet gets it: [negative, prompt]
#   ref<K>_pooled.npy          [2, 96]       text_embeds as the UNet gets it: [negative, prompt]
#   ref<K>_time_ids.npy        [2, 6]        add_time_ids (64, 64, 0, 0, 64, 64) twice
#   ref<K>_noise.npy           [1, 4, 16, 16] seeded_noise(seed), before init_noise_sigma
#   ref<K>_latents.npy         [steps, 1, 4, 16, 16] the latent after each Euler step (the last is decoded)
#   ref<K>_noise_pred.npy      [steps, 1, 4, 16, 16] the guided noise prediction at each step
#   ref<K>_image.npy           [1, 3, 64, 64] the VAE decoder's output on [-1, 1]
#   ref<K>.png                 the 8-bit image
# and README.md (how the noise is drawn, what each file holds).

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_tiny_sdxl as E  # noqa: E402
import scene_check  # noqa: E402
import scenes  # noqa: E402
import tiny_sdxl_model as X  # noqa: E402
import tiny_sdxl_pipeline as P  # noqa: E402

REFERENCES = [  # (prompt, negative prompt ("" = none: zeros), seed, steps, guidance)
    ("a large green ring on the right on a gradient orange background", "", 7, 4, 5.0),
    ("a small red circle at the top left and a blue square in the center on a striped yellow background",
     "a purple cross at the bottom right on a plain white background", 3, 4, 5.0),
]

README = """# tiny-sdxl PyTorch references ({model})

Written by `tools/make_tiny_sdxl_reference.py {args}`: tools/tiny_sdxl_pipeline.py (diffusers'
StableDiffusionXLPipeline re-implemented: its header lists every step) on the weights of the
exported folder (the VAE decoder as exported, with its trunk scaled by k = {k:g} and force_upcast: run it in FP32).

| K | prompt | negative prompt | seed | steps | guidance |
|---|---|---|---|---|---|
{rows}

## Initial noise

`seeded_noise(seed, [1, 4, 16, 16])` of tools/tiny_sd_pipeline.py, the generator qeval's C++ pipeline already
reproduces bit for bit (eval/pipelines/noise.cc, `SeededNoise.BitIdenticalToThePythonReference`): splitmix64 seeded
with mix64(seed), Box-Muller on pairs of 53-bit uniforms (u1 in (0, 1], u2 in [0, 1)), z0 = r cos(2 pi u2),
z1 = r sin(2 pi u2), r = sqrt(-2 ln u1) in float64, rounded to float32, row-major. ref<K>_noise.npy holds it; the
first latent is noise * float32(init_noise_sigma) (Euler, "leading" spacing: sqrt(sigma_max^2 + 1)).

## Files (float32)

| file | shape | what |
|---|---|---|
| ref<K>.json | | prompt, negative prompt, seed, steps, guidance, input ids (tokenizer pads "<|endoftext|>", tokenizer_2 pads "!"), timesteps, sigmas, init_noise_sigma, scaling_factor |
| ref<K>_prompt_embeds.npy | [2, 77, {d12}] | encoder_hidden_states as the UNet gets it: [negative, prompt]; each = concat(hidden_states.2 of text_encoder ({d1}), hidden_states.2 of text_encoder_2 ({d2})) (the penultimate of 4 hidden states); an empty negative prompt gives zeros |
| ref<K>_pooled.npy | [2, {p2}] | text_embeds as the UNet gets it: [negative, prompt] (text_encoder_2's text_embeds; zeros for an empty negative prompt) |
| ref<K>_time_ids.npy | [2, 6] | (64, 64, 0, 0, 64, 64) for both halves |
| ref<K>_noise.npy | [1, 4, 16, 16] | the seeded noise, before init_noise_sigma |
| ref<K>_noise_pred.npy | [steps, 1, 4, 16, 16] | eps_neg + g (eps_text - eps_neg) at each step |
| ref<K>_latents.npy | [steps, 1, 4, 16, 16] | the latent after each Euler step; the last one / scaling_factor is the VAE's input |
| ref<K>_image.npy | [1, 3, 64, 64] | vae_decoder output on [-1, 1] |
| ref<K>.png | 64 x 64 | round(clamp(image / 2 + 0.5, 0, 1) * 255) |

The UNet's timestep input is a float32 0-d tensor (the timestep value, e.g. 751.0).
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ckpt", help="the checkpoint folder the shipped export came from (tools/export_tiny_sdxl.py)")
    src.add_argument("--random-init", type=int, metavar="SEED", help="the seeded random init (export --random-init)")
    ap.add_argument("--out", default=os.path.join(scenes.REPO, "tests", "data", "tiny_sdxl"))
    ap.add_argument("--size", choices=sorted(X.SIZES), default=None,
                    help="as tools/export_tiny_sdxl.py --size (the export's: a checkpoint's own when left out)")
    a = ap.parse_args()
    torch.set_num_threads(1)  # one summation order
    os.makedirs(a.out, exist_ok=True)
    log, vae, te, te2, unet, scaling = E.load(a.ckpt, a.random_init, a.size)
    probe = torch.from_numpy(np.stack([E.SD.seeded_noise(s, P.LATENT_SHAPE) for s in range(8)]) / np.float32(scaling))
    k = X.overflow_scale(vae, probe)  # as the export: the decoder the folder holds
    decoder = X.scale_decoder_trunk(vae, k)
    tok, tok2 = P.tokenizers(E.TOKENIZER_SRC)
    rows = []
    for n, (prompt, negative, seed, steps, guidance) in enumerate(REFERENCES):
        cap = {}
        img = P.generate(te, te2, unet, decoder.decode, tok, tok2, [prompt], [seed], scaling, steps=steps,
                         guidance=guidance, negative_prompts=[negative], capture=cap)
        for name in ("prompt_embeds", "pooled", "time_ids", "noise", "latents", "noise_pred", "image"):
            arr = cap[name].astype(np.float32)
            if name in ("latents", "noise_pred"):
                arr = arr[:, :1]  # [steps, 1, 4, 16, 16]
            np.save(os.path.join(a.out, "ref%d_%s.npy" % (n, name)), arr)
        scenes.write_png(os.path.join(a.out, "ref%d.png" % n), img[0])
        meta = {"prompt": prompt, "negative_prompt": negative, "seed": seed, "steps": steps,
                "guidance_scale": guidance, "scheduler": "EulerDiscreteScheduler", "timestep_spacing": "leading",
                "steps_offset": 1, "timesteps": [float(t) for t in cap["timesteps"]],
                "sigmas": [float(s) for s in cap["sigmas"]], "init_noise_sigma": cap["init_noise_sigma"],
                "scaling_factor": scaling, "vae_trunk_scale_k": k, "time_ids": P.add_time_ids().tolist(),
                "input_ids": tok.encode(prompt), "input_ids_2": tok2.encode(prompt),
                "size": X.SIZE, "model": ("random init, seed %d" % a.random_init) if a.ckpt is None else
                ("exported from %s" % os.path.basename(os.path.normpath(a.ckpt)))}
        if negative:
            meta.update(negative_input_ids=tok.encode(negative), negative_input_ids_2=tok2.encode(negative))
        with open(os.path.join(a.out, "ref%d.json" % n), "w") as f:
            json.dump(meta, f, indent=1)
            f.write("\n")
        rows.append("| %d | %s | %s | %d | %d | %.1f |" % (n, prompt, negative or "(none: zeros)", seed, steps, guidance))
        print("ref%d: %s | neg %r | seed %d -> objects drawn %s" % (
            n, prompt, negative, seed, [ok for _, ok, _ in scene_check.check_image(img[0], prompt)]), flush=True)
    args = ("--random-init %d" % a.random_init) if a.ckpt is None else "--ckpt %s" % a.ckpt
    if a.size:
        args += " --size %s" % a.size
    with open(os.path.join(a.out, "README.md"), "w") as f:
        f.write(README.format(model="random init" if a.ckpt is None else "trained", args=args, k=k,
                              rows="\n".join(rows), d1=X.TEXT_CONFIG["hidden_size"],
                              d2=X.TEXT2_CONFIG["hidden_size"],
                              d12=X.TEXT_CONFIG["hidden_size"] + X.TEXT2_CONFIG["hidden_size"],
                              p2=X.TEXT2_CONFIG["projection_dim"]))
    print("wrote %s" % a.out)


if __name__ == "__main__":
    main()
