"""SimA on a DeiT backbone: DeiT's layout with every softmax attention replaced by SimA (docs/sima_deit_layout.md).

No official SimA-DeiT checkpoint or code exists (the SimA repository ships XCiT only), so the layout is chosen to
be timm's DeiT (`VisionTransformer`) key for key, so that a DeiT-style SimA training run loads unchanged:
`cls_token` (1, 1, C), `pos_embed` (1, 1+N, C), `patch_embed.proj` (Conv16 s16), `blocks.i.{norm1, attn.{qkv, proj},
norm2, mlp.{fc1, fc2}}`, `norm`, `head` on the CLS token. SimA attention l1-normalizes q and k over all 1+N tokens
(CLS included) and picks `(QK^T)V` iff 1+N < head_dim, the official SimA rule on the tokens it sees.
LayerNorm eps 1e-6, qkv bias, no layer scale, as DeiT.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn as nn

from ..errors import VitedgeError
from .features import Tap, token_map
from .layers import ORDERS, DropPath, Mlp, SimAAttention, init_vit_weights
from .preprocess import SIMA_RECIPE
from .layers.resample import Resized
from .registry import register_model, register_model_module

__all__ = ["SimADeiT", "SimADeiTBlock", "PatchEmbed16"]


class PatchEmbed16(nn.Module):
    """Non-overlapping patches -> tokens (B, N, C), row-major over the grid (key `proj`)."""

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, embed_dim: int = 768):
        super().__init__()
        if img_size % patch_size:
            raise VitedgeError(f"img_size {img_size} is not a multiple of patch_size {patch_size}: pick a multiple")
        self.img_size, self.patch_size = img_size, patch_size
        self.num_patches = (img_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        want = getattr(self, "input_hw", (self.img_size, self.img_size))
        if tuple(x.shape[-2:]) != tuple(want):
            raise VitedgeError(f"SimA-DeiT is set for {want[0]}x{want[1]} inputs (its pos_embed grid); got "
                               f"{x.shape[-2]}x{x.shape[-1]}: set_input_size((H, W)) first (vitedge does, for --imgsz)")
        return self.proj(x).flatten(2).transpose(1, 2)


class SimADeiTBlock(nn.Module):
    """`x + attn(norm1 x)`, `x + mlp(norm2 x)` with SimA attention (keys `norm1`, `attn`, `norm2`, `mlp`)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = True, drop: float = 0.0,
                 drop_path: float = 0.0, norm_layer=nn.LayerNorm, attn_order: str = "auto"):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = SimAAttention(dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_order=attn_order)
        self.drop = nn.Dropout(drop) if drop > 0 else nn.Identity()  # DeiT's proj_drop (no keys)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.drop(self.attn(self.norm1(x))))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class SimADeiT(nn.Module):
    """DeiT with SimA attention: patch embed, CLS token, pos_embed, blocks, final norm, head on CLS.

    `attn_order` ("auto" = SimA's rule `qk_first iff 1+N < head_dim`, or "qk_first" / "kv_first") fixes the
    association order; `attn_drop_rate` is accepted for DeiT signature compatibility (SimA has no attention matrix
    to drop in the Q(K^T V) order).
    """

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, num_classes: int = 1000,
                 embed_dim: int = 768, depth: int = 12, num_heads: int = 12, mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, norm_layer=None, attn_order: str = "auto"):
        super().__init__()
        if embed_dim % num_heads:
            raise VitedgeError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}: change either")
        if attn_order not in ORDERS:
            raise VitedgeError(f"attn_order must be one of {', '.join(ORDERS)}; got {attn_order!r}")
        norm_layer = norm_layer or partial(nn.LayerNorm, eps=1e-6)
        self.num_classes, self.img_size = num_classes, img_size
        self.num_features = self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.patch_embed = PatchEmbed16(img_size, patch_size, in_chans, embed_dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + self.patch_embed.num_patches, embed_dim))
        self.pos_drop = nn.Dropout(drop_rate) if drop_rate > 0 else nn.Identity()
        dpr = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]  # stochastic depth decay rule
        self.blocks = nn.Sequential(*[
            SimADeiTBlock(embed_dim, num_heads, mlp_ratio, qkv_bias, drop_rate, dpr[i], norm_layer, attn_order)
            for i in range(depth)])
        self.norm = norm_layer(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        init_vit_weights(self, self.pos_embed, self.cls_token)  # DeiT's init

    def set_input_size(self, hw: tuple[int, int]) -> list[dict]:
        """Run at H x W (multiples of 16): `pos_embed` resampled from its pretrained grid, the CLS position kept,
        as timm's `resample_abs_pos_embed` (SimA's DeiT code is timm's VisionTransformer; docs/models.md)."""
        p = self.patch_embed.patch_size
        grid = (hw[0] // p, hw[1] // p)
        r = Resized(self)
        r.table(self, "pos_embed", "pos_embed", (self.img_size // p,) * 2, grid, prefix=1)
        self.patch_embed.num_patches, self.patch_embed.input_hw = grid[0] * grid[1], tuple(hw)
        return r.records

    def forward_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """The last block's tokens (B, 1+N, C), the CLS token first."""
        x = self.patch_embed(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        return self.blocks(self.pos_drop(x + self.pos_embed))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.forward_tokens(x))[:, 0]

    classifier_modules = ("norm", "head")   # what a backbone checkpoint does not need

    def feature_info(self) -> list[Tap]:
        """One map: the last block's patch tokens (stride 16), the CLS token dropped, before the classifier's final
        norm, as timm's forward_intermediates gives a ViT's (SimA has no DeiT dense-prediction code)."""
        return [Tap(0, self.patch_embed.patch_size, self.embed_dim)]

    def forward_intermediates(self, x: torch.Tensor, indices) -> list[torch.Tensor]:
        return [token_map(self.forward_tokens(x), x.shape[-2:], self.patch_embed.patch_size)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))


_NOTE = "pos_embed (1+14x14) resampled bicubic to the patch grid, CLS kept"
# DeiT-Ti / DeiT-S widths (head_dim 64), DeiT's drop-path 0.1
register_model("sima_deit_tiny", "sima_deit", stride=16, sizes_note=_NOTE, patch_size=16,
               embed_dim=192, depth=12, num_heads=3, mlp_ratio=4, qkv_bias=True, drop_path_rate=0.1)(SimADeiT)
register_model("sima_deit_small", "sima_deit", stride=16, sizes_note=_NOTE, patch_size=16,
               embed_dim=384, depth=12, num_heads=6, mlp_ratio=4, qkv_bias=True, drop_path_rate=0.1)(SimADeiT)


register_model_module(__name__, plan="sima_deit", recipe=SIMA_RECIPE)
