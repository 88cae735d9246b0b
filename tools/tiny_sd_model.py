#!/usr/bin/python3
"""tiny-sd's networks in PyTorch, with the structure (and parameter names) of diffusers' AutoencoderKL and UNet2DConditionModel and transformers' CLIPTextModel."""

# Imported by tools/train_tiny_sd.py (training, on the GPU machine's PyTorch 2.x) and
# tools/export_tiny_sd.py (ONNX export, on Debian's PyTorch 1.13): everything here runs on both.
# Attention is written out (softmax(q k^T / sqrt(d)) v), as the TorchScript exports of SD contain
# it; training may switch to F.scaled_dot_product_attention (same function) with use_sdpa.
#
# What each network holds, and the diffusers/transformers module it mirrors:
#   VAE (AutoencoderKL): Encoder/Decoder of ResnetBlock2D (GroupNorm, SiLU, 3x3 conv), a mid block
#     with a single-head spatial self-attention, Downsample2D (pad right/bottom, stride-2 conv) and
#     Upsample2D (nearest 2x, conv); 64x64x3 <-> 16x16x4 with the diagonal-Gaussian posterior.
#   Text encoder (CLIPTextModel): token + position embeddings, pre-LN transformer layers with
#     causal self-attention and a quick-GELU MLP, final LayerNorm; last_hidden_state is the output.
#   UNet (UNet2DConditionModel): sinusoidal timestep projection (flip_sin_to_cos, shift 0) + MLP,
#     conv_in, CrossAttnDownBlock2D / UNetMidBlock2DCrossAttn / CrossAttnUpBlock2D of ResnetBlock2D
#     and Transformer2DModel (GroupNorm, 1x1 conv proj_in/out, BasicTransformerBlock with self-
#     attention, cross-attention and a GEGLU feed-forward), skip connections, conv_out.
#     The defaults are tiny-sd's (its exported graphs must not change); the keyword parameters give
#     the full-size networks of tools/export_full_size.py: a transformer depth per block (0 = diffusers'
#     DownBlock2D / UpBlock2D, no attention), a head count instead of a head size, linear proj_in/out
#     (SDXL's use_linear_projection), and SDXL's "text_time" added conditioning (text_embeds + time_ids).

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# Hyper-parameters of the shipped model (MODEL_CARD.md repeats them).
VAE_CONFIG = dict(in_channels=3, latent_channels=4, block_out_channels=(32, 64, 64), layers_per_block=1,
                  norm_num_groups=32)
TEXT_CONFIG = dict(vocab_size=622, max_position_embeddings=77, hidden_size=128, num_layers=3, num_heads=4,
                   intermediate_size=512)
UNET_CONFIG = dict(in_channels=4, out_channels=4, block_out_channels=(64, 96), layers_per_block=1,
                   cross_attention_dim=128, attention_head_dim=32, norm_num_groups=32)


def attention(q, k, v, heads, mask=None, use_sdpa=False):
    """Multi-head attention on [B, N, C] tensors; mask is additive, broadcast to [B, heads, Nq, Nk]."""
    b, nq, c = q.shape
    nk = k.shape[1]
    d = c // heads
    q = q.reshape(b, nq, heads, d).transpose(1, 2)
    k = k.reshape(b, nk, heads, d).transpose(1, 2)
    v = v.reshape(b, nk, heads, d).transpose(1, 2)
    if use_sdpa:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    else:
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
        if mask is not None:
            scores = scores + mask
        out = torch.matmul(scores.softmax(dim=-1), v)
    return out.transpose(1, 2).reshape(b, nq, c)


# ---------------------------------------------------------------- shared blocks (diffusers names)

class ResnetBlock2D(nn.Module):
    def __init__(self, in_channels, out_channels, temb_channels=None, groups=32, eps=1e-6):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, in_channels, eps=eps)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.time_emb_proj = nn.Linear(temb_channels, out_channels) if temb_channels else None
        self.norm2 = nn.GroupNorm(groups, out_channels, eps=eps)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.conv_shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else None

    def forward(self, x, temb=None):
        h = self.conv1(F.silu(self.norm1(x)))
        if self.time_emb_proj is not None:
            h = h + self.time_emb_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        return x + h


class Downsample2D(nn.Module):
    def __init__(self, channels, vae_padding=False):
        super().__init__()
        self.vae_padding = vae_padding  # the VAE pads right/bottom by one and convolves unpadded
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=0 if vae_padding else 1)

    def forward(self, x):
        if self.vae_padding:
            x = F.pad(x, (0, 1, 0, 1))
        return self.conv(x)


class Upsample2D(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


# ---------------------------------------------------------------- VAE

class VaeAttention(nn.Module):
    """The VAE mid block's single-head self-attention over positions (diffusers Attention with group_norm)."""

    def __init__(self, channels, groups):
        super().__init__()
        self.group_norm = nn.GroupNorm(groups, channels, eps=1e-6)
        self.to_q = nn.Linear(channels, channels)
        self.to_k = nn.Linear(channels, channels)
        self.to_v = nn.Linear(channels, channels)
        self.to_out = nn.ModuleList([nn.Linear(channels, channels)])

    def forward(self, x):
        b, c, h, w = x.shape
        y = self.group_norm(x).reshape(b, c, h * w).transpose(1, 2)
        y = attention(self.to_q(y), self.to_k(y), self.to_v(y), heads=1)
        y = self.to_out[0](y).transpose(1, 2).reshape(b, c, h, w)
        return x + y


class VaeMidBlock(nn.Module):
    def __init__(self, channels, groups):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock2D(channels, channels, None, groups),
                                      ResnetBlock2D(channels, channels, None, groups)])
        self.attentions = nn.ModuleList([VaeAttention(channels, groups)])

    def forward(self, x):
        return self.resnets[1](self.attentions[0](self.resnets[0](x)))


class EncoderBlock(nn.Module):
    def __init__(self, cin, cout, layers, groups, downsample):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock2D(cin if i == 0 else cout, cout, None, groups) for i in range(layers)])
        self.downsamplers = nn.ModuleList([Downsample2D(cout, vae_padding=True)]) if downsample else None

    def forward(self, x):
        for r in self.resnets:
            x = r(x)
        if self.downsamplers is not None:
            x = self.downsamplers[0](x)
        return x


class DecoderBlock(nn.Module):
    def __init__(self, cin, cout, layers, groups, upsample):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock2D(cin if i == 0 else cout, cout, None, groups) for i in range(layers)])
        self.upsamplers = nn.ModuleList([Upsample2D(cout)]) if upsample else None

    def forward(self, x):
        for r in self.resnets:
            x = r(x)
        if self.upsamplers is not None:
            x = self.upsamplers[0](x)
        return x


class Encoder(nn.Module):
    def __init__(self, in_channels, latent_channels, block_out_channels, layers_per_block, norm_num_groups):
        super().__init__()
        ch = block_out_channels
        self.conv_in = nn.Conv2d(in_channels, ch[0], 3, padding=1)
        self.down_blocks = nn.ModuleList([
            EncoderBlock(ch[max(i - 1, 0)], ch[i], layers_per_block, norm_num_groups, downsample=i < len(ch) - 1)
            for i in range(len(ch))])
        self.mid_block = VaeMidBlock(ch[-1], norm_num_groups)
        self.conv_norm_out = nn.GroupNorm(norm_num_groups, ch[-1], eps=1e-6)
        self.conv_out = nn.Conv2d(ch[-1], 2 * latent_channels, 3, padding=1)

    def forward(self, x):
        x = self.conv_in(x)
        for b in self.down_blocks:
            x = b(x)
        x = self.mid_block(x)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


class Decoder(nn.Module):
    def __init__(self, in_channels, latent_channels, block_out_channels, layers_per_block, norm_num_groups):
        super().__init__()
        rev = list(reversed(block_out_channels))
        self.conv_in = nn.Conv2d(latent_channels, rev[0], 3, padding=1)
        self.mid_block = VaeMidBlock(rev[0], norm_num_groups)
        self.up_blocks = nn.ModuleList([
            DecoderBlock(rev[max(i - 1, 0)], rev[i], layers_per_block + 1, norm_num_groups, upsample=i < len(rev) - 1)
            for i in range(len(rev))])
        self.conv_norm_out = nn.GroupNorm(norm_num_groups, rev[-1], eps=1e-6)
        self.conv_out = nn.Conv2d(rev[-1], in_channels, 3, padding=1)

    def forward(self, z):
        x = self.mid_block(self.conv_in(z))
        for b in self.up_blocks:
            x = b(x)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


class AutoencoderKL(nn.Module):
    def __init__(self, in_channels=3, latent_channels=4, block_out_channels=(32, 64, 64), layers_per_block=1,
                 norm_num_groups=32):
        super().__init__()
        args = (in_channels, latent_channels, block_out_channels, layers_per_block, norm_num_groups)
        self.encoder = Encoder(*args)
        self.decoder = Decoder(*args)
        self.quant_conv = nn.Conv2d(2 * latent_channels, 2 * latent_channels, 1)
        self.post_quant_conv = nn.Conv2d(latent_channels, latent_channels, 1)

    def encode(self, x):
        """Mean and log-variance of the posterior, each [B, 4, H/4, W/4]."""
        moments = self.quant_conv(self.encoder(x))
        mean, logvar = moments.chunk(2, dim=1)
        return mean, logvar.clamp(-30.0, 20.0)

    def decode(self, z):
        return self.decoder(self.post_quant_conv(z))


class VaeDecoderExport(nn.Module):
    """vae_decoder.onnx: latent (already divided by the scaling factor) -> image on [-1, 1], as SD's export."""

    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, latent_sample):
        return self.vae.decode(latent_sample)


# ---------------------------------------------------------------- CLIP text encoder

def quick_gelu(x):
    return x * torch.sigmoid(1.702 * x)


class ClipAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x, mask, use_sdpa=False):
        return self.out_proj(attention(self.q_proj(x), self.k_proj(x), self.v_proj(x), self.heads, mask, use_sdpa))


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
        self.layer_norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.self_attn = ClipAttention(dim, heads)
        self.layer_norm2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = ClipMlp(dim, hidden)

    def forward(self, x, mask, use_sdpa=False):
        x = x + self.self_attn(self.layer_norm1(x), mask, use_sdpa)
        return x + self.mlp(self.layer_norm2(x))


class ClipTextModel(nn.Module):
    def __init__(self, vocab_size=622, max_position_embeddings=77, hidden_size=128, num_layers=3, num_heads=4,
                 intermediate_size=512):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, hidden_size)
        self.position_embedding = nn.Embedding(max_position_embeddings, hidden_size)
        self.register_buffer("position_ids", torch.arange(max_position_embeddings)[None], persistent=False)
        self.layers = nn.ModuleList([ClipEncoderLayer(hidden_size, num_heads, intermediate_size)
                                     for _ in range(num_layers)])
        self.final_layer_norm = nn.LayerNorm(hidden_size, eps=1e-5)
        self.use_sdpa = False

    def forward(self, input_ids):
        n = input_ids.shape[1]
        x = self.token_embedding(input_ids) + self.position_embedding(self.position_ids[:, :n])
        # CLIP's causal mask: -inf above the diagonal (transformers builds it with full + triu).
        mask = torch.full((n, n), float("-inf"), device=x.device, dtype=x.dtype).triu(1)[None, None]
        for layer in self.layers:
            x = layer(x, mask, self.use_sdpa)
        return self.final_layer_norm(x)


# ---------------------------------------------------------------- UNet

def timestep_embedding(timesteps, dim, flip_sin_to_cos=True, downscale_freq_shift=0.0, max_period=10000):
    """diffusers' get_timestep_embedding."""
    half = dim // 2
    exponent = -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=timesteps.device)
    exponent = exponent / (half - downscale_freq_shift)
    emb = timesteps[:, None].float() * torch.exp(exponent)[None, :]
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    if flip_sin_to_cos:
        emb = torch.cat([emb[:, half:], emb[:, :half]], dim=-1)
    return emb


class TimestepEmbedding(nn.Module):
    def __init__(self, cin, dim):
        super().__init__()
        self.linear_1 = nn.Linear(cin, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x):
        return self.linear_2(F.silu(self.linear_1(x)))


class Attention(nn.Module):
    def __init__(self, query_dim, heads, cross_attention_dim=None):
        super().__init__()
        kv_dim = cross_attention_dim or query_dim
        self.heads = heads
        self.to_q = nn.Linear(query_dim, query_dim, bias=False)
        self.to_k = nn.Linear(kv_dim, query_dim, bias=False)
        self.to_v = nn.Linear(kv_dim, query_dim, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(query_dim, query_dim)])

    def forward(self, x, context=None, use_sdpa=False):
        context = x if context is None else context
        return self.to_out[0](attention(self.to_q(x), self.to_k(context), self.to_v(context), self.heads,
                                        use_sdpa=use_sdpa))


class GEGLU(nn.Module):
    def __init__(self, dim_in, dim_out):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out * 2)

    def forward(self, x):
        h, gate = self.proj(x).chunk(2, dim=-1)
        return h * F.gelu(gate)


class FeedForward(nn.Module):
    def __init__(self, dim, mult=4):
        super().__init__()
        self.net = nn.ModuleList([GEGLU(dim, dim * mult), nn.Dropout(0.0), nn.Linear(dim * mult, dim)])

    def forward(self, x):
        for m in self.net:
            x = m(x)
        return x


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim, heads, cross_attention_dim):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.attn2 = Attention(dim, heads, cross_attention_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim)

    def forward(self, x, context, use_sdpa=False):
        x = x + self.attn1(self.norm1(x), use_sdpa=use_sdpa)
        x = x + self.attn2(self.norm2(x), context, use_sdpa=use_sdpa)
        return x + self.ff(self.norm3(x))


class Transformer2DModel(nn.Module):
    def __init__(self, channels, heads, cross_attention_dim, groups, depth=1, use_linear_projection=False):
        super().__init__()
        self.use_linear_projection = use_linear_projection
        proj = (lambda: nn.Linear(channels, channels)) if use_linear_projection else (
            lambda: nn.Conv2d(channels, channels, 1))
        self.norm = nn.GroupNorm(groups, channels, eps=1e-6)
        self.proj_in = proj()
        self.transformer_blocks = nn.ModuleList([BasicTransformerBlock(channels, heads, cross_attention_dim)
                                                 for _ in range(depth)])
        self.proj_out = proj()

    def forward(self, x, context, use_sdpa=False):
        b, c, h, w = x.shape
        if self.use_linear_projection:  # diffusers: the projections act on [B, HW, C] tokens
            y = self.proj_in(self.norm(x).permute(0, 2, 3, 1).reshape(b, h * w, c))
        else:
            y = self.proj_in(self.norm(x))
            y = y.permute(0, 2, 3, 1).reshape(b, h * w, c)
        for blk in self.transformer_blocks:
            y = blk(y, context, use_sdpa)
        if self.use_linear_projection:
            return self.proj_out(y).reshape(b, h, w, c).permute(0, 3, 1, 2) + x
        y = y.reshape(b, h, w, c).permute(0, 3, 1, 2)
        return self.proj_out(y) + x


class CrossAttnDownBlock2D(nn.Module):
    """depth 0 is diffusers' DownBlock2D (resnets only, no attentions)."""

    def __init__(self, cin, cout, temb, layers, heads, cross_dim, groups, downsample, depth=1,
                 use_linear_projection=False):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock2D(cin if i == 0 else cout, cout, temb, groups, eps=1e-5)
                                      for i in range(layers)])
        self.attentions = nn.ModuleList([Transformer2DModel(cout, heads, cross_dim, groups, depth,
                                                            use_linear_projection)
                                         for _ in range(layers)]) if depth else None
        self.downsamplers = nn.ModuleList([Downsample2D(cout)]) if downsample else None

    def forward(self, x, temb, context, use_sdpa=False):
        states = []
        for i, r in enumerate(self.resnets):
            x = r(x, temb)
            if self.attentions is not None:
                x = self.attentions[i](x, context, use_sdpa)
            states.append(x)
        if self.downsamplers is not None:
            x = self.downsamplers[0](x)
            states.append(x)
        return x, states


class UNetMidBlock2DCrossAttn(nn.Module):
    def __init__(self, channels, temb, heads, cross_dim, groups, depth=1, use_linear_projection=False):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock2D(channels, channels, temb, groups, eps=1e-5),
                                      ResnetBlock2D(channels, channels, temb, groups, eps=1e-5)])
        self.attentions = nn.ModuleList([Transformer2DModel(channels, heads, cross_dim, groups, depth,
                                                            use_linear_projection)])

    def forward(self, x, temb, context, use_sdpa=False):
        x = self.resnets[0](x, temb)
        x = self.attentions[0](x, context, use_sdpa)
        return self.resnets[1](x, temb)


class CrossAttnUpBlock2D(nn.Module):
    """depth 0 is diffusers' UpBlock2D (resnets only, no attentions)."""

    def __init__(self, prev_out, cout, skip_channels, temb, heads, cross_dim, groups, upsample, depth=1,
                 use_linear_projection=False):
        super().__init__()
        # skip_channels: channels of the skip states this block pops, in the order it pops them.
        self.resnets = nn.ModuleList([ResnetBlock2D((prev_out if i == 0 else cout) + s, cout, temb, groups, eps=1e-5)
                                      for i, s in enumerate(skip_channels)])
        self.attentions = nn.ModuleList([Transformer2DModel(cout, heads, cross_dim, groups, depth,
                                                            use_linear_projection)
                                         for _ in skip_channels]) if depth else None
        self.upsamplers = nn.ModuleList([Upsample2D(cout)]) if upsample else None

    def forward(self, x, skips, temb, context, use_sdpa=False):
        for i, r in enumerate(self.resnets):
            x = torch.cat([x, skips.pop()], dim=1)
            x = r(x, temb)
            if self.attentions is not None:
                x = self.attentions[i](x, context, use_sdpa)
        if self.upsamplers is not None:
            x = self.upsamplers[0](x)
        return x


class UNet2DConditionModel(nn.Module):
    """transformer_layers_per_block: depth of each block's Transformer2DModels, 0 = no attention (default 1
    everywhere); mid_block_layers: the mid block's depth; num_attention_heads: heads per block (int or tuple;
    default: channels // attention_head_dim); addition_time_embed_dim: SDXL's "text_time" conditioning
    (time_ids [B, 6] projected to that size each, concatenated after text_embeds
    [B, projection_class_embeddings_input_dim - 6 * addition_time_embed_dim])."""

    def __init__(self, in_channels=4, out_channels=4, block_out_channels=(64, 96), layers_per_block=1,
                 cross_attention_dim=128, attention_head_dim=32, norm_num_groups=32, transformer_layers_per_block=None,
                 mid_block_layers=1, num_attention_heads=None, use_linear_projection=False,
                 addition_time_embed_dim=None, projection_class_embeddings_input_dim=None):
        super().__init__()
        ch = block_out_channels
        temb = 4 * ch[0]
        self.time_proj_dim = ch[0]
        self.use_sdpa = False
        depth = list(transformer_layers_per_block or [1] * len(ch))
        lin = use_linear_projection
        self.conv_in = nn.Conv2d(in_channels, ch[0], 3, padding=1)
        self.time_embedding = TimestepEmbedding(ch[0], temb)
        self.addition_time_embed_dim = addition_time_embed_dim
        if addition_time_embed_dim:
            self.add_embedding = TimestepEmbedding(projection_class_embeddings_input_dim, temb)
        if num_attention_heads is None:
            heads = [c // attention_head_dim for c in ch]
        else:
            heads = list(num_attention_heads) if isinstance(num_attention_heads, (list, tuple)) else (
                [num_attention_heads] * len(ch))
        self.down_blocks = nn.ModuleList()
        skip_channels = [ch[0]]
        for i, c in enumerate(ch):
            last = i == len(ch) - 1
            self.down_blocks.append(CrossAttnDownBlock2D(ch[max(i - 1, 0)] if i else ch[0], c, temb, layers_per_block,
                                                         heads[i], cross_attention_dim, norm_num_groups,
                                                         downsample=not last, depth=depth[i],
                                                         use_linear_projection=lin))
            skip_channels += [c] * layers_per_block + ([] if last else [c])
        self.mid_block = UNetMidBlock2DCrossAttn(ch[-1], temb, heads[-1], cross_attention_dim, norm_num_groups,
                                                 mid_block_layers, lin)
        self.up_blocks = nn.ModuleList()
        rev = list(reversed(ch))
        prev = ch[-1]
        for i, c in enumerate(rev):
            pops = [skip_channels.pop() for _ in range(layers_per_block + 1)]
            j = len(ch) - 1 - i
            self.up_blocks.append(CrossAttnUpBlock2D(prev, c, pops, temb, heads[j], cross_attention_dim,
                                                     norm_num_groups, upsample=i < len(ch) - 1, depth=depth[j],
                                                     use_linear_projection=lin))
            prev = c
        self.conv_norm_out = nn.GroupNorm(norm_num_groups, ch[0], eps=1e-5)
        self.conv_out = nn.Conv2d(ch[0], out_channels, 3, padding=1)

    def forward(self, sample, timestep, encoder_hidden_states, text_embeds=None, time_ids=None):
        # timestep: [B] (any float/int dtype), as diffusers' ONNX exports take it.
        temb = self.time_embedding(timestep_embedding(timestep, self.time_proj_dim).to(sample.dtype))
        if self.addition_time_embed_dim:  # diffusers' addition_embed_type "text_time" (SDXL)
            b = time_ids.shape[0]
            time_embeds = timestep_embedding(time_ids.reshape(-1), self.addition_time_embed_dim).reshape(b, -1)
            temb = temb + self.add_embedding(torch.cat([text_embeds, time_embeds.to(text_embeds.dtype)], dim=-1))
        x = self.conv_in(sample)
        skips = [x]
        for b in self.down_blocks:
            x, states = b(x, temb, encoder_hidden_states, self.use_sdpa)
            skips += states
        x = self.mid_block(x, temb, encoder_hidden_states, self.use_sdpa)
        for b in self.up_blocks:
            x = b(x, skips, temb, encoder_hidden_states, self.use_sdpa)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


class TextEncoderExport(nn.Module):
    """text_encoder.onnx: input_ids -> last_hidden_state, pooler_output (tools/export_tiny_sd.py, export_full_size.py)."""

    def __init__(self, text):
        super().__init__()
        self.text = text

    def forward(self, input_ids):
        h = self.text(input_ids)
        # CLIP's pooled output: the hidden state at the EOS token (the largest id in the vocabulary).
        pooled = h[torch.arange(h.shape[0]), input_ids.to(torch.int64).argmax(dim=-1)]
        return h, pooled


def build_models():
    return AutoencoderKL(**VAE_CONFIG), ClipTextModel(**TEXT_CONFIG), UNet2DConditionModel(**UNET_CONFIG)


def param_count(m):
    return sum(p.numel() for p in m.parameters())


if __name__ == "__main__":
    vae, text, unet = build_models()
    print("vae decoder %.3fM, encoder %.3fM, text %.3fM, unet %.3fM" % (
        (param_count(vae.decoder) + param_count(vae.post_quant_conv)) / 1e6,
        (param_count(vae.encoder) + param_count(vae.quant_conv)) / 1e6, param_count(text) / 1e6, param_count(unet) / 1e6))
    x = torch.randn(2, 3, 64, 64)
    mean, logvar = vae.encode(x)
    print("latent", tuple(mean.shape), "decoded", tuple(vae.decode(mean).shape))
    ids = torch.randint(0, 622, (2, 77))
    ctx = text(ids)
    eps = unet(mean, torch.tensor([10, 900]), ctx)
    print("context", tuple(ctx.shape), "eps", tuple(eps.shape))
