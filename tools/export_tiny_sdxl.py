#!/usr/bin/python3
"""Exports tiny-sdxl (a checkpoint of tools/train_tiny_sdxl.py, or a seeded random init) as Optimum's `optimum-cli export onnx` writes an SDXL pipeline."""

# Usage (from the repository root, Debian's Python: torch 1.13, onnx 1.12; tools/ort installed for the check):
#   /usr/bin/python3 tools/export_tiny_sdxl.py --ckpt OUT [--out models/tiny-sdxl] [--seeds 4]
#   /usr/bin/python3 tools/export_tiny_sdxl.py --random-init 0 --out /work/xfer/tiny-sdxl-random
#
# The layout, file and tensor names are those of Optimum's exporter for stabilityai/stable-diffusion-xl-base-1.0
# (optimum-onnx: exporters/onnx/model_configs.py CLIPTextOnnxConfig, CLIPTextWithProjectionOnnxConfig,
# UNetOnnxConfig, VaeDecoderOnnxConfig; exporters/utils.py _get_submodels_for_export_diffusion, which turns on
# output_hidden_states for both SDXL text encoders; onnx/convert.py, which saves each component's config.json, the
# scheduler, both tokenizers and model_index.json):
#   model_index.json                     StableDiffusionXLPipeline, force_zeros_for_empty_prompt true
#   scheduler/scheduler_config.json      EulerDiscreteScheduler, SDXL base's file
#   text_encoder/model.onnx              input_ids int64 [batch_size, sequence_length] -> last_hidden_state,
#                                        pooler_output, hidden_states.0 .. hidden_states.3      (CLIPTextModel)
#   text_encoder_2/model.onnx            input_ids int64 -> text_embeds, last_hidden_state, hidden_states.0 .. 3
#                                                                                    (CLIPTextModelWithProjection)
#   unet/model.onnx                      sample [batch_size, 4, height, width], timestep float32 0-d (a scalar, as
#                                        Optimum's DummyTimestepInputGenerator since 2024-11), encoder_hidden_states
#                                        [batch_size, sequence_length, 160], text_embeds [batch_size, 96], time_ids
#                                        [batch_size, 6] -> out_sample
#   vae_decoder/model.onnx               latent_sample [batch_size, 4, latent_height, latent_width] -> sample
#   */config.json                        transformers' CLIPTextConfig / diffusers' UNet2DConditionModel and
#                                        AutoencoderKL configs with the keys diffusers reads
#   tokenizer/, tokenizer_2/             tiny-sd's vocabulary and merges; tokenizer_2's pad token is "!"
# (int64 ids and the 0-d timestep: Optimum's defaults, int_dtype "int64"; no vae_encoder, which qeval does not use.)
#
# The exported VAE decoder's trunk is scaled by a power of two k (tools/tiny_sdxl_model.py scale_decoder_trunk) so
# that its intermediate values pass float16's 65504 while the FP32 output stays the same within rounding: the real
# SDXL VAE's FP16 overflow, hence "force_upcast": true in its config. k is chosen so the largest trunk value on
# seeded latents is >= 4 x 65504 (printed, and written to export_info.json with the measured maxima).
#
# Every graph is run with ONNX Runtime (tools/ort, CPU, no optimisations) and compared with PyTorch (relative L2
# < 1e-5 required). export_info.json records parameters, bytes, ORT errors, k and the trunk maxima.

import argparse
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scene_check  # noqa: E402
import scenes  # noqa: E402
import tiny_sd_model as M  # noqa: E402
import tiny_sd_pipeline as SD  # noqa: E402
import tiny_sdxl_model as X  # noqa: E402
import tiny_sdxl_pipeline as P  # noqa: E402

OPSET = 17  # as tools/export_tiny_sd.py
ORT_RUNNER = os.path.join(scenes.REPO, "tools", "ort", "run_reference.js")
SIZE_BUDGET_BYTES = 12 * 1000 * 1000  # the shipped tiny-sdxl's ONNX files
RANDOM_SCALING_FACTOR = 0.13025  # SDXL's, for a random init (a trained VAE's is 1 / std of its latents)
TOKENIZER_SRC = os.path.join(scenes.REPO, "models", "tiny-sd", "tokenizer")
DIFFUSERS_VERSION = "0.30.0"
TRANSFORMERS_VERSION = "4.44.0"


def rel_l2(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / max(1e-30, np.linalg.norm(b)))


def load(ckpt=None, random_init=None, size=None):
    """(log, vae, text_encoder, text_encoder_2, unet, scaling_factor) in eval mode, FP32, on the CPU. size: one of
    tools/tiny_sdxl_model.py's SIZES (a checkpoint's own, from its train_log.json, when None)."""
    if ckpt:
        with open(os.path.join(ckpt, "train_log.json")) as f:
            log = json.load(f)
        X.set_size(size or log.get("size", "ship"))
        vae, te, te2, unet = X.build_models()
        for m, name in ((vae, "vae.pt"), (te, "text_ema.pt"), (te2, "text2_ema.pt"), (unet, "unet_ema.pt")):
            m.load_state_dict(torch.load(os.path.join(ckpt, name), map_location="cpu"))
        scaling = log["vae"]["scaling_factor"]
    else:
        X.set_size(size or "ship")
        torch.manual_seed(random_init)
        vae, te, te2, unet = X.build_models()
        log = {"random_init": random_init, "size": X.SIZE}
        scaling = RANDOM_SCALING_FACTOR
    return log, vae.eval(), te.eval(), te2.eval(), unet.eval(), scaling


def export_and_check(module, inputs, names_in, names_out, dynamic_axes, path):
    """Exports module to path (TorchScript exporter, opset 17), checks it with ONNX Runtime against PyTorch."""
    module.eval()
    torch_inputs = tuple(torch.from_numpy(np.asarray(a)) for a in inputs)
    kwargs = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}  # TorchScript
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(module, torch_inputs, path, opset_version=OPSET, do_constant_folding=True,
                          input_names=names_in, output_names=names_out, dynamic_axes=dynamic_axes, **kwargs)
        ref = module(*torch_inputs)
    ref = (ref,) if isinstance(ref, torch.Tensor) else ref
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    got_in = [i.name for i in model.graph.input]
    got_out = [o.name for o in model.graph.output]
    if got_in != names_in or got_out != names_out:
        raise SystemExit("%s: inputs %s outputs %s, expected %s %s" % (path, got_in, got_out, names_in, names_out))
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "in"))
        for n, a in zip(names_in, inputs):
            np.save(os.path.join(tmp, "in", n + ".npy"), np.asarray(a))
        subprocess.run(["node", ORT_RUNNER, path, os.path.join(tmp, "in"), os.path.join(tmp, "out")], check=True,
                       stdout=subprocess.DEVNULL)
        errs = {n: rel_l2(np.load(os.path.join(tmp, "out", n + ".npy")), r.numpy())
                for n, r in zip(names_out, ref)}
    size = os.path.getsize(path)
    worst = max(errs.values())
    print("%s: %.2f MB, %d nodes, ORT vs torch rel L2 max %.1e" % (os.path.relpath(path), size / 1e6,
                                                                   len(model.graph.node), worst), flush=True)
    if not worst < 1e-5:
        raise SystemExit("%s: ONNX Runtime and PyTorch disagree: %s" % (path, errs))
    return dict(bytes=size, nodes=len(model.graph.node), ort_rel_l2_max=worst)


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def clip_config(cfg, with_projection, pad_id):
    c = {"_name_or_path": "qeval/tiny-sdxl", "architectures": [
        "CLIPTextModelWithProjection" if with_projection else "CLIPTextModel"],
        "attention_dropout": 0.0, "bos_token_id": 620, "dropout": 0.0, "eos_token_id": 621,
        "hidden_act": "quick_gelu", "hidden_size": cfg["hidden_size"], "initializer_factor": 1.0,
        "initializer_range": 0.02, "intermediate_size": cfg["intermediate_size"], "layer_norm_eps": 1e-05,
        "max_position_embeddings": cfg["max_position_embeddings"], "model_type": "clip_text_model",
        "num_attention_heads": cfg["num_heads"], "num_hidden_layers": cfg["num_layers"],
        "output_hidden_states": True, "pad_token_id": pad_id,
        "projection_dim": cfg.get("projection_dim", cfg["hidden_size"]), "torch_dtype": "float32",
        "transformers_version": TRANSFORMERS_VERSION, "vocab_size": cfg["vocab_size"],
        "export_model_type": "clip-text-with-projection" if with_projection else "clip-text"}
    return c


def unet_config(u=None, sample_size=None):
    """diffusers' config.json of a UNet of tools/tiny_sd_model.py's config `u` (default tiny-sdxl's), with
    num_attention_heads per level (or attention_head_dim, the head size, as tools/export_full_size.py's)."""
    u = u or X.UNET_CONFIG
    sample_size = sample_size or X.SAMPLE_SIZE
    depth = list(u["transformer_layers_per_block"])
    heads = u.get("num_attention_heads") or [max(1, c // u["attention_head_dim"]) for c in u["block_out_channels"]]
    down = ["CrossAttnDownBlock2D" if d else "DownBlock2D" for d in depth]
    return {
        "_class_name": "UNet2DConditionModel", "_diffusers_version": DIFFUSERS_VERSION, "act_fn": "silu",
        "addition_embed_type": "text_time", "addition_embed_type_num_heads": 64,
        "addition_time_embed_dim": u["addition_time_embed_dim"],
        # SDXL's config names the head counts attention_head_dim (diffusers reads it as num_attention_heads).
        "attention_head_dim": list(heads), "block_out_channels": list(u["block_out_channels"]),
        "center_input_sample": False, "class_embed_type": None, "class_embeddings_concat": False,
        "conv_in_kernel": 3, "conv_out_kernel": 3, "cross_attention_dim": u["cross_attention_dim"],
        "cross_attention_norm": None, "down_block_types": down, "downsample_padding": 1, "dual_cross_attention": False,
        "encoder_hid_dim": None, "encoder_hid_dim_type": None, "flip_sin_to_cos": True, "freq_shift": 0,
        "in_channels": u["in_channels"], "layers_per_block": u["layers_per_block"], "mid_block_only_cross_attention": None,
        "mid_block_scale_factor": 1, "mid_block_type": "UNetMidBlock2DCrossAttn", "norm_eps": 1e-05,
        "norm_num_groups": u["norm_num_groups"], "num_attention_heads": None, "num_class_embeds": None,
        "only_cross_attention": False, "out_channels": u["out_channels"],
        "projection_class_embeddings_input_dim": u["projection_class_embeddings_input_dim"],
        "resnet_out_scale_factor": 1.0, "resnet_skip_time_act": False, "resnet_time_scale_shift": "default",
        "sample_size": sample_size, "time_cond_proj_dim": None, "time_embedding_act_fn": None,
        "time_embedding_dim": None, "time_embedding_type": "positional", "timestep_post_act": None,
        # diffusers' mid block takes the last level's depth: tiny-sdxl's mid_block_layers equals it.
        "transformer_layers_per_block": [max(1, d) for d in depth],
        "up_block_types": ["CrossAttnUpBlock2D" if d else "UpBlock2D" for d in reversed(depth)],
        "upcast_attention": False, "use_linear_projection": u["use_linear_projection"],
    }


def vae_config(scaling, sample_size, v=None):
    v = v or X.VAE_CONFIG
    n = len(v["block_out_channels"])
    return {"_class_name": "AutoencoderKL", "_diffusers_version": DIFFUSERS_VERSION, "act_fn": "silu",
            "block_out_channels": list(v["block_out_channels"]), "down_block_types": ["DownEncoderBlock2D"] * n,
            "force_upcast": True, "in_channels": v["in_channels"], "latent_channels": v["latent_channels"],
            "layers_per_block": v["layers_per_block"], "norm_num_groups": v["norm_num_groups"],
            "out_channels": v["in_channels"], "sample_size": sample_size, "scaling_factor": scaling,
            "up_block_types": ["UpDecoderBlock2D"] * n}


def model_index():
    return {"_class_name": "StableDiffusionXLPipeline", "_diffusers_version": DIFFUSERS_VERSION,
            "feature_extractor": [None, None], "force_zeros_for_empty_prompt": True, "image_encoder": [None, None],
            "scheduler": ["diffusers", "EulerDiscreteScheduler"], "text_encoder": ["transformers", "CLIPTextModel"],
            "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
            "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "CLIPTokenizer"],
            "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"]}


def write_tokenizers(out):
    special = {"content": None, "lstrip": False, "normalized": True, "rstrip": False, "single_word": False}
    tok = lambda s: dict(special, content=s)  # noqa: E731
    for sub, pad in (("tokenizer", "<|endoftext|>"), ("tokenizer_2", P.PAD_2)):
        d = os.path.join(out, sub)
        os.makedirs(d, exist_ok=True)
        for f in ("vocab.json", "merges.txt"):
            shutil.copyfile(os.path.join(TOKENIZER_SRC, f), os.path.join(d, f))
        write_json(os.path.join(d, "tokenizer_config.json"), {
            "add_prefix_space": False, "bos_token": tok("<|startoftext|>"), "clean_up_tokenization_spaces": True,
            "do_lower_case": True, "eos_token": tok("<|endoftext|>"), "errors": "replace", "model_max_length": 77,
            "pad_token": pad if pad == P.PAD_2 else tok(pad), "tokenizer_class": "CLIPTokenizer",
            "unk_token": tok("<|endoftext|>")})
        write_json(os.path.join(d, "special_tokens_map.json"), {
            "bos_token": tok("<|startoftext|>"), "eos_token": tok("<|endoftext|>"),
            "pad_token": pad if pad == P.PAD_2 else tok(pad), "unk_token": tok("<|endoftext|>")})


def export(out, log, vae, te, te2, unet, scaling, seed=0):
    """Writes the whole folder; returns export_info (also written to out/export_info.json)."""
    os.makedirs(out, exist_ok=True)
    rng = np.random.RandomState(seed)
    tok, tok2 = P.tokenizers(TOKENIZER_SRC)
    texts = ["a small red circle at the top left on a plain blue background", ""]
    ids = np.array([tok.encode(t) for t in texts], dtype=np.int64)
    ids2 = np.array([tok2.encode(t) for t in texts], dtype=np.int64)
    info = {"opset": OPSET, "torch": torch.__version__, "onnx": onnx.__version__, "models": {},
            "params": {"text_encoder": M.param_count(te), "text_encoder_2": M.param_count(te2),
                       "unet": M.param_count(unet),
                       "vae_decoder": M.param_count(vae.decoder) + M.param_count(vae.post_quant_conv)}}
    info.update({k: log[k] for k in ("random_init",) if k in log})
    info["size"] = X.SIZE
    batch_seq = {0: "batch_size", 1: "sequence_length"}
    n1, n2 = X.TEXT_CONFIG["num_layers"], X.TEXT2_CONFIG["num_layers"]
    names1, names2 = X.text_output_names(1, n1), X.text_output_names(2, n2)
    info["models"]["text_encoder"] = export_and_check(
        X.TextEncoderExport(te), [ids], ["input_ids"], names1,
        dict({"input_ids": batch_seq}, **{n: batch_seq for n in names1 if n != "pooler_output"},
             pooler_output={0: "batch_size"}), os.path.join(out, "text_encoder", "model.onnx"))
    info["models"]["text_encoder_2"] = export_and_check(
        X.TextEncoder2Export(te2), [ids2], ["input_ids"], names2,
        dict({"input_ids": batch_seq}, **{n: batch_seq for n in names2 if n != "text_embeds"},
             text_embeds={0: "batch_size"}), os.path.join(out, "text_encoder_2", "model.onnx"))
    with torch.no_grad():
        ctx, pooled = X.encode_prompt_embeds(te, te2, torch.from_numpy(ids), torch.from_numpy(ids2))
    img = {0: "batch_size", 2: "height", 3: "width"}
    info["models"]["unet"] = export_and_check(
        unet, [rng.randn(2, 4, X.SAMPLE_SIZE, X.SAMPLE_SIZE).astype(np.float32), np.array(981.0, dtype=np.float32),
               ctx.numpy(), pooled.numpy(), np.stack([P.add_time_ids()] * 2)],
        ["sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids"], ["out_sample"],
        {"sample": img, "encoder_hidden_states": batch_seq, "text_embeds": {0: "batch_size"},
         "time_ids": {0: "batch_size"}, "out_sample": img}, os.path.join(out, "unet", "model.onnx"))

    # The SDXL-VAE-like FP16 overflow: k from the trunk's maxima on seeded latents (a trained model's latents are
    # ~N(0, 1) after the scaling factor, so these are its decoder inputs).
    probe = torch.from_numpy(np.stack([SD.seeded_noise(s, P.LATENT_SHAPE) for s in range(8)]) / np.float32(scaling))
    k = X.overflow_scale(vae, probe)
    scaled = X.scale_decoder_trunk(vae, k)
    with torch.no_grad():
        a, b = vae.decode(probe), scaled.decode(probe)
    info["vae_overflow"] = {"k": k, "trunk_max_abs_unscaled": X.decoder_trunk_max_abs(vae, probe),
                            "trunk_max_abs_exported": X.decoder_trunk_max_abs(scaled, probe),
                            "output_rel_l2_scaled_vs_unscaled": rel_l2(b.numpy(), a.numpy()),
                            "probe": "seeded_noise(s, [4, 16, 16]) / scaling_factor, s = 0..7"}
    print("vae_decoder trunk scaled by k = %g: largest trunk value %.4g -> %.4g (float16 max 65504); output rel L2 "
          "scaled vs unscaled %.1e" % (k, info["vae_overflow"]["trunk_max_abs_unscaled"],
                                       info["vae_overflow"]["trunk_max_abs_exported"],
                                       info["vae_overflow"]["output_rel_l2_scaled_vs_unscaled"]), flush=True)
    lat = {0: "batch_size", 2: "latent_height", 3: "latent_width"}
    info["models"]["vae_decoder"] = export_and_check(
        M.VaeDecoderExport(scaled), [probe[:2].numpy()], ["latent_sample"], ["sample"],
        {"latent_sample": lat, "sample": {0: "batch_size", 2: "sample_height", 3: "sample_width"}},
        os.path.join(out, "vae_decoder", "model.onnx"))

    write_json(os.path.join(out, "model_index.json"), model_index())
    write_json(os.path.join(out, "scheduler", "scheduler_config.json"), P.SCHEDULER_CONFIG)
    write_json(os.path.join(out, "text_encoder", "config.json"), clip_config(X.TEXT_CONFIG, False, 621))
    write_json(os.path.join(out, "text_encoder_2", "config.json"), clip_config(X.TEXT2_CONFIG, True, 0))
    write_json(os.path.join(out, "unet", "config.json"), unet_config())
    write_json(os.path.join(out, "vae_decoder", "config.json"), vae_config(scaling, P.IMAGE_SIZE))
    write_tokenizers(out)
    onnx_bytes = sum(m["bytes"] for m in info["models"].values())
    info["onnx_bytes"] = onnx_bytes
    info["scaling_factor"] = scaling
    write_json(os.path.join(out, "export_info.json"), info)
    print("ONNX files: %.2f MB (budget %.0f MB); parameters %s" % (onnx_bytes / 1e6, SIZE_BUDGET_BYTES / 1e6,
                                                                  info["params"]), flush=True)
    return info


def score_prompts(te, te2, unet, vae, scaling, seeds, steps=20, guidance=5.0):
    """Prompt following of the PyTorch FP32 pipeline on prompts/tiny_eval.txt (seed s of prompt i: 1000 s + i, as
    tools/export_tiny_sd.py): [(objects drawn, prompts complete)] per seed, and the first seed's images."""
    prompts = scenes.read_prompts(os.path.join(scenes.REPO, "prompts", "tiny_eval.txt"))
    tok, tok2 = P.tokenizers(TOKENIZER_SRC)
    per_seed, first = [], None
    for seed in range(seeds):
        imgs = np.concatenate([P.generate(te, te2, unet, vae.decode, tok, tok2, prompts[i:i + 32],
                                          [1000 * seed + i + k for k in range(len(prompts[i:i + 32]))], scaling,
                                          steps=steps, guidance=guidance) for i in range(0, len(prompts), 32)])
        obj, prm, _ = scene_check.score(imgs, prompts)
        per_seed.append((obj, prm))
        first = imgs if first is None else first
        print("   Euler %d steps g %.1f, noise seeds 1000*%d+i: %.1f%% of objects drawn, %.1f%% of prompts complete"
              % (steps, guidance, seed, 100 * obj, 100 * prm), flush=True)
    return per_seed, first


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ckpt", help="folder with vae.pt, text_ema.pt, text2_ema.pt, unet_ema.pt, train_log.json")
    src.add_argument("--random-init", type=int, metavar="SEED", help="untrained weights: torch.manual_seed(SEED)")
    ap.add_argument("--out", default=os.path.join(scenes.REPO, "models", "tiny-sdxl"))
    ap.add_argument("--seeds", type=int, default=0,
                    help="also score prompt following (PyTorch FP32, Euler 20 steps, guidance 5) with this many "
                         "noise seeds per tiny_eval prompt; written to export_info.json")
    ap.add_argument("--size", choices=sorted(X.SIZES), default=None,
                    help="widths (tools/tiny_sdxl_model.py SIZES): ship (models/tiny-sdxl, the default of a random "
                         "init) or test (the same structure at about a quarter of the widths: the C++ tests' "
                         "fixture); a checkpoint's own size when left out")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    log, vae, te, te2, unet, scaling = load(a.ckpt, a.random_init, a.size)
    info = export(a.out, log, vae, te, te2, unet, scaling)
    if a.seeds:
        per_seed, _ = score_prompts(te, te2, unet, vae, scaling, a.seeds)
        info["prompt_following"] = {"setting": "Euler 20 steps, guidance 5.0, no negative prompt, PyTorch FP32",
                                    "seeds": "1000 s + prompt index", "per_seed_objects_prompts": per_seed,
                                    "objects_mean": float(np.mean([o for o, _ in per_seed]))}
        write_json(os.path.join(a.out, "export_info.json"), info)
        print("objects drawn, mean over %d seeds: %.1f%%" % (a.seeds, 100 * info["prompt_following"]["objects_mean"]))
    if a.ckpt and info["onnx_bytes"] > SIZE_BUDGET_BYTES:
        raise SystemExit("over the size budget: %.2f MB" % (info["onnx_bytes"] / 1e6))


if __name__ == "__main__":
    main()
