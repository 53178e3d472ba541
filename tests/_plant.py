"""Planted errors for sensitivity checks: one output channel of one mid-network weight of an ONNX graph, scaled.

Used by the criteria tests and benchmarks/parity_noise.py (the study that picks the noise rule's floor and K).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

WEIGHT_OPS = ("Conv", "Gemm", "MatMul")


@dataclass(frozen=True)
class Planted:
    node: str         # the node whose weight was changed
    op: str
    initializer: str  # the weight's initializer name
    channel: int      # the output channel scaled
    factor: float


def weight_nodes(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, str, int]]:
    """(node, weight initializer, output-channel axis) of every Conv/Gemm/MatMul whose weight is an initializer
    of rank >= 2, in graph order."""
    inits = {i.name: i for i in model.graph.initializer}
    out = []
    for node in model.graph.node:
        if node.op_type not in WEIGHT_OPS or len(node.input) < 2 or node.input[1] not in inits:
            continue
        w = inits[node.input[1]]
        if len(w.dims) < 2:
            continue
        if node.op_type == "Conv":
            axis = 0
        elif node.op_type == "Gemm":
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            axis = 0 if trans_b else 1
        else:
            axis = len(w.dims) - 1
        out.append((node, node.input[1], axis))
    return out


def plant_channel_scale(model: onnx.ModelProto, factor: float, position: float = 0.5,
                        channel: int | None = None) -> tuple[onnx.ModelProto, Planted]:
    """A copy of `model` with one output channel of the weight of the Conv/Gemm/MatMul at `position` (0..1 along
    the graph's weight nodes; 0.5 = mid-network) multiplied by `factor`. The channel defaults to the middle one.
    A weight shared by several nodes is skipped in favour of the next unshared one."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    cands = weight_nodes(m)
    if not cands:
        raise ValueError("no Conv/Gemm/MatMul with an initializer weight in this graph")
    uses: dict[str, int] = {}
    for node in m.graph.node:
        for i in node.input:
            uses[i] = uses.get(i, 0) + 1
    start = min(int(position * len(cands)), len(cands) - 1)
    order = list(range(start, len(cands))) + list(range(start - 1, -1, -1))
    pick = next((cands[i] for i in order if uses[cands[i][1]] == 1), None)
    if pick is None:
        raise ValueError("every weight initializer is shared")
    node, name, axis = pick
    init = next(i for i in m.graph.initializer if i.name == name)
    w = numpy_helper.to_array(init).copy()
    ch = w.shape[axis] // 2 if channel is None else channel
    idx = [slice(None)] * w.ndim
    idx[axis] = ch
    w[tuple(idx)] = (w[tuple(idx)].astype(np.float64) * factor).astype(w.dtype)
    init.CopyFrom(numpy_helper.from_array(w, name))
    return m, Planted(node.name, node.op_type, name, int(ch), float(factor))
