"""The matrix cache re-hashes its shared verified bases' files too (hubs/): a base whose ONNX (or deploy-form, or
ground truth) was changed after it was verified is never served to a cell, and `--verify-cache` names it."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from vitedge.cli import main
from vitedge.exporter.matrix import matrix
from vitedge.exporter.matrix.cache import Cache
from vitedge.tests._matrix import XS, plan_of, write_plan


def _zero_one_conv(path):
    """The first Conv's weight zeroed in place: a corrupted graph that still loads and runs."""
    model = onnx.load(str(path))
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    init = next(i for i in model.graph.initializer if i.name == conv.input[1])
    init.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(init)), init.name))
    onnx.save(model, str(path))


def test_a_corrupted_cached_verified_base_is_never_served(tmp_path, capsys):
    plan = write_plan(tmp_path / "plan", plan_of([XS], precisions=("fp32", "fp16")))
    out = tmp_path / "out"
    first = matrix(plan, out=out, workers=1, progress=False)
    assert first.exit_code == 0
    store = Cache(out / ".cache")
    graphs = list(store.root.glob("hubs/*/*/hub.onnx"))
    assert len(graphs) == 1
    _zero_one_conv(graphs[0])

    # --verify-cache re-hashes the base against the record written when it was verified
    assert main(["-q", "matrix", "--out", str(out), "--verify-cache"]) == 1
    printed = capsys.readouterr().out
    assert "UNTRUSTED" in printed and "hub.onnx" in printed

    # the cells' entries gone: they are rebuilt on a fresh base, never on the corrupted graph
    for c in first.cells:
        store.drop(c.cache_key)
    second = matrix(plan, out=out, workers=1, progress=False)
    assert second.exit_code == 0 and not any(c.from_cache for c in second.cells)
    for c in second.cells:
        assert c.status == "passed", (c.id, c.reason)
    assert main(["-q", "matrix", "--out", str(out), "--verify-cache"]) == 0
