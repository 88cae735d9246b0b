#!/usr/bin/python3
"""Exports full-size random-weight benchmark models (SD-1.5-like and SDXL-like UNets, a CLIP-L-size text encoder, an SD VAE decoder, SDXL's two text encoders and VAE decoder), the pipeline.json around the SD-1.5-like ones and an Optimum-layout SDXL folder, as ONNX with external data."""

# Usage (Debian's python3-torch + python3-onnx here; the GPU machine's python3 there):
#   /usr/bin/python3 tools/export_full_size.py --out /tmp/full [--only unet,sdxl-unet,text-encoder,vae-decoder,pipeline]
#   /usr/bin/python3 tools/export_full_size.py --out /tmp/full --fp16 --no-shape-inference \
#       --only sdxl-unet,sdxl-text-encoder,sdxl-text-encoder-2,sdxl-vae-decoder,sdxl-pipeline
#                                              [--widths-scale 0.1] [--fp16] [--seed 0] [--check build/qeval]
#
# Random weights, never trained: these models exist for speed, memory and scale tests (issues 23 and 24). They
# are built from tools/tiny_sd_model.py's diffusers-structured modules, with PyTorch's default initialisation
# after torch.manual_seed(seed + a fixed offset per model), always on the CPU, so that the same seed gives the
# same weights on every machine, in every model subset (--only) and in bench/gpu/torch_peer.py, which imports
# build_model() and make_inputs() from here.
#
# Written under --out (never commit it; it is GBs at full size):
#   unet/model.onnx + model.onnx.data          SD-1.5-like UNet: sample, timestep (float32), encoder_hidden_states
#                                              -> out_sample
#   sdxl_unet/model.onnx + model.onnx.data     SDXL-like UNet: + text_embeds, time_ids -> out_sample
#   text_encoder/model.onnx + model.onnx.data  CLIP-L-size: input_ids (int32) -> last_hidden_state, pooler_output
#   vae_decoder/model.onnx + model.onnx.data   latent_sample -> sample (SD's VAE decoder, 8x upsampling)
#   pipeline.json + tokenizer/                 qeval's txt2img pipeline over unet, text_encoder and vae_decoder
#                                              (tiny-sd's tokenizer: its ids are < 622, inside CLIP's vocabulary)
#   sdxl/text_encoder/, sdxl/text_encoder_2/   SDXL's text encoders at full size (CLIP ViT-L: 12 layers of 768;
#                                              OpenCLIP bigG's role: 32 layers of 1280, 20 heads, its 1280-wide pooled
#                                              projection), as Optimum exports them: input_ids int64 ->
#                                              last_hidden_state, pooler_output / text_embeds, hidden_states.0 .. N
#   sdxl/vae_decoder/                          SDXL's VAE decoder (SD's architecture, its own weights)
#   sdxl/ (sdxl-pipeline)                      the Optimum SDXL layout around them (tools/export_tiny_sdxl.py's
#                                              configs, tokenizers, scheduler and model_index.json; scaling factor
#                                              0.13025, force_upcast), sdxl/unet/ hard links to sdxl_unet/'s files
#   manifest.json                              per model: parameters, bytes, export seconds, configuration
# Each graph: TorchScript exporter (dynamo=False where the keyword exists), opset 17, constant folding, dynamic
# batch and spatial sizes (diffusers' convert_stable_diffusion_checkpoint_to_onnx.py names), traced at a small
# latent; then onnx.save with every tensor over 1 KiB in one model.onnx.data beside model.onnx.
#
# --widths-scale S multiplies every width (channels, text width, cross-attention width, head size of the SDXL-like
# UNet) by S, rounded to GroupNorm's 32 channels (text width to 96, 12 heads x 8): depths, vocabulary and the
# 77 tokens stay, so a toy-width export has the full-size graph's structure and runs here in seconds.
# --fp16 exports every model of the call in float16 (inputs and outputs float16, timestep too, as diffusers'
# converter with --fp16); tracing then runs on CUDA when there is one. Without CUDA (Debian's PyTorch 1.13 has no
# float16 convolution or GroupNorm on the CPU) the float32 graph is traced without weights and rewritten as float16,
# the weights written one by one as float16 (export_fp16_on_cpu: memory is the float32 module build_model() makes,
# 10.4 GB for the full-size SDXL-like UNet, not a float32 export's copies of it); the timestep and time_ids
# projections stay float32, as diffusers computes them. Checked at --widths-scale 0.05 only (rel-L2 1.6e-3).
# --check QEVAL runs each exported graph with `QEVAL infer` (CPU) on make_inputs() at --latent and prints
# max-abs and relative L2 against PyTorch FP32 (exit 1 past --check-tol); inputs, PyTorch's and qeval's outputs
# stay in <model>/check/.

import argparse
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import tiny_sd_model as M  # noqa: E402
import tiny_sdxl_model as X  # noqa: E402

OPSET = 17
MODELS = ("unet", "sdxl-unet", "text-encoder", "vae-decoder", "sdxl-text-encoder", "sdxl-text-encoder-2",
          "sdxl-vae-decoder")
TEXT_MODELS = ("text-encoder", "sdxl-text-encoder", "sdxl-text-encoder-2")
DIRS = {"unet": "unet", "sdxl-unet": "sdxl_unet", "text-encoder": "text_encoder", "vae-decoder": "vae_decoder",
        "sdxl-text-encoder": "sdxl/text_encoder", "sdxl-text-encoder-2": "sdxl/text_encoder_2",
        "sdxl-vae-decoder": "sdxl/vae_decoder"}
SEED_OFFSET = {"unet": 1, "sdxl-unet": 2, "text-encoder": 3, "vae-decoder": 4, "sdxl-text-encoder": 5,
               "sdxl-text-encoder-2": 6, "sdxl-vae-decoder": 7}  # weights of one model never depend on which
# others a call builds
DEFAULT_LATENT = {"unet": 64, "sdxl-unet": 128, "text-encoder": None, "vae-decoder": 64, "sdxl-text-encoder": None,
                  "sdxl-text-encoder-2": None, "sdxl-vae-decoder": 128}
SDXL_SCALING_FACTOR = 0.13025
TRACE_LATENT = 16  # spatial sizes are dynamic: tracing small is as good and much faster
SD15_SCALING_FACTOR = 0.18215

# Full-size configurations (diffusers' config.json of the models they imitate).
SD15_UNET = dict(in_channels=4, out_channels=4, block_out_channels=(320, 640, 1280, 1280), layers_per_block=2,
                 cross_attention_dim=768, num_attention_heads=8, norm_num_groups=32,
                 transformer_layers_per_block=(1, 1, 1, 0), mid_block_layers=1)
SDXL_UNET = dict(in_channels=4, out_channels=4, block_out_channels=(320, 640, 1280), layers_per_block=2,
                 cross_attention_dim=2048, attention_head_dim=64, norm_num_groups=32,
                 transformer_layers_per_block=(0, 2, 10), mid_block_layers=10, use_linear_projection=True,
                 addition_time_embed_dim=256, projection_class_embeddings_input_dim=1280 + 6 * 256)
SDXL_TEXT_EMBEDS = 1280  # OpenCLIP bigG's pooled projection
CLIP_L_TEXT = dict(vocab_size=49408, max_position_embeddings=77, hidden_size=768, num_layers=12, num_heads=12,
                   intermediate_size=3072)
BIGG_TEXT = dict(vocab_size=49408, max_position_embeddings=77, hidden_size=1280, num_layers=32, num_heads=20,
                 intermediate_size=5120)
SD_VAE = dict(in_channels=3, latent_channels=4, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
              norm_num_groups=32)


def scaled(width, scale, quantum):
    return width if scale == 1.0 else max(quantum, int(round(width * scale / quantum)) * quantum)


def configs(scale=1.0):
    """The four configurations at --widths-scale scale (1.0: the full-size ones above)."""
    ch = lambda w: scaled(w, scale, 32)  # noqa: E731
    text_width = scaled(CLIP_L_TEXT["hidden_size"], scale, 96)
    text = dict(CLIP_L_TEXT, hidden_size=text_width, intermediate_size=4 * text_width)
    sd15 = dict(SD15_UNET, block_out_channels=tuple(ch(c) for c in SD15_UNET["block_out_channels"]),
                cross_attention_dim=text_width)
    time_dim = scaled(SDXL_UNET["addition_time_embed_dim"], scale, 8)
    # SDXL's context is the two encoders' hidden states side by side, its text_embeds bigG's pooled projection.
    big_width = scaled(BIGG_TEXT["hidden_size"], scale, 80)  # 20 heads of a multiple of 4
    big = dict(BIGG_TEXT, hidden_size=big_width, intermediate_size=4 * big_width, projection_dim=big_width)
    text_embeds = big_width
    sdxl = dict(SDXL_UNET, block_out_channels=tuple(ch(c) for c in SDXL_UNET["block_out_channels"]),
                cross_attention_dim=text_width + big_width,
                attention_head_dim=scaled(SDXL_UNET["attention_head_dim"], scale, 8),
                addition_time_embed_dim=time_dim, projection_class_embeddings_input_dim=text_embeds + 6 * time_dim)
    vae = dict(SD_VAE, block_out_channels=tuple(ch(c) for c in SD_VAE["block_out_channels"]))
    return {"unet": sd15, "sdxl-unet": sdxl, "text-encoder": text, "vae-decoder": vae, "sdxl-text-encoder": text,
            "sdxl-text-encoder-2": big, "sdxl-vae-decoder": vae}


def build_model(name, scale=1.0, seed=0):
    """The exported module of `name`, seeded, on the CPU, float32, eval mode."""
    cfg = configs(scale)[name]
    torch.manual_seed(seed * 1000 + SEED_OFFSET[name])
    if name in ("unet", "sdxl-unet"):
        m = M.UNet2DConditionModel(**cfg)
    elif name == "text-encoder":
        m = M.TextEncoderExport(M.ClipTextModel(**cfg))
    elif name == "sdxl-text-encoder":
        m = X.TextEncoderExport(X.ClipTextModel(**cfg))
    elif name == "sdxl-text-encoder-2":
        m = X.TextEncoder2Export(X.ClipTextModelWithProjection(**cfg))
    else:
        m = M.VaeDecoderExport(M.AutoencoderKL(**cfg))
    return m.eval()


def param_count(name, module):
    if name in ("vae-decoder", "sdxl-vae-decoder"):  # the encoder is built (same seeds as a whole VAE) but not exported
        return M.param_count(module.vae.decoder) + M.param_count(module.vae.post_quant_conv)
    return M.param_count(module)


def io_names(name):
    """(input names, output names, dynamic axes) as diffusers' ONNX converter and Optimum name them."""
    img = {0: "batch", 1: "channels", 2: "height", 3: "width"}
    # Outputs too: a graph that declares the traced output shape contradicts every other size (ONNX Runtime warns).
    if name == "text-encoder":
        return ["input_ids"], ["last_hidden_state", "pooler_output"], {
            "input_ids": {0: "batch", 1: "sequence"}, "last_hidden_state": {0: "batch", 1: "sequence"},
            "pooler_output": {0: "batch"}}
    if name in ("sdxl-text-encoder", "sdxl-text-encoder-2"):  # Optimum's names (tools/export_tiny_sdxl.py)
        seq = {0: "batch_size", 1: "sequence_length"}
        outs = X.text_output_names(1 if name == "sdxl-text-encoder" else 2, configs()[name]["num_layers"])
        return ["input_ids"], outs, dict({"input_ids": seq}, **{
            n: ({0: "batch_size"} if n in ("pooler_output", "text_embeds") else seq) for n in outs})
    if name in ("vae-decoder", "sdxl-vae-decoder"):
        return ["latent_sample"], ["sample"], {"latent_sample": img, "sample": img}
    ins = ["sample", "timestep", "encoder_hidden_states"]
    dyn = {"sample": img, "timestep": {0: "batch"}, "encoder_hidden_states": {0: "batch", 1: "sequence"},
           "out_sample": img}
    if name == "sdxl-unet":
        ins += ["text_embeds", "time_ids"]
        dyn.update({"text_embeds": {0: "batch"}, "time_ids": {0: "batch"}})
    return ins, ["out_sample"], dyn


def make_inputs(name, scale=1.0, latent=None, batch=2, seed=0):
    """Seeded numpy inputs (float32, int32 ids) in io_names() order; latent None = the model's full size."""
    cfg = configs(scale)[name]
    rng = np.random.RandomState(seed * 1000 + 100 + SEED_OFFSET[name])
    latent = latent or DEFAULT_LATENT[name]
    if name in TEXT_MODELS:  # int64 ids as Optimum's SDXL exports take them
        ids = rng.randint(1, 600, (batch, 77)).astype(np.int32 if name == "text-encoder" else np.int64)
        ids[:, 40:] = 621  # EOS (the largest id, so that pooler_output takes it) and padding, as the tokenizer
        return [ids]
    if name in ("vae-decoder", "sdxl-vae-decoder"):
        return [rng.randn(batch, 4, latent, latent).astype(np.float32)]
    ins = [rng.randn(batch, 4, latent, latent).astype(np.float32),
           np.array([981.0, 21.0] * batch, dtype=np.float32)[:batch],
           rng.randn(batch, 77, cfg["cross_attention_dim"]).astype(np.float32)]
    if name == "sdxl-unet":
        size = 8.0 * latent  # micro-conditioning: original size, crop top-left, target size
        ins += [rng.randn(batch, cfg["projection_class_embeddings_input_dim"] - 6 * cfg["addition_time_embed_dim"])
                .astype(np.float32), np.array([[size, size, 0.0, 0.0, size, size]] * batch, dtype=np.float32)]
    return ins


def to_torch(arrays, dtype, device):
    out = []
    for a in arrays:
        t = torch.from_numpy(a)
        out.append((t.to(dtype) if t.is_floating_point() else t).to(device))
    return tuple(out)


def private_export_without_shape_inference():
    """PyTorch's TorchScript exporter entry that can skip ONNX shape inference (torch.onnx.utils._export), or None."""
    f = getattr(getattr(torch.onnx, "utils", None), "_export", None)
    if f is None or "onnx_shape_inference" not in inspect.signature(f).parameters:
        return None
    return f


# ONNX inputs that must stay float32 in a float16 graph (op type -> input indices): Resize's roi and scales.
FLOAT32_INPUTS = {"Resize": (1, 2)}


def float32_island(graph, inputs):
    """The nodes a float16 diffusers export computes in float32: from `inputs` (timestep, time_ids: their sinusoidal
    projections, and what concatenates with them) up to the first MatMul/Gemm, which reads them cast to float16."""
    readers = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    island, values, todo = [], set(inputs), list(inputs)
    while todo:
        v = todo.pop()
        for n in readers.get(v, []):
            # Shape and Size give int64: what depends on them only is no float value.
            if n.op_type in ("MatMul", "Gemm", "Shape", "Size") or any(n is m for m in island):
                continue
            island.append(n)
            for o in n.output:
                if o not in values:
                    values.add(o)
                    todo.append(o)
    return island, values


def to_float16_graph(graph, keep_float32):
    """Rewrites a float32 graph as float16: float inputs, outputs, constants, initializers (but `keep_float32`, by
    name), Cast(to=float) and ConstantOfShape values become float16; shapes are inferred again by the reader."""
    from onnx import numpy_helper
    F32, F16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16

    def half(t):
        h = numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name)
        t.CopyFrom(h)

    # The timestep projections stay float32 (diffusers computes them in float32 and casts the result).
    island, island_values = float32_island(graph, [v.name for v in graph.input if v.name in ("timestep", "time_ids")])
    island_ids = set(id(n) for n in island)
    for v in list(graph.input) + list(graph.output):
        if v.type.tensor_type.elem_type == F32:
            v.type.tensor_type.elem_type = F16
    del graph.value_info[:]
    for t in graph.initializer:
        if t.data_type == F32 and t.name not in keep_float32:
            half(t)
    constants = {n.output[0]: n for n in graph.node if n.op_type == "Constant"}
    for n in island:  # its constants stay float32
        for i in n.input:
            if i in constants:
                keep_float32.add(i)
    for n in graph.node:
        if id(n) in island_ids:
            continue
        if n.op_type == "Constant" and n.output[0] not in keep_float32:
            for a in n.attribute:
                if a.name == "value" and a.t.data_type == F32:
                    half(a.t)
        elif n.op_type == "ConstantOfShape":
            for a in n.attribute:
                if a.name == "value" and a.t.data_type == F32:
                    half(a.t)
        elif n.op_type == "Cast":
            for a in n.attribute:
                if a.name == "to" and a.i == F32:
                    a.i = F16
    # Float16 values entering the island (its graph inputs, what it concatenates) cast to float32; island values
    # read outside it cast to float16.
    nodes, casts = list(graph.node), {}
    float16_values = set(v.name for v in graph.input if v.type.tensor_type.elem_type == F16)
    float16_values |= set(t.name for t in graph.initializer if t.data_type == F16)
    for n in nodes:
        if id(n) in island_ids or n.op_type == "Constant":
            continue
        float16_values.update(n.output)  # outside the island every float value is float16 now

    def cast(value, to, suffix):
        key = (value, to)
        if key not in casts:
            out = value + suffix
            casts[key] = (out, onnx.helper.make_node("Cast", [value], [out], to=to, name=out + "_cast"))
        return casts[key][0]

    seeds = set(v.name for v in graph.input if v.name in ("timestep", "time_ids"))
    for n in nodes:
        inside = id(n) in island_ids
        for k, i in enumerate(n.input):
            # Float16 values: the seeds, and what the island concatenates (SDXL's text_embeds); other values from
            # outside are shapes and indices.
            if inside and (i in seeds or (n.op_type == "Concat" and i in float16_values and i not in island_values)):
                n.input[k] = cast(i, F32, "/to_float32")
            elif not inside and i in island_values and n.op_type in ("MatMul", "Gemm", "Add", "Mul", "Concat"):
                n.input[k] = cast(i, F16, "/to_float16")
            elif not inside and k in FLOAT32_INPUTS.get(n.op_type, ()) and i in float16_values:
                # Resize's roi/scales computed in the graph (a Concat of float16 values): ONNX wants float32.
                n.input[k] = cast(i, F32, "/to_float32")
    order = []
    for n in nodes:  # each cast right before its first reader
        for i in n.input:
            for key, (out, c) in casts.items():
                if out == i and c not in order:
                    order.append(c)
        order.append(n)
    del graph.node[:]
    graph.node.extend(order)


def export_fp16_on_cpu(name, module, out_dir, scale, shape_inference=True):
    """--fp16 without CUDA (PyTorch's CPU kernels lack float16 convolution): traces the float32 graph without its
    weights (export_params=False), the parameters first written one by one as float16 into model.onnx.data (each
    64-byte aligned) and replaced in the module by a zero broadcast (no memory), then makes the parameters
    initializers in that file and the graph float16 (to_float16_graph). Peak memory: the float32 module as
    built_model() makes it, then less. Returns (onnx bytes, data bytes)."""
    names_in, names_out, dyn = io_names(name)
    os.makedirs(out_dir, exist_ok=True)
    data_path = os.path.join(out_dir, "model.onnx.data")
    params = {}  # name -> (offset, length, shape)
    with open(data_path + ".tmp", "wb") as f:
        for pname, p in list(module.named_parameters()) + list(module.named_buffers()):
            if not p.is_floating_point():
                continue
            pad = (-f.tell()) % 64
            f.write(b"\0" * pad)
            b = p.detach().numpy().astype(np.float16).tobytes()
            params[pname] = (f.tell(), len(b), list(p.shape))
            f.write(b)
            # A distinct value each: the exporter merges parameters of equal values into one (Identity nodes).
            p.data = torch.full((1,), float(len(params)), dtype=p.dtype).expand(p.shape)
    inputs = to_torch(make_inputs(name, scale, latent=None if name in TEXT_MODELS else TRACE_LATENT),
                      torch.float32, "cpu")
    kwargs = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
    export = torch.onnx.export
    if not shape_inference and private_export_without_shape_inference():
        export, kwargs = private_export_without_shape_inference(), {"onnx_shape_inference": False}
    tmp = tempfile.mkdtemp(prefix=".export-", dir=out_dir)
    try:
        raw = os.path.join(tmp, "model.onnx")
        with torch.no_grad():
            # No constant folding: folded forms of the weights (transposed MatMul operands) would be exported as
            # inputs without values; qeval folds them when it plans.
            export(module, inputs, raw, opset_version=OPSET, do_constant_folding=False, export_params=False,
                   keep_initializers_as_inputs=True, input_names=names_in, output_names=names_out, dynamic_axes=dyn,
                   **kwargs)
        model = onnx.load(raw)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    g = model.graph
    inits = []
    for v in list(g.input):
        if v.name not in params:
            continue
        offset, length, shape = params[v.name]
        t = onnx.TensorProto(name=v.name, data_type=onnx.TensorProto.FLOAT16, dims=shape)
        t.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", "model.onnx.data"), ("offset", str(offset)), ("length", str(length))):
            e = t.external_data.add()
            e.key, e.value = key, value
        inits.append(t)
        g.input.remove(v)
    missing = [v.name for v in g.input if v.name not in names_in]
    if missing:
        raise SystemExit("%s: graph inputs that are no parameter of the module: %s" % (name, ", ".join(missing[:5])))
    keep = set()
    for n in g.node:
        for i in FLOAT32_INPUTS.get(n.op_type, ()):
            if i < len(n.input) and n.input[i]:
                keep.add(n.input[i])
    to_float16_graph(g, keep)  # adds the island's constants to keep
    g.initializer.extend(inits)
    os.replace(data_path + ".tmp", data_path)
    onnx.save_model(model, os.path.join(out_dir, "model.onnx"))
    onnx.checker.check_model(os.path.join(out_dir, "model.onnx"))
    return os.path.getsize(os.path.join(out_dir, "model.onnx")), os.path.getsize(data_path)


def export_onnx(name, module, out_dir, fp16, scale, shape_inference=True):
    """Traces module (at TRACE_LATENT) into out_dir/model.onnx + model.onnx.data; returns (onnx bytes, data bytes)."""
    names_in, names_out, dyn = io_names(name)
    if fp16 and not torch.cuda.is_available():
        return export_fp16_on_cpu(name, module, out_dir, scale, shape_inference)
    device = "cuda" if fp16 and torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if fp16 else torch.float32
    if fp16 and device == "cpu":
        print("  --fp16 without CUDA: tracing float16 on the CPU (PyTorch %s may lack float16 kernels)"
              % torch.__version__, flush=True)
    module = module.to(device=device, dtype=dtype)
    inputs = to_torch(make_inputs(name, scale, latent=None if name in TEXT_MODELS else TRACE_LATENT), dtype,
                      device)
    kwargs = {}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kwargs["dynamo"] = False  # the TorchScript exporter, as tools/export_tiny_sd.py (PyTorch >= 2.9 default)
    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".export-", dir=out_dir)
    try:
        raw = os.path.join(tmp, "model.onnx")  # > 2 GB: PyTorch writes one file per tensor beside it
        export = torch.onnx.export
        if not shape_inference:
            export = private_export_without_shape_inference()
            if export is None:
                print("  --no-shape-inference: PyTorch %s has no torch.onnx.utils._export(onnx_shape_inference=...); "
                      "exporting with shape inference" % torch.__version__, flush=True)
                export = torch.onnx.export
            else:
                kwargs = {"onnx_shape_inference": False}
        try:
            with torch.no_grad():
                export(module, inputs, raw, opset_version=OPSET, do_constant_folding=True, input_names=names_in,
                       output_names=names_out, dynamic_axes=dyn, **kwargs)
        except RuntimeError as e:
            if fp16 and device == "cpu" and "Half" in str(e):
                raise SystemExit("%s: --fp16 needs a CUDA device here: PyTorch %s's CPU kernels lack float16 (%s)"
                                 % (name, torch.__version__, str(e).splitlines()[0]))
            raise
        model = onnx.load(raw)
        for f in ("model.onnx", "model.onnx.data"):
            if os.path.exists(os.path.join(out_dir, f)):
                os.remove(os.path.join(out_dir, f))
        onnx.save_model(model, os.path.join(out_dir, "model.onnx"), save_as_external_data=True,
                        all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=1024)
        del model
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    onnx.checker.check_model(os.path.join(out_dir, "model.onnx"))  # by path: works past 2 GB
    module.to(device="cpu", dtype=torch.float32)
    return (os.path.getsize(os.path.join(out_dir, "model.onnx")),
            os.path.getsize(os.path.join(out_dir, "model.onnx.data")))


def rel_l2(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / max(1e-30, np.linalg.norm(b)))


def check_with_qeval(qeval, name, module, out_dir, scale, latent, seed, fp16):
    """Runs out_dir/model.onnx in `qeval infer` (CPU) and compares with this module in PyTorch FP32."""
    names_in, names_out, _ = io_names(name)
    inputs = make_inputs(name, scale, latent, batch=2, seed=seed)
    d = os.path.join(out_dir, "check")
    shutil.rmtree(d, ignore_errors=True)
    for sub in ("inputs", "expected"):
        os.makedirs(os.path.join(d, sub))
    for n, a in zip(names_in, inputs):
        np.save(os.path.join(d, "inputs", n + ".npy"), a.astype(np.float16) if fp16 and a.dtype == np.float32 else a)
    with torch.no_grad():
        ref = module(*to_torch(inputs, torch.float32, "cpu"))
    ref = (ref,) if isinstance(ref, torch.Tensor) else ref
    for n, r in zip(names_out, ref):
        np.save(os.path.join(d, "expected", n + ".npy"), r.numpy())
    t0 = time.time()
    p = subprocess.run([qeval, "infer", "--model", os.path.join(out_dir, "model.onnx"), "--inputs",
                        os.path.join(d, "inputs"), "--out", os.path.join(d, "qeval")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        print(p.stdout)
        raise SystemExit("%s: qeval infer exited %d" % (name, p.returncode))
    res = {}
    for n, r in zip(names_out, ref):
        q = np.load(os.path.join(d, "qeval", n + ".npy")).astype(np.float32)
        res[n] = {"max_abs": float(np.max(np.abs(q - r.numpy()))), "rel_l2": rel_l2(q, r.numpy()),
                  "shape": list(q.shape)}
    return res, time.time() - t0


def copy_tokenizer(out):
    d = os.path.join(out, "tokenizer")
    os.makedirs(d, exist_ok=True)
    for f in ("vocab.json", "merges.txt"):
        shutil.copyfile(os.path.join(REPO, "models", "tiny-sd", "tokenizer", f), os.path.join(d, f))


def pipeline_json(latent):
    """qeval's txt2img pipeline over the SD-1.5-like models (docs/pipelines.md), SD 1.5's scheduler settings."""
    return {
        "format": "qeval.pipeline", "version": 1, "task": "txt2img", "name": "full-size-sd15-random",
        "tokenizer": {"type": "clip_bpe", "vocab": "tokenizer/vocab.json", "merges": "tokenizer/merges.txt",
                      "max_length": 77, "pad_token": "<|endoftext|>"},
        "text_encoder": {"model": "text_encoder/model.onnx", "input": "input_ids", "input_type": "int32",
                         "output": "last_hidden_state"},
        "unet": {"model": "unet/model.onnx", "sample": "sample", "timestep": "timestep", "timestep_type": "float32",
                 "encoder_hidden_states": "encoder_hidden_states", "output": "out_sample"},
        "vae_decoder": {"model": "vae_decoder/model.onnx", "input": "latent_sample", "output": "sample",
                        "scaling_factor": SD15_SCALING_FACTOR},
        "latent": {"channels": 4, "height": latent, "width": latent},
        "image": {"channels": 3, "height": 8 * latent, "width": 8 * latent, "range": [-1, 1]},
        "scheduler": {"type": "ddim", "num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012,
                      "beta_schedule": "scaled_linear", "prediction_type": "epsilon", "timestep_spacing": "leading",
                      "steps_offset": 1, "set_alpha_to_one": False, "clip_sample": False},
        "defaults": {"steps": 20, "guidance_scale": 7.5, "negative_prompt": ""},
        "noise": {"generator": "splitmix64_box_muller", "doc": "tools/tiny_sd_pipeline.py (seeded_noise)"},
        "prompts": {"calibration": os.path.join(REPO, "prompts", "tiny_calib.txt"),
                    "evaluation": os.path.join(REPO, "prompts", "tiny_eval.txt")},
    }


def write_sdxl_folder(out, scale, latent):
    """out/sdxl/ as Optimum's `optimum-cli export onnx` writes an SDXL pipeline (tools/export_tiny_sdxl.py's configs,
    tokenizers, scheduler and model_index.json), over the SDXL models exported into it and sdxl_unet/'s files
    (hard links). Returns the sub-folders still missing a model.onnx."""
    import export_tiny_sdxl as E
    d = os.path.join(out, "sdxl")
    cfg = configs(scale)
    os.makedirs(os.path.join(d, "unet"), exist_ok=True)
    for f in ("model.onnx", "model.onnx.data"):
        src, dst = os.path.join(out, DIRS["sdxl-unet"], f), os.path.join(d, "unet", f)
        if os.path.exists(src):
            if os.path.exists(dst):
                os.remove(dst)
            os.link(src, dst)
    E.write_json(os.path.join(d, "model_index.json"), E.model_index())
    E.write_json(os.path.join(d, "scheduler", "scheduler_config.json"), E.P.SCHEDULER_CONFIG)
    E.write_json(os.path.join(d, "text_encoder", "config.json"), E.clip_config(cfg["sdxl-text-encoder"], False, 621))
    E.write_json(os.path.join(d, "text_encoder_2", "config.json"), E.clip_config(cfg["sdxl-text-encoder-2"], True, 0))
    E.write_json(os.path.join(d, "unet", "config.json"), E.unet_config(cfg["sdxl-unet"], latent))
    E.write_json(os.path.join(d, "vae_decoder", "config.json"),
                 E.vae_config(SDXL_SCALING_FACTOR, 8 * latent, cfg["sdxl-vae-decoder"]))
    E.write_tokenizers(d)
    return [s for s in ("text_encoder", "text_encoder_2", "unet", "vae_decoder")
            if not os.path.exists(os.path.join(d, s, "model.onnx"))]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, help="output folder (outside the repository: GBs at full size)")
    ap.add_argument("--only", default="unet,sdxl-unet,text-encoder,vae-decoder,pipeline",
                    help="comma-separated subset of: " + ", ".join(MODELS + ("pipeline", "sdxl-pipeline")))
    ap.add_argument("--widths-scale", type=float, default=1.0, help="multiply every width (toy models for tests)")
    ap.add_argument("--fp16", action="store_true", help="export in float16 (traced on CUDA when available)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--latent", type=int, default=None,
                    help="latent size of --check inputs and of pipeline.json (default: 64; SDXL-like UNet 128)")
    ap.add_argument("--check", metavar="QEVAL", help="run each graph in `QEVAL infer` and compare with PyTorch")
    ap.add_argument("--check-tol", type=float, default=1e-4, help="largest relative L2 --check accepts")
    ap.add_argument("--no-shape-inference", action="store_true",
                    help="skip the exporter's ONNX shape inference (private torch.onnx.utils._export): its cost grows "
                         "faster than the graph (SDXL-like UNet at widths scale 0.1 here: 394 s with, 96 s without)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    only = [s.strip() for s in a.only.split(",") if s.strip()]
    for s in only:
        if s not in MODELS + ("pipeline", "sdxl-pipeline"):
            ap.error("--only: '%s' is not one of %s" % (s, ", ".join(MODELS + ("pipeline", "sdxl-pipeline"))))
    if a.widths_scale <= 0 or a.widths_scale > 1:
        ap.error("--widths-scale must be in (0, 1]")
    torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = False  # constant folding must compute in true FP32
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(a.out, exist_ok=True)
    manifest_path = os.path.join(a.out, "manifest.json")
    manifest = {}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
    manifest.update({"tool": "tools/export_full_size.py", "torch": torch.__version__, "onnx": onnx.__version__,
                     "widths_scale": a.widths_scale, "seed": a.seed})
    models = manifest.setdefault("models", {})
    failed = False
    print("%-13s %10s %11s %12s %9s  %s" % ("model", "params", "onnx bytes", "data bytes", "export s", "check"))
    for name in MODELS:
        if name not in only:
            continue
        t0 = time.time()
        module = build_model(name, a.widths_scale, a.seed)
        build_s = time.time() - t0
        params = param_count(name, module)
        out_dir = os.path.join(a.out, DIRS[name])
        t0 = time.time()
        onnx_bytes, data_bytes = export_onnx(name, module, out_dir, a.fp16, a.widths_scale, not a.no_shape_inference)
        export_s = time.time() - t0
        entry = {"dir": DIRS[name], "params": params, "onnx_bytes": onnx_bytes, "data_bytes": data_bytes,
                 "build_s": round(build_s, 2), "export_s": round(export_s, 2),
                 "dtype": "float16" if a.fp16 else "float32", "onnx_shape_inference": not a.no_shape_inference,
                 "config": configs(a.widths_scale)[name]}
        check = ""
        if a.check:
            latent = a.latent if name != "sdxl-unet" or a.latent is None else 2 * a.latent
            if a.fp16 and not torch.cuda.is_available():  # export_fp16_on_cpu left the module without weights
                module = build_model(name, a.widths_scale, a.seed)
            res, check_s = check_with_qeval(a.check, name, module, out_dir, a.widths_scale, latent, a.seed, a.fp16)
            entry["check"] = res
            worst = max(r["rel_l2"] for r in res.values())
            ok = worst <= a.check_tol or (a.fp16 and worst <= 1e-2)
            failed |= not ok
            check = "qeval vs torch: " + ", ".join("%s max-abs %.2e rel-L2 %.2e" % (n, r["max_abs"], r["rel_l2"])
                                                  for n, r in res.items()) + (" ok" if ok else " FAILED")
            check += " (%.1f s)" % check_s
        models[name] = entry
        print("%-13s %9.2fM %11d %12d %9.1f  %s" % (name, params / 1e6, onnx_bytes, data_bytes, export_s, check),
              flush=True)
        del module
    if "pipeline" in only:
        copy_tokenizer(a.out)
        latent = a.latent or DEFAULT_LATENT["unet"]
        with open(os.path.join(a.out, "pipeline.json"), "w") as f:
            json.dump(pipeline_json(latent), f, indent=2)
            f.write("\n")
        missing = [DIRS[n] for n in ("unet", "text-encoder", "vae-decoder")
                   if not os.path.exists(os.path.join(a.out, DIRS[n], "model.onnx"))]
        print("pipeline.json: %dx%d images from a %dx%d latent%s" % (
            8 * latent, 8 * latent, latent, latent,
            "" if not missing else " (export %s too before running it)" % ", ".join(missing)))
    if "sdxl-pipeline" in only:
        latent = a.latent or DEFAULT_LATENT["sdxl-unet"]
        missing = write_sdxl_folder(a.out, a.widths_scale, latent)
        print("sdxl/: an Optimum-layout SDXL folder, %dx%d images from a %dx%d latent%s" % (
            8 * latent, 8 * latent, latent, latent,
            "" if not missing else " (export %s too before running it)" % ", ".join(missing)))
    with open(manifest_path + ".tmp", "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    os.replace(manifest_path + ".tmp", manifest_path)
    if failed:
        raise SystemExit("qeval and PyTorch disagree past --check-tol %g" % a.check_tol)


if __name__ == "__main__":
    main()
