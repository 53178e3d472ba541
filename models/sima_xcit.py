"""SimA (arXiv 2206.08898): the XCiT backbone with softmax-free l1-normalized attention, in the official layout.

`SimAVisionTransformer` follows UCDvision/sima `sima.py` (MODELS.md §3, golden README §5); official checkpoints
(`{'model': sd}`) load with `strict=True` and no remapping, in the official key order:
`cls_token`, `patch_embed.proj.{0,2,4,6}.{0.weight, 1.*}` (p16; p8 has `{0,2,4}`), `blocks.i.{gamma1, gamma2,
gamma3, norm1, attn.{qkv, proj}, norm2, mlp.{fc1, fc2}, norm3, local_mp.{conv1, bn, conv2}}`,
`cls_attn_blocks.{0,1}.{gamma1, gamma2, norm1, attn.{qkv, proj}, norm2, mlp}`, `norm`, `head`,
`pos_embeder.token_projection`. The official SyncBatchNorm is a BatchNorm2d here (same keys, same eval math).

Quirks kept on purpose (they define the released function): the CLS token joins only after the SimA blocks; the
class-attention block returns `cat(cls, norm1(x)[:, 1:])`, so patch tokens get `x_p + gamma1 * norm1(x_p)` and are
then doubled by the block's residual (`2 * norm2(.)` with `tokens_norm`, else `2 * (.)`).
"""
from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import VitedgeError
from .features import Tap
from .layers import ORDERS, DropPath, Mlp, SimAAttention, init_vit_weights
from .preprocess import SIMA_RECIPE
from .registry import register_model, register_model_module

__all__ = ["SimAVisionTransformer", "ConvPatchEmbed", "PositionalEncodingFourier", "LPI", "SimABlock",
           "ClassAttention", "ClassAttentionBlock", "fourier_features", "patch_grid", "l1_normalize_tokens",
           "xcit_out_indices", "xcit_fpn", "xcit_intermediates"]

CLS_ATTN_EPS = 1e-6  # ClassAttention's l1-normalize eps (SimA blocks use F.normalize's default 1e-12)


def conv3x3_bn(in_chs: int, out_chs: int) -> nn.Sequential:
    """conv3x3 s2 p1 without bias + BN (keys `0.weight`, `1.*`); the official BN is SyncBatchNorm."""
    return nn.Sequential(nn.Conv2d(in_chs, out_chs, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(out_chs))


def patch_grid(img_size: int, patch_size: int) -> int:
    """Tokens per side after the conv stem (each conv3x3 s2 p1 maps s -> floor((s - 1) / 2) + 1)."""
    s = img_size
    for _ in range(int(math.log2(patch_size))):
        s = (s - 1) // 2 + 1
    return s


class ConvPatchEmbed(nn.Module):
    """XCiT's conv stem: log2(patch) x (conv3x3 s2 + BN) with GELU between; returns tokens and the grid."""

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, embed_dim: int = 768):
        super().__init__()
        if patch_size not in (8, 16):
            raise VitedgeError(f"SimA's conv patch embedding supports patch_size 8 or 16, got {patch_size}: "
                               "use one of them")
        n_convs = int(math.log2(patch_size))
        if embed_dim < 2 ** (n_convs - 1):
            raise VitedgeError(f"embed_dim {embed_dim} too small for the {n_convs}-conv stem (widths "
                               f"embed_dim // 2**i): use at least {2 ** (n_convs - 1)}")
        widths = [in_chans] + [embed_dim // 2 ** i for i in range(n_convs - 1, -1, -1)]
        layers: list[nn.Module] = []
        for i in range(n_convs):
            if i:
                layers.append(nn.GELU())
            layers.append(conv3x3_bn(widths[i], widths[i + 1]))
        self.proj = nn.Sequential(*layers)
        self.img_size, self.patch_size = img_size, patch_size
        self.num_patches = patch_grid(img_size, patch_size) ** 2

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x = self.proj(x)
        hp, wp = x.shape[2], x.shape[3]
        return x.flatten(2).transpose(1, 2), (hp, wp)


def fourier_features(h: int, w: int, hidden_dim: int = 32, temperature: float = 10000.0,
                     dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """XCiT's Fourier features (1, 2*hidden_dim, h, w): [sin/cos of y, sin/cos of x], 2pi-normalized cumsum.

    The official code computes them in float32; `dtype` float64 serves the fp64 equivalence gate.
    """
    ones = torch.ones(1, h, w, dtype=dtype, device=device)
    eps, scale = 1e-6, 2 * math.pi
    y = ones.cumsum(1)
    x = ones.cumsum(2)
    y = y / (y[:, -1:, :] + eps) * scale
    x = x / (x[:, :, -1:] + eps) * scale
    dim_t = torch.arange(hidden_dim, dtype=dtype, device=device)
    dim_t = temperature ** (2 * torch.div(dim_t, 2, rounding_mode="floor") / hidden_dim)
    pos_x = x[..., None] / dim_t
    pos_y = y[..., None] / dim_t
    pos_x = torch.stack((pos_x[..., 0::2].sin(), pos_x[..., 1::2].cos()), dim=4).flatten(3)
    pos_y = torch.stack((pos_y[..., 0::2].sin(), pos_y[..., 1::2].cos()), dim=4).flatten(3)
    return torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)


class PositionalEncodingFourier(nn.Module):
    """Fourier features projected by a 1x1 conv (`token_projection`, 2*hidden -> dim), for the actual grid."""

    def __init__(self, hidden_dim: int = 32, dim: int = 768, temperature: float = 10000.0):
        super().__init__()
        self.token_projection = nn.Conv2d(hidden_dim * 2, dim, kernel_size=1)
        self.hidden_dim, self.dim, self.temperature = hidden_dim, dim, temperature

    def forward(self, b: int, h: int, w: int) -> torch.Tensor:
        wt = self.token_projection.weight
        feats = fourier_features(h, w, self.hidden_dim, self.temperature,
                                 torch.promote_types(wt.dtype, torch.float32), wt.device)
        return self.token_projection(feats.to(wt.dtype)).expand(b, -1, -1, -1)


class LPI(nn.Module):
    """Local patch interaction: `conv2(BN(GELU(conv1(x))))` on the token grid, both convs depthwise 3x3 zero-padded."""

    def __init__(self, dim: int, kernel_size: int = 3):
        super().__init__()
        pad = kernel_size // 2
        self.conv1 = nn.Conv2d(dim, dim, kernel_size, padding=pad, groups=dim)
        self.act = nn.GELU()
        self.bn = nn.BatchNorm2d(dim)
        self.conv2 = nn.Conv2d(dim, dim, kernel_size, padding=pad, groups=dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, n, c = x.shape
        x = x.permute(0, 2, 1).reshape(b, c, h, w)
        x = self.conv2(self.bn(self.act(self.conv1(x))))
        return x.reshape(b, c, n).permute(0, 2, 1)


def _layer_scales(module: nn.Module, names: tuple[str, ...], dim: int, eta: float | None) -> None:
    # XCiT: a learnable per-channel scale initialised to eta, or the constant 1.0 when eta is None.
    for name in names:
        setattr(module, name, nn.Parameter(eta * torch.ones(dim)) if eta is not None else 1.0)


class SimABlock(nn.Module):
    """`x += g1*SimA(norm1 x)`; `x += g3*LPI(norm3 x)`; `x += g2*MLP(norm2 x)`."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = False,
                 drop: float = 0.0, drop_path: float = 0.0, norm_layer=nn.LayerNorm, eta: float | None = None,
                 attn_order: str = "auto"):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = SimAAttention(dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_order=attn_order)
        self.attn_out_drop = nn.Dropout(drop)  # the official proj_drop (no parameters, no keys)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)
        self.norm3 = norm_layer(dim)
        self.local_mp = LPI(dim)
        _layer_scales(self, ("gamma1", "gamma2", "gamma3"), dim, eta)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x = x + self.drop_path(self.gamma1 * self.attn_out_drop(self.attn(self.norm1(x))))
        x = x + self.drop_path(self.gamma3 * self.local_mp(self.norm3(x), h, w))
        return x + self.drop_path(self.gamma2 * self.mlp(self.norm2(x)))


def l1_normalize_tokens(t: torch.Tensor, eps: float) -> torch.Tensor:
    """`F.normalize(t, p=1, dim=-2, eps)`: each (batch, head, channel) column over the token axis."""
    return F.normalize(t, p=1.0, dim=-2, eps=eps)


class ClassAttention(nn.Module):
    """SimA's softmax-free class attention: l1-normalized q, k over all tokens, CLS query only (keys `qkv`, `proj`).

    Returns `cat(proj(cls), x[:, 1:])` (x = this module's input), as the official code does.
    """

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, proj_drop: float = 0.0,
                 eps: float = CLS_ATTN_EPS):
        super().__init__()
        self.num_heads = num_heads
        self.eps = eps
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = l1_normalize_tokens(q, self.eps), l1_normalize_tokens(k, self.eps)
        attn = (q[:, :, 0:1] * k).sum(dim=-1)  # (B, h, N+1): the CLS query against every key
        cls = (attn.unsqueeze(2) @ v).transpose(1, 2).reshape(b, 1, c)
        return torch.cat((self.proj_drop(self.proj(cls)), x[:, 1:]), dim=1)


class ClassAttentionBlock(nn.Module):
    """CaiT-style block with XCiT's residual quirks (see the module docstring); `cat` instead of slice assignment."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = False,
                 drop: float = 0.0, drop_path: float = 0.0, norm_layer=nn.LayerNorm, eta: float | None = None,
                 tokens_norm: bool = False):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = ClassAttention(dim, num_heads=num_heads, qkv_bias=qkv_bias, proj_drop=drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)
        _layer_scales(self, ("gamma1", "gamma2"), dim, eta)
        self.tokens_norm = tokens_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.gamma1 * self.attn(self.norm1(x)))
        if self.tokens_norm:
            x = self.norm2(x)
        else:  # official: x[:, 0:1] = norm2(x[:, 0:1]) in place
            x = torch.cat((self.norm2(x[:, 0:1]), x[:, 1:]), dim=1)
        cls = self.gamma2 * self.mlp(x[:, 0:1])
        # the residual adds the whole sequence to itself: patch tokens are doubled (official behaviour)
        return x + self.drop_path(torch.cat((cls, x[:, 1:]), dim=1))


class SimAVisionTransformer(nn.Module):
    """XCiT with SimA attention. Eval returns logits; train returns `(logits, logits)` as the official code.

    `qk_scale` and `attn_drop_rate` are accepted for signature compatibility and unused (SimA has no scale and,
    in the Q(K^T V) order, no attention matrix). `patch_proj` is accepted and ignored, as in XCiT (always the
    conv stem). `attn_order` ("auto" = official rule `(QK^T)V iff N < head_dim`, or "qk_first" / "kv_first")
    fixes the SimA association order.
    """

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, num_classes: int = 1000,
                 embed_dim: int = 768, depth: int = 12, num_heads: int = 12, mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, qk_scale: float | None = None, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, drop_path_rate: float = 0.0, norm_layer=None,
                 cls_attn_layers: int = 2, use_pos: bool = True, patch_proj: str = "linear",
                 eta: float | None = None, tokens_norm: bool = False, attn_order: str = "auto"):
        super().__init__()
        if embed_dim % num_heads:
            raise VitedgeError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}: change either")
        if attn_order not in ORDERS:
            raise VitedgeError(f"attn_order must be one of {', '.join(ORDERS)}; got {attn_order!r}")
        self.num_classes = num_classes
        self.num_features = self.embed_dim = embed_dim
        self.num_heads, self.patch_size, self.tokens_norm = num_heads, patch_size, tokens_norm
        norm_layer = norm_layer or partial(nn.LayerNorm, eps=1e-6)

        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))  # first key, as in the official state_dict
        self.patch_embed = ConvPatchEmbed(img_size, patch_size, in_chans, embed_dim)
        self.pos_drop = nn.Dropout(drop_rate)
        # XCiT uses the same drop-path rate in every block
        self.blocks = nn.ModuleList([
            SimABlock(embed_dim, num_heads, mlp_ratio, qkv_bias, drop_rate, drop_path_rate, norm_layer, eta,
                      attn_order) for _ in range(depth)])
        self.cls_attn_blocks = nn.ModuleList([
            ClassAttentionBlock(embed_dim, num_heads, mlp_ratio, qkv_bias, drop_rate, 0.0, norm_layer, eta,
                                tokens_norm) for _ in range(cls_attn_layers)])
        self.norm = norm_layer(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.pos_embeder = PositionalEncodingFourier(dim=embed_dim)
        self.use_pos = use_pos
        self._init_weights()

    def _init_weights(self) -> None:
        init_vit_weights(self, self.cls_token)  # official: convs and BNs keep PyTorch's defaults

    def tokens_and_grid(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """The patch tokens with their positional encoding, and the grid."""
        b = x.shape[0]
        x, (hp, wp) = self.patch_embed(x)
        if self.use_pos:
            x = x + self.pos_embeder(b, hp, wp).reshape(b, -1, x.shape[1]).permute(0, 2, 1)
        return self.pos_drop(x), (hp, wp)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        x, (hp, wp) = self.tokens_and_grid(x)
        for blk in self.blocks:
            x = blk(x, hp, wp)
        x = torch.cat((self.cls_token.expand(b, -1, -1), x), dim=1)
        for blk in self.cls_attn_blocks:
            x = blk(x)
        return self.norm(x)[:, 0]

    def forward(self, x: torch.Tensor):
        x = self.head(self.forward_features(x))
        return (x, x) if self.training else x

    classifier_modules = ("norm", "head", "cls_attn_blocks", "cls_token")   # what a detection backbone lacks

    def feature_info(self) -> list[Tap]:
        """The official XCiT detection backbone's outputs (facebookresearch/xcit `detection/backbone/xcit.py`; the
        SimA repository has no dense-prediction code): the tokens after the blocks `out_indices` as maps at the
        patch stride, each resampled by its `fpn{i}` to stride 4, 8, 16 and 32."""
        p, c = self.patch_size, self.embed_dim
        blocks = xcit_out_indices(len(self.blocks))
        return [Tap(b, 4 * 2 ** i, c, partial(xcit_fpn, i, p), module=f"fpn{i + 1}",
                    side=partial(_fpn_side, i, p)) for i, b in enumerate(blocks)]

    def forward_intermediates(self, x: torch.Tensor, indices) -> list[torch.Tensor]:
        return xcit_intermediates(self, x, indices, xcit_out_indices(len(self.blocks)))


def xcit_out_indices(depth: int) -> list[int]:
    """The blocks the official XCiT detection configs tap: [3, 5, 7, 11] at depth 12, [7, 11, 15, 23] at depth 24,
    i.e. the blocks ending the first 1/3, 1/2, 2/3 and all of the depth (so other depths, the tests' reduced ones,
    follow the same rule; a shallow model may tap one block twice)."""
    return [max(depth * k // 12 - 1, 0) for k in (4, 6, 8, 12)]


def xcit_fpn(i: int, patch: int, dim: int) -> nn.Module:
    """The official `fpn{i + 1}` that takes the patch-stride map to stride 4 * 2^i: transposed convs (with a
    BatchNorm and GELU between two of them, p16's stride 4), the map as is, or max-pooling."""
    up = partial(nn.ConvTranspose2d, dim, dim, kernel_size=2, stride=2)
    if patch == 16:
        return [nn.Sequential(up(), nn.BatchNorm2d(dim), nn.GELU(), up()), nn.Sequential(up()), nn.Identity(),
                nn.MaxPool2d(kernel_size=2, stride=2)][i]
    return [nn.Sequential(up()), nn.Identity(), nn.Sequential(nn.MaxPool2d(kernel_size=2, stride=2)),
            nn.Sequential(nn.MaxPool2d(kernel_size=4, stride=4))][i]


def _fpn_side(i: int, patch: int, n: int) -> int:
    """A side of `fpn{i + 1}`'s map for an input side `n` (the grid ceil(n / patch), up-sampled or floor-pooled)."""
    g = patch_grid(n, patch)
    scale = (4 * 2 ** i) / patch
    return g * int(1 / scale) if scale < 1 else g // int(scale)


def xcit_intermediates(model: nn.Module, x: torch.Tensor, indices, blocks: list[int]) -> list[torch.Tensor]:
    """The token maps after the blocks of the taps at `indices` (NCHW, at the patch stride), before their `fpn`;
    the train-form and the deploy-form (`tokens_and_grid`, `blocks`) share it."""
    x, (hp, wp) = model.tokens_and_grid(x)
    want = [blocks[i] for i in indices]
    maps = {}
    for i, blk in enumerate(model.blocks[:max(want) + 1]):
        x = blk(x, hp, wp) if isinstance(blk, SimABlock) else blk(x)
        if i in want:
            maps[i] = x.transpose(1, 2).reshape(x.shape[0], -1, hp, wp)
    return [maps[b] for b in want]


# MODELS.md §3.1: name -> (embed_dim, depth, num_heads, eta, tokens_norm)
_VARIANTS = {
    "sima_nano_12": (128, 12, 4, 1.0, False),
    "sima_tiny_12": (192, 12, 4, 1.0, True),
    "sima_small_12": (384, 12, 8, 1.0, True),
    "sima_tiny_24": (192, 24, 4, 1e-5, True),
    "sima_small_24": (384, 24, 8, 1e-5, True),
    "sima_medium_24": (512, 24, 8, 1e-5, True),
    "sima_large_24": (768, 24, 16, 1e-5, True),
}
_SIZES_NOTE = "Fourier positional encoding is computed for the actual grid"

for _name, (_dim, _depth, _heads, _eta, _tn) in _VARIANTS.items():
    for _p in (16, 8):
        register_model(f"{_name}_p{_p}", "sima", stride=_p, sizes_note=_SIZES_NOTE, patch_size=_p,
                       embed_dim=_dim, depth=_depth, num_heads=_heads, mlp_ratio=4, qkv_bias=True, eta=_eta,
                       tokens_norm=_tn)(SimAVisionTransformer)


register_model_module(__name__, plan="sima", recipe=SIMA_RECIPE)
