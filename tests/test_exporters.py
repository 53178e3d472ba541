"""Both ONNX exporters (TorchScript and dynamo) on every family's small config: ONNX Runtime parity with the
train-form, the deploy-form rewrites present in the graph, localization of a planted corruption (an initializer
scaled in the exported graph) naming the corrupted module, module scopes read from the dynamo exporter's own
node metadata, the per-model fallback and the opset policy.

Each family's two exports are made once per module (dynamo exports take seconds each) and shared by the tests.
"""
from __future__ import annotations

import copy
import re
from collections import Counter

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
from onnx import numpy_helper

from vitedge.exporter.onnx import onnx_dynamo
from vitedge.exporter.verdict.inputs import parity_inputs
from vitedge.exporter.verdict.localize import localize_onnx, node_scopes, param_owners
from vitedge.exporter.onnx.onnx_export import (EXPORTERS, OnnxExportError, check_onnx, check_opset, default_opset,
                                               export_onnx_info, node_counts, simplify_onnx)
from vitedge.exporter.verdict.parity import DEFAULT_TOLERANCES, compute_metrics, run_batched
from vitedge.exporter.reparam import reparameterize
from vitedge.errors import VitedgeError
from vitedge.models import create_model, make_trained_like
from vitedge.targets.graph.metadata import input_shape
from vitedge.targets.onnx.target import OnnxRuntimeRunner
from vitedge.tests.conftest import load_test_helper

CASES = load_test_helper("_families").CASES  # family: (model, reduced overrides, imgsz)
FAMILIES = list(CASES)
BOTH = [(f, e) for f in FAMILIES for e in EXPORTERS]
MAX_REL, MIN_COSINE = 1e-4, 0.99999
# Layout ops the deploy-form rewrites remove or keep: both exporters must emit the same number of each.
LAYOUT_OPS = ("Einsum", "Expand", "Transpose", "Reshape", "MatMul", "Gemm", "Concat")
_CACHE: dict = {}


def _built(family: str) -> dict:
    """train-form, deploy-form and, per exporter, the export record and the simplified graph (made once)."""
    if family not in _CACHE:
        name, overrides, imgsz = CASES[family]
        train = make_trained_like(create_model(name, **overrides), seed=0).eval()
        deploy = reparameterize(train, imgsz)
        entry = {"train": train, "deploy": deploy, "imgsz": imgsz}
        for exporter in EXPORTERS:
            raw = export_onnx_info(copy.deepcopy(deploy), imgsz, batch=1, exporter=exporter)
            entry[exporter] = raw
            entry[exporter + "-simplified"] = simplify_onnx(check_onnx(raw.model))
        _CACHE[family] = entry
    return _CACHE[family]


def _reference(train: nn.Module, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return train(x).numpy()


@pytest.mark.parametrize("family,exporter", BOTH, ids=[f"{f}-{e}" for f, e in BOTH])
def test_both_exporters_match_the_train_form(family, exporter):
    b = _built(family)
    info = b[exporter].info()
    # torch 2.13 exports every family with the dynamo exporter itself: no fallback
    assert info == {"exporter": exporter, "exporter_requested": exporter, "opset": default_opset(exporter),
                    "exporter_fallback": None}
    assert b[exporter].model.opset_import[0].version == default_opset(exporter)
    x = parity_inputs(2, b["imgsz"], seed=0)
    for graph in (b[exporter].model, b[exporter + "-simplified"]):
        m = compute_metrics(_reference(b["train"], x), run_batched(OnnxRuntimeRunner(graph, threads=1), x.numpy()))
        assert m.max_rel <= MAX_REL and m.cosine >= MIN_COSINE, (family, exporter, m)


@pytest.mark.parametrize("family", FAMILIES)
def test_deploy_form_rewrites_survive_the_dynamo_exporter(family):
    b = _built(family)
    dyn, ts = node_counts(b["dynamo-simplified"]), node_counts(b["torchscript-simplified"])
    # no layout Einsum/Expand in any family's rewritten deploy-form (tests/test_deploy_graphs.py, per exporter)
    assert dyn.get("Einsum", 0) == dyn.get("Expand", 0) == 0, dyn
    if family == "swiftformer":  # channels-first end to end: no Transpose at all
        assert dyn.get("Transpose", 0) == 0, dyn
    # the dynamo graph keeps exactly the layout the rewrites give the TorchScript graph
    assert {op: dyn.get(op, 0) for op in LAYOUT_OPS} == {op: ts.get(op, 0) for op in LAYOUT_OPS}, (dyn, ts)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_fp16_policy_finds_the_same_fp32_islands_in_both_graphs(family):
    from vitedge.targets.graph.onnx_fp16 import prepare_fp16

    b = _built(family)
    dyn, ts = (prepare_fp16(b[f"{e}-simplified"]).fp32_nodes for e in ("dynamo", "torchscript"))
    assert dyn and Counter(dyn.values()) == Counter(ts.values())  # islands per policy rule


def test_the_rewrite_ablation_is_visible_through_the_dynamo_exporter():
    b = _built("swiftformer")
    folded = reparameterize(b["train"], b["imgsz"], rewrites=False)
    counts = node_counts(simplify_onnx(check_onnx(export_onnx_info(folded, b["imgsz"], exporter="dynamo").model)))
    assert counts.get("Expand", 0) > 0 and counts.get("Transpose", 0) > 0, counts  # what the rewrites remove


def _conv_or_linear_weights(graph: onnx.ModelProto, deploy: nn.Module) -> list[str]:
    modules = dict(deploy.named_modules())
    return [i.name for i in graph.graph.initializer if i.name.endswith(".weight") and len(i.dims) >= 2
            and isinstance(modules.get(i.name.rpartition(".")[0]), (nn.Conv2d, nn.Linear))]


@pytest.mark.parametrize("family,exporter", BOTH, ids=[f"{f}-{e}" for f, e in BOTH])
def test_localization_names_the_module_of_a_corrupted_initializer(family, exporter):
    b = _built(family)
    graph = onnx.ModelProto()
    graph.CopyFrom(b[exporter + "-simplified"])
    x = parity_inputs(1, b["imgsz"], seed=5).numpy()
    tol = DEFAULT_TOLERANCES["fp32"]
    assert localize_onnx(graph, b["deploy"], x, tol) is None  # healthy: nothing diverges
    names = _conv_or_linear_weights(graph, b["deploy"])
    assert names, "no initializer kept its torch parameter name"
    name = names[len(names) // 2]  # a weight in the middle of the network
    init = next(i for i in graph.graph.initializer if i.name == name)
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, name))
    div = localize_onnx(graph, b["deploy"], x, tol)
    assert div is not None and div.module == name.rpartition(".")[0], (name, div)


def _strip(graph: onnx.ModelProto, *, names: bool = False, metadata: bool = False) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(graph)
    for node in out.graph.node:
        if names:
            node.name = node.name.rsplit("/", 1)[-1]  # the exporter's own name (`node_conv2d_3`)
        if metadata:
            del node.metadata_props[:]
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_dynamo_module_scopes_come_from_the_exporters_own_metadata(family):
    b = _built(family)
    raw = b["dynamo"].model
    paths = {p for p, _ in b["deploy"].named_modules() if p}
    assert sum(bool(onnx_dynamo.node_module_scopes(n)) for n in raw.graph.node) >= 0.9 * len(raw.graph.node)
    by_metadata = node_scopes(_strip(raw, names=True), paths, {})  # nothing but pkg.torch.onnx.name_scopes
    by_names = node_scopes(_strip(raw, metadata=True), paths, {})  # nothing but the scoped names we wrote
    assert by_metadata == by_names
    mapped = [s for s in by_metadata if s]
    assert len(mapped) >= 0.9 * len(by_metadata) and len(set(mapped)) > 3, mapped
    # onnxsim drops node metadata but keeps the names of the nodes it keeps: those map to the same modules
    simplified = b["dynamo-simplified"]
    assert not any(n.metadata_props for n in simplified.graph.node)
    raw_scope = dict(zip((n.name for n in raw.graph.node), by_metadata))
    owners = param_owners(b["deploy"])
    scopes = node_scopes(simplified, paths, owners)
    kept = [(n.name, s) for n, s in zip(simplified.graph.node, scopes) if n.name in raw_scope]
    assert len(kept) >= 0.5 * len(scopes) and all(raw_scope[name] == s for name, s in kept if raw_scope[name])
    # onnxsim's own new nodes (Reshape_N) map through their initializers or not at all, as in TorchScript graphs
    assert sum(s is not None for s in scopes) >= 0.8 * len(scopes)


def test_dynamo_dynamic_batch_runs_at_batch_1_and_3():
    b = _built("swiftformer")
    graph = export_onnx_info(b["deploy"], b["imgsz"], batch=None, exporter="dynamo").model
    assert input_shape(graph)[0] == "batch" and input_shape(graph)[1:] == [3, b["imgsz"], b["imgsz"]]
    runner = OnnxRuntimeRunner(graph, threads=1)
    for n in (1, 3):
        x = parity_inputs(n, b["imgsz"], seed=1)
        m = compute_metrics(_reference(b["train"], x), runner.run(x.numpy()))
        assert m.max_rel <= MAX_REL and m.cosine >= MIN_COSINE, (n, m)


class _DataDependent(nn.Module):
    """Python control flow on a tensor value: torch.export cannot capture it, TorchScript traces one branch."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x).mean((2, 3))
        return y if y.sum() > 0 else -y


def test_a_model_the_dynamo_exporter_cannot_capture_falls_back_and_says_why():
    r = export_onnx_info(_DataDependent(), 16, exporter="dynamo")
    assert (r.exporter, r.requested, r.opset) == ("torchscript", "dynamo", 18)
    assert r.fallback_reason.startswith("torch.onnx.export(dynamo=True) failed: ")
    assert "data-dependent" in r.fallback_reason and "\x1b" not in r.fallback_reason  # the root cause, plain text
    assert r.info()["exporter_fallback"] == r.fallback_reason
    check_onnx(r.model)
    with pytest.raises(OnnxExportError, match="data-dependent"):
        export_onnx_info(_DataDependent(), 16, exporter="dynamo", fallback=False)
    # TorchScript writes opset 20 at most: no fallback at 21
    with pytest.raises(OnnxExportError, match="no fallback"):
        export_onnx_info(_DataDependent(), 16, opset=21, exporter="dynamo")


def test_opset_policy_per_exporter():
    assert default_opset("torchscript") == 17 and default_opset("dynamo") == 18
    with pytest.raises(VitedgeError, match=re.escape("--opset 18 or newer, or --exporter torchscript")):
        check_opset(17, "dynamo")
    with pytest.raises(VitedgeError, match="between 13 and"):
        check_opset(12, "torchscript")
    with pytest.raises(VitedgeError, match="unknown ONNX exporter"):
        default_opset("jit")
    check_opset(17, "torchscript")
    # above its own opset 18 the dynamo exporter converts upwards, and the graph really has the opset asked for
    graph = export_onnx_info(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten()), 8, opset=20, exporter="dynamo").model
    assert onnx_dynamo.graph_opset(graph) == 20
