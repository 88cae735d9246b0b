#!/usr/bin/python3
"""Exports small diffusion/vision reference models to ONNX (tests/data/onnx/) with inputs, ONNX Runtime outputs and PyTorch outputs."""

# Usage (from the repository root):
#   (cd tools/ort && npm ci --ignore-scripts)      # once: ONNX Runtime for Node (see tools/ort/README.md)
#   /usr/bin/python3 tools/make_reference_models.py
#
# Needs Debian's Python with torch (1.13), onnx (1.12) and numpy, and Node.js with tools/ort installed.
# Each model is a small version (random weights, < 2 MB) of the blocks real exports contain, built
# the way diffusers / transformers / timm write them, and exported with the TorchScript exporter
# (opset 17, constant folding on, dynamic axes where the real exports have them) so the graphs hold
# what users' exports hold: Shape/Gather/Concat chains feeding Reshape, GroupNorm as
# InstanceNormalization between Reshapes, LayerNormalization, Erf-based GELU, Resize, Trilu, ...
#
# Writes, per model, tests/data/onnx/<model>/:
#   model.onnx
#   inputs/<input name>.npy          deterministic inputs (normal floats; int64 token ids in range)
#   outputs/<output name>.npy        ONNX Runtime (CPU EP, graph optimizations disabled, 1 thread),
#                                    written by tools/ort/run_reference.js: what the C++ test checks
#   expected_torch/<output name>.npy PyTorch's own outputs: a check of the export, printed as rel L2
# Names with characters outside [A-Za-z0-9_.-] have them replaced by '_'.
#
# Seeds are fixed per model (torch.manual_seed / numpy RandomState), so re-running writes the same
# weights and inputs given the same torch version; ORT's outputs are deterministic for one thread.

import collections
import io
import os
import re
import shutil
import subprocess

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_ROOT = os.path.join(REPO, "tests", "data", "onnx")
ORT_RUNNER = os.path.join(REPO, "tools", "ort", "run_reference.js")
OPSET = 17
MAX_MODEL_BYTES = 2 * 1024 * 1024


def safe_name(name):
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def randomize_norms(module, gen_seed):
    """GroupNorm/LayerNorm start at weight 1, bias 0; give them random affine parameters instead,
    so the test sees the scale and shift applied (a kernel that ignored them would still pass)."""
    g = torch.Generator().manual_seed(gen_seed)
    for m in module.modules():
        if isinstance(m, (nn.GroupNorm, nn.LayerNorm)):
            with torch.no_grad():
                m.weight.copy_(1.0 + 0.2 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=g))


# ----------------------------------------------------------------------------
# diffusers-style blocks
# ----------------------------------------------------------------------------

class ResnetBlock2D(nn.Module):
    """diffusers ResnetBlock2D: GN -> SiLU -> conv3x3 (+ time embedding) -> GN -> SiLU -> conv3x3, + skip."""

    def __init__(self, channels, temb_channels=None, groups=32, eps=1e-6):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, channels, eps=eps)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.time_emb_proj = nn.Linear(temb_channels, channels) if temb_channels else None
        self.norm2 = nn.GroupNorm(groups, channels, eps=eps)
        self.dropout = nn.Dropout(0.0)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x, temb=None):
        h = self.conv1(F.silu(self.norm1(x)))
        if self.time_emb_proj is not None:
            h = h + self.time_emb_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return x + h


class Attention(nn.Module):
    """diffusers Attention (CrossAttention): q/k/v Linear, heads split by reshape/permute, softmax(q k^T * scale) v."""

    def __init__(self, query_dim, cross_dim=None, heads=4, dim_head=16, bias=False):
        super().__init__()
        inner = heads * dim_head
        self.heads = heads
        self.scale = dim_head ** -0.5
        self.to_q = nn.Linear(query_dim, inner, bias=bias)
        self.to_k = nn.Linear(cross_dim or query_dim, inner, bias=bias)
        self.to_v = nn.Linear(cross_dim or query_dim, inner, bias=bias)
        self.to_out = nn.ModuleList([nn.Linear(inner, query_dim), nn.Dropout(0.0)])

    def head_to_batch_dim(self, t):
        b, n, dim = t.shape
        t = t.reshape(b, n, self.heads, dim // self.heads).permute(0, 2, 1, 3)
        return t.reshape(b * self.heads, n, dim // self.heads)

    def batch_to_head_dim(self, t):
        bh, n, d = t.shape
        t = t.reshape(bh // self.heads, self.heads, n, d).permute(0, 2, 1, 3)
        return t.reshape(bh // self.heads, n, d * self.heads)

    def forward(self, x, context=None):
        context = x if context is None else context
        q = self.head_to_batch_dim(self.to_q(x))
        k = self.head_to_batch_dim(self.to_k(context))
        v = self.head_to_batch_dim(self.to_v(context))
        probs = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        probs = probs.softmax(dim=-1)
        out = self.batch_to_head_dim(torch.matmul(probs, v))
        return self.to_out[1](self.to_out[0](out))


class GEGLU(nn.Module):
    def __init__(self, dim_in, dim_out):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out * 2)

    def forward(self, x):
        x, gate = self.proj(x).chunk(2, dim=-1)
        return x * F.gelu(gate)


class FeedForward(nn.Module):
    def __init__(self, dim, mult=4):
        super().__init__()
        self.net = nn.ModuleList([GEGLU(dim, dim * mult), nn.Dropout(0.0), nn.Linear(dim * mult, dim)])

    def forward(self, x):
        for m in self.net:
            x = m(x)
        return x


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim, cross_dim, heads, dim_head):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = Attention(dim, None, heads, dim_head)
        self.norm2 = nn.LayerNorm(dim)
        self.attn2 = Attention(dim, cross_dim, heads, dim_head)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim)

    def forward(self, x, context):
        x = self.attn1(self.norm1(x)) + x
        x = self.attn2(self.norm2(x), context) + x
        x = self.ff(self.norm3(x)) + x
        return x


class Transformer2DModel(nn.Module):
    """SD 1.x style: GroupNorm -> proj_in (1x1 conv) -> tokens -> transformer block -> proj_out (1x1 conv) + residual."""

    def __init__(self, channels, cross_dim, heads=4, dim_head=16, groups=32):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels, eps=1e-6)
        self.proj_in = nn.Conv2d(channels, heads * dim_head, 1)
        self.transformer_blocks = nn.ModuleList([BasicTransformerBlock(heads * dim_head, cross_dim, heads, dim_head)])
        self.proj_out = nn.Conv2d(heads * dim_head, channels, 1)

    def forward(self, x, context):
        b, c, h, w = x.shape
        residual = x
        x = self.proj_in(self.norm(x))
        inner = x.shape[1]
        x = x.permute(0, 2, 3, 1).reshape(b, h * w, inner)
        for blk in self.transformer_blocks:
            x = blk(x, context)
        x = x.reshape(b, h, w, inner).permute(0, 3, 1, 2).contiguous()
        return self.proj_out(x) + residual


class Downsample2D(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x):
        return self.conv(x)


class Upsample2D(nn.Module):
    def __init__(self, channels, out_channels=None):
        super().__init__()
        self.conv = nn.Conv2d(channels, out_channels or channels, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class UNetBlock(nn.Module):
    """A CrossAttnDownBlock2D piece (ResNet + Transformer2D + Downsample) followed by an Upsample."""

    def __init__(self, channels=64, temb_channels=128, cross_dim=64):
        super().__init__()
        self.resnet = ResnetBlock2D(channels, temb_channels)
        self.attention = Transformer2DModel(channels, cross_dim)
        self.downsample = Downsample2D(channels)
        self.upsample = Upsample2D(channels)

    def forward(self, sample, temb, encoder_hidden_states):
        h = self.resnet(sample, temb)
        h = self.attention(h, encoder_hidden_states)
        down = self.downsample(h)
        up = self.upsample(down)
        return h, down, up


class VaeAttentionBlock(nn.Module):
    """diffusers VAE mid-block attention: GroupNorm, one head over all spatial positions, residual."""

    def __init__(self, channels, groups=32):
        super().__init__()
        self.group_norm = nn.GroupNorm(groups, channels, eps=1e-6)
        self.to_q = nn.Linear(channels, channels)
        self.to_k = nn.Linear(channels, channels)
        self.to_v = nn.Linear(channels, channels)
        self.to_out = nn.ModuleList([nn.Linear(channels, channels), nn.Dropout(0.0)])
        self.scale = channels ** -0.5

    def forward(self, x):
        residual = x
        b, c, h, w = x.shape
        x = self.group_norm(x).view(b, c, h * w).transpose(1, 2)
        q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        probs = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * self.scale, dim=-1)
        x = self.to_out[0](torch.matmul(probs, v))
        x = x.transpose(-1, -2).reshape(b, c, h, w)
        return x + residual


class VaeDecoderBlock(nn.Module):
    def __init__(self, latent_channels=4, channels=64, out_channels=3, groups=32):
        super().__init__()
        self.conv_in = nn.Conv2d(latent_channels, channels, 3, padding=1)
        self.resnet = ResnetBlock2D(channels, None, groups)
        self.attention = VaeAttentionBlock(channels, groups)
        self.upsample = Upsample2D(channels)
        self.conv_norm_out = nn.GroupNorm(groups, channels, eps=1e-6)
        self.conv_out = nn.Conv2d(channels, out_channels, 3, padding=1)

    def forward(self, latent_sample):
        x = self.conv_in(latent_sample)
        x = self.resnet(x)
        x = self.attention(x)
        x = self.upsample(x)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


# ----------------------------------------------------------------------------
# transformers-style CLIP text encoder
# ----------------------------------------------------------------------------

def quick_gelu(x):
    return x * torch.sigmoid(1.702 * x)


class ClipAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = self.head_dim ** -0.5
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def _shape(self, t, seq_len, bsz):
        return t.view(bsz, seq_len, self.heads, self.head_dim).transpose(1, 2).contiguous()

    def forward(self, x, causal_attention_mask):
        bsz, tgt_len, dim = x.size()
        q = self.q_proj(x) * self.scale
        proj_shape = (bsz * self.heads, -1, self.head_dim)
        q = self._shape(q, tgt_len, bsz).view(*proj_shape)
        k = self._shape(self.k_proj(x), -1, bsz).view(*proj_shape)
        v = self._shape(self.v_proj(x), -1, bsz).view(*proj_shape)
        src_len = k.size(1)
        w = torch.bmm(q, k.transpose(1, 2))
        w = w.view(bsz, self.heads, tgt_len, src_len) + causal_attention_mask
        w = w.view(bsz * self.heads, tgt_len, src_len)
        w = F.softmax(w, dim=-1)
        out = torch.bmm(w, v)
        out = out.view(bsz, self.heads, tgt_len, self.head_dim).transpose(1, 2)
        out = out.reshape(bsz, tgt_len, dim)
        return self.out_proj(out)


class ClipMlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(quick_gelu(self.fc1(x)))


class ClipEncoderLayer(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.self_attn = ClipAttention(dim, heads)
        self.layer_norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = ClipMlp(dim, hidden)
        self.layer_norm2 = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, x, mask):
        x = x + self.self_attn(self.layer_norm1(x), mask)
        x = x + self.mlp(self.layer_norm2(x))
        return x


class ClipTextModel(nn.Module):
    """transformers CLIPTextTransformer in small: embeddings, causal encoder layers, final LN, EOS pooling."""

    def __init__(self, vocab=1000, dim=64, heads=4, hidden=256, layers=2, max_positions=77):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, dim)
        self.position_embedding = nn.Embedding(max_positions, dim)
        self.register_buffer("position_ids", torch.arange(max_positions).expand((1, -1)))
        self.layers = nn.ModuleList([ClipEncoderLayer(dim, heads, hidden) for _ in range(layers)])
        self.final_layer_norm = nn.LayerNorm(dim, eps=1e-5)

    @staticmethod
    def _build_causal_attention_mask(bsz, seq_len, dtype):
        # As transformers 4.2x builds it: fill with the most negative float, keep the strict upper triangle.
        mask = torch.empty(bsz, seq_len, seq_len, dtype=dtype)
        mask.fill_(torch.tensor(torch.finfo(dtype).min))
        mask.triu_(1)
        return mask.unsqueeze(1)

    def forward(self, input_ids):
        bsz, seq_len = input_ids.shape
        position_ids = self.position_ids[:, :seq_len]
        x = self.token_embedding(input_ids) + self.position_embedding(position_ids)
        mask = self._build_causal_attention_mask(bsz, seq_len, x.dtype)
        for layer in self.layers:
            x = layer(x, mask)
        x = self.final_layer_norm(x)
        pooled = x[torch.arange(x.shape[0]), input_ids.to(dtype=torch.int).argmax(dim=-1)]
        return x, pooled


# ----------------------------------------------------------------------------
# timm-style ViT
# ----------------------------------------------------------------------------

class VitAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class VitMlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class VitBlock(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = VitAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = VitMlp(dim, hidden)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return x


class VisionTransformer(nn.Module):
    def __init__(self, image=32, patch=4, dim=64, heads=4, hidden=256, depth=2):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        n = (image // patch) ** 2
        self.cls_token = nn.Parameter(0.02 * torch.randn(1, 1, dim))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, n + 1, dim))
        self.blocks = nn.ModuleList([VitBlock(dim, heads, hidden) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, image):
        x = self.patch_embed(image).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = x + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        x = self.norm(x)
        return x, x[:, 0]


# ----------------------------------------------------------------------------
# export, inputs, references
# ----------------------------------------------------------------------------

def make_specs():
    """(name, module factory, inputs factory, input names, output names, dynamic axes), seeds fixed per model."""

    def unet_inputs(rs):
        return [rs.standard_normal((1, 64, 16, 16)).astype(np.float32),
                rs.standard_normal((1, 128)).astype(np.float32),
                rs.standard_normal((1, 8, 64)).astype(np.float32)]

    def vae_inputs(rs):
        return [rs.standard_normal((1, 4, 16, 16)).astype(np.float32)]

    def clip_inputs(rs):
        # BOS, 10 random tokens, EOS, then EOS padding (SD 1.x pads with EOS): argmax pooling picks
        # the first EOS, since EOS is the largest id as in CLIP's vocabulary.
        vocab = 1000
        ids = np.full((1, 16), vocab - 1, dtype=np.int64)
        ids[0, 0] = vocab - 2
        ids[0, 1:11] = rs.randint(0, vocab - 2, size=10)
        return [ids]

    def vit_inputs(rs):
        return [rs.standard_normal((1, 3, 32, 32)).astype(np.float32)]

    return [
        ("unet_block", 1, UNetBlock, unet_inputs,
         ["sample", "timestep_embedding", "encoder_hidden_states"],
         ["hidden_states", "down_sample", "up_sample"],
         {"sample": {0: "batch", 2: "height", 3: "width"}, "timestep_embedding": {0: "batch"},
          "encoder_hidden_states": {0: "batch", 1: "sequence"},
          "hidden_states": {0: "batch", 2: "height", 3: "width"},
          "down_sample": {0: "batch", 2: "height_2", 3: "width_2"},
          "up_sample": {0: "batch", 2: "height", 3: "width"}}),
        ("vae_decoder_block", 2, VaeDecoderBlock, vae_inputs,
         ["latent_sample"], ["sample"],
         {"latent_sample": {0: "batch", 2: "height", 3: "width"},
          "sample": {0: "batch", 2: "height_x2", 3: "width_x2"}}),
        ("clip_text_layer", 3, ClipTextModel, clip_inputs,
         ["input_ids"], ["last_hidden_state", "pooler_output"],
         {"input_ids": {0: "batch", 1: "sequence"}, "last_hidden_state": {0: "batch", 1: "sequence"},
          "pooler_output": {0: "batch"}}),
        ("vit_block", 4, VisionTransformer, vit_inputs,
         ["image"], ["last_hidden_state", "pooled"],
         {"image": {0: "batch"}, "last_hidden_state": {0: "batch"}, "pooled": {0: "batch"}}),
    ]


def op_histogram(model):
    hist = collections.Counter()
    for node in model.graph.node:
        hist[(node.domain + "::" if node.domain else "") + node.op_type] += 1
    return hist


def rel_l2(test, ref):
    test = test.astype(np.float64)
    ref = ref.astype(np.float64)
    return float(np.linalg.norm(test - ref) / np.linalg.norm(ref))


def check_npy_bytes(path):
    """The JS writer must produce the bytes np.save would (same header, padding, data)."""
    arr = np.load(path)
    buf = io.BytesIO()
    np.save(buf, arr)
    with open(path, "rb") as f:
        if f.read() != buf.getvalue():
            raise SystemExit(f"{path}: bytes differ from np.save of the same array")


def reset_dir(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)


def build(name, seed, factory, make_inputs, input_names, output_names, dynamic_axes):
    folder = os.path.join(OUT_ROOT, name)
    os.makedirs(folder, exist_ok=True)
    for sub in ("inputs", "outputs", "expected_torch"):
        reset_dir(os.path.join(folder, sub))

    torch.manual_seed(seed)
    module = factory().eval()
    randomize_norms(module, seed + 1000)
    inputs = make_inputs(np.random.RandomState(seed))
    torch_inputs = tuple(torch.from_numpy(a) for a in inputs)

    model_path = os.path.join(folder, "model.onnx")
    with torch.no_grad():
        torch.onnx.export(module, torch_inputs, model_path, opset_version=OPSET, do_constant_folding=True,
                          input_names=input_names, output_names=output_names, dynamic_axes=dynamic_axes)
        torch_outputs = module(*torch_inputs)
    if isinstance(torch_outputs, torch.Tensor):
        torch_outputs = (torch_outputs,)

    model = onnx.load(model_path)
    onnx.checker.check_model(model, full_check=True)
    size = os.path.getsize(model_path)
    if size > MAX_MODEL_BYTES:
        raise SystemExit(f"{model_path}: {size} bytes, over the {MAX_MODEL_BYTES} budget")
    graph_inputs = [i.name for i in model.graph.input]
    graph_outputs = [o.name for o in model.graph.output]
    assert graph_inputs == input_names, (graph_inputs, input_names)
    assert graph_outputs == output_names, (graph_outputs, output_names)

    for n, a in zip(input_names, inputs):
        np.save(os.path.join(folder, "inputs", safe_name(n) + ".npy"), a)
    for n, t in zip(output_names, torch_outputs):
        np.save(os.path.join(folder, "expected_torch", safe_name(n) + ".npy"), t.numpy())

    subprocess.run(["node", ORT_RUNNER, model_path, os.path.join(folder, "inputs"), os.path.join(folder, "outputs")],
                   check=True)

    params = sum(p.numel() for p in module.parameters())
    print(f"== {name}: {params} parameters, model.onnx {size} bytes, {len(model.graph.node)} nodes, "
          f"{len(model.graph.initializer)} initializers")
    print("   inputs:  " + ", ".join(f"{n} {list(a.shape)} {a.dtype}" for n, a in zip(input_names, inputs)))
    hist = op_histogram(model)
    print("   ops:     " + ", ".join(f"{op} {count}" for op, count in sorted(hist.items())))
    worst = 0.0
    for n, t in zip(output_names, torch_outputs):
        path = os.path.join(folder, "outputs", safe_name(n) + ".npy")
        check_npy_bytes(path)
        ort = np.load(path)
        ref = t.numpy()
        assert ort.shape == ref.shape and ort.dtype == ref.dtype, (n, ort.shape, ref.shape, ort.dtype, ref.dtype)
        err = rel_l2(ort, ref)
        worst = max(worst, err)
        print(f"   output {n} {list(ref.shape)}: ORT vs torch rel L2 {err:.3e}, max abs "
              f"{float(np.max(np.abs(ort.astype(np.float64) - ref))):.3e}, |ref| rms {float(np.sqrt(np.mean(ref.astype(np.float64) ** 2))):.3f}")
    if not worst < 1e-5:
        raise SystemExit(f"{name}: ORT and torch disagree (rel L2 {worst:.3e}): the export is suspect")
    return hist


def main():
    if not os.path.isdir(os.path.join(REPO, "tools", "ort", "node_modules", "onnxruntime-node")):
        raise SystemExit("ONNX Runtime for Node is not installed: run `npm ci --ignore-scripts` in tools/ort")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    total = collections.Counter()
    for spec in make_specs():
        total.update(build(*spec))
    print("== all models: " + ", ".join(f"{op} {count}" for op, count in sorted(total.items())))


if __name__ == "__main__":
    main()
