"""vitedge: re-parameterize, export and verify efficient vision transformers for devices.

Public API (lazily imported so `vitedge --help` stays fast):
  create_model, list_models, load_checkpoint, make_trained_like, reparameterize, verify_equivalence,
  export, parity, matrix, VitedgeError
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_API = {
    "create_model": "vitedge.models.registry",
    "list_models": "vitedge.models.registry",
    "get_spec": "vitedge.models.registry",
    "VitedgeError": "vitedge.errors",
    "CheckpointError": "vitedge.errors",
    "make_trained_like": "vitedge.models.trained_like",
    "load_checkpoint": "vitedge.models.checkpoint",
    "reparameterize": "vitedge.exporter.reparam",
    "verify_equivalence": "vitedge.exporter.equivalence",
    "export": "vitedge.exporter.pipeline",
    "parity": "vitedge.exporter.verify",
    "load_deploy_checkpoint": "vitedge.exporter.deploy_checkpoint",
    "save_deploy_checkpoint": "vitedge.exporter.deploy_checkpoint",
    "matrix": "vitedge.exporter.matrix",
}

__all__ = sorted(_API) + ["__version__"]


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'vitedge' has no attribute {name!r}")
