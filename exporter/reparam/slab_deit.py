"""Fold plan for SLAB-DeiT and PRepBN-DeiT: every RepBN / LinearNorm into the next Linear, the final norm
through the (linear) pooling into the head, the attention order fixed at the export resolution.

Deploy-form (`DeiTDeploy`), per forward:
  patch_embed (Conv16 s16 -> flatten -> (B, N, C)) + pos_embed        [constant per-token add]
  (PRepBN: cat(cls_token + pos_embed[:, :1], ...))                      [one constant token]
  blocks: x + attn(x); x + mlp(x)        (norm1 folded into attn.qkv, norm2 into mlp.fc1)
  mean over tokens (SLAB) | token 0 (PRepBN) -> head                  (final norm folded into head)
No BatchNorm / LayerNorm / RepBN / LinearNorm / Dropout remains; nothing per-channel is left unfolded for the
released configs (a LayerNorm built on purpose with norm_layer="layernorm" is kept and listed as unfolded).

Deploy SLA (`SLADeploy`): ReLU(q), ReLU(k + positional_encoding), per head `(q (k^T v)) / (q . sum_j k_j + eps)`
or `((q k^T) v) / (...)`, order fixed here; batched 4-D MatMuls only (no Einsum), one normalizer per head
(a MatMul against sum_j k_j) applied as a single broadcasting Div (no 1/x: fp16 gives 0/eps = 0 instead of
0 * inf), plus the shared depth-wise conv on v.

Rewrites (each exact and switchable, `reparameterize(..., rewrites=[...])`; none = the folded-only token-first
ablation baseline). `tokens_channels_first`: the residual stream is channel-first, (B, C, N, 1), from the patch-embed
conv (a free reshape) to the pooling; every token Linear is a 1x1 Conv2d (ONNX Runtime runs it in its NCHWc
layout with prepacked weights, about as fast as a Gemm and faster than a Conv1d: docs/benchmarks/index.md, design
probes); heads are (B, h, d, N) by
free reshapes, M = v k^T then M q (kv_first) or v (k^T q) (qk_first), so k's transpose is the only one per
block; the dwc reads v by a free reshape; positional encodings are (1, h, d, N) constants. PRepBN's softmax
attention forms S^T = k^T q and normalizes over the key axis, again one transpose. `erf_gelu_fusable`: the
MLP GELU is written in ONNX Runtime's fusable form (`ErfGELU`). `pos_embed_in_patch_conv`: see `DeiTDeploy`.
`qkv_as_three_projections` (SLA): q, k and v each from a Linear / 1x1 conv of its own (the qkv rows split, no
Split op); channel-first, the dwc shared by the heads becomes one depthwise conv over v's (B, C, H, W) map (its
weights repeated per head), so ONNX Runtime runs it in its blocked layout straight from v's conv.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...errors import VitedgeError
from ...models.features import token_map
from ...models.layers import Mlp, SimplifiedLinearAttention
from ...models.layers.attention import order_reason, order_record, resolve_order, sla_rule
from ...models.slab_deit import Attention, DeiTBase, PRepBNDeiT, SlabDeiT
from .engine import FoldContext, register_plan
from .primitives import (ChannelAffine, ErfGELU, PositionPlanesPatchEmbed, PreNormBlockDeploy, affine_before,
                         linear_to_conv1x1, repbn_affine, scale_output, split_outputs, tile_depthwise)

SLA_EPS = 1e-6


norm_affine = repbn_affine  # kept as this module's public name


def _split_heads_cf(qkv: torch.Tensor, h: int, d: int) -> tuple[torch.Tensor, ...]:
    """(B, 3C, N, 1) or (B, 3C, H, W) -> q, k, v as (B, h, d, N): a free reshape (the (3 h d) channel split is
    row-major) and one Split along the (3 h) axis; unbinding a separate axis of 3 would add a Squeeze per output
    (measured: docs/benchmarks/index.md, design probes)."""
    b, _, s1, s2 = qkv.shape
    return qkv.reshape(b, 3 * h, d, s1 * s2).split(h, dim=1)


class ChannelsFirst(nn.Module):
    """Runs a last-axis module (an unfoldable LayerNorm) on (B, C, N, 1) tokens; only built for unfolded configs."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(_to_tokens(x)).transpose(1, 2).reshape(x.shape)


class SLADeploy(nn.Module):
    """SLA with folded qkv, a fixed association order and no Einsum (see the module docstring).

    `channel_first`: input and output are (B, C, N, 1) or the (B, C, H, W) grid and qkv / proj are 1x1 convs;
    else (B, N, C) and Linear.
    """

    def __init__(self, attn: SimplifiedLinearAttention, grid: tuple[int, int], order: str, channel_first: bool,
                 three_projections: bool = False):
        super().__init__()
        self.num_heads, self.head_dim = attn.num_heads, attn.head_dim
        self.grid, self.order, self.channel_first = grid, order, channel_first
        self.qkv, self.proj, self.dwc = attn.qkv, attn.proj, attn.dwc
        if channel_first:
            self.qkv, self.proj = linear_to_conv1x1(attn.qkv), linear_to_conv1x1(attn.proj)
        self.three_projections = three_projections
        if three_projections:
            # qkv_as_three_projections: q, k and v each from a layer of their own (no Split of one qkv output) and,
            # channel-first, the shared dwc as one depthwise conv over v's (B, C, H, W) map (class doc)
            self.q, self.k, self.v = split_outputs(self.qkv, 3)
            del self.qkv
            if channel_first:
                self.dwc = tile_depthwise(attn.dwc, self.num_heads)
        n, h, d = grid[0] * grid[1], self.num_heads, self.head_dim
        pe = attn.positional_encoding.detach().reshape(1, n, h, d)
        # Stored in the layout k has when it is added: (1, h, d, N) channel-first, else (1, N, h, d).
        self.positional_encoding = nn.Parameter(pe.permute(0, 2, 3, 1).contiguous() if channel_first else pe,
                                                requires_grad=False)

    def copies_disagree(self) -> str | None:
        """Where the heads' copies of the tiled dwc (qkv_as_three_projections, channel-first) differ: an edited
        deploy checkpoint would give each head its own dwc. None when they agree (or nothing is tiled)."""
        if not (self.three_projections and self.channel_first):
            return None
        for t in (self.dwc.weight, self.dwc.bias):
            if t is not None:
                per_head = t.reshape(self.num_heads, -1)
                if not torch.equal(per_head, per_head[:1].expand_as(per_head)):
                    return "the heads' copies of the shared dwc differ"
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._channel_first(x) if self.channel_first else self._token_first(x)

    def _token_first(self, x: torch.Tensor) -> torch.Tensor:
        # The official layout: heads as (B, h, N, d); the dwc reads v as (B*h, d, H, W) and back.
        b, n, c = x.shape
        h, d = self.num_heads, self.head_dim
        if self.three_projections:
            q, k, v = (f(x).reshape(b, n, h, d) for f in (self.q, self.k, self.v))
        else:
            q, k, v = self.qkv(x).reshape(b, n, 3, h, d).unbind(2)
        q = F.relu(q).transpose(1, 2)
        k = F.relu(k + self.positional_encoding).transpose(1, 2)
        v = v.transpose(1, 2)
        kt = k.transpose(-2, -1)                                   # (B, h, d, N)
        den = q @ kt.sum(dim=-1, keepdim=True)                     # (B, h, N, 1): once per head
        num = q @ (kt @ v) if self.order == "kv_first" else (q @ kt) @ v
        out = num / (den + SLA_EPS)
        fmap = v.transpose(-2, -1).reshape(b * h, d, *self.grid)
        out = out + self.dwc(fmap).reshape(b, h, d, n).transpose(-2, -1)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))

    def _channel_first(self, x: torch.Tensor) -> torch.Tensor:
        # (B, C, N, 1) or (B, C, H, W) in and out, (B, h, d, N) per head: every split / merge and the dwc
        # input/output are free reshapes; the only transpose is k's, as the (B, h, N, d) operand of one MatMul.
        if self.three_projections:
            return self._three_projections(x)
        b, c = x.shape[:2]
        n, h, d = x.shape[2] * x.shape[3], self.num_heads, self.head_dim
        q, k, v = _split_heads_cf(self.qkv(x), h, d)
        q, k = F.relu(q), F.relu(k + self.positional_encoding)
        out = self._heads_cf(q, k, v) + self.dwc(v.reshape(b * h, d, *self.grid)).reshape(b, h, d, n)
        return self.proj(out.reshape(x.shape))

    def _heads_cf(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """SLA per head on channel-first (B, h, d, N) q, k (their ReLUs applied, k's positions added) and v."""
        b, h, d = q.shape[:3]
        den = k.sum(dim=-1).reshape(b, h, 1, d) @ q                 # (B, h, 1, N): once per head, broadcast over d
        kt = k.transpose(-2, -1)                                   # (B, h, N, d)
        num = (v @ kt) @ q if self.order == "kv_first" else v @ (kt @ q)
        return num / (den + SLA_EPS)

    def _three_projections(self, x: torch.Tensor) -> torch.Tensor:
        # Channel-first with q, k, v convs: ONNX Runtime runs each conv in its blocked layout and reorders each
        # output once for the head MatMuls; v's map also feeds the tiled dwc directly, still blocked (no Split, no
        # reorder into and out of a (B*h, d, H, W) dwc): 1.01-1.03x on SLAB-DeiT-T (docs/benchmarks/rewrite_ablation.md)
        b, c = x.shape[:2]
        n, h, d = x.shape[2] * x.shape[3], self.num_heads, self.head_dim
        q = F.relu(self.q(x).reshape(b, h, d, n))
        k = F.relu(self.k(x).reshape(b, h, d, n) + self.positional_encoding)
        fmap = self.v(x)
        if tuple(fmap.shape[2:]) != tuple(self.grid):               # (B, C, N, 1) tokens; the grid needs no Reshape
            fmap = fmap.reshape(b, c, *self.grid)
        out = self._heads_cf(q, k, fmap.reshape(b, h, d, n))
        return self.proj((out.reshape(fmap.shape) + self.dwc(fmap)).reshape(x.shape))


class SoftmaxAttentionDeploy(nn.Module):
    """Softmax MHSA with the norm folded into qkv and the 1/sqrt(d) scale folded into its q rows.

    `channel_first`: (B, C, N, 1) in and out; the scores are formed transposed, S^T = k^T q (k's transpose is
    the only one), normalized over the key axis (-2), and `v @ softmax(S^T)` is already (B, h, d, N).
    """

    def __init__(self, attn: Attention, channel_first: bool = False):
        super().__init__()
        self.num_heads, self.channel_first = attn.num_heads, channel_first
        self.qkv, self.proj = attn.qkv, attn.proj
        if channel_first:
            self.qkv, self.proj = linear_to_conv1x1(attn.qkv), linear_to_conv1x1(attn.proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channel_first:
            b, c, n, _ = x.shape
            q, k, v = _split_heads_cf(self.qkv(x), self.num_heads, c // self.num_heads)
            attn_t = (k.transpose(-2, -1) @ q).softmax(dim=-2)     # (B, h, N_k, N_q)
            return self.proj((v @ attn_t).reshape(b, c, n, 1))
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class PatchEmbedCFDeploy(nn.Module):
    """Patch-embed conv output (B, C, H, W) -> (B, C, N, 1) tokens: a free reshape, no transpose."""

    def __init__(self, proj: nn.Conv2d):
        super().__init__()
        self.proj = proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        return x.reshape(x.shape[0], x.shape[1], -1, 1)


class DeiTDeploy(nn.Module):
    """Deploy-form of both SLAB DeiT classes.

    Token-first (`channel_first` False, the folded-only baseline): (B, N, C) tokens; `cls_token` None means
    mean pooling over the patch tokens. Channel-first: (B, C, N, 1) tokens for the whole network, so every
    Linear is a 1x1 Conv2d (ONNX Runtime runs those in its blocked NCHWc layout with prepacked weights; see
    docs/benchmarks/index.md, design probes); `pos_embed` is (1, C, N, 1), or (1, C, 1+N, 1)
    with the CLS token (its position folded in) as row 0, so `pad(x) + pos_embed` inserts it without Concat
    or Expand; `pool` is "mean" or "cls". `pos_planes` (mean pooling only): the positional embedding is added by
    the patch conv itself (PositionPlanesPatchEmbed) and, channel-first, the tokens stay the conv's (B, C, H, W)
    grid, so that the residual stream starts at the conv (no Add of a constant, no Reshape).
    """

    def __init__(self, patch_embed: nn.Module, pos_embed: torch.Tensor, blocks: nn.Sequential, norm: nn.Module,
                 head: nn.Module, cls_token: torch.Tensor | None, channel_first: bool = False,
                 pos_planes: bool = False):
        super().__init__()
        self.channel_first = channel_first
        self.pool = "mean" if cls_token is None else "cls"
        if pos_planes:
            if cls_token is not None:
                raise ValueError("pos_planes needs mean pooling (no CLS token)")
            self.patch_embed = PositionPlanesPatchEmbed(patch_embed.proj, pos_embed, patch_embed.grid,
                                                        grid_out=channel_first)
            pos_embed = None
        else:
            self.patch_embed = PatchEmbedCFDeploy(patch_embed.proj) if channel_first else patch_embed
        if channel_first and pos_embed is not None:
            pos = pos_embed.detach().transpose(1, 2)
            if cls_token is not None:
                pos = torch.cat((cls_token.detach().transpose(1, 2), pos), dim=2)
            pos_embed, cls_token = pos.unsqueeze(-1).contiguous(), None
        self.pos_embed = None if pos_embed is None else nn.Parameter(pos_embed.detach().clone(), requires_grad=False)
        self.cls_token = None if cls_token is None else nn.Parameter(cls_token.detach().clone(), requires_grad=False)
        self.blocks, self.norm, self.head = blocks, norm, head
        self.patch = int(patch_embed.proj.stride[0])  # the token grid's stride (feature maps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._channel_first(x) if self.channel_first else self._token_first(x)

    def forward_intermediates(self, x: torch.Tensor, indices) -> list[torch.Tensor]:
        """The last block's patch tokens as an NCHW map (models/slab_deit.py DeiTBase.feature_info)."""
        hw = x.shape[-2:]
        if self.channel_first:
            x = self.patch_embed(x)
            if self.pool == "cls":
                x = F.pad(x, (0, 0, 1, 0))
            x = self.blocks(x if self.pos_embed is None else x + self.pos_embed)
        else:
            x = self.patch_embed(x) if self.pos_embed is None else self.patch_embed(x) + self.pos_embed
            if self.cls_token is not None:
                x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
            x = self.blocks(x)
        return [token_map(x, hw, self.patch)]

    def _token_first(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x) if self.pos_embed is None else self.patch_embed(x) + self.pos_embed
        if self.cls_token is not None:
            x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = self.norm(self.blocks(x))
        x = x.mean(dim=1) if self.cls_token is None else x[:, 0]
        return self.head(x)

    def _channel_first(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        if self.pool == "cls":
            x = F.pad(x, (0, 0, 1, 0))  # a zero row for the CLS token: 0 + its constant is exact
        x = self.norm(self.blocks(x if self.pos_embed is None else x + self.pos_embed))
        x = x.mean(dim=(2, 3)) if self.pool == "mean" else x[:, :, 0, 0]
        return self.head(x)


def _fold_norm_into(norm: nn.Module, linear: nn.Linear, path: str, target: str,
                    ctx: FoldContext) -> tuple[nn.Module, nn.Module]:
    """(norm', linear'): the norm folded into the Linear that reads it (exact: a Linear is affine per input)."""
    ab = norm_affine(norm)
    if ab is None:
        ctx.unfold(path, f"{type(norm).__name__} uses per-token statistics; it is not a constant affine")
        return norm, linear
    ctx.fold(f"norm->{target}")
    return nn.Identity(), affine_before(linear, *ab)


def _deploy_mlp(mlp: Mlp, channel_first: bool, ctx: FoldContext) -> Mlp:
    mlp.act = ErfGELU() if ctx.use("erf_gelu_fusable") else nn.GELU()  # drops the (eval-identity) hidden dropout
    if channel_first:
        mlp.fc1, mlp.fc2 = linear_to_conv1x1(mlp.fc1), linear_to_conv1x1(mlp.fc2)
    return mlp


def _channels_first_norm(norm: nn.Module, channel_first: bool) -> nn.Module:
    """An unfolded per-token norm made to read (B, C, N, 1) tokens (folded ones are Identity already)."""
    return ChannelsFirst(norm) if channel_first and not isinstance(norm, nn.Identity) else norm


def _to_tokens(t: torch.Tensor) -> torch.Tensor:
    return t.flatten(2).transpose(1, 2)  # (B, C, N, 1) -> the train-form's (B, N, C)


def _less_pos(pos: torch.Tensor, to_train):
    """The deploy patch embed's output (positions added) as the train-form's patch embed output (without)."""
    pos = pos.detach().clone()
    return lambda t: (t if to_train is None else to_train(t)) - pos.to(t)


def _sla_order(attn: SimplifiedLinearAttention, n: int, ctx: FoldContext) -> tuple[str, str, dict]:
    requested = ctx.attn_order if ctx.attn_order != "auto" else attn.attn_order
    rule = sla_rule(n, n, attn.head_dim, attn.head_dim)
    order = resolve_order(requested, rule)
    return (order, order_reason(requested, rule, n, n, attn.head_dim, attn.head_dim),
            order_record("sla", n, n, attn.head_dim, requested, order))


def _deploy_attention(attn: nn.Module, path: str, grid: tuple[int, int], cf: bool, ctx: FoldContext) -> nn.Module:
    if isinstance(attn, SimplifiedLinearAttention):
        order, why, record = _sla_order(attn, grid[0] * grid[1], ctx)
        ctx.order(path, order, why, record)
        return SLADeploy(attn, grid, order, channel_first=cf, three_projections=ctx.use("qkv_as_three_projections"))
    if isinstance(attn, Attention):
        ctx.order(path, "qk_first", "softmax attention: q k^T is formed for the softmax (attn_order does not apply)")
        dim = attn.qkv.in_features
        s = torch.ones(3 * dim, dtype=attn.qkv.weight.dtype, device=attn.qkv.weight.device)
        s[:dim] = attn.scale
        attn.qkv = scale_output(attn.qkv, s)
        ctx.fold("attn_scale->q")
        return SoftmaxAttentionDeploy(attn, channel_first=cf)
    raise VitedgeError(f"{path}: unsupported attention {type(attn).__name__}; "
                       "build the model with vitedge.create_model")


@register_plan(SlabDeiT, rewrites=("tokens_channels_first", "erf_gelu_fusable", "pos_embed_in_patch_conv",
                                   "qkv_as_three_projections"))
def plan_slab_deit(model: DeiTBase, ctx: FoldContext) -> DeiTDeploy:
    grid = model.patch_embed.grid  # (the engine set the copy to ctx.imgsz: models/slab_deit.py set_input_size)
    cf = ctx.use("tokens_channels_first")  # channel-first tokens (B, C, N, 1) through the whole network
    # SLAB (mean pooling): the positional embedding added by the patch conv, checked as the conv's output less it;
    # only where every token's position fits one plane (N <= patch area: 196 <= 256 at 224 px), so that the conv
    # reads one channel more, as a 4-channel image conv (qdq.IMAGE_CHANNELS), and not k more
    (ph, pw), n = model.patch_embed.proj.kernel_size, grid[0] * grid[1]
    pos_planes = isinstance(model, SlabDeiT) and n <= ph * pw and ctx.use("pos_embed_in_patch_conv")
    to_train = _to_tokens if cf else None
    ctx.check("patch_embed", "patch_embed", to_train=_less_pos(model.pos_embed, to_train) if pos_planes else to_train)
    blocks = []
    for i, blk in enumerate(model.blocks):
        p = f"blocks.{i}"
        attn = blk.attn
        norm1, attn.qkv = _fold_norm_into(blk.norm1, attn.qkv, f"{p}.norm1", "qkv", ctx)
        norm2, fc1 = _fold_norm_into(blk.norm2, blk.mlp.fc1, f"{p}.norm2", "fc1", ctx)
        blk.mlp.fc1 = fc1
        blocks.append(PreNormBlockDeploy(_channels_first_norm(norm1, cf), _deploy_attention(attn, f"{p}.attn", grid, cf, ctx),
                                  _channels_first_norm(norm2, cf), _deploy_mlp(blk.mlp, cf, ctx)))
        ctx.check(p, p, to_train=to_train)

    # Final norm -> head: pooling (token mean or CLS pick) commutes with a per-channel affine, the head is linear.
    norm, head = model.norm, model.head
    ab = norm_affine(norm)
    if ab is not None and isinstance(head, nn.Linear):
        norm, head = nn.Identity(), affine_before(head, *ab)
        ctx.fold("norm->head")
    elif ab is not None:
        norm = ChannelAffine(*ab, dim=1 if cf else -1)
        ctx.unfold("norm", "no classifier head to fold into (num_classes=0)")
    else:
        ctx.unfold("norm", f"{type(norm).__name__} uses per-token statistics; it is not a constant affine")
        norm = _channels_first_norm(norm, cf)

    if isinstance(model, PRepBNDeiT):
        # cat(cls, x) + pos == cat(cls + pos[:, :1], x + pos[:, 1:]): one constant token.
        cls = model.cls_token + model.pos_embed[:, :1]
        pos = model.pos_embed[:, 1:]
        ctx.fold("pos_embed->cls_token")
    else:
        cls, pos = None, model.pos_embed
        ctx.fold("unused cls_token dropped")
    return DeiTDeploy(model.patch_embed, pos, nn.Sequential(*blocks), norm, head, cls, channel_first=cf,
                      pos_planes=pos_planes)


# PRepBN-DeiT pools its CLS token: its positional embedding stays an Add (pos_embed_in_patch_conv is SLAB's)
register_plan(PRepBNDeiT, rewrites=("tokens_channels_first", "erf_gelu_fusable"))(plan_slab_deit)
