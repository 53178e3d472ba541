"""ONNX export of a deploy-form model: TorchScript export, checker + shape inference, onnxsim.

The `vitedge.*` metadata_props helpers live one layer down (vitedge.targets.graph.metadata): the targets read them.

The graph has one input `image` (float32 NCHW, already normalized with the model's mean/std) and one
output `logits`. Every graph we keep passed `onnx.checker` (full check) and strict shape inference.
"""
from __future__ import annotations

import copy
import io
import warnings
from collections import Counter
from pathlib import Path

import onnx
import torch
import torch.nn as nn

from ..errors import VitedgeError

INPUT_NAME = "image"
OUTPUT_NAME = "logits"
DEFAULT_OPSET = 17
MIN_OPSET = 13  # the oldest opset the tests exercise (per-axis ReduceSum inputs, Gemm broadcasting)
NORM_OPS = ("BatchNormalization", "LayerNormalization", "InstanceNormalization", "GroupNormalization")


class OnnxExportError(RuntimeError):
    """Export, checking or simplification failed; the message says at which step."""


def max_opset() -> int:
    """The newest opset the TorchScript exporter (the path we use) can write."""
    from torch.onnx import _constants

    return min(getattr(_constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", 20), onnx.defs.onnx_opset_version())


def check_opset(opset: int) -> None:
    newest = max_opset()
    if not MIN_OPSET <= opset <= newest:
        raise VitedgeError(f"--opset must be between {MIN_OPSET} and {newest}; got {opset}")


def export_onnx(model: nn.Module, imgsz: int, batch: int | None = 1, opset: int = DEFAULT_OPSET) -> onnx.ModelProto:
    """Trace `model` (eval, fp32, CPU) to ONNX in memory; `batch=None` gives a dynamic batch axis."""
    check_opset(opset)
    if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in model.state_dict().values()
           if t.is_floating_point()):
        model = copy.deepcopy(model).float().cpu()  # never change the caller's model
    model.eval()
    # A dynamic axis is traced at batch 2 so no shape op is specialised on a broadcastable size-1 batch.
    x = torch.zeros(batch or 2, 3, imgsz, imgsz)
    dynamic_axes = None if batch else {INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}}
    buf = io.BytesIO()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer warnings about Python-side shapes are expected here
            torch.onnx.export(model, (x,), buf, dynamo=False, input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                              opset_version=opset, dynamic_axes=dynamic_axes, do_constant_folding=True)
    except Exception as e:  # the exporter raises many types; the pipeline reports the hop as failed
        raise OnnxExportError(f"torch.onnx.export failed: {type(e).__name__}: {_first_line(e)}") from e
    return onnx.load_from_string(buf.getvalue())


def check_onnx(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx.checker (full) and strict shape inference; returns the model with inferred value_info."""
    try:
        onnx.checker.check_model(model, full_check=True)
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except Exception as e:
        raise OnnxExportError(f"ONNX check failed: {type(e).__name__}: {_first_line(e)}") from e
    outs = [o.name for o in inferred.graph.output]
    ins = [i.name for i in inferred.graph.input]
    if ins != [INPUT_NAME] or outs != [OUTPUT_NAME]:
        raise OnnxExportError(f"ONNX graph has inputs {ins} / outputs {outs}; expected [{INPUT_NAME!r}] / [{OUTPUT_NAME!r}]")
    return inferred


def simplify_onnx(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnxsim (constant folding + graph rewrites), then the same checks as the raw export."""
    import onnxsim

    try:
        simplified, ok = onnxsim.simplify(model)
    except Exception as e:
        raise OnnxExportError(f"onnxsim failed: {type(e).__name__}: {_first_line(e)}") from e
    if not ok:
        raise OnnxExportError("onnxsim could not validate its simplified graph")
    # Shape inference output is kept out of the saved file: value_info would only duplicate it.
    check_onnx(simplified)
    return simplified


def node_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Nodes per op type, including any subgraphs (If/Loop bodies), sorted by op type."""
    counts: Counter = Counter()

    def walk(graph):
        for n in graph.node:
            counts[n.op_type] += 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                for g in a.graphs:
                    walk(g)

    walk(model.graph)
    return dict(sorted(counts.items()))


def norm_nodes(counts: dict[str, int]) -> int:
    return sum(counts.get(op, 0) for op in NORM_OPS)


def save_onnx(model: onnx.ModelProto, path: str | Path) -> Path:
    path = Path(path)
    onnx.save(model, str(path))
    return path


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0][:300] if s else ""
