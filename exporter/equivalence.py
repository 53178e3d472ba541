"""The equivalence gate: deploy-form vs train-form in float64, end to end and block by block."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from .inputs import parity_inputs

DEFAULT_RTOL = 1e-9  # relative to max|y|; real fold bugs move logits by >= 1e-6 with trained-like weights


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
    blocks: list = field(default_factory=list)  # [{"name", "max_abs", "scale", "passed"}]
    diverging_module: str | None = None

    def to_dict(self) -> dict:
        return {"passed": self.passed, "max_abs": self.max_abs, "max_abs_rel": self.max_abs / max(self.scale, 1e-300),
                "rtol": self.rtol, "samples": self.samples, "blocks": self.blocks,
                "diverging_module": self.diverging_module}


def _capture(model: nn.Module, paths: list[str]):
    store, handles = {}, []
    for p in paths:
        def hook(_m, _inp, out, p=p):
            store[p] = out[0] if isinstance(out, (tuple, list)) else out
        handles.append(model.get_submodule(p).register_forward_hook(hook))
    return store, handles


@torch.no_grad()
def verify_equivalence(train_model: nn.Module, deploy_model: nn.Module, imgsz: int | None = None,
                       inputs: torch.Tensor | None = None, samples: int = 6, rtol: float = DEFAULT_RTOL,
                       raise_on_fail: bool = True) -> EquivalenceResult:
    """Compare both models in float64 on structured inputs; each block check and the logits must agree to
    `rtol * max|reference|`. On failure, names the first diverging block (in forward order)."""
    imgsz = imgsz or getattr(deploy_model, "reparam_imgsz", 224)
    x = (inputs if inputs is not None else parity_inputs(samples, imgsz, seed=1234)).double()
    t = copy.deepcopy(train_model).double().eval()
    # Compare the float64 fold when the engine kept it (the float32 weights carry one rounding by design).
    d = copy.deepcopy(getattr(deploy_model, "reparam_fp64", deploy_model)).double().eval()
    checks = list(getattr(deploy_model, "reparam_blocks", []))
    t_store, th = _capture(t, [c.train_path for c in checks])
    d_store, dh = _capture(d, [c.deploy_path for c in checks])
    try:
        y_t, y_d = t(x), d(x)
    finally:
        for h in th + dh:
            h.remove()
    blocks, first_bad = [], None
    for c in checks:
        a = t_store[c.train_path]
        b = d_store[c.deploy_path]
        if c.to_train is not None:
            b = c.to_train(b)
        scale = float(a.abs().max())
        err = float((a - b).abs().max()) if a.shape == b.shape else float("inf")
        ok = err <= rtol * max(scale, 1e-12)
        blocks.append({"name": c.name, "max_abs": err, "scale": scale, "passed": ok})
        if not ok and first_bad is None:
            first_bad = c.name
    scale = float(y_t.abs().max())
    err = float((y_t - y_d).abs().max()) if y_t.shape == y_d.shape else float("inf")
    ok = err <= rtol * max(scale, 1e-12) and first_bad is None
    if not ok and first_bad is None:
        first_bad = "(logits)"
    res = EquivalenceResult(ok, err, scale, rtol, int(x.shape[0]), blocks, first_bad)
    if not ok and raise_on_fail:
        raise EquivalenceError(
            f"re-parameterization changed the function: first diverging block {first_bad}; logits max|diff| "
            f"{err:.3e} vs tolerance {rtol:.0e}*max|y| ({scale:.3e})", first_bad)
    return res
