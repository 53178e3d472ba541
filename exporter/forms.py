"""The two forms of a model, built in one place: checkpoint (or seeded demo weights) -> train-form -> deploy-form.

`export`, `parity`, `vitedge reparam`, `vitedge bench` and `vitedge package` all build their models here, so they
load checkpoints, pick the default size and fold the same way.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from ..errors import VitedgeError
from ..models.checkpoint import load_checkpoint
from ..models.registry import create_model, resolve_imgsz
from ..models.sources import resolve_checkpoint
from ..models.trained_like import make_trained_like
from ..targets.base import sha256_file
from .reparam import reparameterize
from .report import ReparamInfo

DEMO_SEED = 0  # trained-like demo weights when no checkpoint is given

__all__ = ["DEMO_SEED", "Loaded", "model_name", "build_train_form", "resolve_imgsz", "build_deploy_form",
           "reparam_info"]


@dataclass
class Loaded:
    model: nn.Module
    name: str
    weights: str                  # "untrained" | "checkpoint" | "module" (report.WEIGHTS)
    checkpoint_sha256: str | None
    overrides: dict


def model_name(model: nn.Module) -> str:
    return getattr(model, "vitedge_name", None) or type(model).__name__.lower()


def build_train_form(model_or_name, checkpoint: str | Path | None = None, overrides: dict | None = None,
                     seed: int = DEMO_SEED) -> Loaded:
    """The train-form in eval mode: from a checkpoint, or seeded trained-like demo weights (untrained)."""
    overrides = dict(overrides or {})
    if isinstance(model_or_name, str):
        model = create_model(model_or_name, **overrides)
        weights = "untrained"
    elif isinstance(model_or_name, nn.Module):
        if overrides:
            raise VitedgeError("overrides apply to model names only; build the module with them instead")
        model, weights = model_or_name, "module"
        overrides = dict(getattr(model, "vitedge_overrides", {}))
    else:
        raise VitedgeError(f"expected a model name or an nn.Module; got {type(model_or_name).__name__}")
    sha = None
    if checkpoint is not None:  # hf-hub: / timm: sources become a file in the Hugging Face cache first
        path = Path(resolve_checkpoint(checkpoint, getattr(model, "vitedge_name", None)))
        if not path.exists():
            raise VitedgeError(f"checkpoint {path} not found; check the --checkpoint path")
        load_checkpoint(model, path)
        weights, sha = "checkpoint", sha256_file(path)
    elif weights == "untrained":
        make_trained_like(model, seed)  # realistic statistics make the demo's parity meaningful
    if any(p.dtype != torch.float32 for p in model.parameters() if p.is_floating_point()):
        model = copy.deepcopy(model).float()  # the ladder's reference is the float32 train-form
    return Loaded(model.eval(), model_name(model), weights, sha, overrides)


def build_deploy_form(model: nn.Module, imgsz: int, reparam: bool = True, attn_order: str = "auto",
                      strict_schedule: bool = False, rewrites=True) -> tuple[nn.Module, nn.Module]:
    """(deploy-form in float32, the same in float64). The engine folds in float64 and rounds once, so the
    float64 gate checks the fold itself and the float32 weights carry a single rounding."""
    if not reparam:
        deploy = copy.deepcopy(model).eval()
        deploy.reparam_imgsz = imgsz
        return deploy, copy.deepcopy(deploy).double()
    deploy = reparameterize(model, imgsz=imgsz, attn_order=attn_order, strict_schedule=strict_schedule,
                            rewrites=rewrites)
    return deploy, deploy.__dict__.get("reparam_fp64", deploy)


def reparam_info(deploy: nn.Module, reparam: bool = True) -> ReparamInfo:
    """What the re-parameterization did, as the report records it."""
    summary = getattr(deploy, "reparam_summary", None)
    if not reparam or summary is None:
        return ReparamInfo(unfolded=[{"module": "(model)", "why": "--no-reparam: exported in train-form"}])
    d = summary.to_dict()
    return ReparamInfo(folded=d["folded"], unfolded=d["unfolded"], attention_order=d["attention_order"],
                       attention_reason=d.get("attention_reason", {}), schedule=d.get("schedule", []),
                       rewrites=d.get("rewrites", []))
