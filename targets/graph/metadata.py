"""The `vitedge.*` metadata an exported ONNX graph carries (metadata_props), and the shape of its input.

Written by the pipeline on the base graph, copied onto the fp16 graph by the onnx target, read back by
`vitedge parity` to learn how an artifact was exported.
"""
from __future__ import annotations

import json
from pathlib import Path

import onnx

META_PREFIX = "vitedge."


def set_metadata(model: onnx.ModelProto, meta: dict) -> onnx.ModelProto:
    """Write `meta` into metadata_props as `vitedge.<key>` (non-strings as JSON); replaces earlier values."""
    keep = [p for p in model.metadata_props if not p.key.startswith(META_PREFIX)]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    for k, v in meta.items():
        entry = model.metadata_props.add()
        entry.key = META_PREFIX + k
        entry.value = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    model.producer_name = "vitedge"
    from ... import __version__  # the package root (no imports of its own)
    model.producer_version = __version__
    return model


def read_metadata(model: onnx.ModelProto | str | Path) -> dict:
    """The `vitedge.*` metadata_props as a dict (JSON values decoded)."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    out = {}
    for p in model.metadata_props:
        if p.key.startswith(META_PREFIX):
            try:
                out[p.key[len(META_PREFIX):]] = json.loads(p.value)
            except json.JSONDecodeError:
                out[p.key[len(META_PREFIX):]] = p.value
    return out


def input_shape(model: onnx.ModelProto) -> list:
    """The `image` input's dims (ints, or the dim_param name for a symbolic axis)."""
    dims = model.graph.input[0].type.tensor_type.shape.dim
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in dims]
