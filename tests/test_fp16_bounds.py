"""fp16's fixed cosine / PSNR / top-1 bounds follow what an independent fp16 computation reaches on the same samples
(exporter/verdict/metrics.set_bounds, margin fp16_median): a correct fp16 graph of PRepBN-PVT-T, whose own fp16
reference misses cosine 0.999 and top-1 0.99 on stress images, passes; the same graph with a channel zeroed or
sign-flipped in its fp16 weights fails; where the reference meets the fixed bounds they stand, and --tol bounds are
never loosened."""
import copy
from dataclasses import replace

import numpy as np
import onnx
import pytest

from vitedge.exporter.onnx.onnx_export import export_onnx, simplify_onnx
from vitedge.exporter.reparam.build_forms import build_deploy_form
from vitedge.exporter.verdict import parity
from vitedge.exporter.verdict.criteria import GroundTruth
from vitedge.exporter.verdict.hops import parity_inputs_for
from vitedge.models import create_model, make_trained_like
from vitedge.targets.graph.onnx_fp16 import convert_onnx_fp16
from vitedge.targets.graph.precision import default_policy
from vitedge.targets.onnx.target import OnnxRuntimeRunner
from vitedge.targets.plants import plant_fp16_initializer

FP16 = parity.FLOAT64_TOLERANCES["fp16"]


@pytest.fixture(scope="module")
def pvt_stress(tmp_path_factory):
    """PRepBN-PVT-T (demo weights, 224 px) on the default set's stress samples: the truth with its fp16 reference and
    the correct fp16 graph's path."""
    model = make_trained_like(create_model("prepbn_pvt_tiny"), seed=0).eval()
    pset = parity_inputs_for(model, 224, 64)
    idx = pset.indices("stress")
    x = pset.numpy()[idx]
    truth = parity.ground_truth(model, x, ("stress",) * len(idx))
    deploy, _ = build_deploy_form(model, 224)
    truth = parity.with_fp16_reference(truth, deploy, x)
    path = tmp_path_factory.mktemp("fp16") / "model.fp16.onnx"
    onnx.save(convert_onnx_fp16(simplify_onnx(export_onnx(copy.deepcopy(deploy), 224, batch=None)), default_policy()),
              str(path))
    return truth, x, path


def _run(x, path):
    return parity.run_batched(OnnxRuntimeRunner(onnx.load(str(path)), threads=2), x, 8)


def test_a_correct_fp16_graph_passes_where_fp16_itself_misses_the_fixed_bounds(pvt_stress):
    truth, x, path = pvt_stress
    ref = parity.compute_metrics(truth.y64, truth.y16)
    assert ref.cosine < FP16.cosine and ref.top1_agreeing < len(x)      # fp16 itself misses them here
    out = _run(x, path)
    _, sets, problems = parity.judge(truth, out, FP16)
    assert problems == [], problems
    assert set(sets["stress"]["metric_bounds"]) == {"cosine", "psnr_db", "top1_agreement"}
    # the fixed bounds alone fail the same correct graph
    assert any("cosine" in p for p in parity.judge(truth, out, replace(FP16, fp16_median=None))[2])


@pytest.mark.parametrize("plant", ["x0", "sign_flip"])
def test_a_planted_fp16_graph_still_fails(pvt_stress, tmp_path, plant):
    truth, x, path = pvt_stress
    bad = tmp_path / f"{plant}.onnx"
    plant_fp16_initializer(path, bad, plant, 0.5)
    _, _, problems = parity.judge(truth, _run(x, bad), FP16)
    assert problems, f"{plant} passed"


def _near_tied(n=16, classes=10, seed=0):
    """Logits whose top two classes are near-tied in every sample, and an fp16-like reference flipping k of them."""
    rng = np.random.default_rng(seed)
    y64 = rng.normal(size=(n, classes))
    top = y64.argmax(1)
    second = np.argsort(-y64, 1)[:, 1]
    y64[np.arange(n), second] = y64[np.arange(n), top] - 1e-3
    return y64, top, second


def _flip(y, top, second, rows):
    y = y.copy()
    y[rows, second[rows]] = y[rows, top[rows]] + 1e-3
    return y


@pytest.mark.parametrize("flipped, fails", [(2, False), (3, True)])
def test_top1_follows_the_references_disagreements(flipped, fails):
    """The reference flips 1 of 16: with margin 2 a correct artifact may flip 2, not 3 (counts, never fractions)."""
    y64, top, second = _near_tied()
    truth = GroundTruth(y64, y64, ("natural",) * 16, y16=_flip(y64, top, second, [0]))
    tol = replace(FP16, fp16_k=1e9, fp16_median=2.0, cosine=None, psnr_db=None)
    _, sets, problems = parity.judge(truth, _flip(y64, top, second, list(range(flipped))), tol)
    assert sets["natural"]["metric_bounds"] == {"top1_agreement": pytest.approx(14 / 16)}
    assert bool([p for p in problems if "top1_agreement" in p]) == fails, problems


def test_where_the_reference_meets_the_bounds_or_tol_sets_them_they_stand():
    y64, top, second = _near_tied()
    cand = _flip(y64, top, second, [0])
    truth = GroundTruth(y64, y64, ("natural",) * 16, y16=y64)             # the reference flips none
    tol = replace(FP16, fp16_k=1e9, cosine=None, psnr_db=None)
    _, sets, problems = parity.judge(truth, cand, tol)
    assert "metric_bounds" not in sets["natural"] and any("top1_agreement" in p for p in problems)
    truth = replace(truth, y16=_flip(y64, top, second, [0, 1]))
    _, sets, problems = parity.judge(truth, cand, replace(tol, top1_agreement=0.95))  # given, as with --tol
    assert "metric_bounds" not in sets["natural"] and any("top1_agreement" in p for p in problems)
