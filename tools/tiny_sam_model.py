#!/usr/bin/python3
"""tiny-sam's networks in PyTorch: an EfficientViT-SAM-structured image encoder, SAM's prompt encoder (points) and mask decoder."""

# Imported by tools/train_tiny_sam.py (GPU machine, PyTorch 2.x) and tools/export_tiny_sam.py
# (Debian's PyTorch 1.13); everything here runs on both.
#
# Image encoder (efficientvit/models/efficientvit/{backbone,sam}.py): conv stem + DSConv, MBConv
#   stages, EfficientViT blocks (LiteMLA: 1x1 qkv, multi-scale aggregation by 5x5 depthwise +
#   grouped 1x1 convs, ReLU linear attention with v padded by ones, 1x1 projection + BN; then an
#   MBConv), BatchNorm + Hardswish; a SamNeck that projects three stages to one width, resizes them
#   bicubically to stride 4 and adds them, then fused-MBConv blocks and a 1x1 output conv.
#   64x64x3 (normalised) -> image embeddings [64, 16, 16].
# Prompt encoder + mask decoder (segment_anything/modeling/{prompt_encoder,mask_decoder,transformer}.py
#   and utils/onnx.py's SamOnnxModel): random-Fourier positional encoding of points, learned
#   embeddings for positive/negative/padding labels, a no-mask dense embedding, a two-way
#   transformer (depth 2), transposed-conv upscaling with LayerNorm2d/GELU, hypernetwork MLPs per
#   mask token and an IoU head; 4 masks (one single-mask, three multimask) at 64x64.

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

IMAGE_SIZE = 64
EMBED_DIM = 64
EMBED_SIZE = 16
PIXEL_MEAN = (123.675, 116.28, 103.53)   # SAM's normalisation, applied to 0..255 RGB before the encoder
PIXEL_STD = (58.395, 57.12, 57.375)
ENCODER_CONFIG = dict(width_list=(16, 32, 64, 128), depth_list=(1, 1, 1, 1), head_dim=16, neck_dim=EMBED_DIM,
                      neck_depth=2)
DECODER_CONFIG = dict(transformer_dim=EMBED_DIM, depth=2, num_heads=4, mlp_dim=256, num_multimask_outputs=3,
                      iou_head_hidden_dim=128)


# ---------------------------------------------------------------- EfficientViT building blocks

class ConvLayer(nn.Module):
    def __init__(self, cin, cout, k=3, stride=1, groups=1, bias=False, norm=True, act=True):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=bias)
        self.norm = nn.BatchNorm2d(cout) if norm else None
        self.act = nn.Hardswish() if act else None

    def forward(self, x):
        x = self.conv(x)
        if self.norm is not None:
            x = self.norm(x)
        if self.act is not None:
            x = self.act(x)
        return x


class DSConv(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.depth_conv = ConvLayer(cin, cin, 3, groups=cin)
        self.point_conv = ConvLayer(cin, cout, 1, act=False)

    def forward(self, x):
        return self.point_conv(self.depth_conv(x))


class MBConv(nn.Module):
    def __init__(self, cin, cout, stride=1, expand=4, fewer_norm=False):
        super().__init__()
        mid = cin * expand
        self.inverted_conv = ConvLayer(cin, mid, 1, bias=fewer_norm, norm=not fewer_norm)
        self.depth_conv = ConvLayer(mid, mid, 3, stride, groups=mid, bias=fewer_norm, norm=not fewer_norm)
        self.point_conv = ConvLayer(mid, cout, 1, act=False)

    def forward(self, x):
        return self.point_conv(self.depth_conv(self.inverted_conv(x)))


class FusedMBConv(nn.Module):
    def __init__(self, cin, cout, expand=4):
        super().__init__()
        self.spatial_conv = ConvLayer(cin, cin * expand, 3)
        self.point_conv = ConvLayer(cin * expand, cout, 1, act=False)

    def forward(self, x):
        return self.point_conv(self.spatial_conv(x))


class Residual(nn.Module):
    def __init__(self, main):
        super().__init__()
        self.main = main

    def forward(self, x):
        return x + self.main(x)


class LiteMLA(nn.Module):
    """EfficientViT's lightweight multi-scale linear attention (ReLU kernel)."""

    def __init__(self, channels, head_dim, scales=(5,), eps=1e-15):
        super().__init__()
        heads = channels // head_dim
        total = heads * head_dim
        self.dim, self.eps = head_dim, eps
        self.qkv = ConvLayer(channels, 3 * total, 1, norm=False, act=False)
        self.aggreg = nn.ModuleList([nn.Sequential(
            nn.Conv2d(3 * total, 3 * total, s, padding=s // 2, groups=3 * total, bias=False),
            nn.Conv2d(3 * total, 3 * total, 1, groups=3 * heads, bias=False)) for s in scales])
        self.proj = ConvLayer(total * (1 + len(scales)), channels, 1, act=False)

    def forward(self, x):
        qkv = self.qkv(x)
        qkv = torch.cat([qkv] + [op(qkv) for op in self.aggreg], dim=1)
        b, _, h, w = qkv.shape
        qkv = qkv.reshape(b, -1, 3 * self.dim, h * w)
        q, k, v = qkv[:, :, :self.dim], qkv[:, :, self.dim:2 * self.dim], qkv[:, :, 2 * self.dim:]
        q, k = F.relu(q), F.relu(k)
        v = F.pad(v, (0, 0, 0, 1), mode="constant", value=1.0)
        out = torch.matmul(torch.matmul(v, k.transpose(-1, -2)), q)
        out = out[:, :, :-1] / (out[:, :, -1:] + self.eps)
        return self.proj(out.reshape(b, -1, h, w))


class EfficientViTBlock(nn.Module):
    def __init__(self, channels, head_dim):
        super().__init__()
        self.context_module = Residual(LiteMLA(channels, head_dim))
        self.local_module = Residual(MBConv(channels, channels, expand=4, fewer_norm=True))

    def forward(self, x):
        return self.local_module(self.context_module(x))


class ImageEncoder(nn.Module):
    """EfficientViT backbone (stem, 3 stages; the last two with EfficientViT blocks) + SamNeck."""

    def __init__(self, width_list=(16, 32, 64, 128), depth_list=(1, 1, 1, 1), head_dim=16, neck_dim=64, neck_depth=2):
        super().__init__()
        w = width_list
        self.stem = nn.Sequential(ConvLayer(3, w[0], 3, stride=2),
                                  *[Residual(DSConv(w[0], w[0])) for _ in range(depth_list[0])])
        self.stage1 = nn.Sequential(MBConv(w[0], w[1], stride=2),
                                    *[Residual(MBConv(w[1], w[1])) for _ in range(depth_list[1])])
        self.stage2 = nn.Sequential(MBConv(w[1], w[2], stride=2, fewer_norm=True),
                                    *[EfficientViTBlock(w[2], head_dim) for _ in range(depth_list[2])])
        self.stage3 = nn.Sequential(MBConv(w[2], w[3], stride=2, fewer_norm=True),
                                    *[EfficientViTBlock(w[3], head_dim) for _ in range(depth_list[3])])
        # SamNeck: stage outputs -> neck_dim at stride 4 (bicubic), summed; fused-MBConv blocks; 1x1 out.
        self.neck_inputs = nn.ModuleList([ConvLayer(c, neck_dim, 1, act=False) for c in (w[1], w[2], w[3])])
        self.neck_middle = nn.Sequential(*[Residual(FusedMBConv(neck_dim, neck_dim)) for _ in range(neck_depth)])
        self.neck_out = nn.Conv2d(neck_dim, neck_dim, 1)

    def forward(self, x):
        s1 = self.stage1(self.stem(x))
        s2 = self.stage2(s1)
        s3 = self.stage3(s2)
        size = s1.shape[-2:]
        y = self.neck_inputs[0](s1)
        for conv, feat in ((self.neck_inputs[1], s2), (self.neck_inputs[2], s3)):
            y = y + F.interpolate(conv(feat), size=size, mode="bicubic", align_corners=False)
        return self.neck_out(self.neck_middle(y))


# ---------------------------------------------------------------- SAM prompt encoder and mask decoder

class LayerNorm2d(nn.Module):
    def __init__(self, channels, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps

    def forward(self, x):
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class MLP(nn.Module):
    def __init__(self, din, hidden, dout, layers, sigmoid_output=False):
        super().__init__()
        dims = [din] + [hidden] * (layers - 1)
        self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(dims, dims[1:] + [dout])])
        self.sigmoid_output = sigmoid_output

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = F.relu(layer(x)) if i < len(self.layers) - 1 else layer(x)
        return torch.sigmoid(x) if self.sigmoid_output else x


class SamAttention(nn.Module):
    def __init__(self, dim, heads, downsample_rate=1):
        super().__init__()
        inner = dim // downsample_rate
        self.heads = heads
        self.q_proj = nn.Linear(dim, inner)
        self.k_proj = nn.Linear(dim, inner)
        self.v_proj = nn.Linear(dim, inner)
        self.out_proj = nn.Linear(inner, dim)

    def forward(self, q, k, v):
        q, k, v = self.q_proj(q), self.k_proj(k), self.v_proj(v)
        b, nq, c = q.shape
        d = c // self.heads
        q = q.reshape(b, nq, self.heads, d).transpose(1, 2)
        k = k.reshape(b, k.shape[1], self.heads, d).transpose(1, 2)
        v = v.reshape(b, v.shape[1], self.heads, d).transpose(1, 2)
        attn = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
        out = torch.matmul(attn.softmax(dim=-1), v).transpose(1, 2).reshape(b, nq, c)
        return self.out_proj(out)


class TwoWayAttentionBlock(nn.Module):
    def __init__(self, dim, heads, mlp_dim, skip_first_layer_pe):
        super().__init__()
        self.self_attn = SamAttention(dim, heads)
        self.norm1 = nn.LayerNorm(dim)
        self.cross_attn_token_to_image = SamAttention(dim, heads, downsample_rate=2)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, mlp_dim, dim, 2)
        self.norm3 = nn.LayerNorm(dim)
        self.norm4 = nn.LayerNorm(dim)
        self.cross_attn_image_to_token = SamAttention(dim, heads, downsample_rate=2)
        self.skip_first_layer_pe = skip_first_layer_pe

    def forward(self, queries, keys, query_pe, key_pe):
        if self.skip_first_layer_pe:
            queries = self.self_attn(queries, queries, queries)
        else:
            q = queries + query_pe
            queries = queries + self.self_attn(q, q, queries)
        queries = self.norm1(queries)
        q, k = queries + query_pe, keys + key_pe
        queries = self.norm2(queries + self.cross_attn_token_to_image(q, k, keys))
        queries = self.norm3(queries + self.mlp(queries))
        q, k = queries + query_pe, keys + key_pe
        keys = self.norm4(keys + self.cross_attn_image_to_token(k, q, queries))
        return queries, keys


class TwoWayTransformer(nn.Module):
    def __init__(self, depth, dim, heads, mlp_dim):
        super().__init__()
        self.layers = nn.ModuleList([TwoWayAttentionBlock(dim, heads, mlp_dim, i == 0) for i in range(depth)])
        self.final_attn_token_to_image = SamAttention(dim, heads, downsample_rate=2)
        self.norm_final_attn = nn.LayerNorm(dim)

    def forward(self, image_embedding, image_pe, point_embedding):
        b, c, h, w = image_embedding.shape
        keys = image_embedding.flatten(2).permute(0, 2, 1)
        key_pe = image_pe.flatten(2).permute(0, 2, 1)
        queries = point_embedding
        for layer in self.layers:
            queries, keys = layer(queries, keys, point_embedding, key_pe)
        q, k = queries + point_embedding, keys + key_pe
        queries = self.norm_final_attn(queries + self.final_attn_token_to_image(q, k, keys))
        return queries, keys


class PromptEncoder(nn.Module):
    """SAM's prompt encoder for points (labels 1 positive, 0 negative, -1 padding) and no mask."""

    def __init__(self, dim=64, image_size=64, embed_size=16):
        super().__init__()
        self.image_size, self.embed_size = image_size, embed_size
        # PositionEmbeddingRandom: a fixed Gaussian matrix (scale 1), saved with the weights.
        self.register_buffer("positional_encoding_gaussian_matrix", torch.randn(2, dim // 2))
        self.point_embeddings = nn.ModuleList([nn.Embedding(1, dim) for _ in range(4)])
        self.not_a_point_embed = nn.Embedding(1, dim)
        self.no_mask_embed = nn.Embedding(1, dim)

    def pe_encoding(self, coords):
        coords = 2 * coords - 1
        coords = coords @ self.positional_encoding_gaussian_matrix
        coords = 2 * math.pi * coords
        return torch.cat([torch.sin(coords), torch.cos(coords)], dim=-1)

    def dense_pe(self):
        n = self.embed_size
        grid = torch.ones((n, n), device=self.positional_encoding_gaussian_matrix.device)
        y = (grid.cumsum(dim=0) - 0.5) / n
        x = (grid.cumsum(dim=1) - 0.5) / n
        return self.pe_encoding(torch.stack([x, y], dim=-1)).permute(2, 0, 1)[None]

    def embed_points(self, point_coords, point_labels):
        """As SamOnnxModel._embed_points: coordinates in input pixels, labels as float."""
        point_coords = (point_coords + 0.5) / self.image_size
        emb = self.pe_encoding(point_coords)
        labels = point_labels[..., None]
        emb = emb * (labels != -1).to(emb.dtype)
        emb = emb + self.not_a_point_embed.weight * (labels == -1).to(emb.dtype)
        for i in range(2):
            emb = emb + self.point_embeddings[i].weight * (labels == i).to(emb.dtype)
        return emb


class MaskDecoder(nn.Module):
    def __init__(self, transformer_dim=64, depth=2, num_heads=4, mlp_dim=256, num_multimask_outputs=3,
                 iou_head_hidden_dim=128):
        super().__init__()
        d = transformer_dim
        self.num_mask_tokens = num_multimask_outputs + 1
        self.transformer = TwoWayTransformer(depth, d, num_heads, mlp_dim)
        self.iou_token = nn.Embedding(1, d)
        self.mask_tokens = nn.Embedding(self.num_mask_tokens, d)
        self.output_upscaling = nn.Sequential(nn.ConvTranspose2d(d, d // 4, 2, 2), LayerNorm2d(d // 4), nn.GELU(),
                                              nn.ConvTranspose2d(d // 4, d // 8, 2, 2), nn.GELU())
        self.output_hypernetworks_mlps = nn.ModuleList([MLP(d, d, d // 8, 3) for _ in range(self.num_mask_tokens)])
        self.iou_prediction_head = MLP(d, iou_head_hidden_dim, self.num_mask_tokens, 3)

    def forward(self, image_embeddings, image_pe, sparse, dense):
        b = sparse.shape[0]
        tokens = torch.cat([self.iou_token.weight, self.mask_tokens.weight], dim=0)[None].expand(b, -1, -1)
        tokens = torch.cat([tokens, sparse], dim=1)
        src = image_embeddings + dense
        pos = image_pe.expand(b, -1, -1, -1)
        _, c, h, w = src.shape
        hs, src = self.transformer(src, pos, tokens)
        iou_token_out = hs[:, 0]
        mask_tokens_out = hs[:, 1:1 + self.num_mask_tokens]
        up = self.output_upscaling(src.transpose(1, 2).reshape(b, c, h, w))
        hyper = torch.stack([mlp(mask_tokens_out[:, i]) for i, mlp in enumerate(self.output_hypernetworks_mlps)], dim=1)
        _, cu, hu, wu = up.shape
        masks = torch.matmul(hyper, up.reshape(b, cu, hu * wu)).reshape(b, -1, hu, wu)
        return masks, self.iou_prediction_head(iou_token_out)


class PromptedMaskDecoder(nn.Module):
    """mask_decoder.onnx: image embeddings + points -> 4 mask logits [B, 4, 64, 64] and IoU predictions [B, 4]."""

    def __init__(self, dim=64, image_size=64, embed_size=16, **decoder_config):
        super().__init__()
        self.prompt_encoder = PromptEncoder(dim, image_size, embed_size)
        self.mask_decoder = MaskDecoder(transformer_dim=dim, **decoder_config)

    def forward(self, image_embeddings, point_coords, point_labels):
        sparse = self.prompt_encoder.embed_points(point_coords, point_labels)
        dense = self.prompt_encoder.no_mask_embed.weight.reshape(1, -1, 1, 1)
        return self.mask_decoder(image_embeddings, self.prompt_encoder.dense_pe(), sparse, dense)


def build_models():
    return ImageEncoder(**ENCODER_CONFIG), PromptedMaskDecoder(EMBED_DIM, IMAGE_SIZE, EMBED_SIZE, **{
        k: v for k, v in DECODER_CONFIG.items() if k != "transformer_dim"})


def normalise(images_uint8_nchw):
    mean = torch.tensor(PIXEL_MEAN, device=images_uint8_nchw.device).view(1, 3, 1, 1)
    std = torch.tensor(PIXEL_STD, device=images_uint8_nchw.device).view(1, 3, 1, 1)
    return (images_uint8_nchw.float() - mean) / std


def param_count(m):
    return sum(p.numel() for p in m.parameters())


if __name__ == "__main__":
    enc, dec = build_models()
    print("encoder %.3fM, decoder %.3fM" % (param_count(enc) / 1e6, param_count(dec) / 1e6))
    emb = enc(torch.randn(2, 3, 64, 64))
    masks, iou = dec(emb, torch.tensor([[[10.0, 20.0], [0.0, 0.0]]] * 2), torch.tensor([[1.0, -1.0]] * 2))
    print("embeddings", tuple(emb.shape), "masks", tuple(masks.shape), "iou", tuple(iou.shape))
