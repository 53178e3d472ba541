"""A model's outputs as the exported artifacts name and carry them (torch-free: the graph-level code reads it).

One output is a classifier's `logits`; several (a backbone's feature maps: models/features.py, a user's own heads)
each have a name, a shape per sample and, for a feature map, its stride. The parity ladder keeps several outputs
side by side per sample (`pack_arrays`: one row per sample, each output a block of columns, `output_columns`
saying which), so every hop judges each output as its own set of rows.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

LOGITS = "logits"   # the one output of a classifier (the ONNX / CoreML output name)


@dataclass(frozen=True)
class OutputSpec:
    """One output of an exported module: its name, its shape per sample and, for a feature map, its stride."""
    name: str
    shape: tuple                      # per sample, e.g. (C, H, W)
    stride: int | None = None

    def as_dict(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d


def feature_name(stride: int) -> str:
    return f"feat_s{stride}"


def pack_arrays(outs: Sequence[np.ndarray]) -> np.ndarray:
    """`pack` for a runtime's outputs (numpy arrays in the exported order)."""
    outs = [np.asarray(o) for o in outs]
    if len(outs) == 1:  # (a classifier's (batch, classes) logits as they are)
        return outs[0] if outs[0].ndim == 2 else outs[0].reshape(outs[0].shape[0], -1)
    return np.concatenate([o.reshape(o.shape[0], -1) for o in outs], axis=1)


def output_columns(specs: Sequence[OutputSpec]) -> tuple[tuple[str, int], ...]:
    """(name, number of values per sample) of each output, in the packed order (`pack`)."""
    return tuple((s.name, int(np.prod(s.shape))) for s in specs)


def column_slices(columns) -> tuple[tuple[str, slice], ...]:
    """(name, the slice of a packed row it occupies) of each output, from (name, values per sample) pairs in the
    packed order (`output_columns`)."""
    out, start = [], 0
    for name, n in columns:
        out.append((name, slice(start, start + int(n))))
        start += int(n)
    return tuple(out)
