"""Model registry: name -> constructor, default size, accepted sizes, family (timm-style decorator).

A model's `family` (`ModelSpec.family`: "swiftformer", "slab", "sima", ...) is the paper family users see in
`vitedge models`. The code is organised by model module instead: the one list of them is `MODEL_MODULES`, and
importing `models/<module>.py` registers its models (`register_model`) and its `ModelModule` record
(`register_model_module`), which names the module's fold plan (a module of `vitedge.exporter.reparam`, loaded by
the reparam engine), the checkpoint key remaps that live beside the models, its eval recipe and transformers ports.
One family may span several modules (slab: slab_deit, slab_swin, slab_pvt, slab_cswin).
"""
from __future__ import annotations

import difflib
import importlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch.nn as nn

from ..errors import VitedgeError
from .preprocess import IMAGENET_MEAN, IMAGENET_STD, Recipe
from .input_size import as_hw, canonical, check_stride, size_text
from .size_limit import MAX_IMGSZ, check_size_limit  # noqa: F401  (MAX_IMGSZ: the registry's limit, read here too)

FALLBACK_IMGSZ = 224  # a module that is neither registered nor says its own size

# Loaded in this order; it is also the order in which checkpoint remaps are tried.
MODEL_MODULES = ("swiftformer", "slab_deit", "slab_swin", "sima_xcit", "slab_pvt", "slab_cswin", "sima_deit")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str
    builder: Callable[..., nn.Module]
    default_kwargs: dict = field(default_factory=dict)
    default_imgsz: int = 224
    # Granularity of accepted sizes (e.g. the total stride); None = only `fixed_imgsz`.
    stride: int | None = 32
    # A size the model is locked to (SLAB-DeiT's 14x14 positional encodings), or None.
    fixed_imgsz: int | None = None
    sizes_note: str = ""

    @property
    def recipe(self) -> Recipe:
        """The eval preprocessing of the model's official evaluation (its module's, `register_model_module`)."""
        module = _MODEL_MODULES.get(self.builder.__module__.rsplit(".", 1)[-1])
        return module.recipe if module is not None and module.recipe is not None else Recipe()

    @property
    def mean(self) -> tuple:
        return self.recipe.mean

    @property
    def std(self) -> tuple:
        return self.recipe.std

    def accepted_sizes(self) -> str:
        if self.fixed_imgsz is not None:
            return f"{self.fixed_imgsz} only" + (f" ({self.sizes_note})" if self.sizes_note else "")
        return f"multiples of {self.stride}" + (f" ({self.sizes_note})" if self.sizes_note else "")

    def check_imgsz(self, imgsz, overrides: dict | None = None) -> None:
        """Raise VitedgeError when the model cannot run at `imgsz` (S or (H, W)): the message names the nearest
        valid sizes."""
        fixed = self.fixed_size(overrides or {})
        h, w = as_hw(imgsz)
        if h <= 0 or w <= 0:
            raise VitedgeError(f"--imgsz must be positive, got {size_text(imgsz)}")
        check_size_limit(max(h, w))
        if fixed is not None and (h, w) != (fixed, fixed):
            raise VitedgeError(
                f"{self.name} accepts only --imgsz {fixed} ({self.sizes_note or 'fixed-size positional encodings'}); "
                f"got {size_text(imgsz)}")
        if fixed is None and self.stride:
            check_stride(self.name, imgsz, self.stride)

    def fixed_size(self, overrides: dict) -> int | None:
        if self.fixed_imgsz is None:
            return None
        return int(overrides.get("img_size", self.fixed_imgsz))

    def default_size(self, overrides: dict | None = None) -> int:
        """The size a model built with `overrides` runs at when none is asked for, without building it: its fixed
        size, else the `img_size` it is built for (its position tables' grid), else the spec's default."""
        overrides = overrides or {}
        return self.fixed_size(overrides) or int(overrides.get("img_size") or self.default_imgsz)


@dataclass(frozen=True)
class Remap:
    """A checkpoint key layout a model module accepts: `detect(ckpt_keys, model_keys)` -> whether it applies (always
    decided against the target model's keys); `apply(sd, model_sd)` -> (new state_dict, description)."""
    name: str
    detect: Callable[[set, set], bool]
    apply: Callable[[Mapping, Mapping], tuple[OrderedDict, str]]


@dataclass(frozen=True)
class TransformersPort:
    """A Hugging Face transformers model_type a model module loads (`save_pretrained` folders, hf-hub: repos):
    `from_config(config, where)` -> (registered model name, constructor overrides) from its config.json;
    `layout`: the Remap of its key names to the official ones; `semantics`: constructor overrides its forward
    needs wherever its key layout is loaded (with or without config.json)."""
    model_type: str
    classes: str
    from_config: Callable[[dict, str], tuple[str, dict]]
    layout: Remap
    semantics: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ModelModule:
    """What one models/<module>.py registers beside its models (`register_model_module`)."""
    module: str                 # models/<module>.py: the models and their checkpoint remaps
    plan: str                   # exporter/reparam/<plan>.py: the fold plan
    remaps: tuple = ()          # (Remap, ...)
    recipe: Recipe | None = None  # the official eval preprocessing (None: Recipe()'s ImageNet defaults)
    ports: tuple = ()           # (TransformersPort, ...): Hugging Face transformers model_types it loads


_REGISTRY: dict[str, ModelSpec] = {}
_MODEL_MODULES: dict[str, ModelModule] = {}


def register_model(name: str, family: str, *, default_imgsz: int = 224, stride: int | None = 32,
                   fixed_imgsz: int | None = None, sizes_note: str = "", **default_kwargs):
    """Decorator registering `builder(**kwargs) -> nn.Module` under `name` with its default kwargs."""

    def deco(builder):
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} registered twice")
        _REGISTRY[name] = ModelSpec(name, family, builder, dict(default_kwargs), default_imgsz, stride,
                                    fixed_imgsz, sizes_note)
        return builder

    return deco


def register_model_module(module: str, *, plan: str, remaps: tuple = (), recipe: Recipe | None = None,
                          ports: tuple = ()) -> ModelModule:
    """Called once by each module of MODEL_MODULES (`register_model_module(__name__, plan=...)`)."""
    short = module.rsplit(".", 1)[-1]
    if short not in MODEL_MODULES:
        raise ValueError(f"model module {short!r} is not in registry.MODEL_MODULES")
    _MODEL_MODULES[short] = ModelModule(short, plan, tuple(remaps), recipe, tuple(ports))
    return _MODEL_MODULES[short]


def _ensure_loaded() -> None:
    # Importing a model module runs its register_model / register_model_module calls.
    for module in MODEL_MODULES:
        if module not in _MODEL_MODULES:
            importlib.import_module(f"{__package__}.{module}")


def model_modules() -> list[ModelModule]:
    """Every model module's record, in MODEL_MODULES order."""
    _ensure_loaded()
    return [_MODEL_MODULES[m] for m in MODEL_MODULES]


def checkpoint_remaps() -> tuple[Remap, ...]:
    """Every model module's checkpoint key remaps, in MODEL_MODULES order (each applies only where it detects its
    layout)."""
    return tuple(r for f in model_modules() for r in f.remaps)


def get_spec(name: str) -> ModelSpec:
    """The registry entry of `name`: family, constructor defaults, default size and the sizes it accepts (an
    unknown name raises VitedgeError with the closest registered one)."""
    _ensure_loaded()
    if name not in _REGISTRY:
        lower = {n.lower(): n for n in _REGISTRY}  # suggestions ignore case: SwiftFormer_XS -> swiftformer_xs
        close = [lower[c] for c in difflib.get_close_matches(str(name).lower(), list(lower), n=1)]
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise VitedgeError(f"unknown model {name!r}: {hint}run `vitedge models` for the list")
    return _REGISTRY[name]


def list_models(family: str | None = None) -> list[str]:
    """Every registered model name, sorted (`family`: that family's only)."""
    _ensure_loaded()
    return sorted(n for n, s in _REGISTRY.items() if family is None or s.family == family)


def create_model(name: str, **overrides) -> nn.Module:
    """Build the train-form model `name`; `overrides` use the official constructors' keyword names."""
    spec = get_spec(name)
    kwargs = {**spec.default_kwargs, **overrides}
    try:
        model = spec.builder(**kwargs)
    except VitedgeError:
        raise
    except (TypeError, ValueError, RuntimeError, ZeroDivisionError, IndexError) as e:
        # An override the constructor cannot build is bad input (exit 2), not an internal error.
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise VitedgeError(f"cannot build {name} with overrides {overrides}: {first}; fix the --set values") from None
    model.vitedge_name = name
    model.vitedge_overrides = dict(overrides)
    model.vitedge_spec = spec
    return model


# ---- what a built model says about its input ---------------------------------------------------------

def default_imgsz(model: nn.Module, checkpoint_imgsz=None):
    """The size `model` runs at when none is asked for (S, or (H, W) where a deploy-form or verified base records
    one): its spec's fixed size, else `checkpoint_imgsz` (the size its checkpoint's preprocessing crops to: a
    transformers preprocessor_config.json), else the model's own `img_size` (its pretraining size), else its spec's
    default, else 224."""
    spec = getattr(model, "vitedge_spec", None)
    fixed = spec.fixed_size(getattr(model, "vitedge_overrides", {})) if spec is not None else None
    own = getattr(model, "img_size", None)
    own = own if isinstance(own, int) and not isinstance(own, bool) else None
    return canonical(fixed or checkpoint_imgsz or own or (spec.default_imgsz if spec is not None else FALLBACK_IMGSZ))


def resolve_imgsz(model: nn.Module, imgsz=None, checkpoint_imgsz: int | None = None):
    """`imgsz` (S or (H, W); else the model's default, `default_imgsz`), checked against the sizes a registered
    model accepts, in its one spelling (models/input_size.py `canonical`: S square, (H, W) otherwise)."""
    imgsz = canonical(imgsz or default_imgsz(model, checkpoint_imgsz))
    spec = getattr(model, "vitedge_spec", None)
    if spec is not None:
        spec.check_imgsz(imgsz, getattr(model, "vitedge_overrides", {}))
    return imgsz


def set_input_size(model: nn.Module, imgsz) -> list[dict]:
    """Make the train-form `model` run at `imgsz` (S or (H, W)) by its family's own convention (docs/models.md):
    a model with position tables resamples them, a windowed one pads; the model's `set_input_size((H, W))` does it
    in place and returns what it changed, per tensor ({"tensor", "how", "from", "to"}). The result, also kept on
    the model as `vitedge_resized`, is what report.json's `resized` holds: [] at the model's own size, or for a
    model with nothing tied to its size (convolutions only). A module without the hook (the feature-map wrapper, a
    user's head) resizes the backbones it embeds, their tensors named by their path in it. Idempotent at the size
    it is already at."""
    hook = getattr(model, "set_input_size", None)
    if hook is not None:
        model.vitedge_resized = hook(as_hw(imgsz))
        return model.vitedge_resized
    # a wrapper (feature maps, a user's head on a backbone): the outermost modules that resize, each fed the input
    records, done = [], []
    for name, sub in model.named_modules():
        if name and hasattr(sub, "set_input_size") and not any(name.startswith(f"{d}.") for d in done):
            done.append(name)
            records += [{**r, "tensor": f"{name}.{r['tensor']}"} for r in sub.set_input_size(as_hw(imgsz))]
    if done:
        model.vitedge_resized = records
    return records


def sized(model: nn.Module, imgsz) -> nn.Module:
    """`model` itself, made to run at `imgsz` (`set_input_size`; imgsz None: left as it is). Callers that must not
    change a caller's module pass a copy, resized in its own dtype first (so a float64 copy of a float32 train-form
    holds the same resampled tables as the float32 reference)."""
    if imgsz is not None:
        set_input_size(model, imgsz)
    return model


def transformers_ports() -> dict:
    """{transformers model_type: TransformersPort} over every model module (the model_types a transformers folder of
    `save_pretrained` may hold)."""
    return {p.model_type: p for f in model_modules() for p in f.ports}


def recipe_of(model: nn.Module | ModelSpec | None) -> Recipe:
    """The eval preprocessing `model` is fed with: the one set on it (`vitedge_recipe`: a checkpoint's
    preprocessor_config.json, the user's overrides), else its model module's, else ImageNet defaults."""
    if isinstance(model, ModelSpec):
        return model.recipe
    own = getattr(model, "vitedge_recipe", None)
    if own is not None:
        return own
    spec = getattr(model, "vitedge_spec", None)
    return spec.recipe if spec is not None else Recipe()


def input_stats(model: nn.Module | ModelSpec | None) -> tuple[tuple, tuple]:
    """(mean, std) the model's inputs are normalized with (`recipe_of`)."""
    r = recipe_of(model)
    return tuple(r.mean), tuple(r.std)
