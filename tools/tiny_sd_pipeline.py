#!/usr/bin/python3
"""tiny-sd's reference text-to-image pipeline in PyTorch: noise schedule, DDIM and Euler schedulers (diffusers' formulas), seeded initial noise, classifier-free guidance."""

# What the C++ pipeline (eval/, issue 4) is to reproduce, step for step:
#   schedule   betas = linspace(sqrt(0.00085), sqrt(0.012), 1000)^2 ("scaled_linear"), alphas_cumprod
#              = cumprod(1 - betas), all in float64; coefficients are rounded to float32 where they
#              meet a tensor.
#   DDIM       diffusers' DDIMScheduler, eta 0, set_alpha_to_one False (the final alpha is
#              alphas_cumprod[0]), steps_offset 1, "leading" spacing: t_i = (N-1-i) * (1000 // N) + 1;
#              x_prev = sqrt(a_prev) * x0 + sqrt(1 - a_prev) * eps, x0 = (x - sqrt(1 - a_t) eps) / sqrt(a_t).
#   Euler      diffusers' EulerDiscreteScheduler, "linspace" spacing: t = linspace(0, 999, N) reversed,
#              sigma = sqrt((1 - a) / a) interpolated at t, then 0 appended; init noise sigma =
#              sigma_max; model input x / sqrt(sigma^2 + 1); x += (sigma_next - sigma) * eps.
#   noise      seeded_noise(seed, shape): splitmix64 (tools/scenes.py) seeded with mix64(seed),
#              Box-Muller on pairs of 53-bit uniforms (u1 in (0, 1], u2 in [0, 1)): z0 = r cos(2 pi u2),
#              z1 = r sin(2 pi u2), r = sqrt(-2 ln u1), in float64 through the C library's log, cos,
#              sin, then rounded to float32; filled in row-major order.
#   guidance   eps = eps_uncond + g * (eps_text - eps_uncond), the unconditional text being "".
#   decode     image = vae_decoder(latent / scaling_factor); pixel = round(clamp(image / 2 + 0.5, 0, 1) * 255).

import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenes  # noqa: E402

NUM_TRAIN_TIMESTEPS = 1000
BETA_START, BETA_END = 0.00085, 0.012


def alphas_cumprod():
    betas = np.linspace(BETA_START ** 0.5, BETA_END ** 0.5, NUM_TRAIN_TIMESTEPS, dtype=np.float64) ** 2
    return np.cumprod(1.0 - betas)


def ddim_timesteps(num_steps, steps_offset=1):
    ratio = NUM_TRAIN_TIMESTEPS // num_steps
    return (np.arange(num_steps)[::-1] * ratio + steps_offset).astype(np.int64)


def euler_sigmas(num_steps):
    """(timesteps float64 [N], sigmas float64 [N + 1])."""
    ac = alphas_cumprod()
    sigmas = np.sqrt((1.0 - ac) / ac)
    t = np.linspace(0, NUM_TRAIN_TIMESTEPS - 1, num_steps, dtype=np.float64)[::-1].copy()
    s = np.interp(t, np.arange(NUM_TRAIN_TIMESTEPS), sigmas)
    return t, np.concatenate([s, [0.0]])


def seeded_noise(seed, shape):
    rng = scenes.SplitMix64(scenes.mix64(seed))
    n = int(np.prod(shape))
    out = np.empty(n + (n & 1), dtype=np.float64)
    for i in range(0, n, 2):
        u1 = ((rng.next() >> 11) + 1) * (1.0 / 9007199254740992.0)
        u2 = (rng.next() >> 11) * (1.0 / 9007199254740992.0)
        r = math.sqrt(-2.0 * math.log(u1))
        out[i] = r * math.cos(2.0 * math.pi * u2)
        out[i + 1] = r * math.sin(2.0 * math.pi * u2)
    return out[:n].astype(np.float32).reshape(shape)


def to_uint8(images):
    """[B, 3, H, W] on [-1, 1] -> uint8 [B, H, W, 3]."""
    x = (images.float() / 2 + 0.5).clamp(0, 1) * 255
    return torch.round(x).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


@torch.no_grad()
def generate(text_encoder, unet, vae_decode, tokenizer, prompts, seeds, scaling_factor, steps=20, guidance=5.0,
             scheduler="ddim", device="cpu", latent_shape=(4, 16, 16)):
    """uint8 [B, H, W, 3] images for prompts (one seed each)."""
    ids = torch.tensor([tokenizer.encode(p) for p in prompts] + [tokenizer.encode("")], device=device)
    ctx = text_encoder(ids).float()
    cond, uncond = ctx[:-1], ctx[-1:].expand(len(prompts), -1, -1)
    context = torch.cat([uncond, cond])
    x = torch.tensor(np.stack([seeded_noise(s, latent_shape) for s in seeds]), device=device)
    ac = alphas_cumprod()

    def eps_of(inp, t):
        tt = torch.full((2 * len(prompts),), float(t), device=device)
        e = unet(torch.cat([inp, inp]), tt, context).float()
        eu, ec = e.chunk(2)
        return eu + guidance * (ec - eu)

    if scheduler == "ddim":
        ts = ddim_timesteps(steps)
        ratio = NUM_TRAIN_TIMESTEPS // steps
        for t in ts:
            a_t = ac[t]
            a_prev = ac[t - ratio] if t - ratio >= 0 else ac[0]
            e = eps_of(x, t)
            x0 = (x - np.float32(math.sqrt(1 - a_t)) * e) / np.float32(math.sqrt(a_t))
            x = np.float32(math.sqrt(a_prev)) * x0 + np.float32(math.sqrt(1 - a_prev)) * e
    elif scheduler == "euler":
        ts, sig = euler_sigmas(steps)
        x = x * np.float32(sig[0])
        for i, t in enumerate(ts):
            e = eps_of(x / np.float32(math.sqrt(sig[i] ** 2 + 1)), t)
            x = x + np.float32(sig[i + 1] - sig[i]) * e
    else:
        raise ValueError(scheduler)
    return to_uint8(vae_decode(x / np.float32(scaling_factor)).float())


def grid(images, cols):
    """uint8 [B, H, W, 3] -> one uint8 image, cols per row, 2-pixel white gutters."""
    b, h, w, _ = images.shape
    rows = (b + cols - 1) // cols
    out = np.full((rows * (h + 2) + 2, cols * (w + 2) + 2, 3), 255, dtype=np.uint8)
    for i in range(b):
        r, c = divmod(i, cols)
        out[2 + r * (h + 2):2 + r * (h + 2) + h, 2 + c * (w + 2):2 + c * (w + 2) + w] = images[i]
    return out
