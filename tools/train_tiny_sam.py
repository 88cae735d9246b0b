#!/usr/bin/python3
"""Trains tiny-sam (EfficientViT-SAM-structured encoder, SAM prompt encoder and mask decoder) to segment the scene object under a point; reports held-out mIoU."""

# Usage (GPU machine, from the repository root):
#   python3 tools/train_tiny_sam.py --out OUT --seconds 300
# CPU smoke test (Debian's torch 1.13): /usr/bin/python3 tools/train_tiny_sam.py --smoke --out /tmp/tsam
#
# Data: scenes of the stream scenes.TRAIN_SEED (64x64, 1-3 objects), rasterised on the GPU by
# train_tiny_sd.SceneRenderer (checked bit for bit against tools/scenes.py). Each sample picks one
# visible object; the prompt is a positive point on a random pixel of its mask, then, with
# probability NEGATIVE_POINT, a negative point on a random pixel off the mask (else a padding
# point), then a padding point (label -1, as SAM's ONNX usage appends). Target: the object's mask.
# Loss: BCE + dice on the single-mask output (token 0) plus the smallest BCE + dice among the three
# multimask outputs (SAM trains the best of the three), plus the MSE of the IoU head against the
# masks' actual IoUs. AdamW, warm-up then cosine decay, bf16 autocast, EMA of the weights.
#
# Evaluation: scenes 0..EVAL_SCENES-1 of the stream EVAL_SEED (never trained on), every visible
# object prompted by one positive point at scenes.object_points (its mask pixel nearest the mask's
# centroid) plus a padding point; mIoU of mask 0 thresholded at logit 0.
#
# Writes to --out: image_encoder.pt, mask_decoder.pt (EMA weights), train_log.json.

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenes  # noqa: E402
import tiny_sam_model as S  # noqa: E402
import train_tiny_sd as TSD  # noqa: E402

SEED = 20261122
EVAL_SEED = 0x5EED5A
EVAL_SCENES = 500
NEGATIVE_POINT = 0.5


def sample_prompts(masks, objs, g):
    """masks bool [B, 3, S, S] -> (target bool [B, S, S], coords float [B, 3, 2], labels float [B, 3])."""
    b, _, size, _ = masks.shape
    area = masks.flatten(2).sum(-1).float()                       # [B, 3]
    pick = torch.multinomial((area > 0).float() + 1e-9 * (area == 0).all(1, keepdim=True).float(), 1, generator=g)[:, 0]
    target = masks[torch.arange(b, device=masks.device), pick]    # [B, S, S]
    flat = target.flatten(1).float()
    pos = torch.multinomial(flat + 1e-9, 1, generator=g)[:, 0]
    neg = torch.multinomial((1 - flat) + 1e-9, 1, generator=g)[:, 0]
    coords = torch.zeros(b, 3, 2, device=masks.device)
    labels = torch.full((b, 3), -1.0, device=masks.device)
    coords[:, 0, 0], coords[:, 0, 1], labels[:, 0] = (pos % size).float(), (pos // size).float(), 1.0
    use_neg = torch.rand(b, device=masks.device, generator=g) < NEGATIVE_POINT
    coords[:, 1, 0] = torch.where(use_neg, (neg % size).float(), torch.zeros_like(coords[:, 1, 0]))
    coords[:, 1, 1] = torch.where(use_neg, (neg // size).float(), torch.zeros_like(coords[:, 1, 1]))
    labels[:, 1] = torch.where(use_neg, torch.zeros_like(labels[:, 1]), labels[:, 1])
    return target, coords, labels


def mask_losses(logits, target):
    """Per sample and mask: BCE + dice. logits [B, M, S, S], target bool [B, S, S] -> [B, M]."""
    t = target[:, None].float().expand_as(logits)
    bce = F.binary_cross_entropy_with_logits(logits, t, reduction="none").mean(dim=(2, 3))
    p = torch.sigmoid(logits)
    dice = 1 - (2 * (p * t).sum(dim=(2, 3)) + 1) / (p.sum(dim=(2, 3)) + t.sum(dim=(2, 3)) + 1)
    return bce + dice


def iou_of(logits, target):
    pred = logits > 0
    t = target[:, None].expand_as(pred)
    inter = (pred & t).flatten(2).sum(-1).float()
    union = (pred | t).flatten(2).sum(-1).float()
    return inter / union.clamp(min=1)


def eval_set(count):
    """The held-out point-prompt set: (images uint8 [N, S, S, 3], masks bool [N, S, S], points [N, 2])."""
    imgs, masks, points = [], [], []
    for i in range(count):
        s = scenes.generate_scene(EVAL_SEED, i)
        for m, p in zip(s["masks"], scenes.object_points(s["masks"])):
            if p[0] < 0:
                continue
            imgs.append(s["image"])
            masks.append(m > 0)
            points.append(p)
    return np.stack(imgs), np.stack(masks), np.array(points, dtype=np.float32)


@torch.no_grad()
def evaluate(encoder, decoder, imgs, masks, points, device, batch=256):
    encoder.eval()
    decoder.eval()
    ious, best_ious = [], []
    for i in range(0, len(imgs), batch):
        x = S.normalise(torch.as_tensor(imgs[i:i + batch]).to(device).permute(0, 3, 1, 2))
        n = x.shape[0]
        coords = torch.zeros(n, 2, 2, device=device)
        coords[:, 0] = torch.as_tensor(points[i:i + batch]).to(device)
        labels = torch.tensor([[1.0, -1.0]], device=device).expand(n, 2)
        logits, iou_pred = decoder(encoder(x), coords, labels)
        t = torch.as_tensor(masks[i:i + batch]).to(device)
        iou = iou_of(logits.float(), t)
        ious.append(iou[:, 0].cpu())
        best_ious.append(iou[torch.arange(n), 1 + iou_pred[:, 1:].argmax(1)].cpu())
    return float(torch.cat(ious).mean()), float(torch.cat(best_ious).mean())


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--pool", type=int, default=400000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--ema", type=float, default=0.999)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    args = ap.parse_args()
    eval_scenes = EVAL_SCENES
    if args.smoke:
        args.pool, args.batch, args.steps, eval_scenes = 2000, 8, args.steps or 20, 10
    os.makedirs(args.out, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t_start = time.time()
    objs, style, bg, _, _ = TSD.describe_pool(args.pool, frozenset(), None, args.workers)
    renderer = TSD.SceneRenderer(device)
    TSD.check_renderer(renderer, objs, style, bg)
    objs_t, style_t, bg_t = (torch.as_tensor(a).to(device) for a in (objs, style, bg))
    ev_imgs, ev_masks, ev_points = eval_set(eval_scenes)
    print("torch %s on %s; %d training scenes, %d held-out objects (%.1fs)" % (
        torch.__version__, torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", len(objs), len(ev_imgs),
        time.time() - t_start), flush=True)

    torch.manual_seed(SEED)
    encoder, decoder = (m.to(device) for m in S.build_models())
    encoder_ema, decoder_ema = (m.to(device) for m in S.build_models())
    encoder_ema.load_state_dict(encoder.state_dict())
    decoder_ema.load_state_dict(decoder.state_dict())
    params = list(encoder.parameters()) + list(decoder.parameters())
    ema_params = list(encoder_ema.parameters()) + list(decoder_ema.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.99), weight_decay=0.01)
    g = torch.Generator(device=device).manual_seed(SEED + 1)
    budget = TSD.StepBudget(args.steps, args.seconds)
    amp = device.type == "cuda"
    losses, step = [], 0
    while True:
        idx = torch.randint(0, len(objs), (args.batch,), device=device, generator=g)
        with torch.no_grad():
            img, masks = renderer(objs_t[idx], style_t[idx], bg_t[idx])
            target, coords, labels = sample_prompts(masks, objs_t[idx], g)
            x = S.normalise(img)
        for group in opt.param_groups:
            group["lr"] = TSD.lr_at(step, budget.estimate(), args.lr, 200)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits, iou_pred = decoder(encoder(x), coords, labels)
        logits, iou_pred = logits.float(), iou_pred.float()
        per = mask_losses(logits, target)
        loss_masks = per[:, 0].mean() + per[:, 1:].min(dim=1).values.mean()
        loss_iou = F.mse_loss(iou_pred, iou_of(logits.detach(), target))
        loss = loss_masks + loss_iou
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            TSD.ema_update(ema_params, params, min(args.ema, (1 + step) / (10 + step)))
            # BatchNorm running statistics are buffers: the EMA model takes the live ones.
            for be, b in zip(list(encoder_ema.buffers()), list(encoder.buffers())):
                be.copy_(b)
        if step % 50 == 0:
            losses.append(loss.item())
        if step % 500 == 0:
            print("sam step %d loss %.4f (masks %.4f, iou %.4f) lr %.2e %.0fs" % (
                step, loss.item(), loss_masks.item(), loss_iou.item(), opt.param_groups[0]["lr"],
                time.time() - budget.start), flush=True)
        step += 1
        if budget.update(step):
            break
    miou, miou_best = evaluate(encoder_ema, decoder_ema, ev_imgs, ev_masks, ev_points, device)
    log = dict(seed=SEED, train_seed=scenes.TRAIN_SEED, generator_version=scenes.GENERATOR_VERSION, pool=len(objs),
               eval_seed=EVAL_SEED, eval_scenes=eval_scenes, eval_objects=len(ev_imgs), steps=step,
               seconds=round(time.time() - budget.start, 1), batch=args.batch, lr=args.lr, ema=args.ema,
               negative_point=NEGATIVE_POINT, torch=torch.__version__,
               device=torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
               encoder_config=S.ENCODER_CONFIG, decoder_config=S.DECODER_CONFIG,
               final_loss=float(np.mean(losses[-10:])), loss_curve=losses, eval_miou_mask0=miou,
               eval_miou_best_multimask=miou_best)
    print("sam done: %d steps, loss %.4f; held-out mIoU %.4f (mask 0), %.4f (best predicted of masks 1-3)" % (
        step, log["final_loss"], miou, miou_best), flush=True)
    torch.save({k: v.float().cpu() for k, v in encoder_ema.state_dict().items()}, os.path.join(args.out, "image_encoder.pt"))
    torch.save({k: v.float().cpu() for k, v in decoder_ema.state_dict().items()}, os.path.join(args.out, "mask_decoder.pt"))
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(log, f, indent=1)


if __name__ == "__main__":
    main()
