"""The equivalence gate: deploy-form vs train-form in float64, end to end and block by block.

A fold is exact in real arithmetic, so in float64 the two forms differ only by float64 rounding. That rounding is
tiny for a well-conditioned model (1e-9 of max|y| is far above it), but a deep or ill-conditioned stack amplifies
it, and a fixed 1e-9 then fails correct folds (a 12-18 block PRepBN stack with a growing residual stream). The
amplification is measured, not guessed: the train-form is also run in float32, and its deviation from float64 at
each checked block is the amplification times float32's unit roundoff. Scaled by eps64/eps32 (2^-29) it estimates
float64's own rounding noise there, so a block passes when

    max|deploy64 - train64| <= max(rtol * max|train64|, K64 * (eps64/eps32) * max|train32 - train64|)

K64 = 100 covers two independent float64 computations (the forms' ops differ) with margin; real fold bugs move
logits by >= 1e-6 of max|y| while the noise term stays below 1e-8 even for a chaotic float32 model (noise ~ 1).

The scaling assumes float32's deviation grows as float64's does. Where float32 saturates (its deviation as large as
the signal itself: a deep PVT-Medium's third stage at 256x320 with demo weights) it stops growing while float64's
keeps growing, and the estimate falls short: correct folds failed by 1.1-4x. So a check that fails the scaled bound
gets a second, direct estimate before it is failed: the train-form run in float64 with every weight and buffer
moved by up to one float64 ulp (what a fold's own rounding does to them), and its deviation from the float64 run.
A block passes when its difference is within K64 times either estimate. Only failing runs pay for that run.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ...models.features import as_outputs, output_names, pack
from ...models.registry import default_imgsz, sized
from .inputs import parity_inputs

DEFAULT_RTOL = 1e-9  # relative to max|y|; real fold bugs move logits by >= 1e-6 with trained-like weights
DEFAULT_K64 = 100.0  # multiples of float64's estimated own rounding noise (module doc)
EPS_RATIO = float(torch.finfo(torch.float64).eps / torch.finfo(torch.float32).eps)  # 2^-29


class EquivalenceError(RuntimeError):
    """The deploy-form does not compute the train-form's function; names the first diverging block."""

    def __init__(self, message: str, diverging_module: str | None):
        super().__init__(message)
        self.diverging_module = diverging_module


@dataclass
class EquivalenceResult:
    passed: bool
    max_abs: float
    scale: float
    rtol: float
    samples: int
    blocks: list = field(default_factory=list)  # [{"name", "max_abs", "scale", "fp32_noise", "allowed", "passed"}]
    diverging_module: str | None = None
    k64: float = DEFAULT_K64
    allowed: float = 0.0       # the logits' allowance: max(rtol * scale, k64 * EPS_RATIO * fp32_noise[, k64 * fp64_noise])
    fp32_noise: float = 0.0    # max|train32 - train64| at the logits
    fp64_noise: float | None = None  # max|train64 (weights moved by <= 1 ulp) - train64| at the logits, where measured

    def to_dict(self) -> dict:
        return {"passed": self.passed, "max_abs": self.max_abs, "max_abs_rel": self.max_abs / max(self.scale, 1e-300),
                "rtol": self.rtol, "k64": self.k64, "allowed": self.allowed, "fp32_noise": self.fp32_noise,
                "fp64_noise": self.fp64_noise, "samples": self.samples, "blocks": self.blocks, "diverging_module": self.diverging_module}

    def describe(self) -> str:
        """The bound and the figures: the first failing block's (if one failed), then the logits'."""
        bad = next((b for b in self.blocks if not b["passed"]), None)
        block = (f"block {bad['name']} max|diff| {bad['max_abs']:.3e} vs allowance {bad['allowed']:.3e}; "
                 if bad is not None else "")
        direct = " or measured directly" if self.fp64_noise is not None else ""
        return (f"{block}logits max|diff| {self.max_abs:.3e} vs allowance {self.allowed:.3e} = max({self.rtol:.0e}"
                f"*max|y| ({self.scale:.3e}), {self.k64:g} x float64 noise estimate (scaled from float32{direct}))")


def _capture(model: nn.Module, paths: list[str]):
    store, handles = {}, []
    for p in paths:
        def hook(_m, _inp, out, p=p):
            store[p] = out[0] if isinstance(out, (tuple, list)) else out
        handles.append(model.get_submodule(p).register_forward_hook(hook))
    return store, handles


def allowance(scale: float, fp32_noise: float, rtol: float = DEFAULT_RTOL, k64: float = DEFAULT_K64) -> float:
    """max(rtol * scale, k64 * (eps64/eps32) * fp32_noise): the float64 gate's bound for one checked tensor."""
    return max(rtol * max(scale, 1e-12), k64 * EPS_RATIO * fp32_noise)


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    d = (a.double() - b.double()).abs().max()
    return float(d) if torch.isfinite(d) else float("inf")


def _judge(name: str, a: torch.Tensor, b: torch.Tensor, a32: torch.Tensor, rtol: float, k64: float) -> dict:
    """One checked tensor: its float64 difference against the allowance scaled from float32's deviation."""
    scale = float(a.abs().max())
    err = _max_abs_diff(a, b)
    noise = _max_abs_diff(a, a32)
    allowed = allowance(scale, noise if noise != float("inf") else 0.0, rtol, k64)
    return {"name": name, "max_abs": err, "scale": scale, "fp32_noise": noise, "allowed": allowed,
            "passed": err <= allowed}


def _moved_float64(t: nn.Module, x: torch.Tensor, paths: list[str]) -> tuple[dict, list]:
    """The float64 train-form `t` with every weight and buffer moved by up to one float64 ulp (what a fold's own
    rounding does to them), run on `x`: its tensors at `paths` and its outputs. Their deviation from `t`'s is
    float64's own rounding noise, measured rather than scaled from float32 (seeded: a run gives the same figure)."""
    moved = copy.deepcopy(t)
    g = torch.Generator().manual_seed(0)
    eps = torch.finfo(torch.float64).eps
    with torch.no_grad():
        for q in [*moved.parameters(), *moved.buffers()]:
            if q.is_floating_point():
                q.add_(q * ((torch.rand(q.shape, generator=g, dtype=q.dtype) * 2 - 1) * eps))
    store, hooks = _capture(moved, paths)
    try:
        return store, as_outputs(moved(x))
    finally:
        for h in hooks:
            h.remove()


@torch.no_grad()  # no autograd graph: three forwards' activations held take GBs at large sizes
def verify_equivalence(train_model: nn.Module, deploy_model: nn.Module, imgsz: int | None = None,
                       inputs: torch.Tensor | None = None, samples: int = 6, rtol: float = DEFAULT_RTOL,
                       raise_on_fail: bool = True, k64: float = DEFAULT_K64) -> EquivalenceResult:
    """Compare both models in float64 on structured inputs; each block check and the logits must agree within
    max(rtol * max|reference|, k64 * float64's estimated rounding noise) (module doc; k64=0 gives the plain
    relative bound). On failure, names the first diverging block (in forward order). `imgsz`: the size the
    deploy-form was folded for (default: the train-form's default size, as `reparameterize` defaults)."""
    imgsz = imgsz or default_imgsz(train_model)
    x = (inputs if inputs is not None else parity_inputs(samples, imgsz, seed=1234)).double()
    own = sized(copy.deepcopy(train_model), imgsz)  # the train-form at that size, resized in its own dtype
    t = copy.deepcopy(own).double().eval()
    t32 = own.float().eval()  # its deviation from t measures the rounding amplification
    # Compare the float64 fold when the engine kept it (the float32 weights carry one rounding by design).
    d = copy.deepcopy(getattr(deploy_model, "reparam_fp64", deploy_model)).double().eval()
    checks = list(getattr(deploy_model, "reparam_blocks", []))
    t_store, th = _capture(t, [c.train_path for c in checks])
    t32_store, t32h = _capture(t32, [c.train_path for c in checks])
    d_store, dh = _capture(d, [c.deploy_path for c in checks])
    try:
        y_t, y_d, y_32 = as_outputs(t(x)), as_outputs(d(x)), as_outputs(t32(x.float()))
    finally:
        for h in th + dh + t32h:
            h.remove()
    # a block neither form runs is no part of the function (a classifier's class-attention blocks under the
    # feature maps, which read the tokens before them)
    checks = [c for c in checks if c.train_path in t_store or c.deploy_path in d_store]
    pairs = [(c.name, t_store[c.train_path], d_store[c.deploy_path], t32_store[c.train_path], c.to_train)
             for c in checks]
    if len(y_t) > 1:  # several outputs (feature maps, a user's heads): each is checked on its own scale
        names = output_names(train_model, len(y_t))
        pairs += [(f"(output {n})", a, b, c, None) for n, a, b, c in zip(names, y_t, y_d, y_32)]
    pairs = [(name, a, to_train(b) if to_train is not None else b, a32) for name, a, b, a32, to_train in pairs]
    pairs.append(("(logits)", pack(y_t), pack(y_d), pack(y_32)))
    judged = [_judge(name, a, b, a32, rtol, k64) for name, a, b, a32 in pairs]
    fp64_noise = None
    if k64 > 0 and not all(j["passed"] for j in judged):  # a second, direct estimate before failing (module doc)
        store, y_m = _moved_float64(t, x, [c.train_path for c in checks])
        near = [(t_store[c.train_path], store[c.train_path]) for c in checks]
        near += list(zip(y_t, y_m)) if len(y_t) > 1 else []
        near.append((pack(y_t), pack(y_m)))
        for j, (a, m) in zip(judged, near):
            j["fp64_noise"] = _max_abs_diff(a, m)
            j["allowed"] = max(j["allowed"], k64 * j["fp64_noise"])
            j["passed"] = j["max_abs"] <= j["allowed"]
        fp64_noise = judged[-1]["fp64_noise"]
    *blocks, logits = judged
    first_bad = next((b["name"] for b in blocks if not b["passed"]), None)
    ok = logits["passed"] and first_bad is None
    if not ok and first_bad is None:
        first_bad = "(logits)"
    res = EquivalenceResult(ok, logits["max_abs"], logits["scale"], rtol, int(x.shape[0]), blocks, first_bad, k64,
                            logits["allowed"], logits["fp32_noise"], fp64_noise)
    if not ok and raise_on_fail:
        raise EquivalenceError(
            f"re-parameterization changed the function: first diverging block {first_bad}; {res.describe()}",
            first_bad)
    return res
