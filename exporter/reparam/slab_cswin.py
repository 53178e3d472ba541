"""Fold plan for SLAB-CSWin (`CSWinTransformer`) -> `CSWinDeploy`, locked to the model's input size.

Every norm is a LinearNorm, i.e. its RepBN in eval: a per-channel `a * x + b`. Folds (exact in real arithmetic):
- `stage1_conv_embed.2` (norm) -> `stage1_conv_embed.0` (conv) and `mergeK.norm` -> `mergeK.conv` (`affine_after`:
  their outputs are the residual stream itself);
- block `norm1` -> `qkv`, `norm2` -> `mlp.fc1`; the final `norm` -> `head` through the token mean;
- softmax (LePE) branches: the 1/sqrt(d) scale -> the q rows of `qkv` (both branches share the head width);
- SLA branches: `lepe + dwc(v)` -> one depth-wise conv over the branch width: get_v (3x3, per channel) and dwc
  (k x k, shared by the heads) read the same zero-padded window map of v, so their kernels add once the smaller
  one is centred in the larger (`merge_depthwise`); the unused `scale` parameter is dropped.
Attention orders are fixed per SLA branch for its window token count (SLAB's FLOP rule).

Rewrite (exact, switchable, on by default): `single_window_without_partition`, a branch with one global
window (every released `L` stage and stage 4) skips the window partition and its inverse, which are then the
identity on the token layout.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...errors import VitedgeError
from ...models.input_size import as_hw
from ...models.slab_cswin import (CSWinBlock, CSWinLinearAttention, CSWinTransformer, MergeBlock,
                                  cswin_intermediates, from_windows, to_windows)
from ...models.slab_pvt import merge_heads, split_heads
from .engine import FoldContext, register_plan
from .primitives import ChannelAffine, affine_after, affine_before, scale_output
from .slab_pvt import eval_affine, fixed_order_sla, fold_mlp, sla_order, softmax_order

__all__ = ["CSWinDeploy", "CSWinBlockDeploy", "CSWinBranchDeploy", "ConvTokensDeploy", "merge_depthwise"]


@torch.no_grad()
def merge_depthwise(get_v: nn.Conv2d, dwc: nn.Conv2d, heads: int) -> nn.Conv2d:
    """One depth-wise conv over C = heads*d channels computing `get_v(x) + dwc(x per head)`.

    Channel `h*d + c` gets get_v's kernel plus dwc's kernel `c`, the smaller centred in the larger; with "same"
    zero padding the extra taps multiply zeros, so the sum is exact.
    """
    c = get_v.in_channels
    k = max(get_v.kernel_size[0], dwc.kernel_size[0])
    w = get_v.weight
    conv = nn.Conv2d(c, c, k, padding=k // 2, groups=c).to(w)

    def centred(kernel: torch.Tensor) -> torch.Tensor:
        p = (k - kernel.shape[-1]) // 2
        return F.pad(kernel, (p, p, p, p))

    conv.weight.copy_(centred(w) + centred(dwc.weight).repeat(heads, 1, 1, 1))
    conv.bias.copy_(get_v.bias + dwc.bias.repeat(heads))
    return conv


class ConvTokensDeploy(nn.Module):
    """Conv (norm folded in) on the token map -> (B, N, C) tokens; `resolution` None = the input is already NCHW."""

    def __init__(self, conv: nn.Conv2d, resolution: tuple[int, int] | None):
        super().__init__()
        self.conv, self.resolution = conv, resolution

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.resolution is not None:
            b, n, c = x.shape
            x = x.transpose(1, 2).reshape(b, c, *self.resolution)
        return self.conv(x).flatten(2).transpose(1, 2)


class CSWinBranchDeploy(nn.Module):
    """One stripe-window branch on (B, L, C') q, k, v: `attention + local(v)` per window.

    `local` is the merged lepe+dwc conv (SLA) or get_v (softmax); `positional_encoding` None = softmax branch
    (its scale folded into qkv). `partition` False = one global window (the partition is the identity).
    """

    def __init__(self, heads: int, resolution: tuple[int, int], window: tuple[int, int], local: nn.Conv2d,
                 positional_encoding: torch.Tensor | None, order: str, partition: bool):
        super().__init__()
        self.heads, self.resolution, self.window = heads, tuple(resolution), tuple(window)
        self.local, self.order, self.partition = local, order, partition
        self.positional_encoding = (None if positional_encoding is None else
                                    nn.Parameter(positional_encoding.detach().clone(), requires_grad=False))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        hs, ws = self.window
        if self.partition:
            q, k, v = (to_windows(t, self.resolution, self.window) for t in (q, k, v))
        b, n, c = q.shape
        local = self.local(v.transpose(1, 2).reshape(b, c, hs, ws)).reshape(b, c, n).transpose(1, 2)
        h = self.heads
        if self.positional_encoding is not None:
            q, k = F.relu(q), F.relu(k + self.positional_encoding)
            out = fixed_order_sla(split_heads(q, h), split_heads(k, h), split_heads(v, h), self.order)
        else:
            q, k, v = split_heads(q, h), split_heads(k, h), split_heads(v, h)
            out = (q @ k.transpose(-2, -1)).softmax(dim=-1) @ v
        out = merge_heads(out) + local
        if self.partition:
            out = from_windows(out, self.resolution, self.window)
        return out

    def extra_repr(self) -> str:
        kind = f"linear, order={self.order}" if self.positional_encoding is not None else "softmax"
        return f"heads={self.heads}, window={self.window}, {kind}, partition={self.partition}"


class CSWinBlockDeploy(nn.Module):
    """`x + proj(cat(branches(qkv x)))`, `x + mlp(x)`: norm1 folded into qkv, norm2 into fc1."""

    def __init__(self, qkv: nn.Linear, attns: list[CSWinBranchDeploy], proj: nn.Linear, mlp: nn.Module):
        super().__init__()
        self.qkv, self.attns, self.proj, self.mlp = qkv, nn.ModuleList(attns), proj, mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, c).unbind(2)
        if len(self.attns) == 2:
            half = c // 2
            y = torch.cat([self.attns[0](q[..., :half], k[..., :half], v[..., :half]),
                           self.attns[1](q[..., half:], k[..., half:], v[..., half:])], dim=2)
        else:
            y = self.attns[0](q, k, v)
        x = x + self.proj(y)
        return x + self.mlp(x)


class CSWinDeploy(nn.Module):
    """stage1_conv_embed -> stage1 -> (mergeK -> stageK+1)* -> token mean -> head (final norm folded in)."""

    def __init__(self, conv_embed: nn.Module, stages: list[list[nn.Module]], merges: list[nn.Module], head: nn.Module,
                 img_size: tuple[int, int]):
        super().__init__()
        self.stage1_conv_embed = conv_embed
        for i, blocks in enumerate(stages):
            if i:
                setattr(self, f"merge{i}", merges[i - 1])
            setattr(self, f"stage{i + 1}", nn.ModuleList(blocks))
        self.head, self.img_size = head, img_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_tracing() and tuple(x.shape[-2:]) != tuple(self.img_size):
            raise VitedgeError(f"this CSWin deploy-form was built for {self.img_size[0]}x{self.img_size[1]} inputs; "
                               f"got {x.shape[-2]}x{x.shape[-1]}: resize the input")
        x = self.stage1_conv_embed(x)
        for i in range(4):
            if i:
                x = getattr(self, f"merge{i}")(x)
            for blk in getattr(self, f"stage{i + 1}"):
                x = blk(x)
        return self.head(x.mean(dim=1))

    def forward_intermediates(self, x: torch.Tensor, indices) -> list[torch.Tensor]:
        return cswin_intermediates(self, x, indices)


def _fold_block(blk: CSWinBlock, path: str, ctx: FoldContext) -> CSWinBlockDeploy:
    qkv = affine_before(blk.qkv, *eval_affine(blk.norm1, f"{path}.norm1"))
    ctx.fold("norm->qkv")
    linear = isinstance(blk.attns[0], CSWinLinearAttention)
    if not linear:
        scales = {br.scale for br in blk.attns}
        if len(scales) != 1:
            raise VitedgeError(f"{path}: branches with different softmax scales {sorted(scales)} cannot share qkv's q "
                               "rows; build the model with one qk_scale")
        s = torch.ones(qkv.out_features, dtype=qkv.weight.dtype, device=qkv.weight.device)
        s[:blk.dim] = scales.pop()
        qkv = scale_output(qkv, s)
        ctx.fold("attn_scale->q")
    branches = []
    for b, br in enumerate(blk.attns):
        single = (br.H_sp, br.W_sp) == tuple(br.map_hw)
        partition = not (single and ctx.use("single_window_without_partition"))
        bpath = f"{path}.attns.{b}"
        if linear:
            n = br.window_tokens
            order = sla_order(br.attn_order, n, n, br.head_dim, ctx, bpath)
            local = merge_depthwise(br.get_v, br.dwc, br.num_heads)
            ctx.fold("lepe+dwc->depthwise_conv")
            ctx.fold("unused_sla_scale_dropped")
            branches.append(CSWinBranchDeploy(br.num_heads, br.map_hw, (br.H_sp, br.W_sp), local,
                                              br.positional_encoding, order, partition))
        else:
            softmax_order(ctx, bpath)
            branches.append(CSWinBranchDeploy(br.num_heads, br.map_hw, (br.H_sp, br.W_sp), br.get_v, None,
                                              "qk_first", partition))
    return CSWinBlockDeploy(qkv, branches, blk.proj, fold_mlp(blk.mlp, blk.norm2, f"{path}.norm2", ctx))


def _fold_merge(merge: MergeBlock, path: str, ctx: FoldContext) -> ConvTokensDeploy:
    conv = affine_after(merge.conv, *eval_affine(merge.norm, f"{path}.norm"))
    ctx.fold("norm->merge.conv")
    ctx.check(path, path)
    return ConvTokensDeploy(conv, merge.resolution)


@register_plan(CSWinTransformer, rewrites=("single_window_without_partition",))
def plan_cswin(model: CSWinTransformer, ctx: FoldContext) -> CSWinDeploy:
    conv, _, norm = model.stage1_conv_embed
    embed = ConvTokensDeploy(affine_after(conv, *eval_affine(norm, "stage1_conv_embed.2")), None)
    ctx.fold("norm->stage1_conv_embed.0")
    ctx.check("stage1_conv_embed", "stage1_conv_embed")
    stages, merges = [], []
    for i in range(4):
        if i:
            merges.append(_fold_merge(getattr(model, f"merge{i}"), f"merge{i}", ctx))
        blocks = []
        for j, blk in enumerate(getattr(model, f"stage{i + 1}")):
            p = f"stage{i + 1}.{j}"
            blocks.append(_fold_block(blk, p, ctx))
            ctx.check(p, p)
        stages.append(blocks)
    a, b = eval_affine(model.norm, "norm")
    if isinstance(model.head, nn.Linear):
        head = affine_before(model.head, a, b)  # mean(a x + b) = a mean(x) + b
        ctx.fold("norm->head")
    else:
        head = ChannelAffine(a, b, dim=-1)
        ctx.unfold("norm", "num_classes=0: no head Linear to fold the final norm into; kept as a per-channel affine")
    return CSWinDeploy(embed, stages, merges, head, as_hw(ctx.imgsz))
