"""vitedge: re-parameterize, export and verify efficient vision transformers for devices.

Public API (lazily imported so `vitedge --help` stays fast), one call per command, each returning what the command
writes: export, parity, bench, package, matrix, models (the `vitedge models` rows); and the building blocks
create_model, list_models, get_spec, load_checkpoint, make_trained_like, reparameterize, verify_equivalence,
load_deploy_checkpoint, save_deploy_checkpoint, VitedgeError, CheckpointError; and ExportSettings, what the commands
take (each also builds it from its keywords). Reference: docs/api.md.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings

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


# ---- moved modules ------------------------------------------------------------------------------------------
# exporter/ was grouped by job (core, reparam, onnx, verdict, quantize, flow, timing, packaging, matrix) and the
# TensorRT and ONNX targets became packages. Each old module path stays an alias of its new module for one release:
# importing it gives the very same module object and a DeprecationWarning naming the new path. One table, one finder
# (installed below on sys.meta_path); `vitedge.targets.tensorrt` is itself the new package and serves its old names.
_MOVED_GROUPS = {
    "core": "report progress outdir digests allocator target_plans",
    "reparam": "forms",
    "onnx": "onnx_choice onnx_dynamo onnx_export",
    "verdict": "criteria parity parity_cost emulate images inputs localize probe weight_check truth_cache hops "
               "equivalence classes fp16_ranges",
    "quantize": "calibrate compressed",
    "flow": "pipeline verify deploy_checkpoint hub",
    "timing": "bench bench_api bench_artifact bench_report latency device_bench iphone",
    "packaging": "package package_android bundle",
}
_MOVED = {f"vitedge.exporter.{m}": f"vitedge.exporter.{g}.{m}" for g, ms in _MOVED_GROUPS.items() for m in ms.split()}
_MOVED.update({f"vitedge.targets.{old}": f"vitedge.targets.{new}" for old, new in {
    "ort": "onnx.target", "ort_fusions": "graph.fusions", "tensorrt_api": "tensorrt.api",
    "tensorrt_precision": "tensorrt.precision", "cuda_memory": "tensorrt.cuda_memory"}.items()})


class _MovedModules:
    """Meta-path finder and loader for _MOVED: the old name resolves to the new module object itself."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in _MOVED else None

    def create_module(self, spec):
        warnings.warn(f"{spec.name} moved to {_MOVED[spec.name]}; import it from there (the old path goes in the "
                      f"next release)", DeprecationWarning, stacklevel=2)  # 2: the importing line (importlib skipped)
        module = importlib.import_module(_MOVED[spec.name])
        spec.loader_state = module.__spec__  # the import system sets __spec__ to the alias's: exec_module restores it
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state


if not any(type(f).__name__ == "_MovedModules" for f in sys.meta_path):  # once, even if vitedge is re-imported
    sys.meta_path.append(_MovedModules())
