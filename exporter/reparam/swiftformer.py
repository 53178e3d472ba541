"""SwiftFormer fold plan: the train-form model -> a deploy-form with no BatchNorm and no layer scales.

Folds (all exact in real arithmetic):
- stem conv->BN (x2), Embedding conv->BN, ConvEncoder / LocalRep dwconv->BN (the BN follows the conv)
- layer scales into the last conv/linear of their branch (pwconv2, attn `final`, Mlp `fc2`)
- Mlp `norm1` (BN before a 1x1 conv, no padding) into `fc1`
- the attention's `scale_factor` into `w_g`
- final BN + global average pool + (head + dist_head) / 2 into one Linear after the pool

Deploy-speed rewrites (each exact, each switchable: `reparameterize(..., rewrites=[...])`, all on by default):
- `tokens_channels_first`: tokens stay NCHW (no permute/reshape pairs), Linear-on-tokens become 1x1 convs and
  the global query is a reduction plus a broadcast multiply (one change: the attention's layout);
- `l2_normalize_rsqrt`: inside that channels-first attention, l2-normalize as `x * rsqrt(max(sum(x^2), eps^2))`
  (exactly F.normalize's `x / max(||x||, eps)`, with no ReduceL2/Expand/Div);
- `l2_normalize_reduce_l2`: l2-normalize as `x * (1 / max(||x||, eps))` (F.normalize's formula; ONNX: ReduceL2,
  Clip, Reciprocal, Mul: no tensor of squares, a multiply instead of a divide); it takes precedence over
  `l2_normalize_rsqrt` except while torch.jit.trace records the CoreML lowering, which keeps the rsqrt form
  (`_AneFriendly` in targets/coreml/convert.py: the form chosen for the Neural Engine);
- `erf_gelu_fusable`: erf-GELU written in the form ONNX Runtime fuses into one Gelu op.
With none, the encoders keep the official token layout and attention module (folds only, for ablation).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...models.layers import EfficientAdditiveAttention
from ...models.layers.normalize import l2_normalize_reduce_l2, l2_normalize_rsqrt
from ...models.swiftformer import (ConvEncoder, Embedding, SwiftFormer, SwiftFormerEncoder,
                                   swiftformer_intermediates)
from .engine import FoldContext, register_plan
from .primitives import (ChannelAffine, ErfGELU, affine_before, bn_affine, fuse_conv_bn, linear_to_conv1x1,
                         scale_output)

__all__ = ["ConvBlock", "ConvMlp", "AdditiveAttention2d", "AdditiveAttentionTokens", "EncoderBlock",
           "SwiftFormerDeploy"]


def l2_normalize(x: torch.Tensor, dim, eps: float, rsqrt: bool, reduce_l2: bool) -> torch.Tensor:
    """F.normalize(x, dim=dim, eps=eps) in the form the switched-on rewrites choose (see the module docstring)."""
    if reduce_l2 and (torch.onnx.is_in_onnx_export() or not torch.jit.is_tracing()):
        return l2_normalize_reduce_l2(x, dim, eps)
    if rsqrt or reduce_l2:
        return l2_normalize_rsqrt(x, dim, eps)
    return F.normalize(x, dim=dim, eps=eps)


def _gelu(ctx: FoldContext) -> nn.Module:
    # The rewrite writes erf-GELU in the form ONNX Runtime fuses (see primitives.ErfGELU).
    return ErfGELU() if ctx.use("erf_gelu_fusable") else nn.GELU()


class ConvBlock(nn.Module):
    """Folded ConvEncoder / SwiftFormerLocalRepresentation: `x + pwconv2(GELU(pwconv1(dwconv(x))))`."""

    def __init__(self, dwconv: nn.Conv2d, pwconv1: nn.Conv2d, pwconv2: nn.Conv2d, act: nn.Module | None = None):
        super().__init__()
        self.dwconv, self.pwconv1, self.act, self.pwconv2 = dwconv, pwconv1, act or nn.GELU(), pwconv2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pwconv2(self.act(self.pwconv1(self.dwconv(x))))


class ConvMlp(nn.Module):
    """Folded Mlp: `fc2(GELU(fc1(x)))` with 1x1 convs (norm1 in fc1, layer_scale_2 in fc2)."""

    def __init__(self, fc1: nn.Conv2d, fc2: nn.Conv2d, act: nn.Module | None = None):
        super().__init__()
        self.fc1, self.act, self.fc2 = fc1, act or nn.GELU(), fc2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class AdditiveAttention2d(nn.Module):
    """Efficient additive attention on NCHW (every Linear a 1x1 conv, tokens = pixels).

    q, k l2-normalized over channels; alpha = w_g(q) (scale folded into w_g), l2-normalized over the pixels;
    g = sum over pixels of alpha * q, shape (B, C, 1, 1), broadcast-multiplied with k; out = final(Proj(g * k) + q).
    `w_g` None: the "softmax" attention (every token weight 1, layers.EfficientAdditiveAttention): g = sum of q.
    """

    def __init__(self, to_query: nn.Conv2d, to_key: nn.Conv2d, w_g: nn.Conv2d | None, Proj: nn.Conv2d,
                 final: nn.Conv2d, eps: float = 1e-12, rsqrt: bool = True, reduce_l2: bool = False):
        super().__init__()
        self.to_query, self.to_key, self.w_g, self.Proj, self.final = to_query, to_key, w_g, Proj, final
        self.eps = eps
        self.rsqrt, self.reduce_l2 = rsqrt, reduce_l2

    def norm(self, x: torch.Tensor, dim, eps: float) -> torch.Tensor:
        return l2_normalize(x, dim, eps, self.rsqrt, self.reduce_l2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.norm(self.to_query(x), 1, self.eps)
        k = self.norm(self.to_key(x), 1, self.eps)
        if self.w_g is None:
            g = q.sum(dim=(2, 3), keepdim=True)
        else:
            a = self.norm(self.w_g(q), (2, 3), self.eps)  # (B, 1, H, W)
            g = (a * q).sum(dim=(2, 3), keepdim=True)      # (B, C, 1, 1)
        return self.final(self.Proj(g * k) + q)


class AdditiveAttentionTokens(EfficientAdditiveAttention):
    """The official token-layout attention (B, N, C) with its scale folded into `w_g` and l2-normalize in the form
    of the normalize rewrites switched on (`l2_normalize_rsqrt`, `l2_normalize_reduce_l2`) without
    `tokens_channels_first`."""

    def __init__(self, attn: EfficientAdditiveAttention, rsqrt: bool = True, reduce_l2: bool = False):
        nn.Module.__init__(self)
        self.to_query, self.to_key, self.w_g, self.Proj, self.final = (attn.to_query, attn.to_key, attn.w_g,
                                                                      attn.Proj, attn.final)
        self.scale_factor, self.weights = attn.scale_factor, attn.weights
        self.rsqrt, self.reduce_l2 = rsqrt, reduce_l2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def norm(t: torch.Tensor, dim: int) -> torch.Tensor:
            return l2_normalize(t, dim, 1e-12, self.rsqrt, self.reduce_l2)

        query = norm(self.to_query(x), -1)
        key = norm(self.to_key(x), -1)
        if self.weights == "softmax":  # every token weight 1 (layers.EfficientAdditiveAttention)
            g = torch.sum(query, dim=1, keepdim=True)
        else:
            a = norm((query @ self.w_g) * self.scale_factor, 1)
            g = torch.sum(a * query, dim=1, keepdim=True)
        return self.final(self.Proj(g * key) + query)


class EncoderBlock(nn.Module):
    """Folded SwiftFormerEncoder: local branch, `x + attn(x)`, `x + linear(x)` (layer scales folded).

    `channels_first=False` keeps the official token layout around `attn` (the rewrites-off ablation).
    """

    def __init__(self, local_representation: ConvBlock, attn: nn.Module, linear: ConvMlp, channels_first: bool):
        super().__init__()
        self.local_representation, self.attn, self.linear = local_representation, attn, linear
        self.channels_first = channels_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.local_representation(x)
        if self.channels_first:
            x = x + self.attn(x)
        else:
            b, c, h, w = x.shape
            t = self.attn(x.permute(0, 2, 3, 1).reshape(b, h * w, c))
            x = x + t.reshape(b, h, w, c).permute(0, 3, 1, 2)
        return x + self.linear(x)


class SwiftFormerDeploy(nn.Module):
    """Deploy-form SwiftFormer: `head(mean_hw(network(patch_embed(x))))`; eval-only, one output."""

    def __init__(self, patch_embed: nn.Sequential, network: nn.ModuleList, head: nn.Module):
        super().__init__()
        self.patch_embed, self.network, self.head = patch_embed, network, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        for block in self.network:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))

    def forward_intermediates(self, x: torch.Tensor, indices) -> list[torch.Tensor]:
        return swiftformer_intermediates(self.patch_embed, self.network, x, indices)


def _conv_bn(conv: nn.Conv2d, norm: nn.Module, ctx: FoldContext) -> nn.Conv2d:
    if isinstance(norm, nn.Identity):
        return conv
    ctx.fold("conv+bn")
    return fuse_conv_bn(conv, norm)


def _layer_scale(m: nn.Module, owner: nn.Module, attr: str, ctx: FoldContext) -> nn.Module:
    if not getattr(owner, "use_layer_scale", False):
        return m
    ctx.fold("layer_scale")
    return scale_output(m, getattr(owner, attr).reshape(-1))


def _fold_conv_block(blk: ConvEncoder, ctx: FoldContext) -> ConvBlock:
    dw = _conv_bn(blk.dwconv, blk.norm, ctx)
    return ConvBlock(dw, blk.pwconv1, _layer_scale(blk.pwconv2, blk, "layer_scale", ctx), _gelu(ctx))


def _fold_attention(attn: EfficientAdditiveAttention, final: nn.Linear, ctx: FoldContext) -> nn.Module:
    w_g = attn.w_g * attn.scale_factor
    ctx.fold("attn_scale->w_g")
    rsqrt, reduce_l2 = ctx.use("l2_normalize_rsqrt"), ctx.use("l2_normalize_reduce_l2")
    if not ctx.use("tokens_channels_first"):
        attn.final = final
        attn.w_g.copy_(w_g)
        attn.scale_factor = 1.0
        return AdditiveAttentionTokens(attn, rsqrt, reduce_l2) if rsqrt or reduce_l2 else attn
    g = None
    if attn.weights != "softmax":  # (with softmax weights w_g has no effect: every token weight is 1)
        g = nn.Conv2d(w_g.shape[0], 1, 1, bias=False).to(w_g)
        g.weight.copy_(w_g.t().reshape(1, -1, 1, 1))
    conv = linear_to_conv1x1
    return AdditiveAttention2d(conv(attn.to_query), conv(attn.to_key), g, conv(attn.Proj), conv(final),
                               rsqrt=rsqrt, reduce_l2=reduce_l2)


def _fold_encoder(blk: SwiftFormerEncoder, ctx: FoldContext) -> EncoderBlock:
    local = _fold_conv_block(blk.local_representation, ctx)
    attn = _fold_attention(blk.attn, _layer_scale(blk.attn.final, blk, "layer_scale_1", ctx), ctx)
    mlp = blk.linear
    ctx.fold("bn->conv1x1")
    fc1 = affine_before(mlp.fc1, *bn_affine(mlp.norm1))
    linear = ConvMlp(fc1, _layer_scale(mlp.fc2, blk, "layer_scale_2", ctx), _gelu(ctx))
    return EncoderBlock(local, attn, linear, channels_first=isinstance(attn, AdditiveAttention2d))


def _fold_head(model: SwiftFormer, ctx: FoldContext) -> nn.Module:
    """Final BN, global average pool and the (averaged) heads as one Linear applied after the pool.

    Exact because the per-channel BN affine commutes with the spatial mean.
    """
    a, b = bn_affine(model.norm)
    heads = [model.head] + ([model.dist_head] if model.dist else [])
    if not isinstance(model.head, nn.Linear):  # num_classes=0: features only, nothing to absorb the BN
        ctx.unfold("norm", "num_classes=0 leaves no classifier to absorb the final BatchNorm; kept as a "
                           "per-channel affine after the pool")
        return ChannelAffine(a, b, dim=1)
    avg = nn.Linear(model.head.in_features, model.head.out_features).to(model.head.weight)
    avg.weight.copy_(sum(h.weight for h in heads) / len(heads))
    avg.bias.copy_(sum(h.bias for h in heads) / len(heads))
    ctx.fold("bn+gap+head->linear")
    if len(heads) > 1:
        ctx.fold("dist_head averaged into head")
    return affine_before(avg, a, b)


@register_plan(SwiftFormer, rewrites=("tokens_channels_first", "l2_normalize_rsqrt", "erf_gelu_fusable",
                                      "l2_normalize_reduce_l2"))
def plan_swiftformer(model: SwiftFormer, ctx: FoldContext) -> SwiftFormerDeploy:
    pe = model.patch_embed
    stem = nn.Sequential(_conv_bn(pe[0], pe[1], ctx), pe[2], _conv_bn(pe[3], pe[4], ctx), pe[5])
    ctx.check("patch_embed", "patch_embed")
    network = nn.ModuleList()
    for i, stage in enumerate(model.network):
        if isinstance(stage, Embedding):
            network.append(_conv_bn(stage.proj, stage.norm, ctx))
            ctx.check(f"network.{i}", f"network.{i}")
            continue
        blocks = []
        for j, blk in enumerate(stage):
            path = f"network.{i}.{j}"
            if isinstance(blk, SwiftFormerEncoder):
                blocks.append(_fold_encoder(blk, ctx))
                ctx.check(f"{path}.local_representation", f"{path}.local_representation")
            else:
                blocks.append(_fold_conv_block(blk, ctx))
            ctx.check(path, path)
        network.append(nn.Sequential(*blocks))
    return SwiftFormerDeploy(stem, network, _fold_head(model, ctx))
