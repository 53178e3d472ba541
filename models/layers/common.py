"""Small layers shared by several families."""
from __future__ import annotations

import torch
import torch.nn as nn


class Mlp(nn.Module):
    """timm-style `fc2(act(fc1(x)))` on the last axis (keys `fc1`, `fc2`)."""

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 act_layer=nn.GELU, bias: bool = True, drop: float = 0.0):
        super().__init__()
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features, bias=bias)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_features, out_features, bias=bias)
        # Official Swin/DeiT MLPs drop after act and after fc2; no module at rate 0 keeps deploy graphs clean.
        self.drop = nn.Dropout(drop) if drop > 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop is None:
            return self.fc2(self.act(self.fc1(x)))
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


def init_trunc_normal(module: nn.Module, std: float = 0.02) -> None:
    """The usual ViT init: trunc_normal(std) weights, zero biases for Linear/Conv."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d, nn.Conv1d)):
            nn.init.trunc_normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


class DropPath(nn.Module):
    """Stochastic depth per sample (training only; identity in eval and at rate 0)."""

    def __init__(self, drop_prob: float = 0.0):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1.0 - self.drop_prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask.div_(keep)


@torch.no_grad()
def init_vit_weights(module: nn.Module, *tokens: torch.Tensor, std: float = 0.02) -> None:
    """The official ViT-family init: trunc_normal(std) for `tokens` (pos embeds, cls tokens) and Linear
    weights, zero Linear biases, LayerNorm (1, 0); convs and BatchNorms keep PyTorch's defaults."""
    for t in tokens:
        nn.init.trunc_normal_(t, std=std)
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm) and m.weight is not None:
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
