"""The deploy-form and raw onnx hops of `vitedge export` run on PRE_BASE_SAMPLES of the parity set (each input set
in proportion), the onnx-simplified hop on all of it; a failed simplified hop re-runs the raw one on every input.
A planted 1 % and 0.1 % error in one channel is caught by the subset hops as by the full ones."""
from __future__ import annotations

import numpy as np
import pytest

from vitedge.exporter.flow import pipeline
from vitedge.exporter.verdict.hops import PRE_BASE_SAMPLES, parity_inputs_for, subset_indices
from vitedge.exporter.flow.pipeline import export
from vitedge.models.reduced import reduced
from vitedge.targets.plants import plant_channel_scale

SWIFT = reduced("swiftformer")
IMGSZ = 32
N = 96  # > PRE_BASE_SAMPLES: 72 natural and 24 stress inputs


def test_subset_indices_keep_every_set_in_proportion():
    sets = ("natural", "natural", "natural", "stress") * 24
    idx = subset_indices(sets, 64)
    picked = [sets[i] for i in idx]
    assert len(idx) == 64 and picked.count("natural") == 48 and picked.count("stress") == 16
    assert list(idx) == sorted(idx)
    nat = [i for i, s in enumerate(sets) if s == "natural"]
    assert [i for i in idx if sets[i] == "natural"] == nat[:48]  # each set's first ones
    assert subset_indices(sets, 96) is None and subset_indices(sets, 500) is None
    few = subset_indices(("user",) * 30 + ("stress",) * 2, 4)  # a small set keeps at least one sample
    assert sum(int(i) >= 30 for i in few) == 1


def test_export_runs_the_pre_base_hops_on_a_subset(tmp_path):
    report = export("swiftformer_xs", "onnx", imgsz=IMGSZ, out=tmp_path / "run", samples=N, overrides=SWIFT)
    assert report.exit_code == 0, [(h.hop, h.reason) for h in report.parity]
    for name in ("deploy-form", "onnx"):
        hop = report.hop(name)
        assert hop.samples == PRE_BASE_SAMPLES and "48 natural, 16 stress of the 96" in hop.subset
        assert {s: d["samples"] for s, d in hop.sets.items()} == {"natural": 48, "stress": 16}
    full = report.hop("onnx-simplified")
    assert full.samples == N and full.subset is None


@pytest.mark.parametrize("factor", [1.01, 1.001])
def test_a_planted_error_in_the_raw_graph_fails_the_subset_hop(tmp_path, monkeypatch, factor):
    make = pipeline.export_onnx_info

    def planted(*a, **kw):
        made = make(*a, **kw)
        made.model = plant_channel_scale(made.model, factor)[0]  # 1 % / 0.1 % in one output channel, mid-network
        return made

    monkeypatch.setattr(pipeline, "export_onnx_info", planted)
    report = export("swiftformer_xs", "onnx", imgsz=IMGSZ, out=tmp_path / "run", samples=N, overrides=SWIFT)
    raw = report.hop("onnx")
    assert report.exit_code == 1 and raw.status == "failed" and raw.samples == PRE_BASE_SAMPLES
    assert report.hop("deploy-form").status == "passed"
    sets = parity_inputs_for(pipeline.build_train_form("swiftformer_xs", overrides=SWIFT).model, IMGSZ, N).sets
    kept = set(subset_indices(sets, PRE_BASE_SAMPLES).tolist())
    for name, d in raw.sets.items():  # worst samples name positions in the whole parity set
        assert d["worst_sample"]["index"] in kept and sets[d["worst_sample"]["index"]] == name


def test_a_failed_simplified_hop_reruns_the_raw_hop_on_every_input(tmp_path, monkeypatch):
    simplify = pipeline.simplify_keeping_fusions

    def planted(model):
        simp, info = simplify(model)
        return plant_channel_scale(simp, 1.01)[0], info

    monkeypatch.setattr(pipeline, "simplify_keeping_fusions", planted)
    report = export("swiftformer_xs", "onnx", imgsz=IMGSZ, out=tmp_path / "run", samples=N, overrides=SWIFT)
    assert report.exit_code == 1 and report.hop("onnx-simplified").status == "failed"
    raw = report.hop("onnx")
    assert raw.status == "passed" and raw.samples == N and raw.subset is None  # onnxsim did it, on every input
    assert [h.hop for h in report.parity].count("onnx") == 1
    assert np.isfinite(raw.metrics.max_rel)
