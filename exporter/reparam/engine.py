"""The re-parameterization engine: fold plans (one per model module), a summary of what was folded, schedule check."""
from __future__ import annotations

import copy
import importlib
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

from ...errors import VitedgeError
from ...models.layers.attention import ORDERS
from ...models.layers.norms import LinearNorm
from ...models.features import FeatureMaps
from ...models.registry import create_model, model_modules, resolve_imgsz, sized
from .primitives import ChannelAffine, affine_after, bn_affine, require_repbn_affine


@dataclass
class ReparamSummary:
    folded: Counter = field(default_factory=Counter)
    unfolded: list = field(default_factory=list)          # [{"module", "why"}]
    attention_order: dict = field(default_factory=dict)   # module path -> "qk_first" | "kv_first"
    attention_reason: dict = field(default_factory=dict)  # module path -> why
    # module path -> the SLA / SimA block's rule, real N, N', d at that size, costs and order (layers/attention.py
    # order_record); softmax blocks have no order to choose and are not listed
    attention_blocks: dict = field(default_factory=dict)
    schedule: list = field(default_factory=list)          # [{"module", "lambda"}] for unfinished LinearNorms
    rewrites: list = field(default_factory=list)          # names of deploy-form rewrites applied

    def to_dict(self) -> dict:
        return {"folded": dict(sorted(self.folded.items())), "unfolded": list(self.unfolded),
                "attention_order": dict(self.attention_order), "attention_reason": dict(self.attention_reason),
                "attention_blocks": dict(self.attention_blocks),
                "schedule": list(self.schedule), "rewrites": list(self.rewrites)}


@dataclass
class BlockCheck:
    """A pair of modules whose outputs the equivalence gate compares (block by block).

    `to_train` maps the deploy module's output into the train module's layout (None = same layout).
    """
    name: str
    train_path: str
    deploy_path: str
    to_train: Callable[[torch.Tensor], torch.Tensor] | None = None


@dataclass
class FoldContext:
    imgsz: int
    attn_order: str = "auto"
    enabled: frozenset | None = None  # the deploy-form rewrites switched on (None = every one of the plan's)
    summary: ReparamSummary = field(default_factory=ReparamSummary)
    blocks: list = field(default_factory=list)

    def use(self, name: str) -> bool:
        """Whether rewrite `name` is switched on; if so it is recorded as applied, so ask right where it applies."""
        if name not in _ALL_REWRITES:
            raise KeyError(f"rewrite {name!r} is not declared by any fold plan (register_plan(..., rewrites=...))")
        on = self.enabled is None or name in self.enabled
        if on:
            self.rewrite(name)
        return on

    def fold(self, kind: str, n: int = 1) -> None:
        self.summary.folded[kind] += n

    def unfold(self, module: str, why: str) -> None:
        self.summary.unfolded.append({"module": module, "why": why})

    def order(self, module: str, order: str, why: str, record: dict | None = None) -> None:
        """Record `module`'s attention order and why; `record`: an SLA / SimA block's `order_record`."""
        self.summary.attention_order[module] = order
        self.summary.attention_reason[module] = why
        if record is not None:
            self.summary.attention_blocks[module] = record

    def rewrite(self, name: str) -> None:
        if name not in self.summary.rewrites:
            self.summary.rewrites.append(name)

    def check(self, name: str, train_path: str, deploy_path: str | None = None, to_train=None) -> None:
        self.blocks.append(BlockCheck(name, train_path, deploy_path or train_path, to_train))


FoldPlan = Callable[[nn.Module, FoldContext], nn.Module]
_PLANS: dict[type, FoldPlan] = {}
_REWRITES: dict[type, tuple[str, ...]] = {}
_ALL_REWRITES: set[str] = set()


def register_plan(*classes: type, rewrites: tuple[str, ...] = ()):
    """Register `plan(model_copy, ctx) -> deploy_model` for train-form model classes, with the names of the
    deploy-form rewrites it can apply (each exact and each switchable: the plan asks `ctx.use(name)`)."""

    def deco(fn: FoldPlan) -> FoldPlan:
        for c in classes:
            _PLANS[c] = fn
            _REWRITES[c] = tuple(rewrites)
        _ALL_REWRITES.update(rewrites)
        return fn

    return deco


def available_rewrites(model: nn.Module | str) -> tuple[str, ...]:
    """The deploy-form rewrites the fold plan of `model` (a train-form module or a registered name) can apply."""
    _ensure_plans()
    if isinstance(model, str):
        with torch.device("meta"):
            model = create_model(model)
    if type(model) in _PLANS:
        return _REWRITES[type(model)]
    return tuple(dict.fromkeys(r for _, m in embedded_backbones(model) for r in _REWRITES[type(m)]))


def embedded_backbones(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The outermost submodules of `model` that have a fold plan (a FeatureMaps' backbone, the backbone inside a
    user's own detection or segmentation model), as (path, module); a VitedgeError when there is none."""
    found: list[tuple[str, nn.Module]] = []
    for path, m in model.named_modules():
        if path and type(m) in _PLANS and not any(path.startswith(p + ".") for p, _ in found):
            found.append((path, m))
    if not found:
        raise VitedgeError(f"no re-parameterization plan for {type(model).__name__}, and it embeds no vitedge "
                           "backbone: build the backbone with vitedge.create_model")
    return found


def plan_embedded(model: nn.Module, ctx: FoldContext) -> nn.Module:
    """The fold plan of a module without its own (a FeatureMaps, a user's head on a backbone): every embedded
    backbone folded by its family's plan and put back in place (its gate checks under its path), and a
    FeatureMaps' per-output modules folded (`fold_tap_module`). The rest of the module (a user's neck and heads)
    is kept as it is; the float64 gate covers the whole module."""
    for path, backbone in embedded_backbones(model):
        first = len(ctx.blocks)
        folded = _PLANS[type(backbone)](backbone, ctx)
        for c in ctx.blocks[first:]:
            c.name, c.train_path, c.deploy_path = (f"{path}.{c.name}", f"{path}.{c.train_path}",
                                                   f"{path}.{c.deploy_path}")
        parent, _, leaf = path.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, folded)
    if isinstance(model, FeatureMaps):
        if hasattr(model.backbone, "head"):  # the classifier is no part of the feature maps' function
            model.backbone.head = nn.Identity()
        for t in model.taps:
            fold_tap_module(model, t.attr, ctx)
    return model


def fold_tap_module(model: FeatureMaps, attr: str, ctx: FoldContext) -> None:
    """A FeatureMaps' per-output module `attr`, folded in place: a BatchNorm or RepBN detection norm into a
    per-channel affine; a LayerNorm kept (it normalizes each position by its own statistics); a sequence of layers
    (XCiT's `fpn{i}`) with each BatchNorm folded into the (transposed) convolution before it, the rest kept."""
    norm = getattr(model, attr, None)
    if norm is None or not any(True for _ in norm.parameters()):  # none, an identity or a max-pool
        return
    if isinstance(norm, nn.LayerNorm):  # (the official Swin and CSWin dense-prediction norms)
        ctx.unfold(attr, "a LayerNorm (the official detection norm) normalizes each position by its own "
                         "statistics: no constant affine to fold")
    elif isinstance(norm, nn.Sequential):
        layers = list(norm)
        for i, m in enumerate(layers):
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                if i == 0 or not isinstance(layers[i - 1], (nn.Conv2d, nn.ConvTranspose2d)):
                    raise VitedgeError(f"{attr}.{i}: a BatchNorm that does not follow a convolution: no fold for it")
                layers[i - 1], layers[i] = affine_after(layers[i - 1], *bn_affine(m)), nn.Identity()
                ctx.fold("conv+bn")
        setattr(model, attr, nn.Sequential(*layers))
    else:
        a, b = (bn_affine(norm) if isinstance(norm, nn.modules.batchnorm._BatchNorm)
                else require_repbn_affine(norm, attr))
        setattr(model, attr, ChannelAffine(a, b, dim=1))
        ctx.fold("detection norm->affine")
    ctx.check(attr, attr)


# Old rewrite names, still accepted (with a FutureWarning) and read from deploy checkpoints that recorded them.
RENAMED_REWRITES = {"tokens_channel_first": "tokens_channels_first"}  # vitedge 0.1.0: SLAB-DeiT's spelling


def current_rewrite_names(names, warn: bool = True) -> list[str]:
    """`names` with renamed rewrites replaced by their current names (a FutureWarning per old name if `warn`)."""
    out = []
    for n in names:
        new = RENAMED_REWRITES.get(n)
        if new is not None and warn:
            warnings.warn(f"rewrite name {n!r} is deprecated; use {new!r}", FutureWarning, stacklevel=3)
        out.append(new or n)
    return out


def resolve_rewrites(model: nn.Module, rewrites) -> frozenset:
    """`rewrites`: True (all of the plan's), False/None (none), or an iterable of rewrite names (old names of
    renamed rewrites are accepted with a FutureWarning)."""
    known = available_rewrites(model)
    if rewrites is True:
        return frozenset(known)
    if rewrites is False or rewrites is None:
        return frozenset()
    if isinstance(rewrites, str):
        rewrites = [r for r in rewrites.split(",") if r.strip()]
    names = current_rewrite_names([str(r).strip() for r in rewrites])
    bad = [n for n in names if n not in known]
    if bad:
        raise VitedgeError(f"unknown rewrite {', '.join(map(repr, bad))} for {type(model).__name__}; its rewrites: "
                           f"{', '.join(known) or 'none'} (or all / none)")
    return frozenset(names)


def _ensure_plans() -> None:
    # The module list is the models registry's: each model module names its fold plan module here, whose
    # @register_plan runs on import.
    for module in model_modules():
        importlib.import_module(f"{__package__}.{module.plan}")


def schedule_state(model: nn.Module) -> list[dict]:
    """LinearNorms whose LN->RepBN schedule has not finished: their next training lambda > 0 (or warm-up left)."""
    out = []
    for name, m in model.named_modules():
        if isinstance(m, LinearNorm) and (int(m.warm) > 0 or float(m.lam()) > 0):
            out.append({"module": name, "lambda": round(float(m.lam()), 6), "warm": int(m.warm)})
    return out


def reparameterize(model: nn.Module, imgsz: int | None = None, attn_order: str = "auto",
                   strict_schedule: bool = False, rewrites=True) -> nn.Module:
    """Return the deploy-form of `model` (a new module tree; `model` is untouched).

    `rewrites`: the deploy-speed rewrites beyond folding: True = all of the family's (the default), False =
    folding only, or a collection of names from `available_rewrites(model)` (ablation: each is exact alone).

    The result carries `.reparam_summary` (ReparamSummary) and `.reparam_blocks` (block pairs for the
    equivalence gate). Verify it with `exporter.verdict.equivalence.verify_equivalence`.
    """
    _ensure_plans()
    if attn_order not in ORDERS:
        raise VitedgeError(f"--attn-order must be one of {', '.join(ORDERS)}; got {attn_order!r}")
    imgsz = resolve_imgsz(model, imgsz)
    plan = _PLANS.get(type(model))
    if plan is None:
        embedded_backbones(model)  # (raises where there is none)
        plan = plan_embedded

    ctx = FoldContext(imgsz=imgsz, attn_order=attn_order, enabled=resolve_rewrites(model, rewrites))
    unfinished = schedule_state(model)
    if unfinished:
        lams = ", ".join(f"{u['module']}={u['lambda']}" for u in unfinished[:4])
        more = f" (+{len(unfinished) - 4} more)" if len(unfinished) > 4 else ""
        msg = (f"checkpoint taken before the LN->RepBN schedule finished: lambda {lams}{more}; "
               "using official eval semantics (RepBN only), which differ from the train-mode blend")
        if strict_schedule:
            raise VitedgeError(msg + "; drop --strict-schedule to accept it or finish training")
        warnings.warn(msg, stacklevel=2)
        ctx.summary.schedule = unfinished

    # Fold in float64 and round once to the model's dtype: float32 folding alone leaves ~1e-7 relative
    # error, which would hide real fold bugs under the gate's 1e-9 tolerance. The float64 deploy-form is
    # kept (not as a submodule) for the equivalence gate.
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    # the train-form at that size (its tables resampled or windows padded, in its own dtype: as the reference)
    deploy64 = sized(copy.deepcopy(model), imgsz).double().eval()
    with torch.no_grad():
        deploy64 = plan(deploy64, ctx)
    deploy64.eval()
    for p in deploy64.parameters():
        p.requires_grad_(False)
    deploy = deploy64 if dtype == torch.float64 else copy.deepcopy(deploy64).to(dtype)
    for d in {id(deploy): deploy, id(deploy64): deploy64}.values():
        d.reparam_summary = ctx.summary
        d.reparam_blocks = ctx.blocks
        for attr in ("vitedge_name", "vitedge_overrides", "vitedge_spec", "vitedge_recipe"):
            if hasattr(model, attr):
                setattr(d, attr, getattr(model, attr))
    if deploy is not deploy64:
        deploy.__dict__["reparam_fp64"] = deploy64  # plain attribute: not a submodule, not in the state_dict
    return deploy
