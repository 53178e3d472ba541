"""fp16 range analysis of the deploy-form (torch side): will the model overflow in fp16 outside the fp32 islands?

`analyze_fp16_ranges` runs calibration inputs through the deploy-form model in fp32 and records per-module and
per-op max|x| and the eps constants in use; `check_fp16_safe` fails an fp16 export when a hazard falls outside
the precision policy's islands (vitedge.targets.graph.precision), naming the module. The op names it reports
follow the policy's island walk (a reduction or eps seed, the chain after it, "op<seed" inside an island), so
`PrecisionPolicy.covers(op)` can tell a covered hazard from a real one.
"""
from __future__ import annotations

import weakref
from dataclasses import asdict, dataclass
from typing import Any, Iterable

import numpy as np
import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from ...errors import VitedgeError
from ...targets.graph.precision import FP16_MAX, PrecisionPolicy, default_policy, fp16_flushes_to_zero, is_tiny_eps


@dataclass
class EpsUse:
    module: str
    op: str            # "normalize", "layer_norm", "add_eps", "clamp_eps", ... or "attr" (a module's eps)
    value: float
    fp16_value: float
    flushes_to_zero: bool
    reciprocal_overflows: bool  # 1/eps > 65504 (matters where eps guards a division)
    hazard: bool


@dataclass
class Fp16Hazard:
    module: str
    op: str
    kind: str          # "overflow" | "eps_underflow" | "eps_reciprocal_overflow"
    value: float
    covered_by: str | None  # policy rule keeping it in fp32, or None

    def describe(self) -> str:
        if self.kind == "overflow":
            return f"module '{self.module}' ({self.op}) reaches max|x| = {self.value:.4g} > {FP16_MAX:g}"
        if self.kind == "eps_underflow":
            return f"module '{self.module}' ({self.op}) uses eps {self.value:.3g}, which is 0 in fp16"
        return f"module '{self.module}' ({self.op}) adds eps {self.value:.3g}; 1/eps overflows fp16"


@dataclass
class Fp16Analysis:
    samples: int
    modules: dict[str, dict]            # name -> {"type", "max_abs", "ops": {op: max_abs}}
    eps: list[EpsUse]
    hazards: list[Fp16Hazard]

    @property
    def overflowing_modules(self) -> list[str]:
        return sorted({h.module for h in self.hazards if h.kind == "overflow"})

    @property
    def eps_underflows(self) -> list[EpsUse]:
        return [e for e in self.eps if e.hazard]

    def uncovered(self) -> list[Fp16Hazard]:
        return [h for h in self.hazards if h.covered_by is None]

    def to_dict(self) -> dict:
        return {"samples": self.samples, "fp16_max": FP16_MAX,
                "max_abs": {k: v["max_abs"] for k, v in self.modules.items()},
                "overflowing_modules": self.overflowing_modules,
                "eps": [asdict(e) for e in self.eps],
                "hazards": [asdict(h) for h in self.hazards]}


# torch function name -> the op name the analysis reports (functional forms and tensor methods alike).
_OP_NAMES = {"normalize": "normalize", "layer_norm": "layer_norm", "group_norm": "group_norm",
             "softmax": "softmax", "log_softmax": "log_softmax", "rsqrt": "rsqrt", "sqrt": "sqrt",
             "reciprocal": "reciprocal", "__rtruediv__": "reciprocal", "__rdiv__": "reciprocal", "sum": "sum", "mean": "mean",
             "norm": "norm", "linalg_vector_norm": "norm", "square": "square", "matmul": "matmul",
             "__matmul__": "matmul", "bmm": "matmul", "linear": "linear", "conv2d": "conv2d", "conv1d": "conv1d",
             "einsum": "einsum", "gelu": "gelu", "batch_norm": "batch_norm", "add": "add", "__add__": "add",
             "__radd__": "add", "mul": "mul", "__mul__": "mul", "__rmul__": "mul", "div": "div",
             "__truediv__": "div", "pow": "pow", "__pow__": "pow", "sub": "sub", "__sub__": "sub", "__rsub__": "sub",
             "exp": "exp", "relu": "relu", "clamp": "clamp", "clamp_min": "clamp", "maximum": "clamp",
             "transpose": "transpose", "permute": "permute", "reshape": "reshape", "view": "reshape",
             "expand": "expand", "expand_as": "expand", "flatten": "reshape", "unsqueeze": "reshape",
             "squeeze": "reshape", "neg": "neg", "__neg__": "neg", "abs": "abs", "minimum": "clamp"}
# Seeds of an fp32 island (as the ONNX/MIL walk seeds them); normalize & co. are self-contained.
_CHAIN_SEEDS = frozenset({"sum", "mean", "norm", "add_eps", "clamp_eps"})
_SELF_CONTAINED = frozenset({"normalize", "layer_norm", "group_norm", "softmax", "log_softmax"})
# Ops a chain extends through, and matmul which only ends one where it meets the other operand.
_CHAIN_PASS = frozenset({"add", "sub", "mul", "div", "reciprocal", "rsqrt", "sqrt", "pow", "clamp", "transpose",
                         "permute", "reshape", "expand", "neg", "abs", "square"})
_CHAIN_JOIN = frozenset({"matmul"})
_EPS_ARG_OPS = {"normalize": 3, "layer_norm": 4, "group_norm": 3, "batch_norm": 7}  # positional index of eps
_EPS_DEFAULTS = {"normalize": 1e-12, "layer_norm": 1e-5, "group_norm": 1e-5, "batch_norm": 1e-5}


def _max_abs(t) -> float | None:
    if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
        return float(t.detach().abs().amax())
    if isinstance(t, (tuple, list)):
        vals = [v for v in (_max_abs(x) for x in t) if v is not None]
        return max(vals) if vals else None
    return None


def _live(table: dict, t) -> bool:
    """`t` is the tensor recorded in `table` under its id (ids of freed tensors get reused)."""
    ent = table.get(id(t))
    return ent is not None and ent[0]() is t


class _Recorder(TorchFunctionMode):
    """Records max|out| of every torch op inside each module's forward, and the eps constants used.

    It mirrors the island walk of the graphs: outputs of seed ops (sums, means, eps adds) are tagged, an
    elementwise/shape op on a tagged tensor is reported as "op<seed" (inside that island) and stays tagged
    unless it also takes a non-constant tensor from outside (the rescale, where the chain ends).
    """

    def __init__(self, constants: set[int]):
        super().__init__()
        self.stack: list[str] = [""]
        self.ops: dict[str, dict[str, float]] = {}
        self.eps: dict[tuple[str, str, float], None] = {}
        self.constants = constants                   # ids of parameters and buffers
        self.paused = False                          # set while the hooks measure (not model ops)
        self._tags: dict[int, tuple[Any, str]] = {}    # id -> (weakref, seed) of tensors inside an island chain
        self._squares: dict[int, tuple[Any, str, float]] = {}  # pending x*x: id -> (weakref, module, max)
        # pending activation x activation matmuls: id -> (weakref, module, max, operand ids)
        self._products: dict[int, tuple[Any, str, float, list[int]]] = {}

    def _note(self, mod: str, op: str, value: float | None) -> None:
        if value is not None:
            d = self.ops.setdefault(mod, {})
            d[op] = max(d.get(op, 0.0), value)

    def _tag(self, t) -> str | None:
        return self._tags[id(t)][1] if _live(self._tags, t) else None

    def _set_tag(self, t, seed: str) -> None:
        if isinstance(t, torch.Tensor):
            self._tags[id(t)] = (weakref.ref(t), seed)

    def _claim_products(self, t, seed: str) -> None:
        """A rescaled numerator made of matmuls of activations belongs to the island (as in the graphs)."""
        if not _live(self._products, t):
            return
        todo = [id(t)]
        while todo:
            ent = self._products.pop(todo.pop(), None)
            if ent is not None:
                self._note(ent[1], f"matmul<{seed}", ent[2])
                todo.extend(ent[3])

    def flush(self) -> None:
        """After a batch: squares no reduction consumed and products no rescale claimed are plain fp16 ops."""
        for ref, mod, v in self._squares.values():
            self._note(mod, "mul", v)
        for ref, mod, v, _ in self._products.values():
            self._note(mod, "matmul", v)
        self._squares.clear()
        self._products.clear()
        self._tags.clear()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        op = _OP_NAMES.get(getattr(func, "__name__", ""))
        if op is None or self.paused:
            return out
        mod = self.stack[-1]
        scalars = [a for a in args[1:] if isinstance(a, float)] + [v for v in kwargs.values() if isinstance(v, float)]
        tensors = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
        if op in _EPS_ARG_OPS:
            idx = _EPS_ARG_OPS[op]
            eps = kwargs.get("eps", args[idx] if len(args) > idx else _EPS_DEFAULTS[op])
            self.eps[(mod, op, float(eps))] = None
        if op == "normalize":  # the sum of |x|^p inside it runs in the backend's reduction
            p = float(kwargs.get("p", args[1] if len(args) > 1 else 2.0))
            dim = kwargs.get("dim", args[2] if len(args) > 2 else 1)
            self._note(mod, "sum_of_powers<normalize", float(args[0].detach().abs().pow(p).sum(dim).amax()))
        elif op in ("add", "clamp") and any(is_tiny_eps(c) for c in scalars):
            op = f"{op}_eps"
            self.eps[(mod, op, next(c for c in scalars if is_tiny_eps(c)))] = None
        elif op == "mul" and len(tensors) == 2 and tensors[0] is tensors[1] or op == "pow" and 2.0 in scalars + [
                a for a in args[1:] if isinstance(a, int)]:
            op = "square"
        value = _max_abs(out)
        if op == "square":  # reported when a reduction consumes it (inside the island) or at the end
            self._squares[id(out)] = (weakref.ref(out), mod, value or 0.0)
            return out
        if op in ("sum", "mean", "norm") and tensors and _live(self._squares, tensors[0]):
            _, smod, sv = self._squares.pop(id(tensors[0]))
            self._note(smod, f"square<{op}", sv)
        seeds = [s for s in (self._tag(t) for t in tensors) if s]
        if op in _CHAIN_SEEDS:
            self._set_tag(out, op)
        elif seeds and (op in _CHAIN_PASS or op in _CHAIN_JOIN):
            outside = [t for t in tensors if self._tag(t) is None and id(t) not in self.constants]
            if not (op in _CHAIN_JOIN and not outside):
                op = f"{op}<{seeds[0]}"
                if not outside:
                    self._set_tag(out, seeds[0])
                elif op.split("<")[0] in ("mul", "div"):
                    for t in outside:
                        self._claim_products(t, seeds[0])
        elif op == "matmul" and len(tensors) == 2 and not any(id(t) in self.constants for t in tensors):
            self._products[id(out)] = (weakref.ref(out), mod, value or 0.0,
                                       [id(t) for t in tensors if _live(self._products, t)])
            return out
        self._note(mod, op, value)
        return out


@torch.no_grad()
def analyze_fp16_ranges(deploy_model: nn.Module, inputs: torch.Tensor | Iterable[torch.Tensor],
                        policy: PrecisionPolicy | None = None, batch_size: int = 16) -> Fp16Analysis:
    """Run `inputs` (fp32 NCHW, a tensor or an iterable of batches) through `deploy_model` in fp32 and record
    per-module and per-op activation max|x| and the eps constants in use; hazards are matched to `policy`."""
    policy = policy or default_policy()
    batches = inputs.split(batch_size) if isinstance(inputs, torch.Tensor) else inputs
    rec = _Recorder({id(t) for t in list(deploy_model.parameters()) + list(deploy_model.buffers())})
    module_max: dict[str, float] = {}
    types: dict[str, str] = {}
    handles = []

    def pre(name):
        def hook(_m, _inp):
            rec.stack.append(name)
        return hook

    def post(name):
        def hook(_m, _inp, out):
            rec.stack.pop()
            rec.paused = True
            v = _max_abs(out)
            rec.paused = False
            if v is not None:
                module_max[name] = max(module_max.get(name, 0.0), v)
        return hook

    for name, m in deploy_model.named_modules():
        types[name or "<model>"] = type(m).__name__
        handles.append(m.register_forward_pre_hook(pre(name or "<model>")))
        handles.append(m.register_forward_hook(post(name or "<model>")))
    was_training = deploy_model.training
    deploy_model.eval()
    n = 0
    try:
        with rec:
            for xb in batches:
                deploy_model(xb.float())
                n += xb.shape[0]
                rec.flush()
    finally:
        for h in handles:
            h.remove()
        deploy_model.train(was_training)

    eps_uses = []
    for (mod, op, value) in rec.eps:
        f16 = float(np.float16(value))
        flush = fp16_flushes_to_zero(value)
        recip = value != 0 and (f16 == 0 or 1.0 / f16 > FP16_MAX)
        hazard = flush or (op == "add_eps" and recip)
        eps_uses.append(EpsUse(mod, op, value, f16, flush, recip, hazard))
    for name, m in deploy_model.named_modules():  # eps held as attributes (informational: usage unknown)
        v = getattr(m, "eps", None)
        if isinstance(v, float):
            f16 = float(np.float16(v))
            eps_uses.append(EpsUse(name, "attr", v, f16, fp16_flushes_to_zero(v), 1.0 / max(f16, 1e-45) > FP16_MAX,
                                   False))

    hazards = []
    for mod, ops in rec.ops.items():
        for op, v in ops.items():
            if v > FP16_MAX or not np.isfinite(v):
                hazards.append(Fp16Hazard(mod, op, "overflow", v, policy.covers(op)))
    for e in eps_uses:
        if e.hazard:
            kind = "eps_underflow" if e.flushes_to_zero else "eps_reciprocal_overflow"
            hazards.append(Fp16Hazard(e.module, e.op, kind, e.value, policy.covers(e.op)))
    modules = {name: {"type": types.get(name, ""), "max_abs": v, "ops": rec.ops.get(name, {})}
               for name, v in module_max.items()}
    return Fp16Analysis(n, modules, eps_uses, hazards)


def check_fp16_safe(analysis: Fp16Analysis, policy: PrecisionPolicy | None = None) -> None:
    """Raise VitedgeError naming the first module that would produce inf/NaN in fp16 outside the policy's
    fp32 islands."""
    policy = policy or default_policy()
    bad = [h for h in analysis.hazards if policy.covers(h.op) is None]
    if bad:
        more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
        raise VitedgeError(f"fp16 is unsafe: {bad[0].describe()} outside the precision policy's fp32 islands"
                           f"{more}; export with --precision fp32 (or fix the weights' scale)")


__all__ = ["Fp16Analysis", "Fp16Hazard", "EpsUse", "analyze_fp16_ranges", "check_fp16_safe"]
