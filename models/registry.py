"""Model registry: name -> constructor, default size, accepted sizes, family (timm-style decorator)."""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Callable

import torch.nn as nn

from ..errors import VitedgeError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


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
    mean: tuple = IMAGENET_MEAN
    std: tuple = IMAGENET_STD

    def accepted_sizes(self) -> str:
        if self.fixed_imgsz is not None:
            return f"{self.fixed_imgsz} only" + (f" ({self.sizes_note})" if self.sizes_note else "")
        return f"multiples of {self.stride}" + (f" ({self.sizes_note})" if self.sizes_note else "")

    def check_imgsz(self, imgsz: int, overrides: dict | None = None) -> None:
        """Raise VitedgeError when the model cannot run at `imgsz`."""
        fixed = self.fixed_size(overrides or {})
        if imgsz <= 0:
            raise VitedgeError(f"--imgsz must be positive, got {imgsz}")
        if fixed is not None and imgsz != fixed:
            raise VitedgeError(
                f"{self.name} accepts only --imgsz {fixed} ({self.sizes_note or 'fixed-size positional encodings'}); got {imgsz}")
        if fixed is None and self.stride and imgsz % self.stride:
            raise VitedgeError(
                f"{self.name} needs --imgsz divisible by {self.stride}; got {imgsz} (try {max(self.stride, round(imgsz / self.stride) * self.stride)})")

    def fixed_size(self, overrides: dict) -> int | None:
        if self.fixed_imgsz is None:
            return None
        return int(overrides.get("img_size", self.fixed_imgsz))


_REGISTRY: dict[str, ModelSpec] = {}


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


def _ensure_loaded() -> None:
    # Importing the family modules runs their @register_model decorators.
    from . import swiftformer, slab_deit, slab_swin, sima_xcit  # noqa: F401
    from . import slab_pvt, slab_cswin, sima_deit  # noqa: F401


def get_spec(name: str) -> ModelSpec:
    _ensure_loaded()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise VitedgeError(f"unknown model {name!r}: {hint}run `vitedge models` for the list")
    return _REGISTRY[name]


def list_models(family: str | None = None) -> list[str]:
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
