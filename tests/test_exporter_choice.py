"""`--exporter dynamo|torchscript` through the pipeline API (issue 20): small configs exported with
each exporter by `vitedge.export` (parity ladder passed, rewrites in the graph, the exporter in report.json and in
the ONNX metadata), a planted corruption in each exported graph failed by `vitedge.parity` with the corrupted
module named, the per-model fallback recorded, and the choice carried by bench, package and the matrix keys.

Each family's two exports are made once per module and shared by the tests. tests/test_exporters.py checks the
exporters themselves, below the pipeline, on every family: parity with the train-form, the rewrites in both graphs
and a planted corruption localized. What the pipeline adds (the ladder, report.json, the graph's metadata, `parity`
rebuilding the model from that metadata alone) does not depend on the family, so it runs here on two: SwiftFormer
(a convolutional network) and the two-branch CSWin, whose overrides (a locality split string, an attention type,
per-stage lists) are the most a metadata round trip has to carry.
"""
from __future__ import annotations

import pytest
import onnx
from onnx import numpy_helper

import vitedge
from vitedge.errors import VitedgeError
from vitedge.exporter.onnx import onnx_dynamo, onnx_export
from vitedge.exporter.onnx.onnx_choice import DEFAULT_EXPORTER, EXPORTERS, default_opset
from vitedge.models.reduced import reduced
from vitedge.targets.graph.metadata import read_metadata
from vitedge.tests.conftest import load_test_helper

CASES = load_test_helper("_families").CASES  # family: (model, reduced overrides, imgsz)
LAYOUT_OPS = ("Einsum", "Expand", "Transpose", "Reshape", "MatMul", "Gemm", "Concat")
SAMPLES = 4
TINY = reduced("swiftformer")
_BUILT: dict = {}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("exporters")


def _export(root, family: str, exporter: str):
    key = (family, exporter)
    if key not in _BUILT:
        name, overrides, imgsz = CASES[family]
        out = root / f"{family}-{exporter}"
        report = vitedge.export(name, "onnx", out=out, samples=SAMPLES, imgsz=imgsz, overrides=overrides,
                                exporter=exporter)
        _BUILT[key] = (report, out / f"{name}.onnx")
    return _BUILT[key]


PIPELINE_FAMILIES = ("swiftformer", "slab_cswin")
BOTH = [(f, e) for f in PIPELINE_FAMILIES for e in EXPORTERS]


@pytest.mark.parametrize("family,exporter", BOTH, ids=[f"{f}-{e}" for f, e in BOTH])
def test_export_parity_and_a_planted_corruption_localized(root, family, exporter):
    report, path = _export(root, family, exporter)
    assert report.exit_code == 0, [(h.hop, h.reason) for h in report.parity]
    assert [h.status for h in report.parity] == ["passed"] * 3
    # the exporter that wrote the graph, in report.json and in the graph's own metadata (no fallback on torch 2.13)
    assert (report.exporter, report.exporter_fallback, report.opset) == (exporter, None, default_opset(exporter))
    meta = read_metadata(path)
    assert (meta["exporter"], meta["exporter_fallback"]) == (exporter, None)
    assert onnx.load(str(path)).opset_import[0].version == default_opset(exporter)

    # a 1.5x weight planted in the exported graph: vitedge.parity (no --model: the metadata names it) fails the
    # artifact's hop and names the module the weight belongs to
    graph = onnx.load(str(path))
    names = [i.name for i in graph.graph.initializer if i.name.endswith(".weight") and len(i.dims) >= 2]
    assert names, "no initializer kept its torch parameter name"
    name = names[len(names) // 2]
    init = next(i for i in graph.graph.initializer if i.name == name)
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, name))
    bad = path.with_name("corrupted.onnx")
    onnx.save(graph, str(bad))
    checked = vitedge.parity(None, bad, samples=SAMPLES)
    hop = checked.hop("onnx")
    assert checked.exit_code == 1 and hop.status == "failed", hop
    assert hop.diverging_module == name.rpartition(".")[0], (name, hop.reason)
    assert (checked.model, checked.exporter, checked.opset) == (report.model, exporter, default_opset(exporter))


@pytest.mark.parametrize("family", PIPELINE_FAMILIES)
def test_the_rewrites_are_in_both_exporters_graphs(root, family):
    (ts, _), (dyn, _) = (_export(root, family, e) for e in ("torchscript", "dynamo"))
    assert ts.reparam.rewrites and dyn.reparam.rewrites == ts.reparam.rewrites
    a, b = ts.artifacts["onnx"].nodes, dyn.artifacts["onnx"].nodes
    assert a.get("Einsum", 0) == b.get("Einsum", 0) == 0 and a.get("Expand", 0) == b.get("Expand", 0) == 0
    assert {op: b.get(op, 0) for op in LAYOUT_OPS} == {op: a.get(op, 0) for op in LAYOUT_OPS}, (a, b)


def test_a_dynamo_failure_falls_back_and_says_why(tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise RuntimeError("planted: the dynamo exporter cannot take this model")

    monkeypatch.setattr(onnx_dynamo, "export_dynamo", refuse)
    r = vitedge.export("swiftformer_xs", out=tmp_path / "x", samples=2, imgsz=32, overrides=TINY, exporter="dynamo",
                       opset=18)
    assert r.exit_code == 0 and r.exporter == "torchscript" and r.opset == 18
    assert "planted: the dynamo exporter cannot take this model" in r.exporter_fallback
    meta = read_metadata(tmp_path / "x" / "swiftformer_xs.onnx")
    assert meta["exporter"] == "torchscript" and "planted" in meta["exporter_fallback"]
    # parity reads it back; --exporter dynamo (what was asked) agrees with the metadata, torchscript too
    for given in ("dynamo", "torchscript"):
        p = vitedge.parity(None, tmp_path / "x" / "swiftformer_xs.onnx", samples=2, exporter=given)
        assert (p.exporter, p.exporter_fallback) == ("torchscript", r.exporter_fallback)


def test_exporter_and_opset_are_checked_before_any_work(root, tmp_path):
    with pytest.raises(VitedgeError, match="unknown ONNX exporter 'jit'"):
        vitedge.export("swiftformer_xs", out=tmp_path / "a", exporter="jit")
    with pytest.raises(VitedgeError, match="dynamo exporter writes opset 18 or newer"):
        vitedge.export("swiftformer_xs", out=tmp_path / "a", exporter="dynamo", opset=17)
    assert not (tmp_path / "a").exists()
    _, path = _export(root, "swiftformer", "dynamo")
    with pytest.raises(VitedgeError, match="exported with the dynamo exporter .* not torchscript"):
        vitedge.parity(None, path, samples=2, exporter="torchscript")


def test_bench_package_and_matrix_carry_the_exporter(tmp_path, monkeypatch):
    r = vitedge.bench("swiftformer_xs", overrides=TINY, imgsz="32", backends="onnxruntime", exporter="dynamo",
                      min_iters=2, warmup_s=0.0, max_s=0.0)
    res = next(x for x in r.results if x.backend == "onnxruntime")
    assert res.valid and res.export["exporter"] == "dynamo" and res.export["opset"] == 18
    assert r.settings["exporter"] == "dynamo"

    seen = {}

    def capture(settings, **k):
        seen.update(vars(settings))
        raise KeyboardInterrupt  # stop before any work: only the settings matter here

    monkeypatch.setattr("vitedge.exporter.packaging.package.export", capture)
    with pytest.raises(KeyboardInterrupt):
        vitedge.package("swiftformer_xs", tmp_path / "b.zip", exporter="dynamo")
    assert seen["exporter"] == "dynamo"

    plan = {"models": [{"name": "swiftformer_xs", "set": TINY, "imgsz": 32},
                       {"name": "swiftformer_xs", "label": "xs_dynamo", "set": TINY, "imgsz": 32,
                        "exporter": "dynamo"}]}
    dry = vitedge.matrix(plan, out=tmp_path / "m", dry_run=True)
    keys = {c.label: c.cache_key for c in dry.cells}
    assert keys["swiftformer_xs"] != keys["xs_dynamo"]  # same export but for the exporter: another cache entry
    flag = vitedge.matrix(plan, out=tmp_path / "m", dry_run=True, exporter="dynamo")
    assert {c.label: c.cache_key for c in flag.cells} == {"swiftformer_xs": keys["xs_dynamo"],
                                                          "xs_dynamo": keys["xs_dynamo"]}
    with pytest.raises(VitedgeError, match="opset 18 or newer"):
        vitedge.matrix({"models": [{"name": "swiftformer_xs", "exporter": "dynamo", "opset": 17}]},
                       out=tmp_path / "m2", dry_run=True)
    assert DEFAULT_EXPORTER in EXPORTERS and onnx_export.DEFAULT_EXPORTER == DEFAULT_EXPORTER
