#!/usr/bin/python3
"""Writes benchmark inputs into a folder, one sub-folder per benchmark: the reference models
(tests/data/onnx/*) at realistic sizes and the shipped models as their pipelines call them."""

import os
import sys

import numpy as np

SIZES = {
    # benchmark: {input: shape}; the models' batch, spatial and sequence axes are dynamic.
    "unet_block": {"sample": (1, 64, 64, 64), "timestep_embedding": (1, 128), "encoder_hidden_states": (1, 8, 64)},
    "vae_decoder_block": {"latent_sample": (1, 4, 64, 64)},
    "vit_block": {"image": (8, 3, 32, 32)},
    "clip_text_layer": {"input_ids": (8, 16)},
    # tiny-sd as txt2img calls it: classifier-free guidance runs the text encoder and the UNet at
    # batch 2 (unconditional + conditional), the VAE decoder once per image.
    "tiny_sd_text_encoder": {"input_ids": (2, 77)},
    "tiny_sd_unet": {"sample": (2, 4, 16, 16), "timestep": (2,), "encoder_hidden_states": (2, 77, 128)},
    "tiny_sd_vae_decoder": {"latent_sample": (1, 4, 16, 16)},
    "tiny_sam_image_encoder": {"image": (1, 3, 64, 64)},
}


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(7)
    for model, inputs in SIZES.items():
        d = os.path.join(out, model)
        os.makedirs(d, exist_ok=True)
        for name, shape in inputs.items():
            if name == "input_ids":
                dtype = np.int32 if model.startswith("tiny_sd") else np.int64
                a = rng.integers(1, 60, size=shape).astype(dtype)
            elif name == "timestep":
                a = np.full(shape, 501.0, dtype=np.float32)
            else:
                a = rng.standard_normal(shape).astype(np.float32)
            np.save(os.path.join(d, name + ".npy"), a)


if __name__ == "__main__":
    main()
