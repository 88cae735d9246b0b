#!/usr/bin/python3
"""Trains tiny-sdxl (VAE, both text encoders, UNet) on the synthetic scenes of tiny-sd; scores prompt following on prompts/tiny_eval.txt."""

# Usage (GPU machine, from the repository root; `python3` there is the one with PyTorch 2.x):
#   python3 tools/train_tiny_sdxl.py --out OUT --vae-seconds 90 --unet-seconds 390 --eval   # ~9 min in all
#   python3 tools/train_tiny_sdxl.py --out OUT1 --stage vae --vae-seconds 120                   # or in two calls:
#   python3 tools/train_tiny_sdxl.py --out OUT2 --vae-ckpt OUT1/vae.pt --unet-seconds 480 --eval
# CPU smoke test (Debian's torch 1.13): /usr/bin/python3 tools/train_tiny_sdxl.py --smoke --out /tmp/tsx
# Continuing a run (models/tiny-sdxl/MODEL_CARD.md's reproduce section has the command that shipped): --resume CKPT
# --vae-ckpt CKPT/vae.pt, with the speed options of a launch-bound GPU step (tools/train_tiny_sd.py train_denoiser):
# --cache-latents, --compile reduce-overhead (CUDA graphs), --fused-adam, and a larger --batch with a scaled --unet-lr.
#
# tiny-sd's recipe (tools/train_tiny_sd.py, whose data, renderer, VAE stage and helpers this imports): scenes
# 0..N-1 of scenes.TRAIN_SEED minus the captions of prompts/tiny_eval.txt, rasterised on the GPU (checked bit for
# bit against tools/scenes.py at start-up); the VAE stage is tiny-sd's (same structure, same loss; latent scaling
# factor = 1 / std of posterior samples). Then text_encoder, text_encoder_2 and the UNet are trained together from
# scratch: DDPM epsilon prediction with SDXL's (= SD's) scaled-linear schedule, uniform timesteps, AdamW, warm-up
# then cosine decay, gradient clipping, bf16 autocast, EMA of the weights (the EMA weights ship). SDXL specifics:
#   - context = concat(hidden_states[-2] of both encoders), pooled = text_encoder_2's text_embeds
#     (tools/tiny_sdxl_model.py encode_prompt_embeds), as tools/tiny_sdxl_pipeline.py uses them;
#   - caption dropout: with probability 0.1 (train_tiny_sd.CAPTION_DROPOUT) both the context and the pooled embedding are ZEROS,
#     which is what the pipeline gives the unconditional half (force_zeros_for_empty_prompt);
#   - time_ids are the constant (64, 64, 0, 0, 64, 64) (64x64 images, no crop), as at inference;
#   - tokenizer_2 pads with "!" (id 0): its ids are tokenizer's with every pad after the EOS set to 0.
# A stage given a time budget measures its speed over its first steps and fixes its step count from it.
#
# Writes to --out (7 files): vae.pt, text_ema.pt, text2_ema.pt, unet_ema.pt (what tools/export_tiny_sdxl.py
# reads), raw.pt (the non-EMA weights, for --resume), train_log.json (config, losses, step counts, timings,
# prompt-following scores and per-prompt details), samples.png (the first 32 tiny_eval prompts, best setting).

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenes  # noqa: E402
import tiny_sd_model as M  # noqa: E402
import tiny_sd_pipeline as SDP  # noqa: E402
import tiny_sdxl_model as X  # noqa: E402
import tiny_sdxl_pipeline as P  # noqa: E402
import train_tiny_sd as TSD  # noqa: E402

SEED = 20261127
TOKENIZER_DIR = os.path.join(scenes.REPO, "models", "tiny-sd", "tokenizer")


def ids_for_tokenizer_2(ids, eos_id):
    """tokenizer_2's ids from tokenizer's: the same up to the first EOS, then "!" (id 0) instead of EOS padding."""
    first = (ids == eos_id).int().argmax(dim=-1)
    pos = torch.arange(ids.shape[1], device=ids.device)
    return torch.where(pos[None, :] > first[:, None], torch.zeros_like(ids), ids)


def build_text_unet(device):
    te = X.ClipTextModel(**X.TEXT_CONFIG).to(device)
    te2 = X.ClipTextModelWithProjection(**X.TEXT2_CONFIG).to(device)
    unet = X.SdxlUNet(**X.UNET_CONFIG).to(device)
    return te, te2, unet


def train_unet(args, data, renderer, vae, scaling, device, log, tok):
    torch.manual_seed(SEED + 2)
    te, te2, unet = build_text_unet(device)
    unet = unet.to(memory_format=torch.channels_last)
    te_ema, te2_ema, unet_ema = build_text_unet(device)
    if args.resume:
        raw = torch.load(os.path.join(args.resume, "raw.pt"), map_location=device)
        te.load_state_dict(raw["text"])
        te2.load_state_dict(raw["text2"])
        unet.load_state_dict(raw["unet"])
        for m, f in ((te_ema, "text_ema.pt"), (te2_ema, "text2_ema.pt"), (unet_ema, "unet_ema.pt")):
            m.load_state_dict(torch.load(os.path.join(args.resume, f), map_location=device))
    else:
        for e, m in ((te_ema, te), (te2_ema, te2), (unet_ema, unet)):
            e.load_state_dict(m.state_dict())
    sdpa = hasattr(F, "scaled_dot_product_attention") and device.type == "cuda"
    for m in (te, te2, unet, te_ema, te2_ema, unet_ema):
        m.use_sdpa = sdpa
    time_ids = torch.tensor(P.add_time_ids(), device=device)[None]

    def predict(zt, t, tok_ids, drop):  # dropped captions: zero context and pooled, as the unconditional half
        ctx, pooled = X.encode_prompt_embeds(te, te2, tok_ids, ids_for_tokenizer_2(tok_ids, tok.eos_id))
        keep = (~drop).to(ctx.dtype)
        return unet(zt, t, ctx * keep[:, None, None], pooled * keep.to(pooled.dtype)[:, None],
                    time_ids.expand(zt.shape[0], 6))

    def predict_ema(x, t, tok_ids):
        ctx, pooled = X.encode_prompt_embeds(te_ema, te2_ema, tok_ids, ids_for_tokenizer_2(tok_ids, tok.eos_id))
        return unet_ema(x, t, ctx, pooled, time_ids.expand(x.shape[0], 6))

    TSD.train_denoiser(args, data, renderer, vae, scaling, device, log, SEED,
                       list(te.parameters()) + list(te2.parameters()) + list(unet.parameters()),
                       list(te_ema.parameters()) + list(te2_ema.parameters()) + list(unet_ema.parameters()),
                       predict, predict_ema)
    log["unet"]["caption_dropout_to"] = "zeros (context and pooled)"
    for name, m in (("text_ema", te_ema), ("text2_ema", te2_ema), ("unet_ema", unet_ema)):
        torch.save({k: v.float().cpu() for k, v in m.state_dict().items()}, os.path.join(args.out, name + ".pt"))
    torch.save({name: {k: v.float().cpu() for k, v in m.state_dict().items()}
                for name, m in (("text", te), ("text2", te2), ("unet", unet))}, os.path.join(args.out, "raw.pt"))
    return te_ema, te2_ema, unet_ema


def evaluate(args, te, te2, unet, vae, scaling, device, log):
    prompts = scenes.read_prompts(os.path.join(scenes.REPO, "prompts", "tiny_eval.txt"))
    if args.smoke:
        prompts = prompts[:4]
    tok, tok2 = P.tokenizers(TOKENIZER_DIR)
    for m in (te, te2, unet):
        m.eval()
    results, best = {}, None
    for steps, g in args.eval_settings:
        t0 = time.time()
        imgs = []
        for i in range(0, len(prompts), 64):
            chunk = prompts[i:i + 64]
            imgs.append(P.generate(te, te2, unet, vae.decode, tok, tok2, chunk, list(range(i, i + len(chunk))),
                                   scaling, steps=steps, guidance=g, device=device))
        imgs = np.concatenate(imgs)
        with mp.get_context("fork").Pool(min(16, os.cpu_count() or 1)) as pool:
            res = pool.map(TSD._score_job, list(zip(imgs, prompts)))
        per_obj = float(np.mean([ok for r in res for _, ok, _ in r]))
        per_prompt = float(np.mean([all(ok for _, ok, _ in r) for r in res]))
        by_count = {}
        for r in res:
            by_count.setdefault(len(r), []).extend(ok for _, ok, _ in r)
        key = "euler_%d_g%.1f" % (steps, g)
        results[key] = dict(objects=per_obj, prompts=per_prompt,
                            by_object_count={k: float(np.mean(v)) for k, v in sorted(by_count.items())})
        print("eval %s: objects drawn %.1f%%, prompts complete %.1f%%, by count %s (%.0fs)" % (
            key, 100 * per_obj, 100 * per_prompt,
            {k: round(100 * v, 1) for k, v in results[key]["by_object_count"].items()}, time.time() - t0), flush=True)
        if best is None or per_obj > best[0]:
            best = (per_obj, key, imgs, res)
    log["eval"] = dict(prompts=len(prompts), seeds="prompt index", negative_prompt="none (zeros)",
                       results=results, best=best[1])
    scenes.write_png(os.path.join(args.out, "samples.png"), P.grid(best[2][:32], 8))
    log["eval"]["details"] = [dict(prompt=p, objects=[dict(phrase=ph, ok=bool(ok), found=d) for ph, ok, d in r])
                              for p, r in zip(prompts, best[3])]
    print("OBJECTS DRAWN (best setting %s): %.1f%%" % (best[1], 100 * best[0]), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--stage", choices=["all", "vae"], default="all",
                    help="vae: train the VAE only (vae.pt + train_log.json), for a later --vae-ckpt call")
    ap.add_argument("--pool", type=int, default=400000, help="training scenes described up front")
    ap.add_argument("--holdout", type=int, default=512, help="pool scenes kept out of training for validation")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--vae-lr", type=float, default=1e-3)
    ap.add_argument("--unet-lr", type=float, default=4e-4)
    ap.add_argument("--ema", type=float, default=0.9995)
    ap.add_argument("--vae-steps", type=int, default=0)
    ap.add_argument("--vae-seconds", type=float, default=90)
    ap.add_argument("--vae-batch", type=int, default=256, help="the VAE stage's batch (tiny-sd's)")
    ap.add_argument("--unet-steps", type=int, default=0)
    ap.add_argument("--unet-seconds", type=float, default=390)
    ap.add_argument("--vae-ckpt", help="reuse this vae.pt (train_log.json beside it gives its scaling factor); a "
                                       "tiny-sd VAE checkpoint works: the structure is the same")
    ap.add_argument("--resume", help="folder with raw.pt, *_ema.pt and train_log.json to continue from")
    ap.add_argument("--warmup", type=int, default=0, help="learning-rate warm-up steps (0: 500, or 200 with --resume)")
    ap.add_argument("--cache-latents", action="store_true",
                    help="encode every training scene with the VAE once before the UNet stage (a step then runs no "
                         "renderer or VAE kernels; about 1.6 GB of GPU memory per 100k scenes)")
    ap.add_argument("--compile", choices=["none", "default", "reduce-overhead", "max-autotune-no-cudagraphs"],
                    default="none", help="torch.compile the text encoders + UNet step (PyTorch >= 2.0; "
                                         "reduce-overhead: CUDA graphs, for launch-bound tiny widths)")
    ap.add_argument("--fused-adam", action="store_true", help="AdamW(fused=True) (PyTorch >= 2.0, CUDA)")
    ap.add_argument("--eval", action="store_true", help="score prompt following on prompts/tiny_eval.txt")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run to check the script")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    args = ap.parse_args()
    args.eval_settings = [(20, 5.0), (20, 7.5), (30, 5.0)]
    if args.compile != "none" and not hasattr(torch, "compile"):
        raise SystemExit("--compile needs PyTorch >= 2.0 (this is %s)" % torch.__version__)
    if args.smoke:
        args.pool, args.holdout, args.batch, args.vae_batch = 2000, 16, 8, 8
        args.vae_steps, args.unet_steps = args.vae_steps or 30, args.unet_steps or 30
        args.eval_settings = [(4, 5.0)]
    os.makedirs(args.out, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    log = {}
    if args.resume and os.path.exists(os.path.join(args.resume, "train_log.json")):
        with open(os.path.join(args.resume, "train_log.json")) as f:
            log = json.load(f)
        log.setdefault("history", []).append({k: log.get(k) for k in ("unet", "eval") if k in log})
    log.update(generator_version=scenes.GENERATOR_VERSION, train_seed=scenes.TRAIN_SEED, seed=SEED,
               torch=torch.__version__, device=torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
               command=" ".join(sys.argv), size=X.SIZE, vae_config=X.VAE_CONFIG, text_config=X.TEXT_CONFIG,
               text2_config=X.TEXT2_CONFIG, unet_config=X.UNET_CONFIG,
               schedule=dict(num_train_timesteps=SDP.NUM_TRAIN_TIMESTEPS, beta_start=SDP.BETA_START,
                             beta_end=SDP.BETA_END, beta_schedule="scaled_linear", prediction_type="epsilon"))
    print("torch %s on %s" % (torch.__version__, log["device"]), flush=True)
    t_start = time.time()
    tok, tok2 = P.tokenizers(TOKENIZER_DIR)
    for c in ("a small red circle at the top left and a blue square in the center on a plain white background", ""):
        got = ids_for_tokenizer_2(torch.tensor([tok.encode(c)]), tok.eos_id)[0].tolist()
        if got != tok2.encode(c):
            raise SystemExit("tokenizer_2 ids derived from tokenizer's differ for %r" % c)

    exclude = frozenset(scenes.read_prompts(os.path.join(scenes.REPO, "prompts", "tiny_eval.txt")))
    objs, style, bg, ids, skipped = TSD.describe_pool(args.pool, exclude, TOKENIZER_DIR, args.workers)
    log["data"] = dict(pool=args.pool, kept=int(objs.shape[0]), skipped_eval_captions=skipped, holdout=args.holdout,
                       describe_seconds=round(time.time() - t_start, 1))
    print("described %d scenes (%d skipped: caption in tiny_eval) in %.1fs" % (objs.shape[0], skipped,
                                                                               time.time() - t_start), flush=True)
    renderer = TSD.SceneRenderer(device)
    TSD.check_renderer(renderer, objs, style, bg)
    data = dict(objs=torch.as_tensor(objs).to(device), style=torch.as_tensor(style).to(device),
                bg=torch.as_tensor(bg).to(device), ids=torch.as_tensor(ids).to(device))

    if args.vae_ckpt:
        vae = M.AutoencoderKL(**X.VAE_CONFIG).to(device)
        vae.load_state_dict(torch.load(args.vae_ckpt, map_location=device))
        with open(os.path.join(os.path.dirname(args.vae_ckpt), "train_log.json")) as f:
            log["vae"] = dict(json.load(f)["vae"], reused_from=args.vae_ckpt)
        scaling = log["vae"]["scaling_factor"]
        if os.path.abspath(os.path.dirname(args.vae_ckpt)) != os.path.abspath(args.out):
            torch.save({k: v.float().cpu() for k, v in vae.state_dict().items()}, os.path.join(args.out, "vae.pt"))
    else:
        unet_batch, args.batch = args.batch, args.vae_batch  # train_tiny_sd's VAE stage reads args.batch
        vae, scaling = TSD.train_vae(args, data, renderer, device, log)
        args.batch = unet_batch
    vae.eval()
    if args.stage == "vae":
        log["total_seconds"] = round(time.time() - t_start, 1)
        with open(os.path.join(args.out, "train_log.json"), "w") as f:
            json.dump(log, f, indent=1)
        return
    te, te2, unet = train_unet(args, data, renderer, vae, scaling, device, log, tok)
    if args.eval:
        evaluate(args, te, te2, unet, vae, scaling, device, log)
    log["total_seconds"] = round(time.time() - t_start, 1)
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(log, f, indent=1)
    print("total %.0fs" % (time.time() - t_start), flush=True)


if __name__ == "__main__":
    main()
