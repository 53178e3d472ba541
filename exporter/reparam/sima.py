"""SimA (XCiT) fold plan: `SimAVisionTransformer` -> `SimADeploy`, a size-locked deploy-form.

Exact folds (each a primitive from primitives.py):
- patch embed: every conv3x3 -> BN pair into one biased conv;
- Fourier positional encoding (features + `token_projection`) precomputed for the export grid, in the model dtype;
- SimA blocks: norm1/norm2 affine into qkv/fc1 (the normalization stays: it is data dependent), gamma1/gamma2
  into proj/fc2, gamma3 and LPI's BN scale into conv2, norm3's scale into conv1;
- class-attention blocks: gamma1/gamma2 into proj/fc2; with tokens_norm, the residual's doubling of the
  normalized patch tokens into a second LayerNorm affine (2a, 2b);
- final norm's affine into the head (LayerNorm is per token, so it commutes with taking the CLS token).

Kept explicit, listed in the summary's `unfolded` with the reason:
- the shifts in front of LPI's zero-padded depthwise convs (norm3's beta before conv1, BN's shift before conv2):
  at border pixels the padding taps see 0, not the shift, so `conv(b)` is not a per-channel constant. With the
  scale `a` folded into the conv, `conv(a x + b) = conv_a(x + b / a)`: norm3's `b / a` becomes the LayerNorm's
  bias (free: LayerNormalization takes one), BN's `b / a` a per-channel add (a zero or tiny `a` folds nothing);
- the class-attention norms' affines: their outputs are also residuals (`cat(cls, norm1(x)[:, 1:])`, then
  `x = norm2(x)`), not only inputs of a Linear.

Attention orders are fixed per SimA block for the export N (patch tokens only): the official rule
`(QK^T)V iff N < head_dim`, unless `--attn-order` (or the model's own `attn_order`) forces one.

Rewrites (each exact and switchable, `reparameterize(..., rewrites=[...])`, all on by default):
`l1_normalize_broadcast_div`: l1-normalize as `t / max(sum|t|, eps)` with broadcasting (no Expand in ONNX);
`cls_only_last_class_attention`: the last class-attention block computes only the CLS token (its patch tokens
are dead: only `norm(x)[:, 0]` is read) and the final norm runs on the CLS token only.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...errors import VitedgeError
from ...models.layers.attention import l1_attention, order_record, resolve_order, sima_rule
from ...models.layers.normalize import l1_normalize_div
from ...models.input_size import as_hw
from ...models.sima_xcit import (ClassAttentionBlock, SimABlock, SimAVisionTransformer, patch_grid, xcit_intermediates,
                                 xcit_out_indices)
from .engine import FoldContext, register_plan
from .primitives import (ChannelAffine, PatchEmbedDeploy, affine_before, affine_before_padded_depthwise, bn_affine,
                         fuse_conv_bn, scale_output)

__all__ = ["SimADeploy", "SimABlockDeploy", "ClassAttentionBlockDeploy", "LPIDeploy", "FixedOrderSimA",
           "ShiftedLayerNorm", "sima_order_reason", "plan_sima"]


# ----------------------------------------------------------------------------------------------- deploy modules

def l1_normalize(t: torch.Tensor, eps: float, broadcast: bool) -> torch.Tensor:
    """l1-normalize over the token axis (-2). `broadcast`: plain division by the clamped column sums (no Expand)."""
    if broadcast:
        return l1_normalize_div(t, -2, eps)
    return F.normalize(t, p=1.0, dim=-2, eps=eps)


def _split_qkv(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, n, c3 = qkv.shape
    return qkv.reshape(b, n, 3, heads, c3 // (3 * heads)).permute(2, 0, 3, 1, 4).unbind(0)


class ShiftedLayerNorm(nn.Module):
    """LayerNorm with an optional scale and an optional shift: `(x - mu) / sigma * scale + shift`.

    (nn.LayerNorm cannot have a bias without a weight; ONNX LayerNormalization takes both, so a kept shift is free.)
    """

    def __init__(self, dim: int, eps: float, scale: torch.Tensor | None = None, shift: torch.Tensor | None = None):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.register_buffer("scale", None if scale is None else scale.detach().clone())
        self.register_buffer("shift", None if shift is None else shift.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.dim,), self.scale, self.shift, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, scale={self.scale is not None}, shift={self.shift is not None}"


class FixedOrderSimA(nn.Module):
    """SimA attention with its association order fixed for the export N (keys `qkv`, `proj`)."""

    def __init__(self, qkv: nn.Linear, proj: nn.Linear, num_heads: int, order: str, eps: float, broadcast: bool):
        super().__init__()
        self.qkv, self.proj = qkv, proj
        self.num_heads, self.order, self.eps, self.broadcast = num_heads, order, eps, broadcast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = _split_qkv(self.qkv(x), self.num_heads)
        q, k = l1_normalize(q, self.eps, self.broadcast), l1_normalize(k, self.eps, self.broadcast)
        return self.proj(l1_attention(q, k, v, self.order).transpose(1, 2).reshape(b, n, c))

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, order={self.order}, eps={self.eps}, broadcast_l1={self.broadcast}"


class LPIDeploy(nn.Module):
    """`conv2(shift + GELU(conv1(x)))` on the fixed token grid (conv1/conv2 carry the folded scales)."""

    def __init__(self, conv1: nn.Conv2d, shift: ChannelAffine, conv2: nn.Conv2d, grid: tuple[int, int]):
        super().__init__()
        self.conv1, self.act, self.shift, self.conv2 = conv1, nn.GELU(), shift, conv2
        self.grid = grid

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        x = x.transpose(1, 2).reshape(b, c, *self.grid)
        x = self.conv2(self.shift(self.act(self.conv1(x))))
        return x.flatten(2).transpose(1, 2)

    def extra_repr(self) -> str:
        return f"grid={self.grid}"


class SimABlockDeploy(nn.Module):
    """`x += attn(ln x)`; `x += lpi(ln_shift x)`; `x += mlp(ln x)` with every scale folded into the weights."""

    def __init__(self, norm1: nn.Module, attn: FixedOrderSimA, norm3: nn.Module, local_mp: LPIDeploy,
                 norm2: nn.Module, mlp: nn.Module):
        super().__init__()
        self.norm1, self.attn, self.norm3, self.local_mp = norm1, attn, norm3, local_mp
        self.norm2, self.mlp = norm2, mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        x = x + self.local_mp(self.norm3(x))
        return x + self.mlp(self.norm2(x))


class ClassAttentionBlockDeploy(nn.Module):
    """The official class-attention block's function, written with `cat`:

    u = norm1(x); cls' = x_cls + proj(CA(qkv(u)))   (gamma1 in proj)
    p' = x_p + gamma1 * u_p                            (the `cat(cls, norm1(x)[:, 1:])` quirk)
    c = norm2(cls'); out_cls = c + mlp(c)             (gamma2 in fc2)
    out_p = 2 * norm2(p') (tokens_norm; the 2 is folded into `norm2_patches`) or 2 * p'
    `cls_only` returns out_cls alone (B, 1, C).
    """

    def __init__(self, norm1: nn.LayerNorm, qkv: nn.Linear, proj: nn.Linear, patch_scale: torch.Tensor,
                 norm2: nn.LayerNorm, norm2_patches: nn.Module | None, mlp: nn.Module, num_heads: int, eps: float,
                 broadcast: bool, cls_only: bool):
        super().__init__()
        self.norm1, self.qkv, self.proj, self.norm2, self.mlp = norm1, qkv, proj, norm2, mlp
        self.norm2_patches = norm2_patches  # None: tokens_norm=False (only the CLS token is normalized)
        self.register_buffer("patch_scale", patch_scale.detach().clone())
        self.num_heads, self.eps, self.broadcast, self.cls_only = num_heads, eps, broadcast, cls_only

    def _cls_attention(self, u: torch.Tensor) -> torch.Tensor:
        b, n, c = u.shape
        q, k, v = _split_qkv(self.qkv(u), self.num_heads)
        if self.broadcast:  # only the CLS query row is needed; its normalizer still spans every token
            qc = q[:, :, 0:1] / q.abs().sum(dim=-2, keepdim=True).clamp_min(self.eps)
        else:
            qc = l1_normalize(q, self.eps, False)[:, :, 0:1]
        k = l1_normalize(k, self.eps, self.broadcast)
        out = (qc @ k.transpose(-2, -1)) @ v  # one query: (q K^T) V is the cheap order
        return self.proj(out.transpose(1, 2).reshape(b, 1, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.norm1(x)
        cls = self.norm2(x[:, 0:1] + self._cls_attention(u))
        cls = cls + self.mlp(cls)
        if self.cls_only:
            return cls
        p = x[:, 1:] + self.patch_scale * u[:, 1:]
        p = self.norm2_patches(p) if self.norm2_patches is not None else 2 * p
        return torch.cat((cls, p), dim=1)

    def extra_repr(self) -> str:
        return (f"heads={self.num_heads}, doubled_patch_norm={self.norm2_patches is not None}, "
                f"cls_only={self.cls_only}, eps={self.eps}, broadcast_l1={self.broadcast}")


class SimADeploy(nn.Module):
    """The deploy-form of a SimAVisionTransformer, locked to one input size (eval semantics, returns logits)."""

    def __init__(self, patch_embed: nn.Module, pos_embed: torch.Tensor | None, blocks: list, cls_token: torch.Tensor,
                 cls_attn_blocks: list, norm: nn.Module, head: nn.Module, input_hw: tuple[int, int],
                 norm_cls_only: bool, patch_size: int):
        super().__init__()
        self.patch_embed = patch_embed
        self.register_buffer("pos_embed", None if pos_embed is None else pos_embed.detach().clone())
        self.blocks = nn.ModuleList(blocks)
        self.cls_token = nn.Parameter(cls_token.detach().clone())
        self.cls_attn_blocks = nn.ModuleList(cls_attn_blocks)
        self.norm, self.head = norm, head
        self.input_hw, self.norm_cls_only = input_hw, norm_cls_only
        self.grid = (patch_grid(input_hw[0], patch_size), patch_grid(input_hw[1], patch_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_tracing() and tuple(x.shape[-2:]) != self.input_hw:
            raise VitedgeError(f"this SimA deploy-form was built for {self.input_hw[0]}x{self.input_hw[1]} inputs; "
                               f"got {x.shape[-2]}x{x.shape[-1]}: re-run reparameterize with that --imgsz")
        x, _ = self.tokens_and_grid(x)
        for blk in self.blocks:
            x = blk(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        for blk in self.cls_attn_blocks:
            x = blk(x)
        x = self.norm(x[:, 0]) if self.norm_cls_only else self.norm(x)[:, 0]
        return self.head(x)

    def tokens_and_grid(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x = self.patch_embed(x)
        return (x if self.pos_embed is None else x + self.pos_embed), self.grid

    def forward_intermediates(self, x: torch.Tensor, indices) -> list[torch.Tensor]:
        """The maps after the tapped blocks (models/sima_xcit.py SimAVisionTransformer.feature_info)."""
        return xcit_intermediates(self, x, indices, xcit_out_indices(len(self.blocks)))


# ----------------------------------------------------------------------------------------------- fold helpers

def sima_order_reason(requested: str, rule: str, n: int, d: int, source: str = "override") -> str:
    """Why a SimA block uses `rule` / `requested` (in the style of layers.attention.order_reason)."""
    if requested != "auto":
        return f"forced {requested} by {source}"
    rel = "<" if n < d else ">="
    return (f"{rule} by SimA rule (qk_first iff N < d): N={n} {rel} d={d}: "
            f"(QK^T)V 2*N^2*d={2 * n * n * d} vs Q(K^TV) 2*N*d^2={2 * n * d * d} MACs per head")


def fix_sima_order(attn: nn.Module, n: int, path: str, ctx: FoldContext) -> str:
    """The order a SimA attention over `n` tokens uses in the deploy-form (an --attn-order override wins over the
    model's own `attn_order`), recorded in the summary with its reason."""
    if ctx.attn_order != "auto":
        requested, source = ctx.attn_order, "override"
    else:
        requested, source = attn.attn_order, "the model's attn_order"
    rule = sima_rule(n, attn.head_dim)
    order = resolve_order(requested, rule)
    ctx.order(path, order, sima_order_reason(requested, rule, n, attn.head_dim, source),
              order_record("sima", n, n, attn.head_dim, requested, order))
    return order


def _ln_affine(ln: nn.Module, dim: int, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(ln, nn.LayerNorm):
        raise VitedgeError(f"SimA fold plan expects nn.LayerNorm norms, got {type(ln).__name__}: "
                           "build the model with the default norm_layer")
    a = ln.weight if ln.weight is not None else torch.ones(dim, dtype=ref.dtype, device=ref.device)
    b = ln.bias if ln.bias is not None else torch.zeros(dim, dtype=ref.dtype, device=ref.device)
    return a, b


def _scale_vec(g, dim: int, ref: torch.Tensor) -> torch.Tensor:
    """A layer scale as a vector: the official `gamma*` parameter, or the constant 1.0 when eta is None."""
    if isinstance(g, torch.Tensor):
        return g.reshape(-1)
    return torch.full((dim,), float(g), dtype=ref.dtype, device=ref.device)


def _plain_ln(ln: nn.LayerNorm) -> nn.LayerNorm:
    return nn.LayerNorm(ln.normalized_shape, eps=ln.eps, elementwise_affine=False)


def _fold_patch_embed(pe: nn.Module, ctx: FoldContext) -> PatchEmbedDeploy:
    layers = []
    for m in pe.proj:
        if isinstance(m, nn.Sequential):  # (conv3x3 no bias, BN)
            layers.append(fuse_conv_bn(m[0], m[1]))
            ctx.fold("conv+bn")
        else:
            layers.append(m)
    return PatchEmbedDeploy(nn.Sequential(*layers))


def _fold_mlp(mlp: nn.Module, a: torch.Tensor | None, b: torch.Tensor | None, gamma: torch.Tensor,
              ctx: FoldContext) -> nn.Module:
    new = copy.deepcopy(mlp)
    if a is not None:
        new.fc1 = affine_before(mlp.fc1, a, b)
        ctx.fold("layernorm_affine->linear")
    new.fc2 = scale_output(mlp.fc2, gamma)
    ctx.fold("layer_scale->linear")
    return new


def _record_padded_fold(ctx: FoldContext, aff: ChannelAffine, path: str, kind: str, conv: str, kept: str) -> None:
    if aff.scale is None:
        ctx.fold(kind)
        ctx.unfold(path, f"shift precedes the zero-padded depthwise {conv}, whose border taps see 0 instead of it: "
                         f"scale folded into {conv}, shift (divided by the scale) {kept}")
    else:
        ctx.unfold(path, f"scale has a zero or tiny entry (shift/scale beyond fp16 range) and the shift precedes the "
                         f"zero-padded depthwise {conv}: the whole affine is {kept}")


def _fold_sima_block(blk: SimABlock, path: str, n: int, grid: tuple[int, int], ctx: FoldContext) -> SimABlockDeploy:
    attn = blk.attn
    w = attn.qkv.weight
    dim = w.shape[1]
    g1, g2, g3 = (_scale_vec(g, dim, w) for g in (blk.gamma1, blk.gamma2, blk.gamma3))

    # SimA: norm1 affine -> qkv, gamma1 -> proj, order fixed for the export N
    a1, b1 = _ln_affine(blk.norm1, dim, w)
    qkv = affine_before(attn.qkv, a1, b1)
    proj = scale_output(attn.proj, g1)
    ctx.fold("layernorm_affine->linear")
    ctx.fold("layer_scale->linear")
    order = fix_sima_order(attn, n, f"{path}.attn", ctx)
    new_attn = FixedOrderSimA(qkv, proj, attn.num_heads, order, attn.eps,
                              broadcast=ctx.use("l1_normalize_broadcast_div"))

    # LPI: norm3 scale -> conv1 (shift kept as the LayerNorm's bias); BN scale and gamma3 -> conv2 (shift kept)
    lpi = blk.local_mp
    a3, b3 = _ln_affine(blk.norm3, dim, w)
    aff3, conv1 = affine_before_padded_depthwise(lpi.conv1, a3, b3)
    norm3 = ShiftedLayerNorm(dim, blk.norm3.eps, aff3.scale, aff3.shift)
    _record_padded_fold(ctx, aff3, f"{path}.norm3", "layernorm_scale->depthwise_conv",
                        "local_mp.conv1", "kept as the LayerNorm's bias")
    bn_a, bn_b = bn_affine(lpi.bn)
    aff_bn, conv2 = affine_before_padded_depthwise(lpi.conv2, bn_a, bn_b)
    conv2 = scale_output(conv2, g3)
    ctx.fold("layer_scale->conv")
    _record_padded_fold(ctx, aff_bn, f"{path}.local_mp.bn", "bn_scale->depthwise_conv", "conv2",
                        "kept as a per-channel add")
    new_lpi = LPIDeploy(conv1, aff_bn, conv2, grid)

    # MLP: norm2 affine -> fc1, gamma2 -> fc2
    a2, b2 = _ln_affine(blk.norm2, dim, w)
    mlp = _fold_mlp(blk.mlp, a2, b2, g2, ctx)
    return SimABlockDeploy(_plain_ln(blk.norm1), new_attn, norm3, new_lpi, _plain_ln(blk.norm2), mlp)


def _fold_cls_block(blk: ClassAttentionBlock, path: str, cls_only: bool, ctx: FoldContext) -> ClassAttentionBlockDeploy:
    attn = blk.attn
    w = attn.qkv.weight
    dim = w.shape[1]
    g1, g2 = _scale_vec(blk.gamma1, dim, w), _scale_vec(blk.gamma2, dim, w)
    _ln_affine(blk.norm1, dim, w)  # type check
    proj = scale_output(attn.proj, g1)
    ctx.fold("layer_scale->linear")
    mlp = _fold_mlp(blk.mlp, None, None, g2, ctx)
    ctx.unfold(f"{path}.norm1", "affine kept: norm1(x) feeds qkv and also the patch-token residual "
                                "(the official cat(cls, norm1(x)[:, 1:]) quirk)")
    ctx.unfold(f"{path}.norm2", "affine kept: norm2's output is itself the residual (x = norm2(x) before the MLP)")
    norm2_patches = None
    if blk.tokens_norm and not cls_only:
        # the residual doubles the normalized patch tokens: 2 * LN(p) = LN with affine (2a, 2b), exact
        a, b = _ln_affine(blk.norm2, dim, w)
        norm2_patches = nn.LayerNorm(dim, eps=blk.norm2.eps).to(w)
        norm2_patches.weight.copy_(2 * a)
        norm2_patches.bias.copy_(2 * b)
        ctx.fold("patch_doubling->layernorm_affine")
    return ClassAttentionBlockDeploy(copy.deepcopy(blk.norm1), attn.qkv, proj, g1, copy.deepcopy(blk.norm2),
                                     norm2_patches, mlp, attn.num_heads, attn.eps,
                                     ctx.use("l1_normalize_broadcast_div"), cls_only)


@register_plan(SimAVisionTransformer, rewrites=("l1_normalize_broadcast_div", "cls_only_last_class_attention"))
def plan_sima(model: SimAVisionTransformer, ctx: FoldContext) -> SimADeploy:
    hw = as_hw(ctx.imgsz)
    grid = (patch_grid(hw[0], model.patch_size), patch_grid(hw[1], model.patch_size))
    n = grid[0] * grid[1]

    patch_embed = _fold_patch_embed(model.patch_embed, ctx)
    ctx.check("patch_embed", "patch_embed")
    pos = None
    if model.use_pos:
        c = model.embed_dim
        pos = model.pos_embeder(1, *grid).reshape(1, c, n).permute(0, 2, 1).contiguous()  # (for that grid)
        ctx.fold("fourier_pos->constant")

    blocks = []
    for i, blk in enumerate(model.blocks):
        blocks.append(_fold_sima_block(blk, f"blocks.{i}", n, grid, ctx))
        ctx.check(f"blocks.{i}", f"blocks.{i}")

    cls_blocks = []
    last = len(model.cls_attn_blocks) - 1
    for i, blk in enumerate(model.cls_attn_blocks):
        cls_only = i == last and ctx.use("cls_only_last_class_attention")
        cls_blocks.append(_fold_cls_block(blk, f"cls_attn_blocks.{i}", cls_only, ctx))
        if not cls_only:  # a CLS-only block's output has no train-form counterpart; the logits check covers it
            ctx.check(f"cls_attn_blocks.{i}", f"cls_attn_blocks.{i}")
    norm_cls_only = last >= 0 and ctx.use("cls_only_last_class_attention")

    # final norm: per token, so its affine commutes with taking the CLS token and folds into the head
    norm, head = model.norm, model.head
    if isinstance(head, nn.Linear):
        a, b = _ln_affine(norm, model.embed_dim, head.weight)
        head = affine_before(head, a, b)
        norm = _plain_ln(norm)
        ctx.fold("layernorm_affine->linear")
    else:
        norm = copy.deepcopy(norm)
    return SimADeploy(patch_embed, pos, blocks, model.cls_token, cls_blocks, norm, head, hw,
                      norm_cls_only, model.patch_size)
