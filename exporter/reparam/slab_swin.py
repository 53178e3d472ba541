"""Fold plan for SLAB-Swin (`SlabSwinTransformer`) and PRepBN-Swin (`SwinTransformer`).

Every norm is RepBN in eval (LinearNorm evaluates its RepBN alone), i.e. a per-channel `a * x + b`:
- `patch_embed.norm` -> the patch conv (`affine_after`: b' = a * conv_bias + b, not SLAB's merge that drops a * bias);
- block `norm1` -> `attn.qkv` and `norm2` -> `mlp.fc1` (`affine_before`; the affine commutes with the cyclic
  shift and window partition, which only permute tokens);
- `downsample.norm` -> `downsample.reduction` (which gains a bias);
- the final norm -> `head` through the token mean (mean(a x + b) = a mean(x) + b).
Window attention gets its relative position bias `table[index]` and its shift mask as constant buffers.
SLA keeps the shared `SimplifiedLinearAttention` module with its association order fixed per block.

Rewrites (each exact in real arithmetic, each switchable, all on by default): `softmax_scale_into_qkv` folds the
softmax scale into the q rows of `qkv`; `shift_mask_merged_with_bias` merges the shift mask into the bias
constant; `single_window_without_partition` skips roll/partition for single-window blocks;
`patch_merging_as_reshape` gathers PatchMerging's 2x2 neighbours with one reshape/transpose instead of four
strided slices and a concat.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ...models.layers import Mlp, SimplifiedLinearAttention
from ...models.layers.attention import order_reason, order_record, resolve_order, sla_rule
from ...models.slab_swin import (PatchMerging, SlabSwinTransformer, SwinTransformer, SwinTransformerBlock,
                                 WindowAttention, merge_heads, patch_merge_gather, split_qkv,
                                 padded_size, swin_intermediates, window_softmax_attention, windowed)
from .engine import FoldContext, register_plan
from .primitives import (ChannelAffine, PatchEmbedDeploy, affine_after, affine_before, require_repbn_affine,
                         scale_output)

__all__ = ["SwinDeploy", "SwinStageDeploy", "SwinBlockDeploy", "WindowAttentionDeploy",
           "PatchMergingDeploy", "norm_affine"]


# ---------------------------------------------------------------- deploy-form modules

class WindowAttentionDeploy(nn.Module):
    """Softmax window attention with constant biases.

    `bias` (nH, N, N) is added to every window; `window_bias` (nW, 1 or nH, N, N) per window position (the
    0/-100 shift mask, or mask + relative position bias once merged). `scale` is None once folded into `qkv`.
    """

    def __init__(self, qkv: nn.Linear, proj: nn.Linear, num_heads: int, scale: float | None,
                 bias: torch.Tensor | None, window_bias: torch.Tensor | None):
        super().__init__()
        self.qkv, self.proj, self.num_heads, self.scale = qkv, proj, num_heads, scale
        self.register_buffer("bias", bias)
        self.register_buffer("window_bias", window_bias)

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None) -> torch.Tensor:
        q, k, v = split_qkv(self.qkv(x), self.num_heads)
        if self.scale is not None:
            q = q * self.scale
        return self.proj(merge_heads(window_softmax_attention(q, k, v, self.bias, self.window_bias)))


class SwinBlockDeploy(nn.Module):
    """`x + attn(windows(x))`, then `x + mlp(x)`: norms folded into `attn.qkv` / `mlp.fc1`."""

    def __init__(self, attn: nn.Module, mlp: Mlp, resolution: tuple[int, int], window_size: int, shift_size: int,
                 partition: bool = True, norm1: nn.Module | None = None):
        super().__init__()
        self.attn, self.mlp = attn, mlp
        self.resolution, self.window_size, self.shift_size = tuple(resolution), window_size, shift_size
        self.partition = partition  # False only for one unshifted window covering the whole map
        # A map padded to window multiples is padded after norm1 (zeros that are not normalized): there the norm
        # stays an explicit affine before the padding instead of folding into qkv.
        self.norm1 = norm1

    def _attend(self, windows: torch.Tensor) -> torch.Tensor:
        return self.attn(windows, (self.window_size, self.window_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.partition:
            y = x if self.norm1 is None else self.norm1(x)
            x = x + windowed(y, self.resolution, self.window_size, self.shift_size, self._attend)
        else:
            x = x + self._attend(x)
        return x + self.mlp(x)

    def extra_repr(self) -> str:
        return (f"resolution={self.resolution}, window_size={self.window_size}, shift_size={self.shift_size}, "
                f"partition={self.partition}")


class PatchMergingDeploy(nn.Module):
    """2x2 neighbour gather -> `reduction` (norm folded in, with a bias).

    `as_reshape`: one reshape/transpose producing the official channel order [(0,0), (1,0), (0,1), (1,1)]
    (row offset minor) instead of four strided slices and a concat.
    """

    def __init__(self, reduction: nn.Linear, resolution: tuple[int, int], as_reshape: bool):
        super().__init__()
        self.reduction, self.resolution, self.as_reshape = reduction, tuple(resolution), as_reshape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.as_reshape:
            return self.reduction(patch_merge_gather(x, self.resolution))
        h, w = self.resolution
        c = x.shape[-1]
        x = x.reshape(-1, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 4, 2, 5)  # (B, h/2, w/2, dw, dh, C)
        return self.reduction(x.reshape(-1, (h // 2) * (w // 2), 4 * c))


class SwinStageDeploy(nn.Module):
    def __init__(self, blocks: list[nn.Module], downsample: nn.Module | None):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return x if self.downsample is None else self.downsample(x)


class SwinDeploy(nn.Module):
    """patch_embed (+ absolute_pos_embed) -> layers -> token mean -> head (final norm folded in).

    Module paths match the train-form (`patch_embed`, `layers.i.blocks.j`, `layers.i.downsample`, `head`).
    """

    def __init__(self, patch_embed: nn.Module, absolute_pos_embed: torch.Tensor | None, layers: list[nn.Module],
                 head: nn.Module, img_size: int):
        super().__init__()
        self.patch_embed = patch_embed
        self.absolute_pos_embed = None if absolute_pos_embed is None else nn.Parameter(absolute_pos_embed)
        self.layers = nn.ModuleList(layers)
        self.head = head
        self.img_size = img_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        if self.absolute_pos_embed is not None:
            x = x + self.absolute_pos_embed
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=1))

    def forward_intermediates(self, x: torch.Tensor, indices) -> list[torch.Tensor]:
        return swin_intermediates(self, x, indices)


# ---------------------------------------------------------------- folds

norm_affine = require_repbn_affine  # kept as this module's public name


def _fold_window_attention(attn: WindowAttention, mask: torch.Tensor | None,
                           ctx: FoldContext) -> WindowAttentionDeploy:
    qkv, scale = attn.qkv, attn.scale
    if ctx.use("softmax_scale_into_qkv"):
        s = torch.ones(qkv.out_features, dtype=qkv.weight.dtype)
        s[:attn.dim] = scale  # the q rows
        qkv, scale = scale_output(qkv, s), None
    bias = attn.relative_position_bias().detach().clone()
    ctx.fold("relative_position_bias->constant")
    window_bias = None
    if mask is not None:
        window_bias = mask.detach().clone().unsqueeze(1)  # (nW, 1, N, N)
        ctx.fold("shift_mask->constant")
        if ctx.use("shift_mask_merged_with_bias"):
            window_bias, bias = window_bias + bias, None  # (nW, nH, N, N): one add instead of two
    return WindowAttentionDeploy(qkv, attn.proj, attn.num_heads, scale, bias, window_bias)


def _fix_sla_order(attn: SimplifiedLinearAttention, path: str, ctx: FoldContext) -> None:
    n, d = attn.num_tokens, attn.head_dim
    requested = ctx.attn_order if ctx.attn_order != "auto" else attn.attn_order
    rule = sla_rule(n, n, d, d)
    attn.attn_order = resolve_order(requested, rule)
    ctx.order(path, attn.attn_order, order_reason(requested, rule, n, n, d, d),
              order_record("sla", n, n, d, requested, attn.attn_order))


def _fold_block(blk: SwinTransformerBlock, path: str, ctx: FoldContext) -> SwinBlockDeploy:
    attn, norm1 = blk.attn, None
    if padded_size(blk.input_resolution, blk.window_size) != tuple(blk.input_resolution):
        norm1 = ChannelAffine(*norm_affine(blk.norm1, f"{path}.norm1"), dim=-1)
        ctx.unfold(f"{path}.norm1", f"the {blk.input_resolution[0]}x{blk.input_resolution[1]} map is zero-padded "
                   f"to window-{blk.window_size} multiples after the norm: it stays an affine before the padding")
    else:
        attn.qkv = affine_before(attn.qkv, *norm_affine(blk.norm1, f"{path}.norm1"))
        ctx.fold("norm->attn.qkv")
    if isinstance(attn, SimplifiedLinearAttention):
        _fix_sla_order(attn, f"{path}.attn", ctx)
    else:
        attn = _fold_window_attention(attn, blk.attn_mask, ctx)
    mlp = blk.mlp
    mlp.fc1 = affine_before(mlp.fc1, *norm_affine(blk.norm2, f"{path}.norm2"))
    mlp.drop = None  # dropout is the identity in eval
    ctx.fold("norm->mlp.fc1")
    single = blk.shift_size == 0 and blk.window_size == min(blk.input_resolution) == max(blk.input_resolution)
    partition = not (single and ctx.use("single_window_without_partition"))
    ctx.check(path, path)
    return SwinBlockDeploy(attn, mlp, blk.input_resolution, blk.window_size, blk.shift_size, partition=partition,
                           norm1=norm1)


def _fold_merging(down: PatchMerging, path: str, ctx: FoldContext) -> PatchMergingDeploy:
    reduction = affine_before(down.reduction, *norm_affine(down.norm, f"{path}.norm"))
    ctx.fold("norm->downsample.reduction")
    as_reshape = ctx.use("patch_merging_as_reshape")
    ctx.check(path, path)
    return PatchMergingDeploy(reduction, down.input_resolution, as_reshape=as_reshape)


def _fold_head(model: SlabSwinTransformer | SwinTransformer, ctx: FoldContext) -> nn.Module:
    a, b = norm_affine(model.norm, "norm")
    if isinstance(model.head, nn.Linear):
        ctx.fold("norm->head")
        return affine_before(model.head, a, b)
    ctx.unfold("norm", "num_classes=0: no head Linear to fold the final norm into; kept as a per-channel affine")
    return ChannelAffine(a, b, dim=-1)


@register_plan(SlabSwinTransformer, SwinTransformer, rewrites=("softmax_scale_into_qkv", "shift_mask_merged_with_bias",
                                                            "single_window_without_partition",
                                                            "patch_merging_as_reshape"))
def plan_swin(model: SlabSwinTransformer | SwinTransformer, ctx: FoldContext) -> SwinDeploy:
    pe = model.patch_embed  # (the engine set the copy to ctx.imgsz: models/slab_swin.py set_input_size)
    proj = pe.proj
    if pe.norm is not None:
        proj = affine_after(proj, *norm_affine(pe.norm, "patch_embed.norm"))
        ctx.fold("norm->patch_embed.proj")
    ctx.check("patch_embed", "patch_embed")
    layers = []
    for i, layer in enumerate(model.layers):
        blocks = [_fold_block(blk, f"layers.{i}.blocks.{j}", ctx) for j, blk in enumerate(layer.blocks)]
        down = None if layer.downsample is None else _fold_merging(layer.downsample, f"layers.{i}.downsample", ctx)
        layers.append(SwinStageDeploy(blocks, down))
    ape = model.absolute_pos_embed.detach().clone() if model.ape else None
    return SwinDeploy(PatchEmbedDeploy(proj), ape, layers, _fold_head(model, ctx), model.img_size)
