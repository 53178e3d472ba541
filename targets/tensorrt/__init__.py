"""The `tensorrt` target as a package: target.py (TensorRTTarget, the Target behind get_target("tensorrt"): a
serialized engine plus its JSON sidecar, and its runner), api.py (the TensorRT Python API table, per major version),
precision.py (precision truth from the engine inspector's JSON) and cuda_memory.py (device buffers, stream, events).

`vitedge.targets.tensorrt` was the target's module before it became this package: its names still resolve here,
lazily, so `from vitedge.targets.tensorrt import TensorRTTarget` keeps working and imports no TensorRT.
"""
from __future__ import annotations

import importlib


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return getattr(importlib.import_module(f"{__name__}.target"), name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
