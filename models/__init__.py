"""Train-form models in the official checkpoint layouts, their registry and safe checkpoint loading.

The registry and the model modules import torch; they load on first use so that `vitedge models` (which
reads the shipped catalog) starts without it.
"""
from __future__ import annotations

import importlib
import sys as _sys
import types as _types

from ..errors import CheckpointError, VitedgeError

_LAZY = {"ModelSpec": ".registry", "create_model": ".registry", "get_spec": ".registry", "list_models": ".registry",
         "register_model": ".registry", "make_trained_like": ".trained_like"}

__all__ = ["CheckpointError", "VitedgeError", "ModelSpec", "create_model", "get_spec", "list_models",
           "register_model", "make_trained_like"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Models(_types.ModuleType):
    """`vitedge.models` is both this package and the public `vitedge.models()` call (the catalog as data, see
    catalog.models): the package's own module object is made callable, so `import vitedge.models.registry` and
    `vitedge.models(family="slab")` both keep working."""

    def __call__(self, family: str | None = None) -> list[dict]:
        """`vitedge models` as data (also `vitedge models --json`): one dict per registered model, sorted by name,
        with the keys name, family, params (int), gmacs (float: multiply-accumulates of one 1x3xHxW eval forward
        at default_imgsz, matmul/conv/linear only), default_imgsz (int) and accepted_sizes (str). `family`
        ("swiftformer", "slab", "sima", "sima_deit") keeps that family's models; an unknown one raises
        VitedgeError listing the families."""
        from .catalog import models

        return models(family)


_sys.modules[__name__].__class__ = _Models
