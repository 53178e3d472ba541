"""Seeded "trained-like" weights: the test utility behind every equivalence and parity check.

Default initialisations (layer scale 1e-5, identity BatchNorm statistics, zero positional encodings)
hide broken folds inside tolerance, so this gives every parameter and buffer a realistic, non-trivial
value while keeping activations O(1):
- Conv/Linear weights ~ N(0, 1/fan_in), biases ~ N(0, 0.05)
- norm weights ~ 1 + N(0, 0.1), norm biases ~ N(0, 0.05)
- BatchNorm running_mean ~ N(0, 0.1), running_var ~ U(0.5, 1.5) (not the statistics of any batch)
- RepBN alpha ~ U(0.2, 1.0); layer scales (`layer_scale*`, `gamma*`) ~ U(0.2, 0.8) with random sign
- positional encodings, cls tokens ~ N(0, 0.2); SwiftFormer `w_g` ~ N(0, 1)
- LinearNorm schedules at their end (iter = 0), as a finished training run leaves them
- models with RepBN (SLAB): RepBN does not renormalize the residual stream, so random statistics let it
  grow block after block and deep softmax stacks turn fp32 rounding into percent-level noise. As SLAB's own
  recipe ends with a BN recalibration, each RepBN's statistics are set from the activations it sees on
  a small calibration batch (`calibration`, by default four synthetic images: noise, gradient, checkerboard,
  1/f; models/synthetic.py), then perturbed (mean + N(0, 0.1)*std, var * U(0.5, 1.5)) so they are NOT the batch
  statistics; softmax attentions scale their q, k rows (`trained_like_qk_scale`) so softmax is neither flat
  nor one-hot. This is the golden fixtures' recipe.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from .layers.norms import LinearNorm, RepBN
from .registry import default_imgsz
from .synthetic import synthetic_batch

_SCALE_NAMES = ("layer_scale", "gamma")
_TOKEN_NAMES = ("positional_encoding", "pos_embed", "cls_token", "absolute_pos_embed")
CALIBRATION_KINDS = ("noise", "gradient", "checker", "smooth")  # the RepBN calibration batch
CALIBRATION_SEED = 7


@torch.no_grad()
def make_trained_like(model: nn.Module, seed: int = 0, residual_scale: float = 0.5, calibrate: bool = True,
                      imgsz: int | None = None, calibration: torch.Tensor | None = None) -> nn.Module:
    """Fill `model` in place with seeded trained-like values; returns it.

    `residual_scale` multiplies output projections of residual branches (`attn.proj`, `mlp.fc2`, ...)
    so deep residual streams stay bounded without renormalizing norms. `calibration`: the normalized NCHW batch
    RepBN statistics are taken from (default: four synthetic images at `imgsz` or the model's size).
    """
    g = torch.Generator().manual_seed(seed)

    def normal(t, std, mean=0.0):
        t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float64).mul(std).add(mean).to(t.dtype))

    def uniform(t, lo, hi):
        t.copy_((torch.rand(t.shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(t.dtype))

    for name, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            fan_in = m.weight[0].numel()
            normal(m.weight, 1.0 / math.sqrt(fan_in))
            if name.endswith(("proj", "fc2", "pwconv2", "Proj", "final")) and residual_scale != 1.0:
                m.weight.mul_(residual_scale)
            if m.bias is not None:
                normal(m.bias, 0.05)
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            if m.affine:
                normal(m.weight, 0.1, 1.0)
                normal(m.bias, 0.05)
            if m.track_running_stats:
                normal(m.running_mean, 0.1)
                uniform(m.running_var, 0.5, 1.5)
                m.num_batches_tracked.fill_(1000)
        elif isinstance(m, (nn.LayerNorm, nn.GroupNorm)):
            if m.weight is not None:
                normal(m.weight, 0.1, 1.0)
            if m.bias is not None:
                normal(m.bias, 0.05)
        if isinstance(m, RepBN):
            uniform(m.alpha, 0.2, 1.0)
        if isinstance(m, LinearNorm):
            m.iter.fill_(0)
            m.warm.fill_(0)

    for pname, p in model.named_parameters():
        leaf = pname.rsplit(".", 1)[-1]
        if leaf.startswith(_SCALE_NAMES):
            uniform(p, 0.2, 0.8)
            p.mul_(torch.where(torch.rand(p.shape, generator=g) < 0.5, -1.0, 1.0).to(p.dtype))
        elif leaf in _TOKEN_NAMES or leaf.startswith("pos_embed"):
            normal(p, 0.2)
        elif leaf == "w_g":
            normal(p, 1.0)
        elif leaf == "relative_position_bias_table":
            normal(p, 1.0)
    for m in model.modules():
        qk = getattr(m, "trained_like_qk_scale", None)
        if qk is not None and hasattr(m, "qkv"):
            m.qkv.weight[: 2 * (m.qkv.out_features // 3)].mul_(qk)
        elif qk is not None:  # separate q and kv projections (PVT)
            m.q.weight.mul_(qk)
            m.kv.weight[: m.kv.out_features // 2].mul_(qk)
    whole_model = hasattr(model, "vitedge_spec") or isinstance(getattr(model, "img_size", None), int)
    if calibrate and whole_model and any(isinstance(m, RepBN) for m in model.modules()):  # needs image inputs
        if calibration is None:
            calibration = synthetic_batch(CALIBRATION_KINDS, imgsz or default_imgsz(model), CALIBRATION_SEED)
        _calibrate_repbn(model, g, calibration)
    return model


def _calibrate_repbn(model: nn.Module, g: torch.Generator, x: torch.Tensor) -> None:
    bns = [m.bn for m in model.modules() if isinstance(m, RepBN)]
    was_training = model.training
    model.eval()
    dtype = next(p.dtype for p in model.parameters())
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average: one batch -> exactly its statistics
        bn.train()
    model(x.to(dtype))
    for bn in bns:
        bn.eval()
        bn.momentum = 0.1
        bn.num_batches_tracked.fill_(1000)
        std = bn.running_var.sqrt()
        bn.running_mean.add_(0.1 * std * torch.randn(std.shape, generator=g, dtype=torch.float64).to(std))
        bn.running_var.mul_((0.5 + torch.rand(std.shape, generator=g, dtype=torch.float64)).to(std))
    model.train(was_training)
