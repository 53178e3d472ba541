"""SLAB-PVT and PRepBN-PVT (`classification/models/slab_pvt.py` of xinghaochen/SLAB) in the official layout.

One class, `PyramidVisionTransformer`, serves both: `attn_type` picks per stage simplified linear attention
(`L`, SLAB-PVT, spatial reduction `la_sr_ratios`, default 1) or PVT's softmax attention (`S`, the `pvt_*_prepbn`
configs, spatial reduction `sr_ratios` 8,4,2,1). Every norm is a LinearNorm(LN eps 1e-6 -> RepBN, step 300000).

Keys: `pos_embed{1..4}` (root parameters, so first), `patch_embed{i}.{proj, norm}`, `block{i}.j.{norm1, attn, norm2,
mlp.{fc1, fc2}}` with `attn.{positional_encoding (L only), q, kv, proj, sr, norm (sr > 1), dwc (L only)}`, `head`.
No final norm; the head reads the token mean.

Quirks kept on purpose (they define the released function):
- `_get_pos_embed` compares each stage's token count with stage 1's, so stages 2-4 always take a same-size
  bilinear interpolation (an identity that exports as Resize ops; the deploy-form drops it). At input sizes where
  a later stage has exactly stage 1's token count the official code crashes; we raise a VitedgeError instead.
- With sr > 1 the SLA value tokens are linearly interpolated along the flattened token axis back to N before the
  depth-wise conv. The SLA runs in the input dtype (no fp32 guard in the PVT/CSWin code).
"""
from __future__ import annotations

from functools import partial
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import VitedgeError
from .layers import (ORDERS, DropPath, LinearNorm, Mlp, RepBN, init_vit_weights, linear_attention, resolve_order,
                     sla_rule)
from .features import Tap
from .preprocess import SLAB_RECIPE
from .layers.resample import Resized
from .registry import register_model, register_model_module

__all__ = ["PyramidVisionTransformer", "PVTPatchEmbed", "PVTBlock", "PVTAttention", "PVTLinearAttention",
           "pvt_linear_norm", "split_heads", "merge_heads", "tokens_to_map", "interpolate_tokens"]

# The SLAB-PVT norm: LN (eps 1e-6) blended into RepBN over the LinearNorm default 300000 training forwards.
pvt_linear_norm = partial(LinearNorm, norm1=partial(nn.LayerNorm, eps=1e-6), norm2=RepBN)


def split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, N, h*d) -> (B, h, N, d), channels split as `(h d)`."""
    b, n, c = t.shape
    return t.reshape(b, n, heads, c // heads).transpose(1, 2)


def merge_heads(t: torch.Tensor) -> torch.Tensor:
    """(B, h, N, d) -> (B, N, h*d)."""
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


def tokens_to_map(t: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """(..., N, C) tokens, row-major over the grid -> (prod(...), C, H, W)."""
    n, c = t.shape[-2:]
    return t.reshape(-1, n, c).transpose(1, 2).reshape(-1, c, *hw)


def interpolate_tokens(v: torch.Tensor, n: int) -> torch.Tensor:
    """The official `F.interpolate(v.permute(0, 2, 1), size=n, mode='linear')` along the token axis of (B, N', d)."""
    return F.interpolate(v.transpose(1, 2), size=n, mode="linear").transpose(1, 2)


class _SpatialReduction(nn.Module):
    """q, kv and proj of a PVT attention, and its spatial-reduction path `sr` conv -> `norm` -> kv (sr > 1)."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool, sr_ratio: int, norm_layer):
        super().__init__()
        if dim % num_heads:
            raise VitedgeError(f"dim {dim} is not divisible by num_heads {num_heads}: change either")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.sr_ratio = sr_ratio
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, kernel_size=sr_ratio, stride=sr_ratio)
            self.norm = norm_layer(dim)

    def keys_values(self, x: torch.Tensor, hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v of (B, N', C): from x, or from the reduced grid `norm(sr(x))` (N' = N / sr^2)."""
        if self.sr_ratio > 1:
            x = self.norm(self.sr(tokens_to_map(x, hw)).flatten(2).transpose(1, 2))
        b, n, c = x.shape
        return self.kv(x).reshape(b, n, 2, c).unbind(2)

    def reduced_tokens(self, n: int) -> int:
        return n // (self.sr_ratio * self.sr_ratio)


class PVTAttention(_SpatialReduction):
    """PVT's softmax attention with spatial reduction (keys `q`, `kv`, `proj`, `sr`, `norm`)."""

    trained_like_qk_scale = 0.5  # test weights: softmax neither flat nor one-hot (golden recipe)

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, qk_scale: float | None = None,
                 attn_drop: float = 0.0, sr_ratio: int = 1, norm_layer=nn.LayerNorm):
        super().__init__(dim, num_heads, qkv_bias, sr_ratio, norm_layer)
        self.scale = qk_scale or self.head_dim ** -0.5
        self.attn_drop = nn.Dropout(attn_drop) if attn_drop > 0 else None

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        h = self.num_heads
        q = split_heads(self.q(x), h)
        k, v = (split_heads(t, h) for t in self.keys_values(x, hw))
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        if self.attn_drop is not None:
            attn = self.attn_drop(attn)
        return self.proj(merge_heads(attn @ v))


class PVTLinearAttention(_SpatialReduction):
    """SLAB's SLA in PVT (keys `positional_encoding`, `q`, `kv`, `proj`, `sr`, `norm`, `dwc`).

    ReLU(q), ReLU(k + positional_encoding), normalized linear attention per head in the order `attn_order`
    fixes ("auto" = SLAB's FLOP rule with N_q = N, N_k = N'), plus a depth-wise conv (shared across heads) on v
    laid out as the token grid (v first interpolated back to N tokens when sr > 1).
    """

    def __init__(self, dim: int, num_patches: int, num_heads: int = 8, qkv_bias: bool = False, sr_ratio: int = 1,
                 kernel_size: int = 5, norm_layer=nn.LayerNorm, attn_order: str = "auto"):
        super().__init__(dim, num_heads, qkv_bias, sr_ratio, norm_layer)
        resolve_order(attn_order, "kv_first")  # validate early
        self.attn_order = attn_order
        self.dwc = nn.Conv2d(self.head_dim, self.head_dim, kernel_size, padding=kernel_size // 2, groups=self.head_dim)
        self.positional_encoding = nn.Parameter(torch.zeros(1, self.reduced_tokens(num_patches), dim))

    def order_for(self, nq: int, nk: int) -> str:
        return resolve_order(self.attn_order, sla_rule(nq, nk, self.head_dim, self.head_dim))

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        b, n, c = x.shape
        h = self.num_heads
        k, v = self.keys_values(x, hw)
        q, k = F.relu(self.q(x)), F.relu(k + self.positional_encoding)
        q, k, v = (split_heads(t, h).reshape(b * h, -1, self.head_dim) for t in (q, k, v))
        out = linear_attention(q, k, v, self.order_for(n, k.shape[1]))
        if self.sr_ratio > 1:
            v = interpolate_tokens(v, n)
        out = out + self.dwc(tokens_to_map(v, hw)).flatten(2).transpose(1, 2)
        return self.proj(merge_heads(out.reshape(b, h, n, self.head_dim)))


class PVTBlock(nn.Module):
    """`x + attn(norm1 x)`, `x + mlp(norm2 x)` (keys `norm1`, `attn`, `norm2`, `mlp`)."""

    def __init__(self, dim: int, num_patches: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = False,
                 qk_scale: float | None = None, drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0,
                 norm_layer=nn.LayerNorm, sr_ratio: int = 1, kernel_size: int = 5, attn_type: str = "L",
                 attn_order: str = "auto"):
        super().__init__()
        if attn_type not in ("L", "S"):
            raise VitedgeError(f"attention type {attn_type!r} must be 'L' (linear) or 'S' (softmax): fix attn_type")
        self.norm1 = norm_layer(dim)
        if attn_type == "L":
            # attn_drop is unused by the official SLA (built, never applied)
            self.attn = PVTLinearAttention(dim, num_patches, num_heads, qkv_bias, sr_ratio, kernel_size, norm_layer,
                                           attn_order)
        else:
            self.attn = PVTAttention(dim, num_heads, qkv_bias, qk_scale, attn_drop, sr_ratio, norm_layer)
        self.drop = nn.Dropout(drop) if drop > 0 else nn.Identity()  # the official proj_drop (no keys)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = x + self.drop_path(self.drop(self.attn(self.norm1(x), hw)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PVTPatchEmbed(nn.Module):
    """Conv(patch, stride patch) -> tokens -> norm (keys `proj`, `norm`); returns tokens and the grid."""

    def __init__(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int, norm_layer):
        super().__init__()
        self.patch_size = patch_size
        self.H = self.W = img_size // patch_size
        self.num_patches = self.H * self.W
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.norm = norm_layer(embed_dim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        hw = (x.shape[2] // self.patch_size, x.shape[3] // self.patch_size)
        return self.norm(self.proj(x).flatten(2).transpose(1, 2)), hw


def _stage_list(value, n: int, what: str) -> list:
    values = [int(c) for c in value] if isinstance(value, str) else list(value)
    if len(values) < n:
        raise VitedgeError(f"{what} {value!r} gives {len(values)} entries for {n} stages: give one per stage")
    return values[:n]


class PyramidVisionTransformer(nn.Module):
    """SLAB's PVT-v1 classifier: 4 stages of (patch embed + pos embed + blocks), token mean, head.

    `attn_type` has one letter per stage: `L` = SLA with spatial reduction `la_sr_ratios[i]`, `S` = softmax
    attention with `sr_ratios[i]`. `attn_order` ("auto", "qk_first", "kv_first") is the SLA association order.
    `qk_scale` and `focusing_factor` are accepted as officially (the latter is unused by SLA).
    """

    def __init__(self, img_size: int = 224, patch_size: int = 4, in_chans: int = 3, num_classes: int = 1000,
                 embed_dims: Sequence[int] = (64, 128, 320, 512), num_heads: Sequence[int] = (1, 2, 5, 8),
                 mlp_ratios: Sequence[float] = (8, 8, 4, 4), qkv_bias: bool = True, qk_scale: float | None = None,
                 drop_rate: float = 0.0, attn_drop_rate: float = 0.0, drop_path_rate: float = 0.0,
                 norm_layer=None, depths: Sequence[int] = (2, 2, 2, 2), sr_ratios: Sequence[int] = (8, 4, 2, 1),
                 la_sr_ratios: str | Sequence[int] = "1111", num_stages: int = 4, focusing_factor: int = 3,
                 kernel_size: int = 5, attn_type: str = "LLLL", attn_order: str = "auto"):
        super().__init__()
        if attn_order not in ORDERS:
            raise VitedgeError(f"attn_order must be one of {', '.join(ORDERS)}; got {attn_order!r}")
        if len(attn_type) < num_stages or any(t not in "LS" for t in attn_type[:num_stages]):
            raise VitedgeError(f"attn_type {attn_type!r} needs one of L/S per stage ({num_stages} stages), e.g. 'LLLL'")
        if img_size % (patch_size * 2 ** (num_stages - 1)):
            raise VitedgeError(f"img_size {img_size} must be divisible by {patch_size * 2 ** (num_stages - 1)} "
                               "(the total stride): pick a multiple")
        norm_layer = norm_layer or pvt_linear_norm
        embed_dims, num_heads, mlp_ratios, depths = (_stage_list(v, num_stages, w) for v, w in (
            (embed_dims, "embed_dims"), (num_heads, "num_heads"), (mlp_ratios, "mlp_ratios"), (depths, "depths")))
        sr_ratios = _stage_list(sr_ratios, num_stages, "sr_ratios")
        la_sr_ratios = _stage_list(la_sr_ratios, num_stages, "la_sr_ratios")
        self.num_classes, self.depths, self.num_stages = num_classes, depths, num_stages
        self.img_size, self.attn_type = img_size, attn_type[:num_stages]
        self.embed_dims = embed_dims

        dpr = [float(v) for v in torch.linspace(0, drop_path_rate, sum(depths), device="cpu")]
        cur = 0
        for i in range(num_stages):
            # official: stage i > 0 embeds a (img_size / 2^(i+1))-sized map with 2x2 patches
            patch_embed = PVTPatchEmbed(img_size if i == 0 else img_size // 2 ** (i + 1), patch_size if i == 0 else 2,
                                        in_chans if i == 0 else embed_dims[i - 1], embed_dims[i], norm_layer)
            n = patch_embed.num_patches
            t = attn_type[i]
            sr = sr_ratios[i] if t == "S" else la_sr_ratios[i]
            block = nn.ModuleList([
                PVTBlock(embed_dims[i], n, num_heads[i], mlp_ratios[i], qkv_bias, qk_scale, drop_rate, attn_drop_rate,
                         dpr[cur + j], norm_layer, sr, kernel_size, t, attn_order) for j in range(depths[i])])
            cur += depths[i]
            setattr(self, f"patch_embed{i + 1}", patch_embed)
            setattr(self, f"pos_embed{i + 1}", nn.Parameter(torch.zeros(1, n, embed_dims[i])))
            setattr(self, f"pos_drop{i + 1}", nn.Dropout(drop_rate) if drop_rate > 0 else nn.Identity())
            setattr(self, f"block{i + 1}", block)
        self.head = nn.Linear(embed_dims[-1], num_classes) if num_classes > 0 else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        init_vit_weights(self, *(getattr(self, f"pos_embed{i + 1}") for i in range(self.num_stages)))

    def stage_pos_embed(self, i: int, hw: tuple[int, int]) -> torch.Tensor:
        """The official `_get_pos_embed` for stage i (0-based) at grid `hw`: stage 1's own size returns the parameter,
        anything else a bilinear resize from the stage's grid (an identity when the sizes agree)."""
        pos = getattr(self, f"pos_embed{i + 1}")
        pe = getattr(self, f"patch_embed{i + 1}")
        h, w = hw
        if h * w == self.patch_embed1.num_patches:
            if pos.shape[1] != h * w:
                raise VitedgeError(f"stage {i + 1} has {h}x{w} tokens, stage 1's count, where the official PVT skips "
                                   f"the positional resize and fails: pick another --imgsz than {h * 2 ** (i + 2)}")
            return pos
        grid = pos.reshape(1, pe.H, pe.W, -1).permute(0, 3, 1, 2)
        return F.interpolate(grid, size=(h, w), mode="bilinear").reshape(1, -1, h * w).permute(0, 2, 1)

    def set_input_size(self, hw: tuple[int, int]) -> list[dict]:
        """Run at H x W (multiples of 32). The stage position embeddings need nothing stored: the forward resizes
        them bilinearly to each stage's grid, as the official `_get_pos_embed` does (recorded here); each SLA
        block's positional encoding, one per key token of its stage's (reduced) grid, is resampled bicubic as
        timm's `resample_abs_pos_embed` (docs/models.md)."""
        r = Resized(self)
        grid = tuple(hw)
        for i in range(self.num_stages):
            pe = getattr(self, f"patch_embed{i + 1}")
            grid = (grid[0] // pe.patch_size, grid[1] // pe.patch_size)
            native = (pe.H, pe.W)
            if grid != native:
                r.records.append({"tensor": f"pos_embed{i + 1}", "how": "resized bilinear to the stage's grid in the "
                                  "forward, as the official PVT's _get_pos_embed (not stored)",
                                  "from": [native[0] * native[1], *native], "to": [grid[0] * grid[1], *grid]})
            for j, blk in enumerate(getattr(self, f"block{i + 1}")):
                if isinstance(blk.attn, PVTLinearAttention):
                    sr = blk.attn.sr_ratio
                    r.table(blk.attn, "positional_encoding", f"block{i + 1}.{j}.attn.positional_encoding",
                            (native[0] // sr, native[1] // sr), (grid[0] // sr, grid[1] // sr),
                            what="SLA positional encoding")
        return r.records

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        for i in range(self.num_stages):
            x, hw = getattr(self, f"patch_embed{i + 1}")(x)
            x = getattr(self, f"pos_drop{i + 1}")(x + self.stage_pos_embed(i, hw))
            for blk in getattr(self, f"block{i + 1}"):
                x = blk(x, hw)
            if i != self.num_stages - 1:
                x = x.reshape(b, *hw, -1).permute(0, 3, 1, 2)
        return x.mean(dim=1)

    classifier_modules = ("head",)   # (no final norm) what a detection checkpoint does not hold

    def feature_info(self) -> list[Tap]:
        """The official PVT detection backbone's outputs (whai362/PVT `detection/pvt.py`, whose `pvt_tiny`...
        SLAB's PVT detection configs name): every stage's tokens after its last block as an NCHW map, with no
        per-output norm."""
        patch = self.patch_embed1.patch_size
        return [Tap(i, patch * 2 ** i, self.embed_dims[i]) for i in range(self.num_stages)]

    def dense_checkpoint_remap(self, sd: dict) -> list[str]:
        """The official PVT detection backbone keeps a class-token slot in its last stage's position embedding
        (`pos_embed4`, one token more) and drops it in forward (`pos_embed[:, 1:]`): dropped here, in place."""
        key = f"pos_embed{self.num_stages}"
        own = getattr(self, key)
        if key in sd and sd[key].dim() == 3 and sd[key].shape[1] == own.shape[1] + 1:
            sd[key] = sd[key][:, 1:]
            return [f"{key}: the official detection layout's class-token slot dropped (its forward drops it)"]
        return []

    def forward_intermediates(self, x: torch.Tensor, indices) -> list[torch.Tensor]:
        outs = []
        for i in range(max(indices) + 1):
            x, hw = getattr(self, f"patch_embed{i + 1}")(x)
            x = getattr(self, f"pos_drop{i + 1}")(x + self.stage_pos_embed(i, hw))
            for blk in getattr(self, f"block{i + 1}"):
                x = blk(x, hw)
            x = x.reshape(x.shape[0], *hw, -1).permute(0, 3, 1, 2)
            if i in indices:
                outs.append(x)
        return outs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))


# ---------------------------------------------------------------- registry (MODELS.md §2.3, cfgs/*pvt*.yaml)

_PVT = dict(patch_size=4, embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8), mlp_ratios=(8, 8, 4, 4),
            qkv_bias=True, sr_ratios=(8, 4, 2, 1), la_sr_ratios="1111", kernel_size=5)
_DEPTHS = {"tiny": ((2, 2, 2, 2), 0.0), "small": ((3, 4, 6, 3), 0.1), "medium": ((3, 4, 18, 3), 0.3)}
_SLAB_NOTE = ("each stage's SLA positional encodings resampled bicubic to its grid; pos embeds resized as "
              "officially (448 and 896 fail as officially)")
_PREPBN_NOTE = ("pos embeds are bilinearly resized away from 224 as officially; 448 and 896 fail as officially "
                "(a later stage then has stage 1's token count)")

for _size, (_depths, _dpr) in _DEPTHS.items():
    register_model(f"slab_pvt_{_size}", "slab", stride=32, sizes_note=_SLAB_NOTE, **_PVT, depths=_depths,
                   drop_path_rate=_dpr, attn_type="LLLL")(PyramidVisionTransformer)
    register_model(f"prepbn_pvt_{_size}", "slab", stride=32, sizes_note=_PREPBN_NOTE, **_PVT, depths=_depths,
                   drop_path_rate=_dpr, attn_type="SSSS")(PyramidVisionTransformer)


register_model_module(__name__, plan="slab_pvt", recipe=SLAB_RECIPE)
