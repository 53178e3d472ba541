"""Backends, one module or package each, behind the interface declared in base.py; graph/ is the torch-free
ONNX/MIL level they share with the pipeline.

TARGETS is the one table of export formats: name -> "module:Class" (imported lazily, so a backend
whose package is missing never breaks the others).
"""
from __future__ import annotations

import importlib

from .base import Artifact, LowerSpec, Runner, Target, UnavailableError

TARGETS: dict[str, str] = {
    "onnx": "vitedge.targets.onnx.target:OnnxTarget",
    "coreml": "vitedge.targets.coreml.target:CoreMLTarget",
    "tensorrt": "vitedge.targets.tensorrt.target:TensorRTTarget",
    "executorch": "vitedge.targets.executorch.target:ExecuTorchTarget",
}

ALIASES = {"trt": "tensorrt", "engine": "tensorrt", "mlpackage": "coreml", "ios": "coreml", "onnxruntime": "onnx",
           "pte": "executorch", "android": "executorch"}


def get_target(name: str) -> Target:
    name = ALIASES.get(name, name)
    mod, cls = TARGETS[name].split(":")
    return getattr(importlib.import_module(mod), cls)()


__all__ = ["TARGETS", "ALIASES", "get_target", "Artifact", "LowerSpec", "Runner", "Target", "UnavailableError"]
