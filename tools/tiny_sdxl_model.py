#!/usr/bin/python3
"""tiny-sdxl's networks in PyTorch: SDXL's structure (two CLIP text encoders, text_time conditioning) at toy size, built from tools/tiny_sd_model.py's diffusers-structured modules."""

# Imported by tools/train_tiny_sdxl.py (training, PyTorch 2.x on the GPU machine), tools/export_tiny_sdxl.py and
# tools/tiny_sdxl_pipeline.py (Debian's PyTorch 1.13 here): everything runs on both.
#
# What SDXL has and where it is here (diffusers / transformers names, so the Optimum export reads like a real one):
#   text_encoder    CLIPTextModel (CLIP ViT-L's role): its hidden_states[-2] (the penultimate layer's output, no
#                   final LayerNorm) is the first part of the context.
#   text_encoder_2  CLIPTextModelWithProjection (OpenCLIP bigG's role, wider): hidden_states[-2] is the second
#                   part of the context; text_embeds = text_projection(final_layer_norm(h)[EOS position]) is the
#                   pooled embedding the UNet's "text_time" conditioning takes.
#   unet            UNet2DConditionModel with addition_embed_type "text_time": time_ids [B, 6] through a sinusoidal
#                   embedding of addition_time_embed_dim per value, concatenated after text_embeds, through a
#                   TimestepEmbedding added to the timestep embedding; three levels with transformer depths
#                   (0, 1, 2) (no attention at the highest resolution, as SDXL's (0, 2, 10)), mid block depth 2,
#                   linear proj_in/out (use_linear_projection), cross-attention width = the two encoders' widths.
#   vae             tiny-sd's AutoencoderKL structure (tools/tiny_sd_model.py, VAE_CONFIG); the exported decoder
#                   carries SDXL-VAE-like FP16 overflow (scale_decoder_trunk below).

import copy
import math
import sys

import torch
import torch.nn as nn

import tiny_sd_model as M

# CLIP-L's role: narrower; bigG's role: wider, with the pooled projection. Widths are chosen for the 12 MB budget
# of the whole export (about 2.6 M parameters) and a training step well under tiny-sd's. SIZES["test"] is the same
# structure (layers, depths, heads, the SDXL conditioning, the VAE's FP16 overflow) at about a quarter of every
# width, for the C++ tests' fixture (tests/data/tiny_sdxl_random, about 1 MB); set_size() picks one.
SIZES = {
    "ship": dict(vae=(32, 64, 64), vae_groups=32, text=(64, 2, 256), text2=(96, 3, 384), add_time=16,
                 unet=(32, 48, 48), unet_groups=16),
    "test": dict(vae=(8, 12, 12), vae_groups=4, text=(12, 2, 48), text2=(18, 3, 72), add_time=8,
                 unet=(8, 8, 8), unet_groups=4),
}
VAE_CONFIG, TEXT_CONFIG, TEXT2_CONFIG, UNET_CONFIG = {}, {}, {}, {}
ADDITION_TIME_EMBED_DIM = 16
SIZE = "ship"


def set_size(name):
    """Sets the module's configs (updated in place: importers' references stay valid) to SIZES[name]."""
    global ADDITION_TIME_EMBED_DIM, SIZE
    if name not in SIZES:
        raise SystemExit("unknown tiny-sdxl size %r (known: %s)" % (name, ", ".join(SIZES)))
    z = SIZES[name]
    SIZE = name
    VAE_CONFIG.clear()
    VAE_CONFIG.update(M.VAE_CONFIG, block_out_channels=z["vae"], norm_num_groups=z["vae_groups"])
    TEXT_CONFIG.clear()
    TEXT_CONFIG.update(vocab_size=622, max_position_embeddings=77, hidden_size=z["text"][0], num_layers=3,
                       num_heads=z["text"][1], intermediate_size=z["text"][2])
    TEXT2_CONFIG.clear()
    TEXT2_CONFIG.update(vocab_size=622, max_position_embeddings=77, hidden_size=z["text2"][0], num_layers=3,
                        num_heads=z["text2"][1], intermediate_size=z["text2"][2], projection_dim=z["text2"][0])
    ADDITION_TIME_EMBED_DIM = z["add_time"]
    UNET_CONFIG.clear()
    UNET_CONFIG.update(in_channels=4, out_channels=4, block_out_channels=z["unet"], layers_per_block=1,
                       cross_attention_dim=TEXT_CONFIG["hidden_size"] + TEXT2_CONFIG["hidden_size"],
                       num_attention_heads=(1, 2, 2), norm_num_groups=z["unet_groups"],
                       transformer_layers_per_block=(0, 1, 2), mid_block_layers=2, use_linear_projection=True,
                       addition_time_embed_dim=ADDITION_TIME_EMBED_DIM,
                       projection_class_embeddings_input_dim=TEXT2_CONFIG["projection_dim"] + 6 * ADDITION_TIME_EMBED_DIM)


set_size("ship")
SAMPLE_SIZE = 16  # latent side; image side = SAMPLE_SIZE * 2 ** (len(VAE block_out_channels) - 1) = 64


class ClipTextModel(M.ClipTextModel):
    """tiny-sd's CLIPTextModel with every layer's output: hidden_states as transformers' output_hidden_states=True."""

    def forward_all(self, input_ids):
        """(last_hidden_state, [embeddings, layer 1 output, ..., layer N output]); hidden_states[-1] has no final LN."""
        n = input_ids.shape[1]
        x = self.token_embedding(input_ids) + self.position_embedding(self.position_ids[:, :n])
        mask = torch.full((n, n), float("-inf"), device=x.device, dtype=x.dtype).triu(1)[None, None]
        hidden = [x]
        for layer in self.layers:
            x = layer(x, mask, self.use_sdpa)
            hidden.append(x)
        return self.final_layer_norm(x), hidden

    def pooled(self, last_hidden_state, input_ids):
        # transformers' CLIP pooling: the state at the EOS token, the largest id (argmax of the ids); tokenizer_2
        # pads with "!" (id 0), tokenizer with EOS itself: argmax's first maximum is the first EOS either way.
        return last_hidden_state[torch.arange(last_hidden_state.shape[0], device=input_ids.device),
                                 input_ids.to(torch.int64).argmax(dim=-1)]


class ClipTextModelWithProjection(ClipTextModel):
    def __init__(self, projection_dim=128, **kw):
        super().__init__(**kw)
        self.text_projection = nn.Linear(kw.get("hidden_size", 128), projection_dim, bias=False)


def encode_prompt_embeds(text, text2, ids, ids2):
    """SDXL's encode_prompt for token ids: (prompt_embeds [B, L, D1 + D2], pooled text_embeds [B, P])."""
    _, h1 = text.forward_all(ids)
    last2, h2 = text2.forward_all(ids2)
    pooled = text2.text_projection(text2.pooled(last2, ids2))
    return torch.cat([h1[-2], h2[-2]], dim=-1), pooled


class SdxlUNet(M.UNet2DConditionModel):
    """The UNet with diffusers' timestep handling: a 0-d timestep (Optimum's export) or [B] is broadcast to the batch."""

    def forward(self, sample, timestep, encoder_hidden_states, text_embeds=None, time_ids=None):
        if timestep.dim() == 0:
            timestep = timestep[None]
        return super().forward(sample, timestep.expand(sample.shape[0]), encoder_hidden_states, text_embeds, time_ids)


# ---------------------------------------------------------------- export wrappers (Optimum's output names, in order)

class TextEncoderExport(nn.Module):
    """text_encoder/model.onnx: input_ids -> last_hidden_state, pooler_output, hidden_states.0 .. hidden_states.N."""

    def __init__(self, text):
        super().__init__()
        self.text = text

    def forward(self, input_ids):
        last, hidden = self.text.forward_all(input_ids)
        return (last, self.text.pooled(last, input_ids)) + tuple(hidden)


class TextEncoder2Export(nn.Module):
    """text_encoder_2/model.onnx: input_ids -> text_embeds, last_hidden_state, hidden_states.0 .. hidden_states.N."""

    def __init__(self, text2):
        super().__init__()
        self.text2 = text2

    def forward(self, input_ids):
        last, hidden = self.text2.forward_all(input_ids)
        return (self.text2.text_projection(self.text2.pooled(last, input_ids)), last) + tuple(hidden)


def text_output_names(kind, num_layers):
    head = ["last_hidden_state", "pooler_output"] if kind == 1 else ["text_embeds", "last_hidden_state"]
    return head + ["hidden_states.%d" % i for i in range(num_layers + 1)]


# ---------------------------------------------------------------- the SDXL VAE's FP16 overflow, modelled


def scale_decoder_trunk(vae, k):
    """A copy of vae whose decoder trunk (conv_in .. the input of conv_norm_out) carries k times the values.

    Scaled: conv_in's weight and bias, each resnet's conv2 weight and bias and its conv_shortcut's bias (the
    shortcut is linear in its already-scaled input), the mid attention's to_out projection, each upsampler's conv
    bias (its weight sees a scaled input). Every GroupNorm in the trunk sees k x its input and removes it (up to its
    epsilon), and conv_norm_out removes it before the output: the FP32 output equals the unscaled decoder's within
    float rounding (k a power of two keeps the convolutions exact multiples), while the trunk's values reach k x
    their usual size, past float16's 65504 for k large enough, as the real SDXL VAE's do (its force_upcast)."""
    v = copy.deepcopy(vae)
    d = v.decoder
    with torch.no_grad():
        d.conv_in.weight.mul_(k)
        d.conv_in.bias.mul_(k)
        resnets = list(d.mid_block.resnets) + [r for b in d.up_blocks for r in b.resnets]
        for r in resnets:
            r.conv2.weight.mul_(k)
            r.conv2.bias.mul_(k)
            if r.conv_shortcut is not None:
                r.conv_shortcut.bias.mul_(k)
        for a in d.mid_block.attentions:
            a.to_out[0].weight.mul_(k)
            a.to_out[0].bias.mul_(k)
        for b in d.up_blocks:
            if b.upsamplers is not None:
                b.upsamplers[0].conv.bias.mul_(k)
    # The GroupNorms that read the trunk (each resnet's norm1, the attention's, conv_norm_out; norm2 reads conv1's
    # unscaled output) see k x their input: k^2 x their epsilon keeps their outputs the same.
    norms = [r.norm1 for r in resnets] + [a.group_norm for a in d.mid_block.attentions]
    for n in norms + [d.conv_norm_out]:
        n.eps *= k * k
    return v


def decoder_trunk_max_abs(vae, latents):
    """Largest |value| the decoder's trunk (conv_in .. conv_norm_out's input) produces for latents (FP32)."""
    d = vae.decoder
    seen = []
    hooks = [m.register_forward_hook(lambda _m, _i, o: seen.append(float(o.detach().abs().max())))
             for m in [d.conv_in] + list(d.mid_block.resnets) + list(d.mid_block.attentions) +
             [r for b in d.up_blocks for r in b.resnets] + [b.upsamplers[0] for b in d.up_blocks if b.upsamplers]]
    try:
        with torch.no_grad():
            vae.decode(latents)
    finally:
        for h in hooks:
            h.remove()
    return max(seen)


def overflow_scale(vae, latents, margin=4.0):
    """The power of two k that puts the trunk's largest value at >= margin x 65504 on these latents."""
    m = decoder_trunk_max_abs(vae, latents)
    return 2.0 ** max(0, math.ceil(math.log2(margin * 65504.0 / max(m, 1e-6))))


# ---------------------------------------------------------------- building

def build_models():
    """(vae, text_encoder, text_encoder_2, unet), PyTorch's default initialisation (seed it first)."""
    return (M.AutoencoderKL(**VAE_CONFIG), ClipTextModel(**TEXT_CONFIG), ClipTextModelWithProjection(**TEXT2_CONFIG),
            SdxlUNet(**UNET_CONFIG))


def param_count(m):
    return M.param_count(m)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        set_size(sys.argv[1])
    vae, te, te2, unet = build_models()
    print("vae decoder %.3fM, encoder %.3fM, text_encoder %.3fM, text_encoder_2 %.3fM, unet %.3fM" % (
        (param_count(vae.decoder) + param_count(vae.post_quant_conv)) / 1e6,
        (param_count(vae.encoder) + param_count(vae.quant_conv)) / 1e6, param_count(te) / 1e6,
        param_count(te2) / 1e6, param_count(unet) / 1e6))
    ids = torch.randint(0, 621, (2, 77))
    ctx, pooled = encode_prompt_embeds(te, te2, ids, ids)
    tid = torch.tensor([[64.0, 64.0, 0.0, 0.0, 64.0, 64.0]] * 2)
    eps = unet(torch.randn(2, 4, 16, 16), torch.tensor(999.0), ctx, pooled, tid)
    print("context", tuple(ctx.shape), "pooled", tuple(pooled.shape), "eps", tuple(eps.shape))
