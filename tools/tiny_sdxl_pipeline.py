#!/usr/bin/python3
"""tiny-sdxl's reference text-to-image pipeline in PyTorch: diffusers' StableDiffusionXLPipeline (encode_prompt, text_time conditioning, CFG, Euler) on tools/tiny_sdxl_model.py's modules."""

# What the C++ SDXL pipeline is to reproduce, step for step (diffusers' pipeline_stable_diffusion_xl.py and
# scheduling_euler_discrete.py; the scheduler arithmetic is tools/make_scheduler_goldens.py's, which qeval's
# eval/pipelines/scheduler.cc already matches):
#   tokens       input_ids  = tokenizer.encode(prompt)   (pad "<|endoftext|>", 77 ids)
#                input_ids2 = tokenizer_2.encode(prompt) (pad "!", id 0; same vocabulary and merges)
#   embeddings   prompt_embeds = concat(last axis) of hidden_states[-2] of text_encoder (ids) and of text_encoder_2
#                (ids2): the penultimate layer's output, no final LayerNorm; [B, 77, 64 + 96].
#                pooled = text_encoder_2's text_embeds (projection of the final-LayerNorm state at the EOS token).
#   negative     force_zeros_for_empty_prompt: an empty (or absent) negative prompt gives zeros for both the
#                negative prompt_embeds and the negative pooled embedding; a non-empty one is encoded like the
#                prompt (both tokenizers). (diffusers zeroes only for negative_prompt=None; qeval's requests say
#                "" for none, read as None here.)
#   time_ids     original size + crop top-left + target size in (H, W) order = (64, 64, 0, 0, 64, 64) float32 for
#                both halves of the CFG batch (image size = unet sample_size 16 x VAE factor 4).
#   CFG batch    [negative, prompt] along the batch axis for encoder_hidden_states, text_embeds and time_ids; the
#                model input is the scaled latent twice; eps = eps_neg + g * (eps_text - eps_neg) in float32.
#   Euler        EulerDiscreteScheduler with SDXL's settings: scaled_linear 0.00085..0.012, 1000 steps, "leading"
#                spacing, steps_offset 1: t_i = (N-1-i) * (1000 // N) + 1; sigma = sqrt((1 - a) / a) at t_i
#                (float64 tables rounded to float32, then 0 appended); init_noise_sigma = sqrt(sigma_max^2 + 1)
#                (leading spacing); model input x / sqrt(sigma^2 + 1) (float32); timestep fed as a float32 0-d
#                tensor (Optimum's export); x += ((x - (x - sigma eps)) / sigma) * (sigma_next - sigma).
#   noise        tools/tiny_sd_pipeline.py's seeded_noise(seed, [1, 4, 16, 16]) (splitmix64 + Box-Muller, what
#                qeval's eval/pipelines/noise.cc reproduces bit for bit), times float32(init_noise_sigma).
#   decode       vae_decoder(latent / float32(scaling_factor)) in FP32 (force_upcast); pixels as tiny-sd's.

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_scheduler_goldens as S  # noqa: E402
import tiny_sd_pipeline as P  # noqa: E402
import tiny_sdxl_model as X  # noqa: E402
import train_tokenizer as T  # noqa: E402

# scheduler/scheduler_config.json of stabilityai/stable-diffusion-xl-base-1.0 (what the export writes).
SCHEDULER_CONFIG = {
    "_class_name": "EulerDiscreteScheduler", "_diffusers_version": "0.19.0.dev0", "beta_end": 0.012,
    "beta_schedule": "scaled_linear", "beta_start": 0.00085, "clip_sample": False, "interpolation_type": "linear",
    "num_train_timesteps": 1000, "prediction_type": "epsilon", "sample_max_value": 1.0, "set_alpha_to_one": False,
    "skip_prk_steps": True, "steps_offset": 1, "timestep_spacing": "leading", "trained_betas": None,
    "use_karras_sigmas": False,
}
SCHED = dict(S.SD, type="euler", timestep_spacing="leading", steps_offset=1)  # the same, as make_scheduler_goldens
PAD_2 = "!"  # SDXL's tokenizer_2 pads with "!" (OpenCLIP's pad id 0)
IMAGE_SIZE = X.SAMPLE_SIZE * 2 ** (len(X.VAE_CONFIG["block_out_channels"]) - 1)
LATENT_SHAPE = (4, X.SAMPLE_SIZE, X.SAMPLE_SIZE)


def tokenizers(folder):
    """(tokenizer, tokenizer_2) from a tokenizer folder (vocab.json + merges.txt): pads EOS and "!"."""
    return T.ClipTokenizer.load(folder), T.ClipTokenizer.load(folder, pad_token=PAD_2)


def add_time_ids(height=IMAGE_SIZE, width=IMAGE_SIZE):
    """diffusers' _get_add_time_ids with the defaults: original (H, W), crop (0, 0), target (H, W)."""
    return np.array([height, width, 0, 0, height, width], dtype=np.float32)


def euler_schedule(steps):
    """(timesteps float32 [N], sigmas float32 [N + 1], init_noise_sigma float64) of SDXL's Euler."""
    return S.euler_tables(SCHED, steps)


@torch.no_grad()
def encode(text, text2, tok, tok2, prompts, device="cpu"):
    """(prompt_embeds [B, 77, D1 + D2], pooled [B, P]) for prompts, as encode_prompt does for each one."""
    ids = torch.tensor([tok.encode(p) for p in prompts], device=device)
    ids2 = torch.tensor([tok2.encode(p) for p in prompts], device=device)
    emb, pooled = X.encode_prompt_embeds(text, text2, ids, ids2)
    return emb.float(), pooled.float()


@torch.no_grad()
def generate(text, text2, unet, vae_decode, tok, tok2, prompts, seeds, scaling_factor, steps=20, guidance=5.0,
             negative_prompts=None, device="cpu", capture=None):
    """uint8 [B, H, W, 3] images (one seed per prompt). capture (a dict) receives the reference tensors as numpy:
    prompt_embeds / pooled / time_ids as the UNet gets them ([negative, prompt] halves), noise, latents after each
    step, noise_pred per step, image (the decoder's float output) and the schedule."""
    b = len(prompts)
    cond, pooled = encode(text, text2, tok, tok2, prompts, device)
    negative_prompts = negative_prompts or [""] * b
    if all(n == "" for n in negative_prompts):  # force_zeros_for_empty_prompt
        neg, neg_pooled = torch.zeros_like(cond), torch.zeros_like(pooled)
    else:
        if any(n == "" for n in negative_prompts):
            raise ValueError("mixing empty and non-empty negative prompts in one batch is not supported")
        neg, neg_pooled = encode(text, text2, tok, tok2, negative_prompts, device)
    guided = guidance > 1.0  # diffusers' do_classifier_free_guidance
    context = torch.cat([neg, cond]) if guided else cond
    text_embeds = torch.cat([neg_pooled, pooled]) if guided else pooled
    time_ids = torch.tensor(np.stack([add_time_ids()] * context.shape[0]), device=device)
    ts, sig, init = euler_schedule(steps)
    noise = np.stack([P.seeded_noise(s, (1,) + LATENT_SHAPE)[0] for s in seeds])
    x = noise * np.float32(init)
    latents, preds = [], []
    for i, t in enumerate(ts):
        mi = x / np.float32(np.sqrt(sig[i] * sig[i] + np.float32(1)))
        mi = torch.from_numpy(np.concatenate([mi, mi]) if guided else mi).to(device)
        e = unet(mi, torch.tensor(np.float32(t), device=device), context, text_embeds, time_ids).float().cpu().numpy()
        if guided:
            eu, ec = e[:b], e[b:]
            e = eu + np.float32(guidance) * (ec - eu)
        x = S.euler_step(SCHED, sig[i], sig[i + 1], e, x).astype(np.float32)
        latents.append(x)
        preds.append(e)
    image = vae_decode(torch.from_numpy(x / np.float32(scaling_factor)).to(device)).float()
    if capture is not None:
        capture.update(prompt_embeds=context.cpu().numpy(), pooled=text_embeds.cpu().numpy(),
                       time_ids=time_ids.cpu().numpy(), noise=noise, latents=np.stack(latents),
                       noise_pred=np.stack(preds), image=image.cpu().numpy(), timesteps=ts, sigmas=sig,
                       init_noise_sigma=init)
    return P.to_uint8(image)


grid = P.grid
