"""The parity ladder: metrics, tolerance profiles, batching, and localization of a failed hop: a corrupted
deploy-form weight and, separately, a corrupted ONNX initializer fail with exit code 1 and name the torch
module that diverges first."""
from __future__ import annotations

import json
import math

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from vitedge.exporter.flow import pipeline
from vitedge.exporter.flow.deploy_checkpoint import load_deploy_checkpoint, reparam_checkpoint
from vitedge.exporter.verdict.localize import localize_onnx
from vitedge.exporter.verdict.parity import (DEFAULT_TOLERANCES, PSNR_CAP_DB, compute_metrics, parse_tol, run_batched,
                                             tolerances)
from vitedge.exporter.verdict.hops import parity_set_for
from vitedge.exporter.flow.pipeline import export
from vitedge.exporter.flow.verify import parity
from vitedge.exporter.core.report import Report
from vitedge.models import VitedgeError
from vitedge.models.reduced import reduced
from vitedge.targets.base import Runner

SWIFT = reduced("swiftformer")
IMGSZ = 64


# ---- metrics and tolerances ----------------------------------------------------------------------

def test_metrics_of_identical_outputs():
    y = np.random.default_rng(0).normal(size=(8, 10))
    m = compute_metrics(y, y.copy())
    assert (m.max_abs, m.max_rel, m.top1_agreement, m.top5_agreement, m.psnr_db) == (0, 0, 1, 1, PSNR_CAP_DB)
    assert m.cosine == pytest.approx(1.0)


def test_metrics_definitions():
    ref = np.array([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]])
    out = ref.copy()
    out[0, 5] += 0.5             # sample 0: only a low logit moves (top-5 set unchanged)
    out[1, [4, 5]] = [5.0, 4.0]  # sample 1: top-1 swaps, top-5 set unchanged
    m = compute_metrics(ref, out)
    assert m.max_abs == pytest.approx(1.0)
    assert m.max_rel == pytest.approx(1.0 / 5.0)  # relative to max|reference|
    assert m.top1_agreement == 0.5 and m.top5_agreement == 1.0
    rmse = math.sqrt((0.5 ** 2 + 1 + 1) / ref.size)
    assert m.psnr_db == pytest.approx(20 * math.log10(5.0 / rmse))
    cos = [(ref[i] @ out[i]) / np.linalg.norm(ref[i]) / np.linalg.norm(out[i]) for i in range(2)]
    assert m.cosine == pytest.approx(min(cos))
    out[0, 0] = -10.0  # now the top-5 set of sample 0 changes too
    assert compute_metrics(ref, out).top5_agreement == 0.5


def test_non_finite_outputs_fail_every_threshold_and_serialize_as_null():
    ref = np.ones((2, 5))
    out = ref.copy()
    out[1, 2] = np.nan
    m = compute_metrics(ref, out)
    problems = DEFAULT_TOLERANCES["fp32"].violations(m)
    assert any("max_rel" in p for p in problems) and any("cosine" in p for p in problems)
    from vitedge.exporter.core.report import Hop, ReparamInfo
    r = Report("m", 8, 1, "untrained", None, ReparamInfo(), parity=[Hop("onnx", "x", "failed", metrics=m)])
    assert json.loads(r.to_json())["parity"][0]["metrics"]["max_abs"] is None  # strict JSON, no NaN


def test_default_tolerances_and_overrides():
    t = tolerances()
    assert (t["fp32"].max_rel, t["fp32"].cosine) == (1e-4, 0.99999)
    assert (t["fp16"].cosine, t["fp16"].psnr_db, t["fp16"].top1_agreement) == (0.999, 35.0, 0.99)
    t = tolerances(["fp16.psnr_db=30", "fp32.cosine=none"])
    assert t["fp16"].psnr_db == 30 and t["fp32"].cosine is None and t["fp32"].max_rel == 1e-4
    assert DEFAULT_TOLERANCES["fp16"].psnr_db == 35.0  # the defaults themselves are untouched
    assert parse_tol("fp32.max_rel=2e-4") == ("fp32", "max_rel", 2e-4)
    for bad in ("fp32.maxrel=1", "fp8.cosine=1", "cosine=1", "fp32.cosine=abc"):
        with pytest.raises(VitedgeError):
            parse_tol(bad)


class _StaticRunner(Runner):
    backend, mode = "fake", "device"

    def __init__(self, batch):
        self.batch, self.calls = batch, []

    def run(self, x):
        assert len(x) == self.batch
        self.calls.append(len(x))
        return x.reshape(len(x), -1)[:, :3] * 2

    def max_batch(self):
        return self.batch


def test_run_batched_pads_the_last_chunk_of_a_static_batch():
    x = np.arange(7 * 4, dtype=np.float32).reshape(7, 4)
    r = _StaticRunner(3)
    y = run_batched(r, x)
    assert r.calls == [3, 3, 3] and y.shape == (7, 3)
    np.testing.assert_array_equal(y, x[:, :3] * 2)


class _AnyBatchRunner(_StaticRunner):
    def run(self, x):
        self.calls.append(len(x))
        return x.reshape(len(x), -1)[:, :3] * 2

    def max_batch(self):
        return None


@pytest.mark.parametrize("hw,chunks", [((224, 224), [32, 8]), ((448, 448), [8, 2]), ((800, 1344), [1, 1, 1])])
def test_a_large_input_runs_in_proportionally_smaller_chunks(hw, chunks):
    """A runner gets 32 samples of 224 x 224 per call, and as many pixels (at least one sample) of a larger input:
    36 samples at 800 x 1344 are not held in one 32-sample chunk (~4 GB of activations for SwiftFormer-XS)."""
    x = np.zeros((sum(chunks), 1, *hw), dtype=np.float32)
    r = _AnyBatchRunner(None)
    assert run_batched(r, x).shape == (len(x), 3) and r.calls == chunks


def test_the_ground_truth_runs_a_large_input_in_smaller_chunks():
    """8 samples per float64 chunk at 224 x 224, 2 at 448 x 448 (as many pixels), in each of the three runs."""
    from vitedge.exporter.verdict.parity import ground_truth

    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()).eval()
    seen = []
    model.register_forward_pre_hook(lambda _m, args: seen.append(len(args[0])))
    truth = ground_truth(model, np.ones((5, 1, 448, 448), np.float32), ("natural",) * 5)
    assert truth.y64.shape == (5, 2) and seen == [2, 2, 1] * 3


# ---- localization of failed hops ------------------------------------------------------------------

@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("parity") / "run"
    report = export("swiftformer_xs", "onnx", imgsz=IMGSZ, out=out, samples=6, overrides=SWIFT)
    assert report.exit_code == 0
    return out, report


def _middle_weight(names, state_dict):
    # a conv/linear weight in the middle of the network (stage 2), named exactly as in the deploy state_dict
    return next(n for n in names if n.startswith("network.2.") and n.endswith(".weight") and state_dict[n].dim() >= 2)


def test_healthy_graph_localizes_nothing(exported):
    out, report = exported
    deploy, _ = pipeline.build_deploy_form(pipeline.build_train_form("swiftformer_xs", overrides=SWIFT).model, IMGSZ)
    model = onnx.load(str(out / "swiftformer_xs.onnx"))
    x = parity_set_for(deploy, 4, IMGSZ)
    assert localize_onnx(model, deploy, x, DEFAULT_TOLERANCES["fp32"]) is None


def test_corrupted_onnx_initializer_fails_and_names_the_module(exported, tmp_path):
    out, _ = exported
    model = onnx.load(str(out / "swiftformer_xs.onnx"))
    deploy, _ = pipeline.build_deploy_form(pipeline.build_train_form("swiftformer_xs", overrides=SWIFT).model, IMGSZ)
    name = _middle_weight([i.name for i in model.graph.initializer], deploy.state_dict())
    init = next(i for i in model.graph.initializer if i.name == name)
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, name))
    bad = tmp_path / "swiftformer_xs.onnx"
    onnx.save(model, str(bad))

    report = parity("swiftformer_xs", bad, samples=6, report_path=tmp_path / "report.json")
    assert report.exit_code == 1
    hop = report.hop("onnx")
    assert hop.status == "failed" and hop.diverging_module == name.rpartition(".")[0]
    assert report.hop("deploy-form").status == "passed"
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["parity"][1]["diverging_module"] == name.rpartition(".")[0] and data["exit_code"] == 1


def test_corrupted_deploy_form_weight_fails_and_names_the_module(tmp_path):
    res = reparam_checkpoint("swiftformer_xs", tmp_path / "deploy.pth", imgsz=IMGSZ, overrides=SWIFT)
    assert res.equivalence.passed and res.path.exists()
    payload = torch.load(res.path, weights_only=True)  # plain tensors and metadata: no pickled classes
    key = _middle_weight(list(payload["state_dict"]), payload["state_dict"])
    payload["state_dict"][key] = payload["state_dict"][key] * 1.5
    torch.save(payload, tmp_path / "corrupt.pth")

    good = parity("swiftformer_xs", deploy_checkpoint=res.path, samples=6)  # size, overrides: from the file
    assert good.exit_code == 0 and good.hop("deploy-form").status == "passed"
    report = parity("swiftformer_xs", deploy_checkpoint=tmp_path / "corrupt.pth", imgsz=IMGSZ, samples=6,
                    overrides=SWIFT)
    assert report.exit_code == 1
    hop = report.hop("deploy-form")
    assert hop.status == "failed" and hop.diverging_module == key.rpartition(".")[0]


def test_corrupted_fold_fails_the_gate_before_any_export(tmp_path, monkeypatch):
    # A wrong weight in the deploy-form the export builds: the float64 gate names the block, nothing is exported.
    build = pipeline.build_deploy_form
    planted = "network.2.0.linear.fc1"
    gate_blocks = []

    def corrupt(*a, **kw):
        d32, d64 = build(*a, **kw)
        for d in (d32, d64):
            w = d.get_submodule(planted).weight
            w.mul_(1.5)
        gate_blocks.extend(c.name for c in d64.reparam_blocks)
        return d32, d64

    monkeypatch.setattr(pipeline, "build_deploy_form", corrupt)
    report = export("swiftformer_xs", "onnx", imgsz=IMGSZ, out=tmp_path / "run", samples=6, overrides=SWIFT)
    assert report.exit_code == 1
    hop = report.hop("deploy-form")
    # the gate compares train and deploy forms block by block (their module trees differ inside a fold): it must
    # name exactly the block holding the planted weight, not a later or an enclosing one
    block = max((b for b in gate_blocks if planted.startswith(b + ".")), key=len)
    assert hop.status == "failed" and hop.diverging_module == block == "network.2.0", (hop.diverging_module, block)
    assert all(h.status == "unverified" for h in report.parity[1:])
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".vitedge-files.json", "report.json"]  # no ONNX at all


def test_corrupted_simplified_graph_in_export_is_quarantined_and_localized(tmp_path, monkeypatch):
    simplify = pipeline.simplify_keeping_fusions
    corrupted = {}

    def corrupt(model):
        simp, info = simplify(model)
        init = next(i for i in simp.graph.initializer if i.name == "network.4.1.attn.to_key.weight")
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * -1.0, init.name))
        corrupted["name"] = init.name
        return simp, info

    monkeypatch.setattr(pipeline, "simplify_keeping_fusions", corrupt)
    out = tmp_path / "run"
    report = export("swiftformer_xs", "onnx", imgsz=IMGSZ, out=out, samples=6, overrides=SWIFT)
    assert report.exit_code == 1
    assert report.hop("onnx").status == "passed"
    hop = report.hop("onnx-simplified")
    assert hop.status == "failed" and hop.diverging_module == "network.4.1.attn.to_key"
    assert not (out / "swiftformer_xs.onnx").exists()
    assert (out / "quarantine" / "swiftformer_xs.onnx").exists()
    assert report.artifacts["onnx"].path == "quarantine/swiftformer_xs.onnx"


def test_fp16_onnx_hop(tmp_path):
    out = tmp_path / "run"
    report = export("swiftformer_xs", "onnx", imgsz=IMGSZ, precision="fp16", out=out, samples=12, overrides=SWIFT)
    assert report.exit_code == 0, [(h.hop, h.reason) for h in report.parity]
    hop = report.hop("onnx-fp16")
    assert hop.status == "passed" and hop.tolerance.profile == "fp16" and hop.mode == "device"
    assert hop.metrics.cosine >= 0.999 and hop.metrics.psnr_db >= 35
    half = onnx.load(str(out / "swiftformer_xs.fp16.onnx"))
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in half.graph.initializer)
    assert report.artifacts["onnx-fp16"].precision == "fp16" and report.artifacts["onnx"].precision == "fp32"
    # parity on the fp16 artifact picks the fp16 profile from the artifact itself
    again = parity("swiftformer_xs", out / "swiftformer_xs.fp16.onnx", samples=12)
    assert again.exit_code == 0 and again.hop("onnx-fp16").tolerance.profile == "fp16"


def test_deploy_checkpoint_round_trip(tmp_path):
    res = reparam_checkpoint("swiftformer_xs", tmp_path / "d.pth", imgsz=IMGSZ, overrides=SWIFT)
    loaded = load_deploy_checkpoint(res.path)
    train = pipeline.build_train_form("swiftformer_xs", overrides=SWIFT).model
    fresh, _ = pipeline.build_deploy_form(train, IMGSZ)
    x = torch.from_numpy(parity_set_for(train, 3, IMGSZ))
    with torch.no_grad():
        assert torch.equal(loaded(x), fresh(x))
    with pytest.raises(VitedgeError, match="exists"):
        reparam_checkpoint("swiftformer_xs", res.path, imgsz=IMGSZ, overrides=SWIFT)
