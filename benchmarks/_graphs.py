"""Models as the benchmark scripts measure them: GFLOP, the project's ONNX builds (image models and single
token layers), node counts, the float64 ground truth and the pipeline's parity rule, and timm (test-only).
"""
from __future__ import annotations

import io
import types
import warnings

import numpy as np
import onnx
import torch
import torch.nn as nn

from vitedge.exporter.onnx.onnx_export import (DEFAULT_OPSET, INPUT_NAME, OUTPUT_NAME, check_onnx, export_onnx,
                                               node_counts, simplify_onnx)
from vitedge.exporter.verdict.criteria import GroundTruth
from vitedge.exporter.verdict.parity import FLOAT64_TOLERANCES, compute_metrics, ground_truth, judge, tolerances
from vitedge.models.flops import model_macs

def gflop(name: str, imgsz: int, overrides: dict | None = None) -> float:
    """GFLOP of one image: 2 x the model's MACs (matmul, conv, linear; vitedge.models.flops)."""
    return 2.0 * model_macs(name, imgsz, **(overrides or {})) / 1e9


def onnx_image_model(model: nn.Module, imgsz: int, batch: int) -> onnx.ModelProto:
    """The project's ONNX path for image models: TorchScript export, checker, onnxsim (static batch)."""
    return simplify_onnx(check_onnx(export_onnx(model, imgsz, batch=batch)))


def onnx_token_model(module: nn.Module, example: torch.Tensor) -> onnx.ModelProto:
    """A (B, N, C) -> (B, N, C) layer through the same export, checker and onnxsim steps.

    The graph reuses the image graph's tensor names so the project's checker and simplifier accept it.
    """
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (example,), buf, dynamo=False, input_names=[INPUT_NAME],
                          output_names=[OUTPUT_NAME], opset_version=DEFAULT_OPSET, do_constant_folding=True)
    return simplify_onnx(check_onnx(onnx.load_from_string(buf.getvalue())))


def total_nodes(model: onnx.ModelProto) -> dict:
    counts = node_counts(model)
    return {"total": int(sum(counts.values())), "by_op": counts}


def ground_truth_on(train: nn.Module, x: np.ndarray) -> GroundTruth:
    """The train-form's float64 ground truth (and per-sample float32 noise) on `x`, judged as one stress set: what
    the pipeline judges every hop against (exporter/verdict/parity.py)."""
    return ground_truth(train, np.ascontiguousarray(x, np.float32), ("stress",) * len(x))


def parity_problems(reference, candidate: np.ndarray) -> list[str]:
    """Empty when `candidate` passes. `reference` a GroundTruth: the pipeline's fp32 rule against float64 (the
    per-sample noise rule, so a correct graph of a chaotic model passes); plain float32 logits: the fp32 metric
    profile against them (comparing candidates that should agree, e.g. attention orders)."""
    if isinstance(reference, GroundTruth):
        return judge(reference, np.asarray(candidate), FLOAT64_TOLERANCES["fp32"])[2]
    return tolerances()["fp32"].violations(compute_metrics(reference, candidate))


def import_timm() -> tuple[types.ModuleType | None, str | None]:
    """(timm, None), or (None, why not): through tests/_timm.py's torchvision workaround (timm is test-only)."""
    try:
        import pytest

        from vitedge.tests._timm import import_timm as _import
    except ImportError as e:
        return None, f"the test helpers are not importable ({e})"
    try:
        return _import(), None
    except pytest.skip.Exception as e:
        return None, str(e.msg if hasattr(e, "msg") else e)
