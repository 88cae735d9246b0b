#!/usr/bin/python3
"""Trains tiny-sd (VAE, CLIP-style text encoder, UNet) on synthetic scenes; scores prompt following on prompts/tiny_eval.txt."""

# Usage (GPU machine, from the repository root; `python3` there is the one with PyTorch 2.x):
#   python3 tools/train_tiny_sd.py --out OUT --stage both --vae-seconds 150 --unet-seconds 330 --eval
#   python3 tools/train_tiny_sd.py --out OUT --stage unet --vae-ckpt .ckpt/vae.pt --resume .ckpt --unet-seconds 480 --eval
# CPU smoke test (Debian's torch 1.13): /usr/bin/python3 tools/train_tiny_sd.py --smoke --out /tmp/tsd
#
# Data: scenes 0..N-1 of the stream scenes.TRAIN_SEED (64x64, 1-3 objects; tools/scenes.py, generator
# version in the log), minus every scene whose caption is in prompts/tiny_eval.txt. Descriptions are
# drawn on the CPU; pixels are rasterised on the GPU by render_batch, which implements the
# generator's integer rules and is checked bit for bit against scenes.render_scene at start-up.
#
# Stage "vae": AutoencoderKL, loss = L1 + MSE of the reconstruction of a posterior sample +
# KL_WEIGHT * mean KL; the latent scaling factor is 1 / std of posterior samples (as SD's 0.18215).
# Stage "unet": text encoder and UNet trained together from scratch, DDPM epsilon prediction with
# SD's scaled-linear schedule (1000 steps, 0.00085..0.012), uniform timesteps, captions replaced by
# "" with probability CAPTION_DROPOUT (classifier-free guidance), AdamW, warm-up then cosine decay,
# gradient clipping, bf16 autocast, EMA of the weights (the EMA weights are what ships).
# A stage given a time budget measures its speed over the first steps and fixes its step count
# from it (the log and the model card record the count; --vae-steps/--unet-steps fix it instead).
#
# Writes to --out: vae.pt, text_ema.pt, unet_ema.pt (+ text_raw.pt, unet_raw.pt to resume),
# train_log.json (config, losses, step counts, timings, prompt-following scores and details),
# samples.png (the first 32 tiny_eval prompts, best evaluated setting); at most 8 files, as the GPU
# machine returns them.

import argparse
import importlib
import json
import math
import multiprocessing as mp
import os
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenes  # noqa: E402
import scene_check  # noqa: E402
import tiny_sd_model as M  # noqa: E402
import tiny_sd_pipeline as P  # noqa: E402
import train_tokenizer as T  # noqa: E402

KL_WEIGHT = 1e-4
CAPTION_DROPOUT = 0.1
SEED = 20261121
MAX_OBJECTS = 3

# ---------------------------------------------------------------- data


def _describe_chunk(job):
    seed, start, stop, exclude, tok_dir = job
    tok = T.ClipTokenizer.load(tok_dir) if tok_dir else None
    n = stop - start
    objs = np.zeros((n, MAX_OBJECTS, 6), dtype=np.int32)  # valid, shape, color, cx, cy, r
    style = np.zeros(n, dtype=np.int32)
    bg = np.zeros(n, dtype=np.int32)
    ids = np.zeros((n, tok.max_length if tok else 1), dtype=np.int32)
    keep = np.ones(n, dtype=bool)
    for k in range(n):
        d = scenes.describe_scene(seed, start + k)
        if d["caption"] in exclude:
            keep[k] = False
            continue
        style[k], bg[k] = d["style"], d["bg_color"]
        for i, o in enumerate(d["objects"]):
            objs[k, i] = (1, o["shape"], o["color"], o["cx"], o["cy"], o["r"])
        if tok:
            ids[k] = tok.encode(d["caption"])
    return objs[keep], style[keep], bg[keep], ids[keep], int((~keep).sum())


def describe_pool(n, exclude, tok_dir, workers, seed=scenes.TRAIN_SEED):
    """Scenes 0..n-1 of the stream `seed` minus captions in exclude: objs, style, bg, token ids, skipped."""
    chunk = max(1000, n // (4 * workers))
    jobs = [(seed, s, min(n, s + chunk), exclude, tok_dir) for s in range(0, n, chunk)]
    with mp.get_context("fork").Pool(workers) as pool:
        parts = pool.map(_describe_chunk, jobs)
    cat = [np.concatenate([p[i] for p in parts]) for i in range(4)]
    return cat + [sum(p[4] for p in parts)]


class SceneRenderer:
    """Rasterises scene descriptions on the device with the generator's integer rules."""

    def __init__(self, device, size=64):
        self.size, self.device = size, device
        k = scenes.SUB // 2
        s = torch.arange(size * k, device=device, dtype=torch.int64)
        self.coord = scenes.SUB * (s // k) + 2 * (s % k) + 1
        self.obj_rgb = torch.tensor(scenes.OBJECT_RGB, device=device, dtype=torch.int64)
        tones = [scenes.background_tones(c) for c in range(len(scenes.COLORS))]
        self.t0 = torch.tensor([t[0] for t in tones], device=device, dtype=torch.int64)
        self.t1 = torch.tensor([t[1] for t in tones], device=device, dtype=torch.int64)
        y = torch.arange(size, device=device)[:, None]
        x = torch.arange(size, device=device)[None, :]
        self.y = y
        self.stripe_even = (((x + y) // max(2, size // 10)) % 2 == 0)

    def inside(self, shape, dx, dy, r):
        ax, ay = dx.abs(), dy.abs()
        d2 = dx * dx + dy * dy
        ri = 3 * r // 5
        w = r // 3
        preds = torch.stack([
            d2 <= r * r,
            (ax <= r) & (ay <= r),
            (dy <= r) & (2 * ax <= dy + r),
            (d2 <= r * r) & (d2 >= ri * ri),
            ((ax <= w) & (ay <= r)) | ((ay <= w) & (ax <= r)),
            ax + ay <= r,
        ])
        return preds.gather(0, shape.view(1, -1, 1, 1).expand(1, *preds.shape[1:]))[0]

    def __call__(self, objs, style, bg):
        """objs int [B, 3, 6], style/bg int [B] -> uint8-valued int64 [B, 3, S, S], masks bool [B, 3, S, S]."""
        size, k = self.size, scenes.SUB // 2
        b = objs.shape[0]
        objs = objs.long()
        top = torch.full((b, size * k, size * k), -1, device=self.device, dtype=torch.int64)
        for i in range(objs.shape[1]):
            valid, shape, _, cx, cy, r = objs[:, i].unbind(-1)
            dx = self.coord[None, None, :] - cx[:, None, None]
            dy = self.coord[None, :, None] - cy[:, None, None]
            ins = self.inside(shape, dx, dy, r[:, None, None]) & (valid[:, None, None] > 0)
            top = torch.where(ins, torch.full_like(top, i), top)
        top = top.view(b, size, k, size, k)
        n_bg = (top == -1).sum(dim=(2, 4))
        t0 = self.t0[bg.long()][:, :, None, None]
        t1 = self.t1[bg.long()][:, :, None, None]
        plain = t0.expand(b, 3, size, size)
        grad = (t0 * (size - 1 - self.y) + t1 * self.y + (size - 1) // 2) // (size - 1)
        stripes = torch.where(self.stripe_even, t0, t1)
        st = style.long()[:, None, None, None]
        back = torch.where(st == 0, plain, torch.where(st == 1, grad, stripes))
        acc = back * n_bg[:, None]
        masks = []
        for i in range(objs.shape[1]):
            n_i = (top == i).sum(dim=(2, 4))
            acc = acc + self.obj_rgb[objs[:, i, 2]][:, :, None, None] * n_i[:, None]
            masks.append(2 * n_i >= scenes.SAMPLES)
        return (acc + scenes.SAMPLES // 2) // scenes.SAMPLES, torch.stack(masks, 1)


def check_renderer(renderer, objs, style, bg, count=48):
    got, masks = renderer(torch.as_tensor(objs[:count]).to(renderer.device), torch.as_tensor(style[:count]).to(renderer.device),
                          torch.as_tensor(bg[:count]).to(renderer.device))
    got, masks = got.cpu().numpy(), masks.cpu().numpy()
    for k in range(count):
        objects = [dict(shape=int(o[1]), color=int(o[2]), cx=int(o[3]), cy=int(o[4]), r=int(o[5]))
                   for o in objs[k] if o[0]]
        img, ref_masks = scenes.render_scene(dict(size=renderer.size, style=int(style[k]), bg_color=int(bg[k]),
                                                  objects=objects))
        if not (got[k].transpose(1, 2, 0) == img).all():
            raise SystemExit("GPU renderer differs from scenes.render_scene on pool scene %d" % k)
        if not all(((ref_masks[i] > 0) == masks[k, i]).all() for i in range(len(objects))):
            raise SystemExit("GPU renderer masks differ from scenes.render_scene on pool scene %d" % k)


# ---------------------------------------------------------------- training helpers


def lr_at(step, total, base, warmup):
    if step < warmup:
        return base * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


class StepBudget:
    """Fixed step count, or one set from the speed measured over steps [probe_from, probe_to)."""

    def __init__(self, steps, seconds, probe_from=100, probe_to=300):
        self.total = steps if steps else None
        self.seconds, self.probe_from, self.probe_to = seconds, probe_from, probe_to
        self.start = time.time()
        self.t_probe = None
        self.rate = None  # steps/s measured over [probe_from, probe_to)

    def estimate(self):
        return self.total if self.total else max(self.probe_to + 1, int(self.seconds * 30))  # provisional

    def update(self, step):
        if self.total is None and step == self.probe_from:
            self.t_probe = time.time()
        if self.total is None and step == self.probe_to:
            rate = (self.probe_to - self.probe_from) / (time.time() - self.t_probe)
            self.rate = round(rate, 2)
            remaining = self.seconds - (time.time() - self.start)
            self.total = step + max(1, int(remaining * rate * 0.97))
        return self.total is not None and step >= self.total


def ema_update(ema_params, params, decay):
    torch._foreach_mul_(ema_params, decay)
    torch._foreach_add_(ema_params, params, alpha=1.0 - decay)


def kl_mean(mean, logvar):
    return 0.5 * (mean.pow(2) + logvar.exp() - 1.0 - logvar).mean()


def psnr(a, b):
    mse = ((a.float() - b.float()) ** 2).mean().item()
    return 10 * math.log10(255.0 ** 2 / max(mse, 1e-12))


# ---------------------------------------------------------------- stages


def train_vae(args, data, renderer, device, log):
    torch.manual_seed(SEED)
    vae = M.AutoencoderKL(**M.VAE_CONFIG).to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(vae.parameters(), lr=args.vae_lr, betas=(0.9, 0.99), weight_decay=0.0)
    objs, style, bg = data["objs"], data["style"], data["bg"]
    n = objs.shape[0] - args.holdout
    g = torch.Generator(device=device).manual_seed(SEED + 1)
    budget = StepBudget(args.vae_steps, args.vae_seconds)
    amp = device.type == "cuda"
    losses, step = [], 0
    while True:
        idx = torch.randint(0, n, (args.batch,), device=device, generator=g)
        img, _ = renderer(objs[idx], style[idx], bg[idx])
        x = (img.float() / 127.5 - 1.0).contiguous(memory_format=torch.channels_last)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, budget.estimate(), args.vae_lr, 200)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            mean, logvar = vae.encode(x)
            z = mean + torch.exp(0.5 * logvar.float()) * torch.randn(mean.shape, device=device, generator=g)
            rec = vae.decode(z).float()
        kl = kl_mean(mean.float(), logvar.float())
        loss = F.l1_loss(rec, x) + F.mse_loss(rec, x) + KL_WEIGHT * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        losses.append((loss.item() if step % 50 == 0 else None, kl.item() if step % 50 == 0 else None))
        if step % 200 == 0:
            print("vae step %d loss %.5f kl %.3f lr %.2e %.0fs" % (step, loss.item(), kl.item(), opt.param_groups[0]["lr"],
                                                                 time.time() - budget.start), flush=True)
        step += 1
        if budget.update(step):
            break
    vae.eval()
    with torch.no_grad():
        idx = torch.arange(n, n + args.holdout, device=device)
        img, _ = renderer(objs[idx], style[idx], bg[idx])
        x = img.float() / 127.5 - 1.0
        mean, logvar = vae.encode(x)
        z = mean + torch.exp(0.5 * logvar) * torch.randn(mean.shape, device=device, generator=g)
        scaling = 1.0 / z.std().item()
        rec = torch.round(((vae.decode(mean) / 2 + 0.5).clamp(0, 1)) * 255)
        rec_sample = torch.round(((vae.decode(z) / 2 + 0.5).clamp(0, 1)) * 255)
        p_mean, p_sample = psnr(rec, img), psnr(rec_sample, img)
    tail = [l for l, _ in losses[-500:] if l is not None]
    log["vae"] = dict(steps=step, seconds=round(time.time() - budget.start, 1), batch=args.batch, lr=args.vae_lr,
                      kl_weight=KL_WEIGHT, final_loss=float(np.mean(tail)), scaling_factor=scaling,
                      holdout_psnr_db_mean=round(p_mean, 2), holdout_psnr_db_sample=round(p_sample, 2),
                      loss_curve=[l for l, _ in losses if l is not None])
    print("vae done: %d steps, loss %.5f, scaling %.5f, hold-out PSNR %.2f dB (mean) %.2f dB (sample)"
          % (step, log["vae"]["final_loss"], scaling, p_mean, p_sample), flush=True)
    torch.save({k: v.float().cpu() for k, v in vae.state_dict().items()}, os.path.join(args.out, "vae.pt"))
    return vae, scaling


def train_denoiser(args, data, renderer, vae, scaling, device, log, seed, params, ema_params, predict, predict_ema):
    """The denoising stage tiny-sd and tiny-sdxl share (the header's stage "unet"): trains params (text encoders
    and UNet) with EMA copies ema_params; fills log["unet"]. predict(zt, t, token_ids, drop) is the noise
    prediction of the trained networks under autocast (drop: bool [batch], the captions to drop);
    predict_ema(x, t, token_ids) the EMA networks' (validation)."""
    # Speed options (getattr: tiny-sd's command line has none of them; each off by default). At tiny widths a GPU
    # step is launch-bound (hundreds of small kernels), so they cut kernels, not FLOPs:
    #   cache_latents  the VAE posterior (mean, logvar) of every training scene computed once up front (the same
    #                  values the per-step render + encode gives: both deterministic), so a step launches no
    #                  renderer or VAE kernels; a fresh posterior sample is still drawn every step;
    #   compile        torch.compile(predict, mode=...) (PyTorch >= 2.0; "reduce-overhead" = CUDA graphs of the
    #                  forward and backward); the compile time is spent inside the stage's time budget;
    #   fused_adam     AdamW(fused=True) (PyTorch >= 2.0 on CUDA): one kernel per step for the update.
    cache = bool(getattr(args, "cache_latents", False))
    compile_mode = getattr(args, "compile", "none") or "none"
    fused = bool(getattr(args, "fused_adam", False)) and device.type == "cuda"
    decay_params = [p for p in params if p.ndim >= 2]
    other_params = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay_params, "weight_decay": 0.01}, {"params": other_params, "weight_decay": 0.0}],
                            lr=args.unet_lr, betas=(0.9, 0.99), **({"fused": True} if fused else {}))
    objs, style, bg, ids = data["objs"], data["style"], data["bg"], data["ids"]
    n = objs.shape[0] - args.holdout
    ac = torch.tensor(P.alphas_cumprod(), device=device, dtype=torch.float32)
    g = torch.Generator(device=device).manual_seed(seed + 3)
    amp = device.type == "cuda"
    warmup = int(getattr(args, "warmup", 0) or 0) or (200 if args.resume else 500)
    vae.eval()
    t_cache = time.time()
    if cache:
        means, logvars = [], []
        with torch.no_grad():
            for i in range(0, n, 2048):
                j = torch.arange(i, min(n, i + 2048), device=device)
                img, _ = renderer(objs[j], style[j], bg[j])
                x = (img.float() / 127.5 - 1.0).contiguous(memory_format=torch.channels_last)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                    mean, logvar = vae.encode(x)
                means.append(mean.float())
                logvars.append(logvar.float())
        means, stds = torch.cat(means), torch.exp(0.5 * torch.cat(logvars))
        print("cached the VAE posterior of %d scenes in %.1fs" % (n, time.time() - t_cache), flush=True)
    if compile_mode != "none":
        if not hasattr(torch, "compile"):
            raise SystemExit("--compile needs PyTorch >= 2.0 (this is %s)" % torch.__version__)
        # a compiler failure runs that code eagerly instead of stopping the run
        importlib.import_module("torch._dynamo").config.suppress_errors = True
        predict = torch.compile(predict, mode=None if compile_mode == "default" else compile_mode)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    budget = StepBudget(args.unet_steps, args.unet_seconds - (time.time() - t_cache))
    losses, step = [], 0
    while True:
        idx = torch.randint(0, n, (args.batch,), device=device, generator=g)
        with torch.no_grad():
            if cache:
                mean, std = means[idx], stds[idx]
            else:
                img, _ = renderer(objs[idx], style[idx], bg[idx])
                x = (img.float() / 127.5 - 1.0).contiguous(memory_format=torch.channels_last)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                    mean, logvar = vae.encode(x)
                mean, std = mean.float(), torch.exp(0.5 * logvar.float())
            z = (mean + std * torch.randn(mean.shape, device=device, generator=g)) * scaling
            tok_ids = ids[idx].long()
            drop = torch.rand(args.batch, device=device, generator=g) < CAPTION_DROPOUT
            t = torch.randint(0, P.NUM_TRAIN_TIMESTEPS, (args.batch,), device=device, generator=g)
            noise = torch.randn(z.shape, device=device, generator=g)
            a = ac[t][:, None, None, None]
            zt = (a.sqrt() * z + (1 - a).sqrt() * noise).contiguous(memory_format=torch.channels_last)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, budget.estimate(), args.unet_lr, warmup)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            pred = predict(zt, t, tok_ids, drop)
        loss = F.mse_loss(pred.float(), noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            ema_update(ema_params, params, min(args.ema, (1 + step) / (10 + step)))
        if step % 50 == 0:
            losses.append(loss.item())
        if step % 500 == 0:
            print("unet step %d loss %.5f lr %.2e %.0fs" % (step, loss.item(), opt.param_groups[0]["lr"],
                                                            time.time() - budget.start), flush=True)
        step += 1
        if budget.update(step):
            break
    # Validation loss of the EMA weights on held-out scenes at fixed timesteps.
    with torch.no_grad():
        gv = torch.Generator(device=device).manual_seed(seed + 4)
        idx = torch.arange(n, n + args.holdout, device=device)
        img, _ = renderer(objs[idx], style[idx], bg[idx])
        mean, logvar = vae.encode(img.float() / 127.5 - 1.0)
        z = (mean + torch.exp(0.5 * logvar) * torch.randn(mean.shape, device=device, generator=gv)) * scaling
        t = torch.linspace(0, 999, args.holdout, device=device).long()
        noise = torch.randn(z.shape, device=device, generator=gv)
        a = ac[t][:, None, None, None]
        val = F.mse_loss(predict_ema(a.sqrt() * z + (1 - a).sqrt() * noise, t, ids[idx].long()), noise).item()
    prev = log.get("unet", {})
    log["unet"] = dict(steps=step + prev.get("steps", 0), steps_this_run=step, resumed=bool(args.resume),
                       seconds=round(time.time() - budget.start, 1), batch=args.batch, lr=args.unet_lr,
                       warmup=warmup, cache_latents=cache, compile=compile_mode, fused_adam=fused,
                       cache_seconds=round(budget.start - t_cache, 1),
                       steps_per_second_after_probe=budget.rate, ema=args.ema, caption_dropout=CAPTION_DROPOUT,
                       final_loss=float(np.mean(losses[-10:])), holdout_loss_ema=val, loss_curve=losses)
    print("unet done: %d steps, loss %.5f (last 500 steps), EMA hold-out loss %.5f" % (step, log["unet"]["final_loss"], val),
          flush=True)


def train_unet(args, data, renderer, vae, scaling, device, log, tok):
    torch.manual_seed(SEED + 2)
    text = M.ClipTextModel(**M.TEXT_CONFIG).to(device)
    unet = M.UNet2DConditionModel(**M.UNET_CONFIG).to(device).to(memory_format=torch.channels_last)
    if args.resume:
        text.load_state_dict(torch.load(os.path.join(args.resume, "text_raw.pt"), map_location=device))
        unet.load_state_dict(torch.load(os.path.join(args.resume, "unet_raw.pt"), map_location=device))
    text_ema = M.ClipTextModel(**M.TEXT_CONFIG).to(device)
    unet_ema = M.UNet2DConditionModel(**M.UNET_CONFIG).to(device)
    if args.resume:
        text_ema.load_state_dict(torch.load(os.path.join(args.resume, "text_ema.pt"), map_location=device))
        unet_ema.load_state_dict(torch.load(os.path.join(args.resume, "unet_ema.pt"), map_location=device))
    else:
        text_ema.load_state_dict(text.state_dict())
        unet_ema.load_state_dict(unet.state_dict())
    sdpa = hasattr(F, "scaled_dot_product_attention") and device.type == "cuda"
    text.use_sdpa = unet.use_sdpa = text_ema.use_sdpa = unet_ema.use_sdpa = sdpa
    empty = torch.tensor(tok.encode(""), device=device, dtype=torch.int64)

    def predict(zt, t, tok_ids, drop):  # dropped captions become "" (tiny-sd's unconditional text)
        return unet(zt, t, text(torch.where(drop[:, None], empty[None], tok_ids)))

    train_denoiser(args, data, renderer, vae, scaling, device, log, SEED,
                   list(text.parameters()) + list(unet.parameters()),
                   list(text_ema.parameters()) + list(unet_ema.parameters()), predict,
                   lambda x, t, tok_ids: unet_ema(x, t, text_ema(tok_ids)))
    for name, m in (("text_ema", text_ema), ("unet_ema", unet_ema), ("text_raw", text), ("unet_raw", unet)):
        torch.save({k: v.float().cpu() for k, v in m.state_dict().items()}, os.path.join(args.out, name + ".pt"))
    return text_ema, unet_ema


def _score_job(job):
    img, cap = job
    return scene_check.check_image(img, cap)


def evaluate(args, text, unet, vae, scaling, tok, device, log):
    prompts = scenes.read_prompts(os.path.join(scenes.REPO, "prompts", "tiny_eval.txt"))
    if args.smoke:
        prompts = prompts[:4]
    text.eval()
    unet.eval()
    results = {}
    best = None
    for sched, steps, g in args.eval_settings:
        t0 = time.time()
        imgs = []
        for i in range(0, len(prompts), 64):
            chunk = prompts[i:i + 64]
            imgs.append(P.generate(text, unet, vae.decode, tok, chunk, list(range(i, i + len(chunk))), scaling,
                                   steps=steps, guidance=g, scheduler=sched, device=device))
        imgs = np.concatenate(imgs)
        with mp.get_context("fork").Pool(min(16, os.cpu_count() or 1)) as pool:
            res = pool.map(_score_job, list(zip(imgs, prompts)))
        per_obj = float(np.mean([ok for r in res for _, ok, _ in r]))
        per_prompt = float(np.mean([all(ok for _, ok, _ in r) for r in res]))
        by_count = {}
        for r in res:
            by_count.setdefault(len(r), []).extend(ok for _, ok, _ in r)
        key = "%s_%d_g%.1f" % (sched, steps, g)
        results[key] = dict(objects=per_obj, prompts=per_prompt, by_object_count={k: float(np.mean(v)) for k, v in
                                                                                   sorted(by_count.items())})
        print("eval %s: %.1f%% of objects, %.1f%% of prompts, by count %s (%.0fs)" % (
            key, 100 * per_obj, 100 * per_prompt, {k: round(100 * v, 1) for k, v in results[key]["by_object_count"].items()},
            time.time() - t0), flush=True)
        if best is None or per_obj > best[0]:
            best = (per_obj, key, imgs, res)
    log["eval"] = dict(prompts=len(prompts), seeds="prompt index", results=results, best=best[1])
    scenes.write_png(os.path.join(args.out, "samples.png"), P.grid(best[2][:32], 8))
    log["eval"]["details"] = [dict(prompt=p, objects=[dict(phrase=ph, ok=bool(ok), found=d) for ph, ok, d in r])
                              for p, r in zip(prompts, best[3])]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--stage", choices=["vae", "unet", "both", "eval"], default="both")
    ap.add_argument("--pool", type=int, default=400000, help="training scenes described up front")
    ap.add_argument("--holdout", type=int, default=512, help="pool scenes kept out of training for validation")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--vae-lr", type=float, default=1e-3)
    ap.add_argument("--unet-lr", type=float, default=4e-4)
    ap.add_argument("--ema", type=float, default=0.9995)
    ap.add_argument("--vae-steps", type=int, default=0)
    ap.add_argument("--vae-seconds", type=float, default=150)
    ap.add_argument("--unet-steps", type=int, default=0)
    ap.add_argument("--unet-seconds", type=float, default=330)
    ap.add_argument("--vae-ckpt", help="vae.pt for --stage unet/eval (with its scaling factor in train_log.json beside it)")
    ap.add_argument("--resume", help="folder with text/unet _raw and _ema .pt and train_log.json to continue from")
    ap.add_argument("--eval", action="store_true", help="score prompt following on prompts/tiny_eval.txt")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run to check the script")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    args = ap.parse_args()
    args.eval_settings = [("ddim", 20, 3.0), ("ddim", 20, 5.0), ("ddim", 20, 7.5), ("euler", 20, 5.0)]
    if args.smoke:
        args.pool, args.holdout, args.batch = 2000, 16, 8
        args.vae_steps, args.unet_steps = args.vae_steps or 45, args.unet_steps or 45
        args.eval_settings = [("ddim", 4, 5.0), ("euler", 4, 5.0)]
    os.makedirs(args.out, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    log = {}
    if args.resume and os.path.exists(os.path.join(args.resume, "train_log.json")):
        with open(os.path.join(args.resume, "train_log.json")) as f:
            log = json.load(f)
        log.setdefault("history", []).append({k: log.get(k) for k in ("unet", "eval") if k in log})
    log.update(generator_version=scenes.GENERATOR_VERSION, train_seed=scenes.TRAIN_SEED, seed=SEED,
               torch=torch.__version__, device=torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
               vae_config=M.VAE_CONFIG, text_config=M.TEXT_CONFIG, unet_config=M.UNET_CONFIG,
               schedule=dict(num_train_timesteps=P.NUM_TRAIN_TIMESTEPS, beta_start=P.BETA_START, beta_end=P.BETA_END,
                             beta_schedule="scaled_linear", prediction_type="epsilon"))
    print("torch %s on %s" % (torch.__version__, log["device"]), flush=True)

    tok_dir = os.path.join(tempfile.mkdtemp(prefix="tiny-sd-tok-"), "tokenizer")
    merges = T.learn_merges(T.training_corpus())
    T.write_tokenizer(tok_dir, merges, T.build_vocab(merges))
    tok = T.ClipTokenizer.load(tok_dir)
    assert len(tok.encoder) == M.TEXT_CONFIG["vocab_size"], len(tok.encoder)

    t0 = time.time()
    exclude = frozenset(scenes.read_prompts(os.path.join(scenes.REPO, "prompts", "tiny_eval.txt")))
    objs, style, bg, ids, skipped = describe_pool(args.pool, exclude, tok_dir, args.workers)
    log["data"] = dict(pool=args.pool, kept=int(objs.shape[0]), skipped_eval_captions=skipped, holdout=args.holdout,
                       describe_seconds=round(time.time() - t0, 1))
    print("described %d scenes (%d skipped: caption in tiny_eval) in %.1fs" % (objs.shape[0], skipped, time.time() - t0),
          flush=True)
    renderer = SceneRenderer(device)
    check_renderer(renderer, objs, style, bg)
    data = dict(objs=torch.as_tensor(objs).to(device), style=torch.as_tensor(style).to(device),
                bg=torch.as_tensor(bg).to(device), ids=torch.as_tensor(ids).to(device))

    if args.stage in ("vae", "both"):
        vae, scaling = train_vae(args, data, renderer, device, log)
    else:
        vae = M.AutoencoderKL(**M.VAE_CONFIG).to(device)
        vae.load_state_dict(torch.load(args.vae_ckpt, map_location=device))
        with open(os.path.join(os.path.dirname(args.vae_ckpt), "train_log.json")) as f:
            prev = json.load(f)
        log["vae"] = prev["vae"]
        scaling = prev["vae"]["scaling_factor"]
        vae.eval()
    if args.stage in ("unet", "both"):
        text, unet = train_unet(args, data, renderer, vae, scaling, device, log, tok)
    elif args.stage == "eval":
        text, unet = M.ClipTextModel(**M.TEXT_CONFIG).to(device), M.UNet2DConditionModel(**M.UNET_CONFIG).to(device)
        text.load_state_dict(torch.load(os.path.join(args.resume, "text_ema.pt"), map_location=device))
        unet.load_state_dict(torch.load(os.path.join(args.resume, "unet_ema.pt"), map_location=device))
    if args.eval and args.stage != "vae":
        evaluate(args, text, unet, vae, scaling, tok, device, log)
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(log, f, indent=1)
    print("total %.0fs" % (time.time() - t0), flush=True)


if __name__ == "__main__":
    main()
