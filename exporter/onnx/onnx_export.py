"""ONNX export of a deploy-form model: export (TorchScript or dynamo), checker + shape inference, onnxsim.

The `vitedge.*` metadata_props helpers live one layer down (vitedge.targets.graph.metadata): the targets read them.

onnxsim never costs an ONNX Runtime fusion: `simplify_keeping_fusions` checks the simplified graph against the raw
one in ONNX Runtime's optimized form and repairs or falls back where onnxsim broke a fused pattern.

The graph has one input `image` (float32 NCHW, already normalized with the model's mean/std) and one
output `logits`. Every graph we keep passed `onnx.checker` (full check) and strict shape inference.

Two exporters write the graph (`exporter=`; their names, the default and the opset defaults are onnx_choice.py):
`torchscript` (`torch.onnx.export(dynamo=False)`, deprecated by PyTorch since 2.9; opsets 13-20, default 17) and
`dynamo` (the torch.export-based one, PyTorch's default since 2.9; opset >= 18, default 18: see `onnx_dynamo`).
When the dynamo exporter cannot handle a model (it raises, or its graph fails the ONNX check), `export_onnx_info`
falls back to TorchScript for that model and says why.
"""
from __future__ import annotations

import copy
import io
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
import torch.nn as nn

from ...errors import VitedgeError
from ...models.features import output_specs
from ...models.input_size import as_hw
from ...models.outputs import LOGITS
from ...targets.graph.fusions import fused_op_counts, lost_fusions
from ...targets.graph.gelu import copy_model, restore_gelu_halves
from .onnx_choice import (DEFAULT_EXPORTER, DEFAULT_OPSET, DYNAMO_OPSET, EXPORTERS, MIN_OPSET,  # noqa: F401
                          check_exporter, default_opset, exporter_label)

INPUT_NAME = "image"
OUTPUT_NAME = LOGITS
NORM_OPS = ("BatchNormalization", "LayerNormalization", "InstanceNormalization", "GroupNormalization")
# onnxsim passes that fold constants into a form ONNX Runtime's fusions do not match (the ladder's rung 2 skips them)
FUSION_HOSTILE_PASSES = ("fuse_preceding_mul_into_conv",)


class OnnxExportError(RuntimeError):
    """Export, checking or simplification failed; the message says at which step."""


def max_opset(exporter: str = "torchscript") -> int:
    """The newest opset `exporter` can write."""
    if check_exporter(exporter) == "dynamo":
        from .onnx_dynamo import newest_opset

        return newest_opset()
    from torch.onnx import _constants

    return min(getattr(_constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", 20), onnx.defs.onnx_opset_version())


def check_opset(opset: int, exporter: str = "torchscript") -> None:
    oldest, newest = (DYNAMO_OPSET if check_exporter(exporter) == "dynamo" else MIN_OPSET), max_opset(exporter)
    if exporter == "dynamo" and opset < oldest:
        raise VitedgeError(f"the dynamo exporter writes opset {oldest} or newer (older opsets need the ONNX version "
                           f"converter, which cannot take every op below {oldest}); got --opset {opset}: use "
                           f"--opset {oldest} or newer, or --exporter torchscript")
    if not oldest <= opset <= newest:
        raise VitedgeError(f"--opset must be between {oldest} and {newest} with the {exporter} exporter; got {opset}")


@dataclass
class OnnxExport:
    """An exported graph and how it was made. `exporter` wrote `model`; it differs from `requested` when the
    dynamo exporter could not handle the model and TorchScript was used instead (`fallback_reason` says why)."""

    model: onnx.ModelProto
    exporter: str
    requested: str
    opset: int
    fallback_reason: str | None = None
    seconds: float = 0.0

    def info(self) -> dict:
        """Plain facts for report.json and the graph's metadata_props."""
        return {"exporter": self.exporter, "exporter_requested": self.requested, "opset": self.opset,
                "exporter_fallback": self.fallback_reason}


def export_onnx(model: nn.Module, imgsz: int, batch: int | None = 1, opset: int | None = None,
                exporter: str = DEFAULT_EXPORTER, fallback: bool = True) -> onnx.ModelProto:
    """Export `model` (eval, fp32, CPU) to ONNX in memory; `batch=None` gives a dynamic batch axis.
    `opset=None`: the exporter's default. See `export_onnx_info` for the exporter actually used."""
    return export_onnx_info(model, imgsz, batch, opset, exporter, fallback).model


def export_onnx_info(model: nn.Module, imgsz: int, batch: int | None = 1, opset: int | None = None,
                     exporter: str = DEFAULT_EXPORTER, fallback: bool = True) -> OnnxExport:
    """`export_onnx`, returning the graph with the exporter that wrote it. With `exporter="dynamo"` and
    `fallback=True`, a model the dynamo exporter cannot export (or whose graph fails the ONNX check) is
    exported with TorchScript at the same opset, and `fallback_reason` records the dynamo error; with
    `fallback=False` that error is raised. Raises OnnxExportError when no exporter succeeded."""
    opset = default_opset(exporter) if opset is None else opset
    check_opset(opset, exporter)
    if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in model.state_dict().values()
           if t.is_floating_point()):
        model = copy.deepcopy(model).float().cpu()  # never change the caller's model
    model.eval()
    # A dynamic axis is traced at batch 2 so no shape op is specialised on a broadcastable size-1 batch.
    x = torch.zeros(batch or 2, 3, *as_hw(imgsz))
    names = tuple(o.name for o in output_specs(model, tuple(x.shape[2:])))  # feature maps: one name each
    start = time.perf_counter()
    if exporter == "dynamo":
        try:
            graph = _export_dynamo(model, x, batch is None, opset, names)
            return OnnxExport(graph, "dynamo", "dynamo", opset, None, time.perf_counter() - start)
        except OnnxExportError as e:
            if not fallback:
                raise
            reason = str(e)
        if opset > max_opset("torchscript"):
            raise OnnxExportError(f"{reason}; no fallback: the TorchScript exporter writes opset {max_opset()} at "
                                  f"most (pass --opset {max_opset()} or lower to allow it)")
        try:
            graph = _export_torchscript(model, x, batch is None, opset, names)
        except OnnxExportError as e:
            raise OnnxExportError(f"{reason}; the TorchScript fallback failed too: {e}") from e
        return OnnxExport(graph, "torchscript", "dynamo", opset, reason, time.perf_counter() - start)
    graph = _export_torchscript(model, x, batch is None, opset, names)
    return OnnxExport(graph, "torchscript", "torchscript", opset, None, time.perf_counter() - start)


def _export_dynamo(model: nn.Module, x: torch.Tensor, dynamic_batch: bool, opset: int,
                   names: tuple[str, ...] = (OUTPUT_NAME,)) -> onnx.ModelProto:
    from .onnx_dynamo import export_dynamo, root_cause

    try:
        graph = export_dynamo(model, x, dynamic_batch, opset, INPUT_NAME, names)
    except ImportError as e:  # onnxscript is the dynamo exporter's own dependency
        raise OnnxExportError(f"torch.onnx.export(dynamo=True) needs {e.name or 'onnxscript'}: pip install "
                              "onnxscript") from e
    except Exception as e:  # torch.export raises many types (unsupported ops, data-dependent control flow)
        raise OnnxExportError(f"torch.onnx.export(dynamo=True) failed: {root_cause(e)}") from e
    try:
        check_onnx(graph)
    except OnnxExportError as e:
        raise OnnxExportError(f"the dynamo exporter's graph failed the ONNX check: {e}") from e
    return graph


def _export_torchscript(model: nn.Module, x: torch.Tensor, dynamic_batch: bool, opset: int,
                        names: tuple[str, ...] = (OUTPUT_NAME,)) -> onnx.ModelProto:
    dynamic_axes = {n: {0: "batch"} for n in (INPUT_NAME, *names)} if dynamic_batch else None
    buf = io.BytesIO()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer warnings about Python-side shapes are expected here
            torch.onnx.export(model, (x,), buf, dynamo=False, input_names=[INPUT_NAME], output_names=list(names),
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
    # a classifier's one output is `logits`; feature maps and a user's heads carry their own distinct names
    if ins != [INPUT_NAME] or not outs or len(set(outs)) != len(outs):
        raise OnnxExportError(f"ONNX graph has inputs {ins} / outputs {outs}; expected [{INPUT_NAME!r}] / "
                              f"[{OUTPUT_NAME!r}] or other distinct names")
    return inferred


def simplify_onnx(model: onnx.ModelProto, keep_fusions: bool = True) -> onnx.ModelProto:
    """onnxsim (constant folding + graph rewrites), then the same checks as the raw export.

    `keep_fusions` (default): never lose one of ONNX Runtime's fusions of `model` (`simplify_keeping_fusions`,
    which also returns the fused-op counts); False: onnxsim as is, the graph a user gets the usual way (the
    benchmarks' baseline).
    """
    return simplify_keeping_fusions(model)[0] if keep_fusions else run_onnxsim(model)


def simplify_keeping_fusions(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    """onnxsim'd `model` with every ONNX Runtime fusion of `model` kept, and a record of how.

    onnxsim computes the same function with fewer nodes, but a rewrite can hide a subgraph from ONNX Runtime's
    pattern-matching fusions (`targets.graph.gelu` has the measured case). So the fused ops of the raw and the
    simplified graph are counted in ONNX Runtime's optimized form (`targets.graph.fusions`); where the simplified
    graph has fewer of a kind, a ladder runs, checking the counts again at every rung, and the first graph that
    keeps them all is returned:
      1. re-establish the patterns onnxsim broke (`restore_gelu_halves`: exact, bit for bit);
      2. onnxsim again with the passes known to break fusions skipped (`FUSION_HOSTILE_PASSES`);
      3. the raw export itself (checked, un-simplified): it has every fusion by definition.
    Returns (graph, info); info = {"method": ..., "ort_fused_ops": {"raw": counts, "written": counts},
    "lost_by_onnxsim": {kind: n}, "restored": {"gelu_half": n}}, meant for the artifact's `info` in the
    report. Raises OnnxExportError when onnxsim fails or its graph fails the checks.
    """
    raw_counts = fused_op_counts(model)
    simplified = run_onnxsim(model)
    counts = fused_op_counts(simplified)
    lost = lost_fusions(raw_counts, counts)
    info = {"method": "onnxsim", "ort_fused_ops": {"raw": raw_counts, "written": counts},
            "lost_by_onnxsim": lost, "restored": {}}
    if not lost:
        return simplified, info

    repaired, n = restore_gelu_halves(simplified)
    if n:
        repaired = check_onnx(repaired)
        del repaired.graph.value_info[:]
        counts = fused_op_counts(repaired)
        if not lost_fusions(raw_counts, counts):
            info.update(method="onnxsim + restored fusable patterns", restored={"gelu_half": n})
            info["ort_fused_ops"]["written"] = counts
            return repaired, info

    try:
        retry = run_onnxsim(model, skipped_optimizers=list(FUSION_HOSTILE_PASSES))
        counts = fused_op_counts(retry)
        if not lost_fusions(raw_counts, counts):
            info.update(method=f"onnxsim without {', '.join(FUSION_HOSTILE_PASSES)}")
            info["ort_fused_ops"]["written"] = counts
            return retry, info
    except OnnxExportError:
        pass  # the last rung needs no onnxsim at all

    info.update(method="raw export (onnxsim lost ONNX Runtime fusions: kept un-simplified)")
    info["ort_fused_ops"]["written"] = raw_counts
    return copy_model(model), info  # a copy: the caller writes metadata into the graph it gets


def run_onnxsim(model: onnx.ModelProto, skipped_optimizers: list[str] | None = None) -> onnx.ModelProto:
    """onnxsim as is (optionally with some of its optimizer passes skipped), then `check_onnx`."""
    import onnxsim

    try:
        simplified, ok = onnxsim.simplify(model, skipped_optimizers=skipped_optimizers)
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
