"""SLAB-CSWin (`classification/models/slab_cswin.py` of xinghaochen/SLAB) in the official layout.

Cross-shaped window attention with, per stage, SLAB's simplified linear attention (`L`) or CSWin's softmax
LePE attention (`S`); every norm a LinearNorm(LN eps 1e-5 -> RepBN, step 120000).

Keys: `stage1_conv_embed.{0 (conv7 s4), 2 (norm)}`, `stageK.j.{qkv, norm1, proj, attns.b.*, mlp.{fc1, fc2}, norm2}`,
`mergeK.{conv, norm}`, `norm`, `head`. An `L` branch has `attns.b.{scale, positional_encoding, get_v, dwc}`, an `S`
branch `attns.b.get_v`.

A block whose stripe width equals its resolution (every released `L` stage: split sizes 56-28-14-7) and every
last-stage block has one global branch (`attns.0`, all heads); otherwise two branches on half the channels and
heads each: horizontal stripes (H x split) and vertical ones (split x W).
Quirks kept on purpose: the SLA branch has an unused `scale` parameter (1, 1, dim); its output is
`o + dwc(v) + lepe` with lepe = get_v(v) (a 3x3 depth-wise conv over the full branch width, zero-padded per
window); the SLA runs in the input dtype (no fp32 guard here).

Length: one official model file (both attention kinds, the window rules at any size, the segmentation feature maps).
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
from .features import ChannelsLayerNorm, Tap
from .preprocess import SLAB_RECIPE
from .layers.resample import Resized
from .registry import register_model, register_model_module
from .slab_pvt import merge_heads, split_heads

__all__ = ["CSWinTransformer", "CSWinBlock", "CSWinLinearAttention", "LePEAttention", "MergeBlock",
           "img2windows", "windows2img", "window_shape", "stripe_padding", "to_windows", "from_windows",
           "cswin_linear_norm", "cswin_intermediates"]

# The SLAB-CSWin norm: LN (eps 1e-5) blended into RepBN over 120000 training forwards.
cswin_linear_norm = partial(LinearNorm, norm1=nn.LayerNorm, norm2=RepBN, step=120000)


def img2windows(x: torch.Tensor, hs: int, ws: int) -> torch.Tensor:
    """(B, C, H, W) -> (B*nW, hs*ws, C), windows and the tokens inside them row-major (official)."""
    b, c, h, w = x.shape
    x = x.reshape(b, c, h // hs, hs, w // ws, ws).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(-1, hs * ws, c)


def windows2img(x: torch.Tensor, hs: int, ws: int, h: int, w: int) -> torch.Tensor:
    """(B*nW, hs*ws, C) -> (B, H*W, C), the inverse of `img2windows` on the token layout."""
    c = x.shape[-1]
    x = x.reshape(-1, h // hs, w // ws, hs, ws, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, h * w, c)


def window_shape(idx: int, resolution, split_size: int) -> tuple[int, int]:
    """(H_sp, W_sp) on a `resolution` map (S or (H, W)): idx -1 one global window, 0 vertical stripes
    (H x split), 1 horizontal (split x W), as the official CSWin's LePEAttention.forward at any size."""
    h, w = (resolution, resolution) if isinstance(resolution, int) else resolution
    if idx == -1:
        return h, w
    if idx == 0:
        return h, split_size
    if idx == 1:
        return split_size, w
    raise ValueError(f"branch index must be -1, 0 or 1, got {idx}")


def stripe_padding(hw: tuple[int, int], window: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) zero padding to window multiples, split evenly with the extra row or column at
    the bottom or right: the official CSWin segmentation backbone's padding for a split window
    (segmentation/backbone/cswin_transformer.py, LePEAttention.forward)."""
    hp, wp = (-hw[0]) % window[0], (-hw[1]) % window[1]
    return hp // 2, hp - hp // 2, wp // 2, wp - wp // 2


def to_windows(t: torch.Tensor, hw: tuple[int, int], window: tuple[int, int]) -> torch.Tensor:
    """(B, H*W, C) tokens -> (B*nW, hs*ws, C) windows of the map padded as `stripe_padding` (zeros)."""
    b, n, c = t.shape
    x = t.transpose(1, 2).reshape(b, c, *hw)
    top, bottom, left, right = stripe_padding(hw, window)
    if top or bottom or left or right:
        x = F.pad(x, (left, right, top, bottom))
    return img2windows(x, *window)


def from_windows(t: torch.Tensor, hw: tuple[int, int], window: tuple[int, int]) -> torch.Tensor:
    """The inverse of `to_windows`: (B*nW, hs*ws, C) -> (B, H*W, C), the padding cropped."""
    top, bottom, left, right = stripe_padding(hw, window)
    h, w = hw[0] + top + bottom, hw[1] + left + right
    x = windows2img(t, *window, h, w)
    if top or bottom or left or right:
        c = x.shape[-1]
        x = x.reshape(-1, h, w, c)[:, top:top + hw[0], left:left + hw[1]].reshape(-1, hw[0] * hw[1], c)
    return x


class _CSWinBranch(nn.Module):
    """What both branch types share: the window shape, `get_v` (LePE) and window partitioning of q, k, v."""

    def __init__(self, dim: int, resolution: int, idx: int, split_size: int, num_heads: int):
        super().__init__()
        if dim % num_heads:
            raise VitedgeError(f"branch width {dim} is not divisible by its {num_heads} heads: change num_heads")
        self.dim, self.resolution, self.num_heads = dim, resolution, num_heads
        self.idx, self.split_size = idx, split_size
        self.map_hw = (resolution, resolution)  # the token map it runs on (set_resolution)
        self.head_dim = dim // num_heads
        self.H_sp, self.W_sp = window_shape(idx, resolution, split_size)
        if resolution % self.H_sp or resolution % self.W_sp:
            raise VitedgeError(f"stripe {self.H_sp}x{self.W_sp} does not tile the {resolution}x{resolution} map: "
                               "fix split_size / la_split_size")
        self.get_v = nn.Conv2d(dim, dim, kernel_size=3, stride=1, padding=1, groups=dim)

    @property
    def window_tokens(self) -> int:
        return self.H_sp * self.W_sp

    def set_resolution(self, hw: tuple[int, int]) -> None:
        """Run on an H x W map: the window follows the official rule at that size (`window_shape`), the map is
        padded to window multiples (`stripe_padding`)."""
        self.map_hw = tuple(hw)
        self.H_sp, self.W_sp = window_shape(self.idx, self.map_hw, self.split_size)

    @property
    def padded(self) -> bool:
        return any(stripe_padding(self.map_hw, (self.H_sp, self.W_sp)))

    def windows(self, t: torch.Tensor) -> torch.Tensor:
        """(B, L, C) tokens -> (B*nW, n, C) window tokens."""
        return to_windows(t, self.map_hw, (self.H_sp, self.W_sp))

    def lepe(self, v: torch.Tensor) -> torch.Tensor:
        """get_v on each window's value map, (B', n, C) -> (B', n, C) (zero padding at every window border)."""
        b, n, c = v.shape
        fmap = v.transpose(1, 2).reshape(b, c, self.H_sp, self.W_sp)
        return self.get_v(fmap).reshape(b, c, n).transpose(1, 2)

    def unwindow(self, t: torch.Tensor) -> torch.Tensor:
        return from_windows(t, self.map_hw, (self.H_sp, self.W_sp))


class CSWinLinearAttention(_CSWinBranch):
    """SLAB's SLA branch (keys `scale` (unused), `positional_encoding`, `get_v`, `dwc`).

    `forward(q, k, v)` takes the branch's (B, L, C) slices and returns (B, L, C).
    """

    def __init__(self, dim: int, resolution: int, idx: int, split_size: int = 7, num_heads: int = 8,
                 kernel_size: int = 5, attn_order: str = "auto"):
        super().__init__(dim, resolution, idx, split_size, num_heads)
        resolve_order(attn_order, "kv_first")  # validate early
        self.attn_order = attn_order
        d = self.head_dim
        self.dwc = nn.Conv2d(d, d, kernel_size, padding=kernel_size // 2, groups=d)
        self.scale = nn.Parameter(torch.zeros(1, 1, dim))  # official, never used in the forward
        self.positional_encoding = nn.Parameter(torch.zeros(1, self.window_tokens, dim))

    def order_for(self, n: int) -> str:
        return resolve_order(self.attn_order, sla_rule(n, n, self.head_dim, self.head_dim))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = self.windows(q), self.windows(k), self.windows(v)
        lepe = self.lepe(v)
        q, k = F.relu(q), F.relu(k + self.positional_encoding)
        b, n, c = q.shape
        h, d = self.num_heads, self.head_dim
        q, k, v = (split_heads(t, h).reshape(b * h, n, d) for t in (q, k, v))
        out = linear_attention(q, k, v, self.order_for(n))
        local = self.dwc(v.transpose(1, 2).reshape(b * h, d, self.H_sp, self.W_sp))  # shared across heads
        out = out + local.reshape(b * h, d, n).transpose(1, 2)
        return self.unwindow(merge_heads(out.reshape(b, h, n, d)) + lepe)


class LePEAttention(_CSWinBranch):
    """CSWin's softmax branch with the locally-enhanced positional encoding (key `get_v`)."""

    def __init__(self, dim: int, resolution: int, idx: int, split_size: int = 7, num_heads: int = 8,
                 attn_drop: float = 0.0, qk_scale: float | None = None):
        super().__init__(dim, resolution, idx, split_size, num_heads)
        self.scale = qk_scale or self.head_dim ** -0.5
        self.attn_drop = nn.Dropout(attn_drop) if attn_drop > 0 else None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = self.windows(q), self.windows(k), self.windows(v)
        lepe = self.lepe(v)
        h = self.num_heads
        q, k, v = split_heads(q, h), split_heads(k, h), split_heads(v, h)
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        if self.attn_drop is not None:
            attn = self.attn_drop(attn)
        return self.unwindow(merge_heads(attn @ v) + lepe)


class CSWinBlock(nn.Module):
    """`x + proj(cat(branches(qkv(norm1 x))))`, `x + mlp(norm2 x)`.

    Keys `qkv`, `norm1`, `proj`, `attns`, `mlp`, `norm2` (in that order, as officially).
    """

    def __init__(self, dim: int, reso: int, num_heads: int, split_size: int = 7, mlp_ratio: float = 4.0,
                 qkv_bias: bool = False, qk_scale: float | None = None, drop: float = 0.0, attn_drop: float = 0.0,
                 drop_path: float = 0.0, norm_layer=nn.LayerNorm, last_stage: bool = False, kernel_size: int = 5,
                 attn_type: str = "L", attn_order: str = "auto"):
        super().__init__()
        if attn_type not in ("L", "S"):
            raise VitedgeError(f"attention type {attn_type!r} must be 'L' (linear) or 'S' (softmax): fix attn_type")
        self.dim, self.num_heads, self.patches_resolution = dim, num_heads, reso
        self.map_hw = (reso, reso)  # the token map it runs on (CSWinTransformer.set_input_size)
        if attn_type == "S":
            self.trained_like_qk_scale = 0.5  # test weights: softmax neither flat nor one-hot (golden recipe)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.norm1 = norm_layer(dim)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(drop) if drop > 0 else nn.Identity()
        last_stage = last_stage or reso == split_size
        self.branch_num = 1 if last_stage else 2
        width, heads = (dim, num_heads) if last_stage else (dim // 2, num_heads // 2)
        idxs = [-1] if last_stage else [0, 1]
        if attn_type == "L":
            self.attns = nn.ModuleList([CSWinLinearAttention(width, reso, i, split_size, heads, kernel_size, attn_order)
                                        for i in idxs])
        else:
            self.attns = nn.ModuleList([LePEAttention(width, reso, i, split_size, heads, attn_drop, qk_scale)
                                        for i in idxs])
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)
        self.norm2 = norm_layer(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        if n != self.map_hw[0] * self.map_hw[1]:
            raise VitedgeError(f"block expects {self.map_hw[0]}x{self.map_hw[1]} tokens, got {n}: feed the size the "
                               "model is set for (set_input_size)")
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, c).unbind(2)
        if self.branch_num == 2:
            half = c // 2
            y = torch.cat([self.attns[0](q[..., :half], k[..., :half], v[..., :half]),
                           self.attns[1](q[..., half:], k[..., half:], v[..., half:])], dim=2)
        else:
            y = self.attns[0](q, k, v)
        x = x + self.drop_path(self.proj_drop(self.proj(y)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class MergeBlock(nn.Module):
    """Conv3x3 s2 on the token map -> tokens -> norm (keys `conv`, `norm`)."""

    def __init__(self, dim: int, dim_out: int, resolution: int, norm_layer=nn.LayerNorm):
        super().__init__()
        self.resolution = (resolution, resolution)  # (H, W) of the map it reads
        self.conv = nn.Conv2d(dim, dim_out, 3, 2, 1)
        self.norm = norm_layer(dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        x = self.conv(x.transpose(1, 2).reshape(b, c, *self.resolution))
        return self.norm(x.flatten(2).transpose(1, 2))


class ToTokens(nn.Module):
    """NCHW -> (B, H*W, C), checking the grid as the official einops Rearrange does (no parameters)."""

    def __init__(self, h: int, w: int):
        super().__init__()
        self.h, self.w = h, w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[2:]) != (self.h, self.w):
            raise VitedgeError(f"CSWin expects a {self.h * 4}x{self.w * 4} input (stem grid {self.h}x{self.w}), got "
                               f"a {x.shape[2]}x{x.shape[3]} grid: resize the input or rebuild with img_size")
        return x.flatten(2).transpose(1, 2)


class CSWinTransformer(nn.Module):
    """SLAB-CSWin classifier: conv7 s4 stem, 4 stages (merge blocks between), final norm, token mean, head.

    `attn_type` has one letter per stage (`L` SLA with stripe width `la_split_size[i]`, `S` LePE softmax with
    `split_size[i]`); `la_split_size` is the official dash-separated string (or a list). `attn_order` fixes the
    SLA association order ("auto" = SLAB's FLOP rule). `patch_size`, `hybrid_backbone`, `use_chk` and
    `focusing_factor` are accepted as officially (the stem is always conv7 s4; SLA ignores the focusing factor).
    """

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, num_classes: int = 1000,
                 embed_dim: int = 64, depth: Sequence[int] = (2, 2, 6, 2), split_size: Sequence[int] = (1, 2, 7, 7),
                 la_split_size: str | Sequence[int] = "56-28-14-7", num_heads: Sequence[int] = (2, 4, 8, 16),
                 mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, drop_path_rate: float = 0.0, hybrid_backbone=None, norm_layer=None,
                 use_chk: bool = False, focusing_factor: int = 3, kernel_size: int = 5, attn_type: str = "LLSS",
                 attn_order: str = "auto"):
        super().__init__()
        if attn_order not in ORDERS:
            raise VitedgeError(f"attn_order must be one of {', '.join(ORDERS)}; got {attn_order!r}")
        if len(attn_type) < 4 or any(t not in "LS" for t in attn_type[:4]):
            raise VitedgeError(f"attn_type {attn_type!r} needs one of L/S per stage (4 stages), e.g. 'LLSS'")
        if img_size % 32:
            raise VitedgeError(f"img_size {img_size} must be divisible by 32 (the total stride): pick a multiple")
        la = [int(s) for s in la_split_size.split("-")] if isinstance(la_split_size, str) else list(la_split_size)
        if len(la) < 4 or len(split_size) < 4 or len(depth) < 4 or len(num_heads) < 4:
            raise VitedgeError("depth, num_heads, split_size and la_split_size need one entry per stage (4 stages)")
        norm_layer = norm_layer or cswin_linear_norm
        self.num_classes, self.img_size, self.attn_type = num_classes, img_size, attn_type[:4]
        self.num_features = self.embed_dim = embed_dim

        self.stage1_conv_embed = nn.Sequential(nn.Conv2d(in_chans, embed_dim, 7, 4, 2),
                                               ToTokens(img_size // 4, img_size // 4), norm_layer(embed_dim))
        dpr = [float(v) for v in torch.linspace(0, drop_path_rate, sum(depth), device="cpu")]
        dim, start = embed_dim, 0
        for i in range(4):
            reso = img_size // 2 ** (i + 2)
            t = attn_type[i]
            split = la[i] if t == "L" else split_size[i]
            if i:
                setattr(self, f"merge{i}", MergeBlock(dim, dim * 2, reso * 2, norm_layer))
                dim *= 2
            setattr(self, f"stage{i + 1}", nn.ModuleList([
                CSWinBlock(dim, reso, num_heads[i], split, mlp_ratio, qkv_bias, qk_scale, drop_rate, attn_drop_rate,
                           dpr[start + j], norm_layer, last_stage=i == 3, kernel_size=kernel_size, attn_type=t,
                           attn_order=attn_order)
                for j in range(depth[i])]))
            start += depth[i]
        self.norm = norm_layer(dim)
        self.head = nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        init_vit_weights(self)  # official: Linear trunc_normal(0.02), LayerNorm (1, 0); convs default

    def set_input_size(self, hw: tuple[int, int]) -> list[dict]:
        """Run at H x W (multiples of 32) as the official CSWin segmentation backbone does: each branch's window
        follows its rule at the new map (a global branch covers the whole map, stripes keep their width and span
        the map), zero-padded to window multiples, centred; each SLA branch's positional encoding, one per token
        of its window, is resampled bicubic from its pretraining window to the new one, as timm's
        `resample_abs_pos_embed` (docs/models.md). The branches (one global or two stripes) stay as pretrained."""
        r = Resized(self)
        self.stage1_conv_embed[1].h, self.stage1_conv_embed[1].w = hw[0] // 4, hw[1] // 4
        for i in range(4):
            stage = (hw[0] // 2 ** (i + 2), hw[1] // 2 ** (i + 2))
            if i:
                getattr(self, f"merge{i}").resolution = (stage[0] * 2, stage[1] * 2)
            for j, blk in enumerate(getattr(self, f"stage{i + 1}")):
                blk.map_hw = stage
                for b, br in enumerate(blk.attns):
                    old = window_shape(br.idx, br.resolution, br.split_size)
                    br.set_resolution(stage)
                    path = f"stage{i + 1}.{j}.attns.{b}"
                    if isinstance(br, CSWinLinearAttention):
                        r.table(br, "positional_encoding", f"{path}.positional_encoding", old, (br.H_sp, br.W_sp),
                                what="SLA positional encoding (one per window token)")
                    if br.padded:
                        top, bottom, left, right = stripe_padding(stage, (br.H_sp, br.W_sp))
                        r.pad(path, f"q, k, v maps zero-padded (top {top}, bottom {bottom}, left {left}, right "
                              f"{right}) to multiples of its {br.H_sp}x{br.W_sp} window",
                              stage, (stage[0] + top + bottom, stage[1] + left + right))
        return r.records

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage1_conv_embed(x)
        for blk in self.stage1:
            x = blk(x)
        for i in range(1, 4):
            x = getattr(self, f"merge{i}")(x)
            for blk in getattr(self, f"stage{i + 1}"):
                x = blk(x)
        return self.norm(x).mean(dim=1)

    classifier_modules = ("norm", "head")   # what a segmentation checkpoint does not hold

    def feature_info(self) -> list[Tap]:
        """The official CSWin segmentation backbone's outputs (microsoft/CSWin-Transformer
        `segmentation/backbone/cswin_transformer.py`; SLAB has no CSWin dense-prediction code): every stage after
        its last block, through an nn.LayerNorm `norm1`..`norm4`, as an NCHW map."""
        return [Tap(i, 4 * 2 ** i, self.embed_dim * 2 ** i, ChannelsLayerNorm, module=f"norm{i + 1}")
                for i in range(4)]

    def forward_intermediates(self, x: torch.Tensor, indices) -> list[torch.Tensor]:
        return cswin_intermediates(self, x, indices)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))


def cswin_intermediates(model: nn.Module, x: torch.Tensor, indices) -> list[torch.Tensor]:
    """The stages at `indices` after their last block, as NCHW maps (tokens are row-major); the train-form and the
    deploy-form share it (`stage1_conv_embed`, `mergeK`, `stageK`)."""
    h, w = x.shape[-2:]
    x = model.stage1_conv_embed(x)
    outs = []
    for i in range(max(indices) + 1):
        if i:
            x = getattr(model, f"merge{i}")(x)
        for blk in getattr(model, f"stage{i + 1}"):
            x = blk(x)
        if i in indices:
            s = 4 * 2 ** i
            outs.append(x.transpose(1, 2).reshape(x.shape[0], -1, h // s, w // s))
    return outs


# ---------------------------------------------------------------- registry (MODELS.md §2.3, cfgs/slab_cswin_*.yaml)

_CSWIN = dict(embed_dim=64, split_size=(1, 2, 7, 7), la_split_size="56-28-14-7", num_heads=(2, 4, 8, 16),
              mlp_ratio=4.0, qkv_bias=True, kernel_size=5, attn_type="LLSS")
_NOTE = "windows as the official segmentation backbone, padded; SLA encodings resampled bicubic to the window"


@register_model("slab_cswin_tiny", "slab", stride=32, sizes_note=_NOTE, **_CSWIN, depth=(2, 4, 18, 1),
                drop_path_rate=0.1)
def slab_cswin_tiny(**kwargs) -> CSWinTransformer:
    """SLAB_CSWin_64_24181_tiny_224 (cfgs/slab_cswin_t.yaml): 21.23M params."""
    return CSWinTransformer(**kwargs)


@register_model("slab_cswin_small", "slab", stride=32, sizes_note=_NOTE, **_CSWIN, depth=(2, 4, 32, 2),
                drop_path_rate=0.3)
def slab_cswin_small(**kwargs) -> CSWinTransformer:
    """SLAB_CSWin_64_24322_small_224 (cfgs/slab_cswin_s.yaml): 35.49M params."""
    return CSWinTransformer(**kwargs)


register_model_module(__name__, plan="slab_cswin", recipe=SLAB_RECIPE)
