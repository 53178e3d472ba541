"""vitedge: re-parameterize, export and verify efficient vision transformers for devices.

Public API (lazily imported so `vitedge --help` stays fast), one call per command, each returning what the command
writes: export, parity, bench, package, matrix, models (the `vitedge models` rows); and the building blocks
create_model, list_models, get_spec, load_checkpoint, make_trained_like, reparameterize, verify_equivalence,
load_deploy_checkpoint, save_deploy_checkpoint, VitedgeError, CheckpointError; and ExportSettings, what the commands
take (each also builds it from its keywords). Reference: docs/api.md.
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
    "load_checkpoint": "vitedge.models.checkpoints",
    "reparameterize": "vitedge.exporter.reparam",
    "verify_equivalence": "vitedge.exporter.verdict.equivalence",
    "export": "vitedge.exporter.flow.pipeline",
    "parity": "vitedge.exporter.flow.verify",
    "load_deploy_checkpoint": "vitedge.exporter.flow.deploy_checkpoint",
    "save_deploy_checkpoint": "vitedge.exporter.flow.deploy_checkpoint",
    "matrix": "vitedge.exporter.matrix",
    "bench": "vitedge.exporter.timing.bench_api",
    "package": "vitedge.exporter.packaging.package",
    "ExportSettings": "vitedge.exporter.core.settings",
}
# `vitedge.models` is the models package, made callable: vitedge.models(family=None) -> the `vitedge models` rows
_MODULES = {"models": "vitedge.models"}

__all__ = sorted([*_API, *_MODULES]) + ["__version__"]


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    raise AttributeError(f"module 'vitedge' has no attribute {name!r}")

