"""SLAB-Swin (`SlabSwinTransformer`) and PRepBN-Swin (`SwinTransformer`) in the official state_dict layouts.

Sources: `classification/models/slab_swin.py` and `swin_transformer.py` of xinghaochen/SLAB (f58db00).
Both are the Swin-v1 backbone; they differ in the attention type per block (SLAB: simplified linear attention
in `L` stages, windowed softmax attention in `S` stages), the window rule and the default norm
(SLAB: LinearNorm LN -> RepBN, step 60000; PRepBN: RepBN). Layout details that keep official checkpoints
loading strictly: `downsample.reduction` (no bias) is built before `downsample.norm`; shifted blocks keep the
0/-100 `attn_mask` as a persistent buffer (their first state_dict key); `relative_position_index` is an int64
buffer beside `relative_position_bias_table`.

Length: one family: SLAB-Swin and PRepBN-Swin share every module but the attention, in the official layout.
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as checkpoint

from ..errors import VitedgeError
from .layers import DropPath, LinearNorm, Mlp, RepBN, SimplifiedLinearAttention, init_vit_weights
from .layers.resample import Resized
from .preprocess import SLAB_RECIPE
from .features import ChannelsLayerNorm, Tap
from .registry import register_model, register_model_module

__all__ = ["SlabSwinTransformer", "SwinTransformer", "SwinTransformerBlock", "WindowAttention", "PatchMerging",
           "PatchEmbed", "window_partition", "window_reverse", "windowed", "padded_size", "relative_position_index",
           "shift_attn_mask", "window_softmax_attention", "split_qkv", "merge_heads", "patch_merge_gather",
           "slab_linear_norm"]

# The SLAB-Swin class default norm: LN (eps 1e-5) blended into RepBN over 60000 training forwards.
slab_linear_norm = partial(LinearNorm, norm1=nn.LayerNorm, norm2=RepBN, step=60000)


# ---------------------------------------------------------------- window helpers (shared with the deploy-form)

def window_partition(x: torch.Tensor, ws: int) -> torch.Tensor:
    """(B, H, W, C) -> (B*nW, ws*ws, C), windows row-major as in the official code (reshapes only)."""
    _, h, w, c = x.shape
    x = x.reshape(-1, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, ws * ws, c)


def window_reverse(windows: torch.Tensor, ws: int, h: int, w: int) -> torch.Tensor:
    """(B*nW, ws*ws, C) -> (B, H, W, C), the inverse of `window_partition`."""
    c = windows.shape[-1]
    x = windows.reshape(-1, h // ws, w // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, h, w, c)


def padded_size(resolution: Sequence[int], ws: int) -> tuple[int, int]:
    """The map size rounded up to window multiples (the official detection backbones' padding)."""
    return tuple(-(-r // ws) * ws for r in resolution)


def windowed(x: torch.Tensor, resolution: Sequence[int], ws: int, shift: int,
             attend: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Zero-pad the map at the bottom and right to window multiples (where it is not), cyclic shift by -shift,
    partition, `attend` per window, reverse, shift back, crop: (B, H*W, C) -> same. The padding is that of SLAB's
    and Swin's detection backbones (`SwinTransformerBlock.forward` of detection/mmdet_custom/swin_transformer_slab.py):
    after norm1, zeros, the shift mask built for the padded map."""
    h, w = resolution
    hp, wp = padded_size(resolution, ws)
    c = x.shape[-1]
    x = x.reshape(-1, h, w, c)
    if (hp, wp) != (h, w):
        x = F.pad(x, (0, 0, 0, wp - w, 0, hp - h))
    if shift:
        x = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
    x = window_reverse(attend(window_partition(x, ws)), ws, hp, wp)
    if shift:
        x = torch.roll(x, shifts=(shift, shift), dims=(1, 2))
    if (hp, wp) != (h, w):
        x = x[:, :h, :w]
    return x.reshape(-1, h * w, c)


def relative_position_index(ws: int) -> torch.Tensor:
    """(ws², ws²) int64 index into the (2ws-1)² relative position bias table (official construction)."""
    coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
    rel[:, :, 0] += ws - 1
    rel[:, :, 1] += ws - 1
    rel[:, :, 0] *= 2 * ws - 1
    return rel.sum(-1)


def shift_attn_mask(h: int, w: int, ws: int, shift: int) -> torch.Tensor:
    """The official (nW, ws², ws²) SW-MSA mask: 0 within a region, -100 across the wrapped-around regions."""
    img = torch.zeros(1, h, w, 1)
    cuts = (slice(0, -ws), slice(-ws, -shift), slice(-shift, None))
    for cnt, (hs, wsl) in enumerate((a, b) for a in cuts for b in cuts):
        img[:, hs, wsl, :] = cnt
    win = window_partition(img, ws).squeeze(-1)  # (nW, ws²)
    diff = win.unsqueeze(1) - win.unsqueeze(2)
    return diff.masked_fill(diff != 0, -100.0).masked_fill(diff == 0, 0.0)


def window_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                             mask: torch.Tensor | None, attn_drop: nn.Module | None = None) -> torch.Tensor:
    """softmax(q kᵀ + bias (+ mask)) v on (B*nW, nH, N, d), q already scaled.

    `bias` broadcasts against (nH, N, N); `mask` is (nW, 1 or nH, N, N) and is added per window.
    """
    attn = q @ k.transpose(-2, -1)
    if bias is not None:
        attn = attn + bias
    if mask is not None:
        nh, n = attn.shape[1], attn.shape[2]
        attn = (attn.reshape(-1, mask.shape[0], nh, n, n) + mask).reshape(-1, nh, n, n)
    attn = attn.softmax(dim=-1)
    if attn_drop is not None:
        attn = attn_drop(attn)
    return attn @ v


def split_qkv(qkv: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B_, N, 3C) -> q, k, v of (B_, nH, N, d) with the official `(3, nH, d)` channel layout."""
    b, n, c3 = qkv.shape
    return qkv.reshape(b, n, 3, num_heads, c3 // (3 * num_heads)).permute(2, 0, 3, 1, 4).unbind(0)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B_, nH, N, d) -> (B_, N, nH*d)."""
    b, h, n, d = x.shape
    return x.transpose(1, 2).reshape(b, n, h * d)


# ---------------------------------------------------------------- train-form modules

class WindowAttention(nn.Module):
    """W-MSA with relative position bias.

    Keys: `relative_position_bias_table`, `relative_position_index` (int64 buffer), `qkv`, `proj`.
    """
    trained_like_qk_scale = 0.25  # test weights: softmax neither flat nor one-hot (golden recipe)


    def __init__(self, dim: int, window_size: int, num_heads: int, qkv_bias: bool = True,
                 qk_scale: float | None = None, attn_drop: float = 0.0, proj_drop: float = 0.0):
        super().__init__()
        self.dim, self.window_size, self.num_heads = dim, window_size, num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window_size - 1) ** 2, num_heads))
        self.register_buffer("relative_position_index", relative_position_index(window_size))
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop) if attn_drop > 0 else None
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop) if proj_drop > 0 else None
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def relative_position_bias(self) -> torch.Tensor:
        """table[index] as (nH, N, N)."""
        n = self.window_size ** 2
        table = self.relative_position_bias_table[self.relative_position_index.reshape(-1)]
        return table.reshape(n, n, -1).permute(2, 0, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = split_qkv(self.qkv(x), self.num_heads)
        out = window_softmax_attention(q * self.scale, k, v, self.relative_position_bias(),
                                       None if mask is None else mask.unsqueeze(1), self.attn_drop)
        out = self.proj(merge_heads(out))
        return out if self.proj_drop is None else self.proj_drop(out)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, window_size={self.window_size}, num_heads={self.num_heads}"


class SwinTransformerBlock(nn.Module):
    """`x + attn(norm1 x)` over (shifted) windows, then `x + mlp(norm2 x)`.

    `attn_type` 'S' = WindowAttention (softmax), 'L' = SimplifiedLinearAttention (one positional encoding of
    window² tokens, dwc shared across heads; the shift mask, when built, is not used by it, as officially).
    If min(resolution) <= window, the window becomes the resolution and the shift is forced to 0.
    """

    def __init__(self, dim: int, input_resolution: Sequence[int], num_heads: int, window_size: int = 7,
                 shift_size: int = 0, mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None,
                 drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0, norm_layer=RepBN,
                 attn_type: str = "S", focusing_factor: int = 3, kernel_size: int = 5, attn_order: str = "auto"):
        super().__init__()
        self.dim, self.num_heads, self.mlp_ratio = dim, num_heads, mlp_ratio
        self.input_resolution = tuple(input_resolution)
        if min(self.input_resolution) <= window_size:
            window_size, shift_size = min(self.input_resolution), 0
        if not 0 <= shift_size < window_size:
            raise VitedgeError(f"shift {shift_size} must lie in [0, window {window_size}): "
                               "fix the window_size override")
        if any(r % window_size for r in self.input_resolution):
            raise VitedgeError(f"window {window_size} does not tile the {self.input_resolution} token grid: choose "
                               "a window_size that divides every stage's resolution")
        if attn_type not in ("L", "S"):
            raise VitedgeError(f"attention type {attn_type!r} must be 'L' (linear) or 'S' (softmax): fix attn_type")
        self.window_size, self.shift_size, self.attn_type = window_size, shift_size, attn_type
        self.norm1 = norm_layer(dim)
        if attn_type == "L":
            # focusing_factor is accepted and unused, as in the official code.
            self.attn = SimplifiedLinearAttention(dim, num_heads, window_size * window_size, qkv_bias=qkv_bias,
                                                  kernel_size=kernel_size, attn_order=attn_order)
        else:
            self.attn = WindowAttention(dim, window_size, num_heads, qkv_bias=qkv_bias, qk_scale=qk_scale,
                                        attn_drop=attn_drop, proj_drop=drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)
        self.register_buffer("attn_mask", self._mask())

    def _mask(self) -> torch.Tensor | None:
        return shift_attn_mask(*padded_size(self.input_resolution, self.window_size), self.window_size,
                               self.shift_size) if self.shift_size else None

    def set_resolution(self, resolution: Sequence[int]) -> bool:
        """Run on a `resolution` token map, keeping the window and shift the block was built with (its
        pretraining ones): the map is padded to window multiples and the shift mask rebuilt for the padded map.
        Returns whether the map is padded."""
        self.input_resolution = tuple(resolution)
        if self.attn_mask is not None:
            self.attn_mask = self._mask().to(self.attn_mask)
        return padded_size(resolution, self.window_size) != self.input_resolution

    def _attend(self, windows: torch.Tensor) -> torch.Tensor:
        if self.attn_type == "S":
            return self.attn(windows, self.attn_mask)
        return self.attn(windows, (self.window_size, self.window_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = self.input_resolution
        if x.shape[1] != h * w:
            raise VitedgeError(f"block expects {h}x{w}={h * w} tokens, got {x.shape[1]}: feed the model's img_size")
        y = windowed(self.norm1(x), self.input_resolution, self.window_size, self.shift_size, self._attend)
        x = x + self.drop_path(y)
        return x + self.drop_path(self.mlp(self.norm2(x)))

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, input_resolution={self.input_resolution}, num_heads={self.num_heads}, "
                f"attn_type={self.attn_type}, window_size={self.window_size}, shift_size={self.shift_size}")


def patch_merge_gather(x: torch.Tensor, resolution: Sequence[int]) -> torch.Tensor:
    """(B, H*W, C) -> (B, H/2*W/2, 4C) as `cat(x[0::2,0::2], x[1::2,0::2], x[0::2,1::2], x[1::2,1::2])`."""
    h, w = resolution
    c = x.shape[-1]
    x = x.reshape(-1, h, w, c)
    x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
    return x.reshape(-1, (h // 2) * (w // 2), 4 * c)


class PatchMerging(nn.Module):
    """2x2 neighbour concat -> norm(4C) -> `reduction` Linear(4C, 2C, no bias).

    `reduction` is built before `norm`: the official key order.
    """

    def __init__(self, input_resolution: Sequence[int], dim: int, norm_layer=RepBN):
        super().__init__()
        self.input_resolution, self.dim = tuple(input_resolution), dim
        if any(r % 2 for r in self.input_resolution):
            raise VitedgeError(f"patch merging needs an even resolution, got {self.input_resolution}: "
                               "use an img_size divisible by 32")
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = norm_layer(4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reduction(self.norm(patch_merge_gather(x, self.input_resolution)))


class PatchEmbed(nn.Module):
    """Conv(patch, stride patch) -> tokens -> optional norm (keys `proj`, `norm`); the input size is fixed."""

    def __init__(self, img_size: int = 224, patch_size: int = 4, in_chans: int = 3, embed_dim: int = 96,
                 norm_layer=None):
        super().__init__()
        self.img_size, self.patch_size = img_size, patch_size
        self.patches_resolution = (img_size // patch_size, img_size // patch_size)
        self.num_patches = self.patches_resolution[0] * self.patches_resolution[1]
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.norm = norm_layer(embed_dim) if norm_layer is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        want = getattr(self, "input_hw", (self.img_size, self.img_size))
        if tuple(x.shape[2:]) != tuple(want):
            raise VitedgeError(f"input {tuple(x.shape[2:])} does not match the size the model is set for, {want}: "
                               "resize the input or call set_input_size((H, W)) (vitedge does, for --imgsz)")
        x = self.proj(x).flatten(2).transpose(1, 2)
        return x if self.norm is None else self.norm(x)


class BasicLayer(nn.Module):
    """One stage: `blocks` (ModuleList) then an optional `downsample` PatchMerging."""

    def __init__(self, dim: int, input_resolution: Sequence[int], num_heads: int, layout: Sequence[tuple[str, int]],
                 drop_path: Sequence[float], norm_layer, downsample: bool, use_checkpoint: bool = False, **block_kw):
        super().__init__()
        self.dim, self.input_resolution, self.depth = dim, tuple(input_resolution), len(layout)
        self.use_checkpoint = use_checkpoint
        self.blocks = nn.ModuleList([
            SwinTransformerBlock(dim, input_resolution, num_heads, window_size=ws,
                                 shift_size=0 if i % 2 == 0 else ws // 2, drop_path=drop_path[i],
                                 norm_layer=norm_layer, attn_type=t, **block_kw)
            for i, (t, ws) in enumerate(layout)])
        self.downsample = PatchMerging(input_resolution, dim, norm_layer=norm_layer) if downsample else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            if self.use_checkpoint and self.training:
                x = checkpoint.checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        return x if self.downsample is None else self.downsample(x)


class _SwinBackbone(nn.Module):
    """The shared Swin-v1 classifier: patch embed (+ape) -> stages -> norm -> token mean -> head."""

    def __init__(self, layouts: Sequence[Sequence[tuple[str, int]]], *, img_size: int, patch_size: int,
                 in_chans: int, num_classes: int, embed_dim: int, num_heads: Sequence[int], mlp_ratio: float,
                 qkv_bias: bool, qk_scale: float | None, drop_rate: float, attn_drop_rate: float,
                 drop_path_rate: float, norm_layer, ape: bool, patch_norm: bool, use_checkpoint: bool,
                 **block_kw):
        super().__init__()
        depths = [len(lay) for lay in layouts]
        if len(num_heads) != len(depths):
            raise VitedgeError(f"num_heads has {len(num_heads)} entries for {len(depths)} stages: give one per stage")
        self.num_classes, self.num_layers, self.embed_dim = num_classes, len(depths), embed_dim
        self.ape, self.patch_norm, self.mlp_ratio = ape, patch_norm, mlp_ratio
        self.num_features = int(embed_dim * 2 ** (self.num_layers - 1))
        self.img_size = img_size
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim, norm_layer if patch_norm else None)
        res = self.patch_embed.patches_resolution
        self.patches_resolution = res
        if ape:
            self.absolute_pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches, embed_dim))
            nn.init.trunc_normal_(self.absolute_pos_embed, std=0.02)
        self.pos_drop = nn.Dropout(drop_rate) if drop_rate > 0 else nn.Identity()
        dpr = [float(v) for v in torch.linspace(0, drop_path_rate, sum(depths), device="cpu")]
        self.layers = nn.ModuleList()
        for i, layout in enumerate(layouts):
            start = sum(depths[:i])
            width, stage_res = int(embed_dim * 2 ** i), res[0] // 2 ** i
            if width % num_heads[i]:
                raise VitedgeError(f"stage {i}: num_heads {num_heads[i]} does not divide its width {width}: "
                                   "choose heads that divide embed_dim * 2**stage")
            if stage_res == 0 or (i < len(layouts) - 1 and stage_res % 2):
                raise VitedgeError(f"stage {i}: resolution {stage_res} cannot be merged by 2: use img_size "
                                   f"divisible by patch_size * 2**{len(layouts) - 1}")
            self.layers.append(BasicLayer(
                int(embed_dim * 2 ** i), (res[0] // 2 ** i, res[1] // 2 ** i), num_heads[i], layout,
                dpr[start:start + depths[i]], norm_layer, downsample=i < self.num_layers - 1,
                use_checkpoint=use_checkpoint, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale,
                drop=drop_rate, attn_drop=attn_drop_rate, **block_kw))
        self.norm = norm_layer(self.num_features)
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        init_vit_weights(self)

    def set_input_size(self, hw: tuple[int, int]) -> list[dict]:
        """Run at H x W (multiples of 32), as the official detection backbones do: every block keeps its
        pretraining window and shift (SLA stages 56 and 28 tokens, softmax stages 7), the map is zero-padded after
        norm1 to window multiples and the shift masks are built for the padded map; an absolute position
        embedding (ape) is resampled bicubic. Returns what changed (docs/models.md)."""
        p = self.patch_embed.patch_size
        res = (hw[0] // p, hw[1] // p)
        r = Resized(self)
        if self.ape:
            r.table(self, "absolute_pos_embed", "absolute_pos_embed", self.patches_resolution, res)
        for i, layer in enumerate(self.layers):
            stage = (res[0] // 2 ** i, res[1] // 2 ** i)
            layer.input_resolution = stage
            for j, blk in enumerate(layer.blocks):
                if blk.set_resolution(stage):
                    shift = f"; shift {blk.shift_size} masked on the padded map" if blk.shift_size else ""
                    r.pad(f"layers.{i}.blocks.{j}", f"token map zero-padded (bottom, right) after norm1 to multiples "
                          f"of its window {blk.window_size}{shift}", stage, padded_size(stage, blk.window_size))
            if layer.downsample is not None:
                layer.downsample.input_resolution = stage
        self.patch_embed.input_hw = tuple(hw)
        return r.records

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        if self.ape:
            x = x + self.absolute_pos_embed
        x = self.pos_drop(x)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x).mean(dim=1)

    classifier_modules = ("norm", "head")   # what a detection checkpoint does not hold

    def feature_info(self) -> list[Tap]:
        """The official detection backbones' outputs (SLAB's mmdet_custom swin_transformer_slab.py and
        swin_transformer_prepbn.py): every stage before its patch merging, through an nn.LayerNorm `norm{i}`."""
        patch = self.patch_embed.proj.stride[0]
        return [Tap(i, patch * 2 ** i, int(self.embed_dim * 2 ** i), ChannelsLayerNorm)
                for i in range(self.num_layers)]

    def forward_intermediates(self, x: torch.Tensor, indices) -> list[torch.Tensor]:
        return swin_intermediates(self, x, indices)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))


def _stage_types(attn_type: str, depths: Sequence[int]) -> list[list[str]]:
    """Per-block attention types from the official string: one letter per stage, 'M' = mixed
    (the trailing number after the stage letters gives how many leading blocks are 'L')."""
    n = len(depths)
    if len(attn_type) < n or any(t not in "LSM" for t in attn_type[:n]):
        raise VitedgeError(f"attn_type {attn_type!r} needs one of L/S/M per stage ({n} stages), e.g. 'LLSS'")
    out = []
    for i, d in enumerate(depths):
        t = attn_type[i]
        if t == "M":
            try:
                n_lin = int(attn_type[n:])
            except ValueError:
                raise VitedgeError(f"attn_type {attn_type!r}: 'M' stages need a block count after the stage "
                                   "letters, e.g. 'LLM2S'") from None
            out.append(["L" if j < n_lin else "S" for j in range(d)])
        else:
            out.append([t] * d)
    return out


class SlabSwinTransformer(_SwinBackbone):
    """SLAB-Swin: `L` stages use `window_size` (SLA), `S` stages use window 7 (12 if window_size > 56)."""

    def __init__(self, img_size: int = 224, patch_size: int = 4, in_chans: int = 3, num_classes: int = 1000,
                 embed_dim: int = 96, depths: Sequence[int] = (2, 2, 6, 2), num_heads: Sequence[int] = (3, 6, 12, 24),
                 window_size: int = 7, mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None,
                 drop_rate: float = 0.0, attn_drop_rate: float = 0.0, drop_path_rate: float = 0.1,
                 norm_layer=slab_linear_norm, ape: bool = False, patch_norm: bool = True,
                 use_checkpoint: bool = False, focusing_factor: int = 3, kernel_size: int = 5,
                 attn_type: str = "LLLL", attn_order: str = "auto"):
        s_window = 7 if window_size <= 56 else 12
        layouts = [[(t, window_size if t == "L" else s_window) for t in types]
                   for types in _stage_types(attn_type, depths)]
        super().__init__(layouts, img_size=img_size, patch_size=patch_size, in_chans=in_chans,
                         num_classes=num_classes, embed_dim=embed_dim, num_heads=num_heads, mlp_ratio=mlp_ratio,
                         qkv_bias=qkv_bias, qk_scale=qk_scale, drop_rate=drop_rate, attn_drop_rate=attn_drop_rate,
                         drop_path_rate=drop_path_rate, norm_layer=norm_layer, ape=ape, patch_norm=patch_norm,
                         use_checkpoint=use_checkpoint, focusing_factor=focusing_factor, kernel_size=kernel_size,
                         attn_order=attn_order)
        self.attn_type = attn_type


class SwinTransformer(_SwinBackbone):
    """PRepBN-Swin: standard Swin (softmax WindowAttention everywhere) with RepBN norms by default.

    `fused_window_process` selects an optional CUDA kernel with the same math officially; it is accepted and ignored.
    """

    def __init__(self, img_size: int = 224, patch_size: int = 4, in_chans: int = 3, num_classes: int = 1000,
                 embed_dim: int = 96, depths: Sequence[int] = (2, 2, 6, 2), num_heads: Sequence[int] = (3, 6, 12, 24),
                 window_size: int = 7, mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None,
                 drop_rate: float = 0.0, attn_drop_rate: float = 0.0, drop_path_rate: float = 0.1,
                 norm_layer=RepBN, ape: bool = False, patch_norm: bool = True, use_checkpoint: bool = False,
                 fused_window_process: bool = False):
        layouts = [[("S", window_size)] * d for d in depths]
        super().__init__(layouts, img_size=img_size, patch_size=patch_size, in_chans=in_chans,
                         num_classes=num_classes, embed_dim=embed_dim, num_heads=num_heads, mlp_ratio=mlp_ratio,
                         qkv_bias=qkv_bias, qk_scale=qk_scale, drop_rate=drop_rate, attn_drop_rate=attn_drop_rate,
                         drop_path_rate=drop_path_rate, norm_layer=norm_layer, ape=ape, patch_norm=patch_norm,
                         use_checkpoint=use_checkpoint)


# ---------------------------------------------------------------- registry

_SLAB_NOTE = "pretraining windows (SLA 56 and 28, softmax 7) kept, the map padded to window multiples"
_PREPBN_NOTE = "window 7 kept, the map padded to window multiples, shift masks for the padded map"
_SWIN_T = dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))


@register_model("slab_swin_tiny", "slab", stride=32, sizes_note=_SLAB_NOTE, **_SWIN_T, window_size=56,
                attn_type="LLSS", kernel_size=5, drop_path_rate=0.2)
def slab_swin_tiny(**kwargs) -> SlabSwinTransformer:
    """cfgs/slab_swin_t.yaml: 29.22M params."""
    return SlabSwinTransformer(**kwargs)


@register_model("slab_swin_small", "slab", stride=32, sizes_note=_SLAB_NOTE,
                **{**_SWIN_T, "depths": (2, 2, 18, 2)}, window_size=56, attn_type="LLSS", kernel_size=5,
                drop_path_rate=0.3)
def slab_swin_small(**kwargs) -> SlabSwinTransformer:
    """cfgs/slab_swin_s.yaml: 50.55M params."""
    return SlabSwinTransformer(**kwargs)


@register_model("prepbn_swin_tiny", "slab", stride=32, sizes_note=_PREPBN_NOTE, **_SWIN_T, window_size=7,
                drop_path_rate=0.2)
def prepbn_swin_tiny(**kwargs) -> SwinTransformer:
    """swin_t_prepbn.yaml: standard Swin-T with RepBN norms, 28.29M params."""
    return SwinTransformer(**kwargs)


register_model_module(__name__, plan="slab_swin", recipe=SLAB_RECIPE)


def swin_intermediates(model: nn.Module, x: torch.Tensor, indices) -> list[torch.Tensor]:
    """The stage outputs at `indices` before each stage's patch merging, as NCHW maps (tokens are row-major);
    the train-form and the deploy-form share it (`patch_embed.proj`, `layers[i].blocks`, `layers[i].downsample`)."""
    b, _, h, w = x.shape
    patch = model.patch_embed.proj.stride[0]
    t = model.patch_embed(x)
    if getattr(model, "absolute_pos_embed", None) is not None:
        t = t + model.absolute_pos_embed
    outs = []
    for i, layer in enumerate(model.layers[:max(indices) + 1]):
        for blk in layer.blocks:
            t = blk(t)
        if i in indices:
            s = patch * 2 ** i
            outs.append(t.transpose(1, 2).reshape(b, -1, h // s, w // s))
        if layer.downsample is not None:
            t = layer.downsample(t)
    return outs
