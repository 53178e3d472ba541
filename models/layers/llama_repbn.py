"""SLAB's LLaMA-style progressive norm (`llama/modeling/llama-350M/modeling_llama.py` of xinghaochen/SLAB).

It differs from the vision LinearNorm (MODELS.md §2.1, last bullet):
- norm1 is an RMSNorm (`weight`), norm2 a RepBN whose BatchNorm, in training, runs over the non-pad tokens only
  (`pad_mask == 1`); pad tokens keep `x` (then get `+ alpha * x` like the others); eval uses the running stats on
  every token, i.e. one per-channel affine;
- RepBN `alpha`, BN gamma and beta start at 0 (norm2 starts as the zero map);
- schedule: `warm`=10000 warm-up ticks of pure RMSNorm, then lambda = r0 * iter / total_step falls over
  `step`=18000 ticks, and the counters tick once every 16 training calls (`num_step` counts calls modulo 16);
- the eps given to the module goes to both the RMSNorm and the BatchNorm.
Buffer and parameter names follow the official module, so its checkpoints load unchanged:
`num_step`, `warm`, `iter`, `total_step`, `norm1.weight`, `norm2.alpha`, `norm2.bn.*`.

The classes subclass the vision `RepBN` / `LinearNorm`, so `RepBN.affine()`, `LinearNorm.lam()`, the unfinished-
schedule check and `make_trained_like` apply to them unchanged. Their fold lives in exporter/reparam/llama_repbn.py.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn as nn

from .norms import LinearNorm, RepBN

__all__ = ["LlamaRMSNorm", "MaskedRepBN", "LlamaLinearNorm", "TICK_EVERY"]

TICK_EVERY = 16  # the schedule counters move once per this many training calls


class LlamaRMSNorm(nn.Module):
    """`weight * x / sqrt(mean(x^2) + eps)` over the last axis (key `weight`).

    The official code takes the mean square in float32 and multiplies the un-cast input; float64 stays float64
    here (the fp64 equivalence checks need it), lower precisions follow the official float32 path.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        dt = torch.promote_types(x.dtype, torch.float32)
        variance = x.to(dt).pow(2).mean(-1, keepdim=True)
        return (self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))).to(x.dtype)


class MaskedRepBN(RepBN):
    """`BN(x) + alpha * x` on (B, T, C) with the BatchNorm over non-pad tokens in training (keys `alpha`, `bn.*`).

    `pad_mask` (B, T): 1 = real token. In training with a mask, the BN statistics (and running-stat updates) come
    from the real tokens only and pad tokens keep x before the `alpha * x` term; in eval (or without a mask) every
    token goes through the BN, as officially.
    """

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__(channels, eps=eps, momentum=0.1)
        with torch.no_grad():  # the LLaMA variant starts from alpha = 0 and a zero BN affine
            self.alpha.zero_()
            self.bn.weight.zero_()
            self.bn.bias.zero_()

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, c = x.shape
        if pad_mask is None or not self.training:
            out = self.bn(x.reshape(-1, c)).reshape(b, t, c)
        else:
            keep = pad_mask == 1
            out = x.clone()
            out[keep] = self.bn(x[keep].reshape(-1, c))
        return out + self.alpha * x


class LlamaLinearNorm(LinearNorm):
    """The LLaMA progressive norm: `lam * RMSNorm(x) + (1 - lam) * MaskedRepBN(x, pad_mask)` in training,
    `MaskedRepBN(x)` in eval, counters ticking once every TICK_EVERY training calls (keys `num_step`, `warm`,
    `iter`, `total_step`, `norm1.*`, `norm2.*`)."""

    def __init__(self, dim: int, eps: float = 1e-5, warm: int = 10000, step: int = 18000, r0: float = 1.0):
        super().__init__(dim, norm1=partial(LlamaRMSNorm, eps=eps), norm2=partial(MaskedRepBN, eps=eps), warm=warm,
                         step=step, r0=r0)
        self.register_buffer("num_step", torch.tensor(0, dtype=torch.long))
        # official buffer order: num_step first
        self._buffers = {k: self._buffers[k] for k in ("num_step", "warm", "iter", "total_step")}

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        if not self.training:
            return self.norm2(x, pad_mask)
        tick = int(self.num_step) % TICK_EVERY == 0
        if self.warm > 0:
            if tick:
                self.warm.copy_(self.warm - 1)
            out = self.norm1(x)
        else:
            lam = self.lam()  # read before the counter moves, as officially
            if self.iter > 0 and tick:
                self.iter.copy_(self.iter - 1)
            out = lam * self.norm1(x) + (1 - lam) * self.norm2(x, pad_mask)
        self.num_step.copy_((self.num_step + 1) % TICK_EVERY)
        return out
