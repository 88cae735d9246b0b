#!/usr/bin/python3
"""Writes larger benchmark inputs for the reference models (tests/data/onnx/*) into a folder: the same models at realistic spatial sizes."""

import os
import sys

import numpy as np

SIZES = {
    # model: {input: shape}; the models' spatial and sequence axes are dynamic.
    "unet_block": {"sample": (1, 64, 64, 64), "timestep_embedding": (1, 128), "encoder_hidden_states": (1, 8, 64)},
    "vae_decoder_block": {"latent_sample": (1, 4, 64, 64)},
    "vit_block": {"image": (8, 3, 32, 32)},
    "clip_text_layer": {"input_ids": (8, 16)},
}


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(7)
    for model, inputs in SIZES.items():
        d = os.path.join(out, model)
        os.makedirs(d, exist_ok=True)
        for name, shape in inputs.items():
            if name == "input_ids":
                a = rng.integers(1, 60, size=shape, dtype=np.int64)
            else:
                a = rng.standard_normal(shape).astype(np.float32)
            np.save(os.path.join(d, name + ".npy"), a)


if __name__ == "__main__":
    main()
