"""Fold plan for SimA-DeiT (`SimADeiT`) -> `SimADeiTDeploy`, locked to the model's input size.

Exact folds:
- each block's norm1 / norm2 affine -> `attn.qkv` / `mlp.fc1` (the LayerNorm stays, without affine: its statistics
  are per token);
- the final norm's affine -> `head` (a LayerNorm is per token, so its affine commutes with taking the CLS token);
- `cat(cls, x) + pos_embed` -> `cat(cls + pos_embed[:, :1], x + pos_embed[:, 1:])`: one constant CLS token.
SimA attention orders are fixed per block for the export token count 1+N (the official rule `(QK^T)V iff N < d`
on the tokens the attention sees; `--attn-order` or the model's `attn_order` can force one).

Rewrites (each exact and switchable, all on by default): `l1_normalize_broadcast_div`, l1-normalize as a
broadcast division (no Expand in ONNX); `final_norm_on_cls_only`, the final LayerNorm on the CLS token only
(only `norm(x)[:, 0]` is read).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ...errors import VitedgeError
from ...models.features import token_map
from ...models.input_size import as_hw
from ...models.sima_deit import SimADeiT, SimADeiTBlock
from .engine import FoldContext, register_plan
from .primitives import PatchEmbedDeploy, PreNormBlockDeploy, affine_before
from .sima import FixedOrderSimA, fix_sima_order

__all__ = ["SimADeiTDeploy", "plan_sima_deit"]


class SimADeiTDeploy(nn.Module):
    """patch_embed (+ constant pos) -> cat(constant CLS) -> blocks -> norm -> head on CLS."""

    def __init__(self, proj: nn.Conv2d, pos_embed: torch.Tensor, cls_token: torch.Tensor, blocks: list[nn.Module],
                 norm: nn.Module, head: nn.Module, img_size: tuple[int, int], norm_cls_only: bool):
        super().__init__()
        self.patch_embed = PatchEmbedDeploy(proj)
        self.pos_embed = nn.Parameter(pos_embed.detach().clone(), requires_grad=False)
        self.cls_token = nn.Parameter(cls_token.detach().clone(), requires_grad=False)
        self.blocks = nn.Sequential(*blocks)
        self.norm, self.head = norm, head
        self.img_size, self.norm_cls_only = img_size, norm_cls_only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_tracing() and tuple(x.shape[-2:]) != tuple(self.img_size):
            raise VitedgeError(f"this SimA-DeiT deploy-form was built for {self.img_size[0]}x{self.img_size[1]} "
                               f"inputs; got {x.shape[-2]}x{x.shape[-1]}: resize the input")
        x = self.forward_tokens(x)
        x = self.norm(x[:, 0]) if self.norm_cls_only else self.norm(x)[:, 0]
        return self.head(x)

    def forward_tokens(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x) + self.pos_embed
        return self.blocks(torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1))

    def forward_intermediates(self, x: torch.Tensor, indices) -> list[torch.Tensor]:
        """The last block's patch tokens as an NCHW map (models/sima_deit.py SimADeiT.feature_info)."""
        return [token_map(self.forward_tokens(x), x.shape[-2:], self.patch_embed.proj.stride[0])]




def _ln_affine(ln: nn.Module, path: str) -> tuple[torch.Tensor, torch.Tensor, nn.LayerNorm]:
    """(a, b, LayerNorm without affine) for a LayerNorm."""
    if not isinstance(ln, nn.LayerNorm) or ln.weight is None:
        raise VitedgeError(f"{path} is a {type(ln).__name__}, not an affine LayerNorm: build the model with the "
                           "default norm_layer")
    return ln.weight, ln.bias, nn.LayerNorm(ln.normalized_shape, eps=ln.eps, elementwise_affine=False)


def _fold_block(blk: SimADeiTBlock, path: str, n: int, ctx: FoldContext) -> PreNormBlockDeploy:
    attn = blk.attn
    a1, b1, norm1 = _ln_affine(blk.norm1, f"{path}.norm1")
    a2, b2, norm2 = _ln_affine(blk.norm2, f"{path}.norm2")
    qkv = affine_before(attn.qkv, a1, b1)
    ctx.fold("layernorm_affine->linear")
    order = fix_sima_order(attn, n, f"{path}.attn", ctx)
    mlp = blk.mlp
    mlp.fc1 = affine_before(mlp.fc1, a2, b2)
    mlp.drop = None  # identity in eval
    ctx.fold("layernorm_affine->linear")
    attn = FixedOrderSimA(qkv, attn.proj, attn.num_heads, order, attn.eps, ctx.use("l1_normalize_broadcast_div"))
    return PreNormBlockDeploy(norm1, attn, norm2, mlp)


@register_plan(SimADeiT, rewrites=("l1_normalize_broadcast_div", "final_norm_on_cls_only"))
def plan_sima_deit(model: SimADeiT, ctx: FoldContext) -> SimADeiTDeploy:
    n = 1 + model.patch_embed.num_patches  # SimA sees the CLS token too
    ctx.check("patch_embed", "patch_embed")
    blocks = []
    for i, blk in enumerate(model.blocks):
        blocks.append(_fold_block(blk, f"blocks.{i}", n, ctx))
        ctx.check(f"blocks.{i}", f"blocks.{i}")
    cls = model.cls_token + model.pos_embed[:, :1]
    ctx.fold("pos_embed->cls_token")
    norm, head = model.norm, model.head
    if isinstance(head, nn.Linear):
        a, b, norm = _ln_affine(norm, "norm")
        head = affine_before(head, a, b)
        ctx.fold("layernorm_affine->linear")
    else:
        ctx.unfold("norm", "num_classes=0: no head Linear to fold the final norm's affine into; kept")
    return SimADeiTDeploy(model.patch_embed.proj, model.pos_embed[:, 1:], cls, blocks, norm, head, as_hw(ctx.imgsz),
                          norm_cls_only=ctx.use("final_norm_on_cls_only"))
