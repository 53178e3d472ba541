"""The weights a saved CoreML package stores, read back from the bytes on disk through the MIL interpreter's own
kernels (the weights check and the localization of a failed compressed hop), and the deploy-form as the package
was built from it (an image input carries 1/std folded into its first conv)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np

from ..base import StoredWeights


def read_package(path: str | Path, function: str | None = None) -> StoredWeights:
    """Every stored weight of the package at `path` (of its `function`; None: the default one), its compressed
    ones for localization, and for an image-input package the fold of 1/std into the reference (inputs scaled by
    std on the way in)."""
    from .convert import fold_input_std
    from .mil_interpreter import load_program

    program = load_program(Path(path), function)
    stored = StoredWeights(package_weights_all(Path(path), function), localize=package_weights(program))
    if program.input_kind == "image":
        pre = json.loads(dict(program.spec.description.metadata.userDefined).get("preprocessing") or "{}")
        imgsz = tuple(int(v) for v in next(iter(program.inputs.values()))[1][-2:])  # (H, W) of the input
        stored.reference = lambda deploy: fold_input_std(copy.deepcopy(deploy).float().eval(), pre["std"], imgsz)[0]
        stored.input_scale = tuple(pre["std"])
    return stored


def _arg(binding, env: dict):
    if isinstance(binding, list):
        return [_arg(b, env) for b in binding]
    kind, v = binding
    return env[v] if kind == "var" else v


def package_weights(program) -> dict[str, np.ndarray]:
    """{MIL weight name without its compression suffixes: decompressed float32 value} for every compressed weight
    of a loaded package program, computed by the interpreter's kernels from the bytes on disk."""
    from ...targets.coreml.mil_ops import OPS, OpArgs

    out = {}
    for o in program.ops:
        if not o.type.startswith("constexpr_"):
            continue
        args = OpArgs(o.type, o.name, {k: _arg(b, program.consts) for k, b in o.inputs.items()},
                      [dt for _, dt in o.outputs])
        name = o.outputs[0][0]
        for suffix in ("_palettized", "_quantized", "_dequantized", "_to_fp16"):
            name = name.removesuffix(suffix)
        out[name] = np.asarray(OPS[o.type](args)[0], np.float32)
    return out


def _is_bias_name(name: str) -> bool:
    """A 1-D MIL const named as a layer's bias (`<layer>_bias`, `<layer>.bias`, with a cast suffix)."""
    for suffix in ("_to_fp16", "_fp16"):
        name = name.removesuffix(suffix)
    return name.replace(".", "_").endswith("_bias")


def package_weights_all(path: Path, function: str | None = None) -> dict[str, np.ndarray]:
    """{MIL name: float32 value} of every float const of rank >= 2, every bias vector and every compressed weight (decompressed by the
    interpreter's kernels) of the saved package."""
    from ...targets.coreml.mil_interpreter import load_program

    program = load_program(path, function)
    out = {name: np.asarray(v, np.float32) for name, v in program.consts.items()
           if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating)
           and (v.ndim >= 2 or (v.ndim == 1 and _is_bias_name(name)))}  # biases are weights too
    out.update(package_weights(program))
    return out
