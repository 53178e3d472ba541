"""SLAB's normalizations: RepBN and the progressive LN -> RepBN module (LinearNorm).

Buffer and parameter names follow the official `classification/models/prepbn.py` so official
checkpoints load unchanged.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

SCHEDULES = ("linear", "cosine", "step")


class RepBN(nn.Module):
    """`BN(x) + alpha * x` over the channel (last) axis of a (B, N, C) token tensor."""

    def __init__(self, channels: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1))
        self.bn = nn.BatchNorm1d(channels, eps=eps, momentum=momentum)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, -1)
        x = self.bn(x) + self.alpha * x
        return x.transpose(1, -1)

    def affine(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Eval-mode function as `a * x + b` per channel: a = g/sqrt(v+eps) + alpha, b = beta - g*mu/sqrt(v+eps)."""
        bn = self.bn
        inv = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        return inv + self.alpha, bn.bias - inv * bn.running_mean


class LinearNorm(nn.Module):
    """Progressive norm: `lam * norm1(x) + (1 - lam) * norm2(x)` in training, `norm2(x)` in eval.

    `lam` falls from `r0` to 0 over `step` training forwards (counted per instance by the `iter` buffer),
    after `warm` forwards of pure `norm1`. Eval always uses `norm2` alone, as the official code does, even
    when the schedule has not finished (the re-parameterizer warns about such checkpoints).
    """

    def __init__(self, dim: int, norm1=nn.LayerNorm, norm2=RepBN, warm: int = 0, step: int = 300000,
                 r0: float = 1.0, schedule: str = "linear", decay_steps: int = 4):
        super().__init__()
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        self.register_buffer("warm", torch.tensor(warm, dtype=torch.long))
        self.register_buffer("iter", torch.tensor(step, dtype=torch.long))
        self.register_buffer("total_step", torch.tensor(step, dtype=torch.long))
        self.r0 = r0
        self.schedule = schedule
        self.decay_steps = decay_steps
        self.norm1 = norm1(dim)
        self.norm2 = norm2(dim)

    def lam(self) -> torch.Tensor:
        """The LN weight for the next training forward (the counter is read before it is decremented)."""
        if self.schedule == "linear":
            return self.r0 * self.iter / self.total_step  # same tensor arithmetic as the official code
        frac = self.iter.double().item() / max(int(self.total_step), 1)
        if self.schedule == "cosine":
            return torch.tensor(self.r0 * 0.5 * (1.0 - math.cos(math.pi * frac)))
        return torch.tensor(self.r0 * math.ceil(frac * self.decay_steps) / self.decay_steps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return self.norm2(x)
        if self.warm > 0:
            self.warm.copy_(self.warm - 1)
            return self.norm1(x)
        lam = self.lam()
        if self.iter > 0:
            self.iter.copy_(self.iter - 1)
        return lam * self.norm1(x) + (1 - lam) * self.norm2(x)
