"""Seeded "trained-like" weights: the test utility behind every equivalence and parity check.

Default initialisations (layer scale 1e-5, identity BatchNorm statistics, zero positional encodings)
hide broken folds inside tolerance, so this gives every parameter and buffer a realistic, non-trivial
value while keeping activations O(1):
- Conv/Linear weights ~ N(0, 1/fan_in), biases ~ N(0, 0.05)
- norm weights ~ 1 + N(0, 0.1), norm biases ~ N(0, 0.05)
- BatchNorm running_mean ~ N(0, 0.1), running_var ~ U(0.5, 1.5) (not the statistics of any batch)
- RepBN alpha ~ U(0.2, 1.0); layer scales (`layer_scale*`, `gamma*`) ~ U(0.2, 0.8) with random sign
- positional encodings, cls tokens ~ N(0, 0.2); SwiftFormer `w_g` ~ N(0, 1)
- residual branches' output projections scaled by `residual_scale` x min(1, sqrt(8 / B)), B = the number of
  such projections (depth-scaled, as GPT-2 / Fixup scale residual projections by depth): each branch adds to the
  stream, and RepBN's `alpha * x` passes the stream's size on to the next branch's input, so without the depth
  factor a 12-24 block stack grows its stream geometrically (max|y| 300-400 at full depth, float32 chaotic on
  saturated inputs). Configs with <= 8 such projections (the golden-fixture sizes) are unchanged.
- LinearNorm schedules at their end (iter = 0), as a finished training run leaves them
- models with RepBN (SLAB): RepBN does not renormalize the residual stream, so random statistics let it
  grow block after block and deep softmax stacks turn fp32 rounding into percent-level noise. As SLAB's own
  recipe ends with a BN recalibration, each RepBN's statistics are set from the activations it sees on
  a small calibration batch (`calibration`, by default four synthetic images: noise, gradient, checkerboard,
  1/f; models/synthetic.py), then perturbed (mean + N(0, 0.1)*std, var * U(0.5, 1.5)) so they are NOT the batch
  statistics; softmax attentions scale their q, k rows (`trained_like_qk_scale`) so softmax is neither flat
  nor one-hot. This is the golden fixtures' recipe.

`make_ill_conditioned` keeps the recipe before the depth factor, with sharper softmax: deliberately
ill-conditioned weights (a correct export of such a model must still pass the noise-aware parity rule).
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
_RESIDUAL_OUT = ("proj", "fc2", "pwconv2", "Proj", "final")  # output projections of residual branches
DEPTH_REF = 8  # residual projections up to which the depth factor is 1 (the golden-fixture configs)


def _residual_outputs(model: nn.Module) -> list[nn.Module]:
    return [m for name, m in model.named_modules()
            if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)) and name.endswith(_RESIDUAL_OUT)]


def depth_factor(model: nn.Module) -> float:
    """min(1, sqrt(DEPTH_REF / B)), B = the number of residual output projections in `model`."""
    return min(1.0, math.sqrt(DEPTH_REF / max(len(_residual_outputs(model)), 1)))


@torch.no_grad()
def make_trained_like(model: nn.Module, seed: int = 0, residual_scale: float = 0.5, calibrate: bool = True,
                      imgsz: int | None = None, calibration: torch.Tensor | None = None,
                      depth_scaled: bool = True, qk_boost: float = 1.0) -> nn.Module:
    """Fill `model` in place with seeded trained-like values; returns it.

    `residual_scale` multiplies output projections of residual branches (`attn.proj`, `mlp.fc2`, ...), times
    the depth factor (`depth_scaled`), so deep residual streams stay bounded without renormalizing norms.
    `calibration`: the normalized NCHW batch RepBN statistics are taken from (default: four synthetic images at
    `imgsz` or the model's size). `qk_boost` multiplies the softmax q, k scale (> 1 sharpens attention;
    make_ill_conditioned uses it).
    """
    g = torch.Generator().manual_seed(seed)

    def normal(t, std, mean=0.0):
        t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float64).mul(std).add(mean).to(t.dtype))

    def uniform(t, lo, hi):
        t.copy_((torch.rand(t.shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(t.dtype))

    res_scale = residual_scale * (depth_factor(model) if depth_scaled else 1.0)
    for name, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            fan_in = m.weight[0].numel()
            normal(m.weight, 1.0 / math.sqrt(fan_in))
            if name.endswith(_RESIDUAL_OUT) and res_scale != 1.0:
                m.weight.mul_(res_scale)
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
        qk = qk * qk_boost if qk is not None else None
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


def make_ill_conditioned(model: nn.Module, seed: int = 0, qk_boost: float = 2.0) -> nn.Module:
    """Deliberately ill-conditioned but valid weights: the recipe without the depth factor and with softmax
    logits sharpened by `qk_boost`. A full-depth PRepBN model made so has a growing residual stream and a
    float32 train-form that is chaotic on saturated (stress) inputs: the case the noise-aware rule exists for."""
    return make_trained_like(model, seed, depth_scaled=False, qk_boost=qk_boost)


ILL_CONDITIONED = ("prepbn_deit_tiny", {"embed_dim": 64, "depth": 12, "num_heads": 2, "num_classes": 100})


def ill_conditioned_prepbn_deit(seed: int = 0) -> nn.Module:
    """A narrow full-depth PRepBN-DeiT (12 blocks, width 64: cheap enough for tests) with make_ill_conditioned
    weights, RepBN statistics calibrated, in eval mode. Its float32 train-form is chaotic on some inputs (float32
    vs float64 differ by 1e-3 to 0.4 of max|y| on photos and saturated images alike), yet its export is correct."""
    from .registry import create_model

    name, overrides = ILL_CONDITIONED
    return make_ill_conditioned(create_model(name, **overrides), seed).eval()


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
