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

from ...errors import VitedgeError
from ...models.checkpoints import Identified, identify, load_checkpoint, resolve_checkpoint
from ...models.digest import sha256_file
from ...models.checkpoints.dense import load_dense_checkpoint
from ...models.features import FeatureMaps, make_trained_like_norms
from ...models.preprocess import RECIPE_FLAGS, Recipe
from ...models.registry import create_model, recipe_of, resolve_imgsz, set_input_size
from ...models.trained_like import make_trained_like
from ...targets.labels import CarriedLabels
from . import reparameterize
from ..core.report import ReparamInfo

DEMO_SEED = 0  # trained-like demo weights when no checkpoint is given

__all__ = ["DEMO_SEED", "Loaded", "model_name", "identify_checkpoint", "carried_labels", "preprocess_recipe",
           "build_train_form", "resolve_imgsz", "build_deploy_form", "reparam_info"]


@dataclass
class Loaded:
    model: nn.Module
    name: str
    weights: str                  # "untrained" | "checkpoint" | "module" (report.WEIGHTS)
    checkpoint_sha256: str | None
    overrides: dict
    labels: CarriedLabels | None = None   # class names the checkpoint carries (a transformers id2label)
    from_checkpoint: dict | None = None   # what the checkpoint determined (report.json `from_checkpoint`)
    checkpoint_imgsz: int | None = None   # the size the checkpoint's preprocessing crops to (its default size)

    resized: list | None = None           # what the train-form changed to run at its size (`at_size`)

    def resolve_imgsz(self, imgsz=None):
        """`imgsz` (S or (H, W)), else the model's default size (its checkpoint's, where it says one), checked
        against the sizes the model accepts."""
        return resolve_imgsz(self.model, imgsz, self.checkpoint_imgsz)

    def at_size(self, imgsz=None):
        """`resolve_imgsz`, and the train-form made to run at that size by its family's convention (its position
        tables resampled, its windows padded: models/registry.py `set_input_size`); that train-form is the
        reference of every hop. Returns the size; `resized` says what changed."""
        imgsz = self.resolve_imgsz(imgsz)
        if hasattr(self.model, "set_input_size") or self.resized is None:  # (a verified base's deploy-form: kept)
            self.resized = set_input_size(self.model, imgsz)
        return imgsz

    def sized(self, imgsz) -> nn.Module:
        """The train-form at `imgsz` (`at_size`), for a caller that rebuilds it."""
        self.at_size(imgsz)
        return self.model

    def facts(self) -> dict:
        """The report.json fields that describe these weights and how they are fed."""
        return {"weights": self.weights, "checkpoint_sha256": self.checkpoint_sha256, "overrides": self.overrides,
                "preprocess": recipe_of(self.model).to_dict(), "from_checkpoint": self.from_checkpoint,
                "resized": list(self.resized or [])}


def model_name(model: nn.Module) -> str:
    return getattr(model, "vitedge_name", None) or type(model).__name__.lower()


def identify_checkpoint(model_or_name, checkpoint, overrides: dict | None = None, labels=None,
                        option_labels=None, dense: bool = False) -> tuple[Identified | None, object]:
    """(the checkpoint read once and the model it determines (models/checkpoints/identify_model.py), the class
    names): the identified checkpoint is None without a checkpoint or for a module given as is; the class names are
    `labels`, else `option_labels` (options["labels"]), else those the checkpoint carries (`carried_labels`), else
    None. `dense` (--features): the checkpoint is a backbone's or a detection model's, read by
    models/checkpoints/dense.py when the train-form is built (not identified here)."""
    identified = None
    if checkpoint is not None and dense and not isinstance(model_or_name, nn.Module):
        if model_or_name is None:  # a detection checkpoint does not say which backbone it holds
            raise VitedgeError("--features with --checkpoint needs --model: the backbone the checkpoint holds")
    elif checkpoint is not None and not isinstance(model_or_name, nn.Module):
        identified = identify(checkpoint, model_or_name, overrides)
    elif model_or_name is None:
        raise VitedgeError("--model is needed (or a --checkpoint that names its model: a transformers folder with "
                           "config.json, or timm:NAME)")
    labels = labels if labels is not None else option_labels
    return identified, labels if labels is not None else carried_labels(identified)


def carried_labels(identified: Identified | None) -> CarriedLabels | None:
    """The class names a checkpoint carries, standing in for --labels (targets/labels.py)."""
    if identified is None or identified.labels is None:
        return None
    return CarriedLabels(identified.labels, f"the class names of {identified.where} (config.json id2label)")


def preprocess_recipe(model: nn.Module, identified: Identified | None = None, preprocess: dict | None = None) -> Recipe:
    """The eval preprocessing `model` is fed with: the checkpoint's preprocessor_config.json, else the model's
    registered one, with the user's `preprocess` fields (crop_pct, interpolation, mean, std) over it."""
    base = identified.recipe if identified is not None and identified.recipe is not None else recipe_of(model)
    given = dict(preprocess or {})
    unknown = sorted(set(given) - set(RECIPE_FLAGS))
    if unknown:
        raise VitedgeError(f"preprocess keys are {', '.join(RECIPE_FLAGS)}; got {', '.join(unknown)}")
    return base.replace("the user's overrides", **given)


def build_train_form(model_or_name, checkpoint: str | Path | None = None, overrides: dict | None = None,
                     seed: int = DEMO_SEED, *, identified: Identified | None = None,
                     preprocess: dict | None = None, features=None) -> Loaded:
    """The train-form in eval mode: from a checkpoint, or seeded trained-like demo weights (untrained).
    `model_or_name` None: the model the checkpoint names (a transformers folder). `identified`: the checkpoint as
    `identify_checkpoint` read it (not read again). `preprocess`: eval preprocessing fields over the model's own.
    `features` ("default" or feature map positions): the backbone's feature maps instead of its logits
    (models/features.py FeatureMaps, its detection norms seeded trained-like without a checkpoint)."""
    overrides = dict(overrides or {})
    sha, dense = None, None
    if isinstance(model_or_name, nn.Module):
        if overrides:
            raise VitedgeError("overrides apply to model names only; build the module with them instead")
        model, weights = model_or_name, "module"
        overrides = dict(getattr(model, "vitedge_overrides", {}))
        if checkpoint is not None:  # hf-hub: / timm: sources become a file in the Hugging Face cache first
            path = Path(resolve_checkpoint(checkpoint, getattr(model, "vitedge_name", None)))
            if not path.exists():
                raise VitedgeError(f"checkpoint {path} not found; check the --checkpoint path")
            load_checkpoint(model, path)
            weights, sha = "checkpoint", sha256_file(path) if path.is_file() else identify(path).digest()
    elif features is not None and checkpoint is not None and isinstance(model_or_name, str):
        model = FeatureMaps(create_model(model_or_name, **overrides), None if features == "default" else features)
        path = Path(resolve_checkpoint(checkpoint, model_or_name))
        dense = load_dense_checkpoint(model, path)
        weights, sha = "checkpoint", sha256_file(path) if path.is_file() else None
        features = None  # (wrapped already)
    elif model_or_name is None or isinstance(model_or_name, str):
        identified = identified or identify_checkpoint(model_or_name, checkpoint, overrides)[0]
        if identified is not None:
            model = create_model(identified.name, **identified.overrides)
            load_checkpoint(model, identified.raw, where=identified.where)
            weights, sha, overrides = "checkpoint", identified.digest(), dict(identified.overrides)
        else:
            model, weights = create_model(model_or_name, **overrides), "untrained"
            make_trained_like(model, seed)  # realistic statistics make the demo's parity meaningful
    else:
        raise VitedgeError(f"expected a model name or an nn.Module; got {type(model_or_name).__name__}")
    if features is not None:
        model = FeatureMaps(model, None if features == "default" else features)
        if weights == "untrained":
            make_trained_like_norms(model, seed)
    model.vitedge_recipe = preprocess_recipe(model, identified, preprocess)
    if any(p.dtype != torch.float32 for p in model.parameters() if p.is_floating_point()):
        model = copy.deepcopy(model).float()  # the ladder's reference is the float32 train-form
    notes = dict(identified.notes, layout=identified.layout) if identified is not None else dense
    return Loaded(model.eval(), model_name(model), weights, sha, overrides, carried_labels(identified), notes,
                  identified.imgsz if identified is not None else None)


def build_deploy_form(model: nn.Module, imgsz: int, reparam: bool = True, attn_order: str = "auto",
                      strict_schedule: bool = False, rewrites=True) -> tuple[nn.Module, nn.Module]:
    """(deploy-form in float32, the same in float64). The engine folds in float64 and rounds once, so the
    float64 gate checks the fold itself and the float32 weights carry a single rounding."""
    if not reparam:
        deploy = copy.deepcopy(model).eval()
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
                       attention_reason=d.get("attention_reason", {}),
                       attention_blocks=d.get("attention_blocks", {}), schedule=d.get("schedule", []),
                       rewrites=d.get("rewrites", []))
