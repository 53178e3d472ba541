"""Train-form models in the official checkpoint layouts, their registry and safe checkpoint loading.

The registry and the model modules import torch; they load on first use so that `vitedge models` (which
reads the shipped catalog) starts without it.
"""
from __future__ import annotations

import importlib

from ..errors import CheckpointError, VitedgeError

_LAZY = {"ModelSpec": ".registry", "create_model": ".registry", "get_spec": ".registry", "list_models": ".registry",
         "register_model": ".registry", "make_trained_like": ".trained_like"}

__all__ = ["CheckpointError", "VitedgeError", "ModelSpec", "create_model", "get_spec", "list_models",
           "register_model", "make_trained_like"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
