"""Fold plan for SLAB-PVT / PRepBN-PVT (`PyramidVisionTransformer`) -> `PVTDeploy`, locked to one input size.

Every norm is a LinearNorm, i.e. its RepBN in eval: a per-channel `a * x + b`. Folds (exact in real arithmetic):
- `patch_embed{i}.norm` -> `patch_embed{i}.proj` (`affine_after`; its output is the residual stream itself);
- block `norm1` -> `attn.q` and `attn.kv` (sr = 1) or `attn.sr` (sr > 1: an unpadded dense conv, so the shift is
  exact at every tap); the spatial-reduction path's own `attn.norm` -> `attn.kv`; `norm2` -> `mlp.fc1`;
- softmax attention: the 1/sqrt(d) scale -> `attn.q`;
- positional embeddings: the identity-size bilinear resizes of stages 2-4 (Resize ops in ONNX) are removed;
  a resize that is not the identity (another input size, PRepBN-PVT only) becomes a constant for that size;
- SLA with sr > 1: the linear resize of v along the tokens becomes a constant (N x N') MatMul.
Attention orders are fixed per block for the export size (SLAB's FLOP rule with N_q = N, N_k = N').

Rewrite (exact, switchable, on by default): `pvt_q_kv_merged_into_qkv`: with sr = 1, `q` and `kv` read the
same input, so they become one `qkv` Linear.
Nothing is left unfolded for the released configurations; a norm that is no constant affine (a LayerNorm built
on purpose) is refused with an error, since the patch-embed norm feeds the residual stream.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...errors import VitedgeError
from ...models.input_size import as_hw, check_stride
from ...models.layers import Mlp
from ...models.layers.attention import order_reason, order_record, resolve_order, sla_rule
from ...models.slab_pvt import (PVTBlock, PVTLinearAttention, PyramidVisionTransformer, merge_heads,
                                split_heads, tokens_to_map)
from .engine import FoldContext, register_plan
from .primitives import PatchEmbedDeploy, affine_after, affine_before, require_repbn_affine, scale_output

__all__ = ["PVTDeploy", "PVTBlockDeploy", "PVTAttentionDeploy", "eval_affine", "fixed_order_sla",
           "sla_order", "softmax_order", "fold_mlp", "SLA_EPS"]

SLA_EPS = 1e-6


eval_affine = require_repbn_affine  # kept as this module's public name


def fixed_order_sla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, order: str) -> torch.Tensor:
    """SLA core on (..., N, d) / (..., N', d) in a fixed order: `num / (q . sum_j k_j + eps)` as one Div
    (no 1/x: an all-zero ReLU query gives 0 / eps = 0 in fp16, not 0 * inf)."""
    kt = k.transpose(-2, -1)
    den = q @ kt.sum(dim=-1, keepdim=True)
    num = q @ (kt @ v) if order == "kv_first" else (q @ kt) @ v
    return num / (den + SLA_EPS)


def sla_order(attn_order: str, nq: int, nk: int, d: int, ctx: FoldContext, path: str) -> str:
    """Fix and record an SLA order: `--attn-order` wins over the model's own `attn_order`; "auto" = FLOP rule."""
    requested = ctx.attn_order if ctx.attn_order != "auto" else attn_order
    rule = sla_rule(nq, nk, d, d)
    order = resolve_order(requested, rule)
    ctx.order(path, order, order_reason(requested, rule, nq, nk, d, d),
              order_record("sla", nq, nk, d, requested, order))
    return order


def softmax_order(ctx: FoldContext, path: str) -> None:
    ctx.order(path, "qk_first", "softmax attention: q k^T is formed for the softmax (attn_order does not apply)")


def fold_mlp(mlp: Mlp, norm: nn.Module, path: str, ctx: FoldContext) -> Mlp:
    """`mlp(norm(x))` with the norm folded into fc1 (the dropout, identity in eval, dropped)."""
    mlp.fc1 = affine_before(mlp.fc1, *eval_affine(norm, path))
    mlp.drop = None
    ctx.fold("norm->mlp.fc1")
    return mlp


# ---------------------------------------------------------------- deploy-form modules

class PVTAttentionDeploy(nn.Module):
    """PVT attention with folded projections on a fixed grid.

    q/k/v come from one `qkv` Linear (sr = 1, rewritten), from `q` + `kv`, or from `q` + `sr` conv -> `kv`.
    `linear`: SLA (`positional_encoding`, `dwc`, fixed `order`, `v_resize` (N, N') for sr > 1); else softmax
    attention with the scale folded into q.
    """

    def __init__(self, heads: int, grid: tuple[int, int], proj: nn.Linear, *, qkv: nn.Linear | None = None,
                 q: nn.Linear | None = None, kv: nn.Linear | None = None, sr: nn.Conv2d | None = None,
                 linear: bool = False, positional_encoding: torch.Tensor | None = None, dwc: nn.Conv2d | None = None,
                 order: str = "kv_first", v_resize: torch.Tensor | None = None):
        super().__init__()
        self.heads, self.grid, self.linear, self.order = heads, tuple(grid), linear, order
        self.qkv, self.q, self.kv, self.sr, self.proj, self.dwc = qkv, q, kv, sr, proj, dwc
        self.positional_encoding = (None if positional_encoding is None else
                                    nn.Parameter(positional_encoding.detach().clone(), requires_grad=False))
        self.register_buffer("v_resize", None if v_resize is None else v_resize.detach().clone())

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, n, c = x.shape
        if self.qkv is not None:
            return self.qkv(x).reshape(b, n, 3, c).unbind(2)
        q = self.q(x)
        if self.sr is not None:
            x = self.sr(tokens_to_map(x, self.grid)).flatten(2).transpose(1, 2)
        k, v = self.kv(x).reshape(b, x.shape[1], 2, c).unbind(2)
        return q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        h = self.heads
        q, k, v = self._qkv(x)
        if not self.linear:
            q, k, v = split_heads(q, h), split_heads(k, h), split_heads(v, h)
            return self.proj(merge_heads((q @ k.transpose(-2, -1)).softmax(dim=-1) @ v))
        q, k = F.relu(q), F.relu(k + self.positional_encoding)
        q, k, v = split_heads(q, h), split_heads(k, h), split_heads(v, h)   # (B, h, N or N', d)
        out = fixed_order_sla(q, k, v, self.order)
        if self.v_resize is not None:
            v = self.v_resize @ v  # the official linear token resize N' -> N, as a constant matrix
        d = c // h
        local = self.dwc(v.transpose(-2, -1).reshape(b * h, d, *self.grid)).reshape(b, h, d, n)
        return self.proj(merge_heads(out + local.transpose(-2, -1)))

    def extra_repr(self) -> str:
        kind = f"linear, order={self.order}" if self.linear else "softmax"
        return f"heads={self.heads}, grid={self.grid}, {kind}"


class PVTBlockDeploy(nn.Module):
    """`x + attn(x)`, `x + mlp(x)`: norm1 folded into the attention's inputs, norm2 into fc1."""

    def __init__(self, attn: PVTAttentionDeploy, mlp: Mlp):
        super().__init__()
        self.attn, self.mlp = attn, mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.mlp(x)


class PVTDeploy(nn.Module):
    """Stages of (patch embed -> + constant pos embed -> blocks), token mean, head; module paths as the train-form."""

    def __init__(self, stages: list[tuple[nn.Module, torch.Tensor, list[nn.Module], tuple[int, int]]],
                 head: nn.Module, imgsz):
        super().__init__()
        self.num_stages, self.imgsz = len(stages), imgsz
        self.grids = [tuple(s[3]) for s in stages]
        for i, (patch_embed, pos, blocks, _) in enumerate(stages):
            setattr(self, f"pos_embed{i + 1}", nn.Parameter(pos.detach().clone(), requires_grad=False))
            setattr(self, f"patch_embed{i + 1}", patch_embed)
            setattr(self, f"block{i + 1}", nn.ModuleList(blocks))
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_tracing() and tuple(x.shape[-2:]) != as_hw(self.imgsz):
            h, w = as_hw(self.imgsz)
            raise VitedgeError(f"this PVT deploy-form was built for {h}x{w} inputs; got "
                               f"{x.shape[-2]}x{x.shape[-1]}: re-run reparameterize with that --imgsz")
        b = x.shape[0]
        for i in range(self.num_stages):
            x = getattr(self, f"patch_embed{i + 1}")(x) + getattr(self, f"pos_embed{i + 1}")
            for blk in getattr(self, f"block{i + 1}"):
                x = blk(x)
            if i != self.num_stages - 1:
                x = x.reshape(b, *self.grids[i], -1).permute(0, 3, 1, 2)
        return self.head(x.mean(dim=1))

    def forward_intermediates(self, x: torch.Tensor, indices) -> list[torch.Tensor]:
        """Every stage at `indices` after its last block, NCHW (models/slab_pvt.py feature_info)."""
        outs = []
        for i in range(max(indices) + 1):
            x = getattr(self, f"patch_embed{i + 1}")(x) + getattr(self, f"pos_embed{i + 1}")
            for blk in getattr(self, f"block{i + 1}"):
                x = blk(x)
            x = x.reshape(x.shape[0], *self.grids[i], -1).permute(0, 3, 1, 2)
            if i in indices:
                outs.append(x)
        return outs


# ---------------------------------------------------------------- folds

def _token_resize_matrix(n_from: int, n_to: int, like: torch.Tensor) -> torch.Tensor:
    """(n_to, n_from) M with `M @ v` = the official `F.interpolate(v^T, n_to, mode='linear')^T` (same weights:
    the resize of each unit vector)."""
    eye = torch.eye(n_from, dtype=like.dtype, device=like.device).unsqueeze(0)
    return F.interpolate(eye, size=n_to, mode="linear")[0].T.contiguous()


@torch.no_grad()
def _stack_linears(*linears: nn.Linear) -> nn.Linear:
    """One Linear whose outputs are the given Linears' outputs, concatenated (all read the same input)."""
    w = torch.cat([lin.weight for lin in linears])
    fused = nn.Linear(w.shape[1], w.shape[0]).to(w)
    fused.weight.copy_(w)
    fused.bias.copy_(torch.cat([lin.bias for lin in linears]))
    return fused


def _fold_attention(blk: PVTBlock, path: str, grid: tuple[int, int], ctx: FoldContext) -> PVTAttentionDeploy:
    attn = blk.attn
    a1, b1 = eval_affine(blk.norm1, f"{path}.norm1")
    c, h, d = attn.dim, attn.num_heads, attn.head_dim
    q = affine_before(attn.q, a1, b1)
    ctx.fold("norm->attn.q")
    if not isinstance(attn, PVTLinearAttention):
        q = scale_output(q, torch.full((c,), attn.scale, dtype=q.weight.dtype, device=q.weight.device))
        ctx.fold("attn_scale->q")
    kv, sr = attn.kv, None
    if attn.sr_ratio > 1:
        sr = affine_before(attn.sr, a1, b1)   # the conv has no padding: exact at every tap
        kv = affine_before(kv, *eval_affine(attn.norm, f"{path}.attn.norm"))
        ctx.fold("norm->attn.sr")
        ctx.fold("sr_norm->attn.kv")
    else:
        kv = affine_before(kv, a1, b1)
        ctx.fold("norm->attn.kv")
    fused = None
    if sr is None and ctx.use("pvt_q_kv_merged_into_qkv"):
        fused = _stack_linears(q, kv)
    parts = dict(qkv=fused) if fused is not None else dict(q=q, kv=kv, sr=sr)

    n = grid[0] * grid[1]
    nk = (grid[0] // attn.sr_ratio) * (grid[1] // attn.sr_ratio)
    if not isinstance(attn, PVTLinearAttention):
        softmax_order(ctx, f"{path}.attn")
        return PVTAttentionDeploy(h, grid, attn.proj, **parts)
    if attn.positional_encoding.shape[1] != nk:
        raise VitedgeError(f"{path}.attn has a positional encoding for {attn.positional_encoding.shape[1]} tokens, "
                           f"not the {nk} of a {grid[0]}x{grid[1]} grid: set_input_size((H, W)) first")
    order = sla_order(attn.attn_order, n, nk, d, ctx, f"{path}.attn")
    v_resize = None
    if attn.sr_ratio > 1:
        v_resize = _token_resize_matrix(nk, n, attn.positional_encoding)
        ctx.fold("v_token_resize->matmul")
    return PVTAttentionDeploy(h, grid, attn.proj, **parts, linear=True, positional_encoding=attn.positional_encoding,
                              dwc=attn.dwc, order=order, v_resize=v_resize)


@register_plan(PyramidVisionTransformer, rewrites=("pvt_q_kv_merged_into_qkv",))
def plan_pvt(model: PyramidVisionTransformer, ctx: FoldContext) -> PVTDeploy:
    stride = model.patch_embed1.patch_size * 2 ** (model.num_stages - 1)
    check_stride("PVT", ctx.imgsz, stride)
    stages = []
    grid = as_hw(ctx.imgsz)
    for i in range(model.num_stages):
        pe = getattr(model, f"patch_embed{i + 1}")
        grid = (grid[0] // pe.patch_size, grid[1] // pe.patch_size)
        proj = affine_after(pe.proj, *eval_affine(pe.norm, f"patch_embed{i + 1}.norm"))
        ctx.fold("norm->patch_embed.proj")
        ctx.check(f"patch_embed{i + 1}", f"patch_embed{i + 1}")
        if grid == (pe.H, pe.W):
            pos = getattr(model, f"pos_embed{i + 1}")
            if i:
                ctx.fold("identity_pos_resize_removed")
        else:  # another input size: the official resize, computed once for it
            pos = model.stage_pos_embed(i, grid)
            ctx.fold("pos_resize->constant")
        blocks = []
        for j, blk in enumerate(getattr(model, f"block{i + 1}")):
            p = f"block{i + 1}.{j}"
            attn = _fold_attention(blk, p, grid, ctx)
            blocks.append(PVTBlockDeploy(attn, fold_mlp(blk.mlp, blk.norm2, f"{p}.norm2", ctx)))
            ctx.check(p, p)
        stages.append((PatchEmbedDeploy(proj), pos, blocks, grid))
    return PVTDeploy(stages, model.head, ctx.imgsz)
