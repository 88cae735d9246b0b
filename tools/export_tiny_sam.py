#!/usr/bin/python3
"""Exports trained tiny-sam checkpoints to models/tiny-sam/ (ONNX opset 17, pipeline.json, MODEL_CARD.md, sample image) and measures held-out mIoU."""

# Usage (from the repository root, Debian's Python: torch 1.13, onnx 1.12, tools/ort installed):
#   /usr/bin/python3 tools/export_tiny_sam.py --ckpt .ckpt/sam1 [--out models/tiny-sam]
#
# --ckpt holds what tools/train_tiny_sam.py wrote: image_encoder.pt, mask_decoder.pt, train_log.json.
# Exports with the TorchScript exporter (opset 17, constant folding; BatchNorm folds into the convs
# in eval mode), names after EfficientViT-SAM's / SAM's ONNX exports:
#   image_encoder.onnx  image float32 [batch, 3, 64, 64] (normalised: (rgb - mean) / std, see
#                       pipeline.json) -> image_embeddings [batch, 64, 16, 16]
#   mask_decoder.onnx   image_embeddings, point_coords float32 [batch, points, 2] (x, y in input
#                       pixels), point_labels float32 [batch, points] (1 positive, 0 negative, -1
#                       padding: append one padding point, as with SAM's ONNX decoder)
#                       -> masks [batch, 4, 64, 64] (logits; mask 0 is the single-mask output),
#                          iou_predictions [batch, 4]
# Both graphs are checked against PyTorch with ONNX Runtime (relative L2 < 1e-5). mIoU is measured
# with PyTorch FP32 on the held-out point-prompt set of train_tiny_sam.eval_set (stream
# train_tiny_sam.EVAL_SEED, scenes 0..499, one positive point per object at
# scenes.object_points + a padding point; mask 0 thresholded at logit 0).

import argparse
import datetime
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_tiny_sd as E  # noqa: E402
import scenes  # noqa: E402
import tiny_sam_model as S  # noqa: E402
import train_tiny_sam as TS  # noqa: E402


def sample_image(encoder, decoder, count=8):
    """Scenes of the held-out stream with their point prompts and predicted masks (tinted) side by side."""
    tiles = []
    for i in range(count):
        s = scenes.generate_scene(TS.EVAL_SEED, i)
        pts = scenes.object_points(s["masks"])
        x = S.normalise(torch.as_tensor(s["image"][None]).permute(0, 3, 1, 2))
        overlay = s["image"].astype(np.float64).copy()
        tints = [(255, 0, 255), (0, 255, 255), (255, 255, 0)]
        with torch.no_grad():
            emb = encoder(x)
            for k, p in enumerate(pts):
                coords = torch.tensor([[[float(p[0]), float(p[1])], [0.0, 0.0]]])
                logits, _ = decoder(emb, coords, torch.tensor([[1.0, -1.0]]))
                m = (logits[0, 0] > 0).numpy()
                overlay[m] = 0.45 * overlay[m] + 0.55 * np.array(tints[k % 3])
        for k, p in enumerate(pts):
            overlay[max(0, p[1] - 1):p[1] + 2, max(0, p[0] - 1):p[0] + 2] = (255, 255, 255)
            overlay[p[1], p[0]] = (0, 0, 0)
        tiles.append(np.concatenate([s["image"], overlay.round().astype(np.uint8)], axis=1))
    from tiny_sd_pipeline import grid
    return grid(np.stack(tiles), 4)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--out", default=os.path.join(scenes.REPO, "models", "tiny-sam"))
    a = ap.parse_args()
    with open(os.path.join(a.ckpt, "train_log.json")) as f:
        log = json.load(f)
    encoder, decoder = S.build_models()
    encoder.load_state_dict(torch.load(os.path.join(a.ckpt, "image_encoder.pt"), map_location="cpu"))
    decoder.load_state_dict(torch.load(os.path.join(a.ckpt, "mask_decoder.pt"), map_location="cpu"))
    encoder.eval()
    decoder.eval()
    os.makedirs(a.out, exist_ok=True)

    imgs, masks, points = TS.eval_set(TS.EVAL_SCENES)
    x = S.normalise(torch.as_tensor(imgs[:2]).permute(0, 3, 1, 2)).numpy()
    ort = {}
    ort["image_encoder.onnx"] = E.export_and_check(
        encoder, [x], ["image"], ["image_embeddings"], {"image": {0: "batch"}, "image_embeddings": {0: "batch"}},
        os.path.join(a.out, "image_encoder.onnx"))
    with torch.no_grad():
        emb = encoder(torch.from_numpy(x)).numpy()
    coords = np.array([[[points[0][0], points[0][1]], [40.0, 12.0], [0.0, 0.0]],
                       [[points[1][0], points[1][1]], [0.0, 0.0], [0.0, 0.0]]], dtype=np.float32)
    labels = np.array([[1.0, 0.0, -1.0], [1.0, -1.0, -1.0]], dtype=np.float32)
    ort["mask_decoder.onnx"] = E.export_and_check(
        decoder, [emb, coords, labels], ["image_embeddings", "point_coords", "point_labels"],
        ["masks", "iou_predictions"],
        {"image_embeddings": {0: "batch"}, "point_coords": {0: "batch", 1: "points"},
         "point_labels": {0: "batch", 1: "points"}}, os.path.join(a.out, "mask_decoder.onnx"))

    torch.set_num_threads(os.cpu_count() or 1)
    miou, miou_best = TS.evaluate(encoder, decoder, imgs, masks, points, torch.device("cpu"))
    print("held-out mIoU (PyTorch FP32, CPU): %.4f mask 0, %.4f best-predicted multimask" % (miou, miou_best))
    scenes.write_png(os.path.join(a.out, "samples.png"), sample_image(encoder, decoder))

    pipeline = {
        "format": "qeval.pipeline", "version": 1, "task": "segmentation", "name": "tiny-sam",
        "image_encoder": {"model": "image_encoder.onnx", "input": "image", "output": "image_embeddings"},
        "mask_decoder": {"model": "mask_decoder.onnx", "image_embeddings": "image_embeddings",
                         "point_coords": "point_coords", "point_labels": "point_labels",
                         "outputs": {"masks": "masks", "iou_predictions": "iou_predictions"},
                         "append_padding_point": True, "mask_threshold": 0.0, "single_mask_index": 0},
        "image": {"channels": 3, "height": S.IMAGE_SIZE, "width": S.IMAGE_SIZE, "pixel_mean": list(S.PIXEL_MEAN),
                  "pixel_std": list(S.PIXEL_STD), "resize": "stretch"},
        # Point-prompt sets written by tools/make_tiny_sam_prompts.py (docs/segment.md).
        "prompts": {"calibration": "../../datasets/point_prompts/tiny_sam_calib.jsonl",
                    "evaluation": "../../datasets/point_prompts/tiny_sam_eval.jsonl"},
    }
    with open(os.path.join(a.out, "pipeline.json"), "w") as f:
        json.dump(pipeline, f, indent=2)
        f.write("\n")
    shipped = ["image_encoder.onnx", "mask_decoder.onnx", "pipeline.json"]
    sizes = {f: os.path.getsize(os.path.join(a.out, f)) for f in shipped}
    total = sum(sizes.values())
    sd = os.path.join(scenes.REPO, "models", "tiny-sd")
    sd_bytes = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(sd) for f in fs
                   if not f.endswith((".md", ".png")))
    enc_p, dec_p = S.param_count(encoder), S.param_count(decoder)
    curve = log["loss_curve"]
    card = f"""# tiny-sam

A small promptable segmentation model with EfficientViT-SAM's structure, trained from scratch by qeval
on synthetic scenes (docs/scenes.md): given a 64x64 scene and a point on an object, it returns that
object's mask. It exists so that qeval's segmentation pipeline, per-layer triage and mask-IoU
reports run on a trained network out of the box; it knows nothing beyond the scenes.

![samples](samples.png)

*Held-out scenes (left) and the masks predicted from the white point prompts (right), PyTorch FP32.*

## Files

| file | what |
|---|---|
| image_encoder.onnx | image float32 [batch, 3, 64, 64], normalised as (RGB 0..255 - pixel_mean) / pixel_std -> image_embeddings [batch, 64, 16, 16] |
| mask_decoder.onnx | image_embeddings, point_coords [batch, points, 2] (x, y in pixels), point_labels [batch, points] (1 positive, 0 negative, -1 padding; append one padding point as with SAM's ONNX decoder) -> masks [batch, 4, 64, 64] (logits; 0 = single-mask output, 1-3 = multimask), iou_predictions [batch, 4] |
| pipeline.json | names, normalisation, threshold, the evaluation prompt set |

| file | size |
|---|---|
""" + "\n".join("| %s | %.2f MB |" % kv for kv in ((k, v / 1e6) for k, v in sizes.items())) + f"""
| **all tiny-sam files** | **{total / 1e6:.2f} MB** (tiny-sd: {sd_bytes / 1e6:.2f} MB; both together {(total + sd_bytes) / 1e6:.2f} MB of the 25 MB budget) |

Exported with the TorchScript exporter of PyTorch {torch.__version__} (opset 17, constant folding; BatchNorm folded
into the convolutions). ONNX Runtime (CPU) reproduces PyTorch to a relative L2 error of
{max(ort['image_encoder.onnx']['ort_rel_l2'].values()):.1e} (encoder) and {max(ort['mask_decoder.onnx']['ort_rel_l2'].values()):.1e} (decoder).

## Architecture

- **Image encoder** ({enc_p / 1e6:.2f} M parameters), EfficientViT backbone + SamNeck: conv stem (stride 2) + DSConv,
  MBConv stage (stride 4), two stages of a strided MBConv + EfficientViT block (LiteMLA: 1x1 qkv, 5x5 depthwise +
  grouped 1x1 multi-scale aggregation, ReLU linear attention with v padded by ones, 1x1 projection; then an
  MBConv), BatchNorm + Hardswish, widths {S.ENCODER_CONFIG['width_list']}, head dim {S.ENCODER_CONFIG['head_dim']};
  the neck projects the three stages to {S.EMBED_DIM} channels, resizes them bicubically to 16x16 and adds them,
  then {S.ENCODER_CONFIG['neck_depth']} fused-MBConv blocks and a 1x1 conv.
- **Prompt encoder + mask decoder** ({dec_p / 1e6:.2f} M parameters), SAM's: random-Fourier positional encoding of
  points, label embeddings (positive, negative, padding), no-mask dense embedding; two-way transformer (depth
  {S.DECODER_CONFIG['depth']}, {S.DECODER_CONFIG['num_heads']} heads, width {S.EMBED_DIM}, MLP {S.DECODER_CONFIG['mlp_dim']},
  cross-attention downsampled 2x), transposed-conv upscaling (16x16 -> 64x64) with LayerNorm2d and GELU,
  hypernetwork MLPs for 4 mask tokens, IoU head.

## Data and training

Synthetic scenes, generator version {log['generator_version']}: scenes 0..{log['pool'] - 1} of the stream seeded
{log['train_seed']:#x} (64x64, one to three objects), drawn on the GPU with the generator's integer rules. Each sample
prompts one visible object: a positive point on a random pixel of its mask, with probability {log['negative_point']}
a negative point off it, and a padding point; the target is the object's mask.

tools/train_tiny_sam.py on one {log['device']} (PyTorch {log['torch']}), seed {log['seed']}, bf16 autocast: {log['steps']}
steps of batch {log['batch']} ({log['seconds']:.0f} s), AdamW lr {log['lr']:.0e} (weight decay 0.01, warm-up 200,
cosine to 10%), gradient clipping 1.0, EMA {log['ema']} (shipped). Loss: BCE + dice of the single-mask output, plus
the smallest BCE + dice among the three multimask outputs, plus the MSE of the IoU head. Loss {curve[0]:.3f} at the
start, {log['final_loss']:.4f} at the end (mean of the last 500 steps).

## Accuracy

Held-out point prompts: scenes 0..{TS.EVAL_SCENES - 1} of the stream seeded {TS.EVAL_SEED:#x} (a stream training never drew from),
{len(imgs)} objects, each prompted by one positive point at its mask pixel nearest the mask's centroid
(`datasets::scene_object_points`, `scenes.object_points`) plus a padding point:

- mIoU of mask 0 (logit > 0): **{miou:.4f}** (PyTorch FP32, CPU; {log['eval_miou_mask0']:.4f} on the GPU at the end of training)
- mIoU of the multimask output with the highest predicted IoU: {miou_best:.4f}

## Reproduce

```sh
python3 tools/train_tiny_sam.py --out OUT --seconds 330          # GPU machine; or --steps {log['steps']}
/usr/bin/python3 tools/export_tiny_sam.py --ckpt OUT             # here (torch 1.13, onnx 1.12, tools/ort)
```

Exported {datetime.date.today().isoformat()}.
"""
    with open(os.path.join(a.out, "MODEL_CARD.md"), "w") as f:
        f.write(card)
    print("tiny-sam files %.2f MB, tiny-sd %.2f MB, together %.2f MB" % (total / 1e6, sd_bytes / 1e6,
                                                                        (total + sd_bytes) / 1e6))
    if total + sd_bytes > E.SIZE_BUDGET_BYTES:
        raise SystemExit("over the 25 MB budget")


if __name__ == "__main__":
    main()
