"""The noise-aware parity rule: per-sample errors against float64, allowances, per-set verdicts, --tol keys."""
from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import vitedge
from vitedge.exporter.verdict import parity
from vitedge.exporter.verdict.criteria import (GroundTruth, NoiseRule, accuracy, allowances,
                                               effective_noise, reference_summary, sample_errors)
from vitedge.models import VitedgeError
from vitedge.targets.base import Runner


class ArrayRunner(Runner):
    """Returns fixed outputs row by row: the hop's artifact, without an artifact."""
    backend, mode = "array", "reference"

    def __init__(self, y: np.ndarray, batch: int | None = None):
        self.y, self.batch, self.i = np.asarray(y, np.float32), batch, 0

    def run(self, x: np.ndarray) -> np.ndarray:
        out = self.y[self.i:self.i + len(x)]
        self.i += len(x)
        return out

    def max_batch(self):
        return self.batch


def _truth(n=8, c=10, seed=0, noise=1e-7, sets=None, labels=None) -> GroundTruth:
    rng = np.random.default_rng(seed)
    y64 = rng.normal(size=(n, c)) * np.linspace(1, 50, n)[:, None]  # very different per-sample scales
    y32 = y64 * (1 + noise * rng.choice([-1.0, 1.0], size=(n, c)))
    sets = sets or ("natural", "natural", "natural", "stress") * (n // 4)
    return GroundTruth(y64, y32, tuple(sets), labels)


def test_sample_errors_are_per_sample_relative_and_nonfinite_is_inf():
    t = np.array([[1.0, -2.0], [100.0, 50.0]])
    c = np.array([[1.0, -2.002], [100.1, 50.0]])
    np.testing.assert_allclose(sample_errors(t, c), [0.001, 0.001])
    c[1, 1] = np.nan
    assert sample_errors(t, c)[1] == np.inf
    with pytest.raises(ValueError):
        sample_errors(t, c[:, :1])
    assert sample_errors(np.zeros((1, 3)), np.zeros((1, 3)))[0] == 0.0  # an all-zero sample stays defined


def test_allowance_is_floor_or_k_times_noise():
    np.testing.assert_allclose(allowances(np.array([1e-9, 1e-3]), 1e-5, 20), [1e-5, 2e-2])
    rule = NoiseRule(floor=1e-5, k=20)
    t = np.ones((3, 2)) * np.array([1.0, 2.0])
    noisy = t * np.array([[1 + 1e-9], [1 + 1e-10], [1 + 1e-3]])  # noise ~0 (floor applies), 1e-3 (K applies)
    cand = t * np.array([[1 + 5e-6], [1 + 2e-6], [1 + 1.5e-2]])
    np.testing.assert_allclose(rule.ratios(t, cand, noisy), [0.5, 0.2, 0.75], rtol=1e-5)
    assert rule.worst(t, cand, noisy) == (pytest.approx(0.75, rel=1e-5), 2)


def test_no_sample_counts_as_quieter_than_its_sets_median():
    np.testing.assert_allclose(effective_noise(np.array([1e-8, 2e-7, 3e-7, 1e-2])), [2.5e-7, 2.5e-7, 3e-7, 1e-2])
    assert effective_noise(np.array([])).size == 0
    rule = NoiseRule(floor=0.0, k=10)
    t = np.ones((4, 3))
    noisy = t * (1 + np.array([1e-9, 2e-7, 2e-7, 2e-7]))[:, None]  # sample 0's float32 draw happened to be tiny
    cand = t * (1 + np.array([1e-6, 1e-6, 1e-6, 1e-6]))[:, None]   # a correct artifact: 5x the typical noise
    assert rule.worst(t, cand, noisy)[0] == pytest.approx(0.5, rel=1e-4)


def test_judge_passes_noise_level_error_and_fails_a_one_channel_error_naming_set_and_sample():
    truth = _truth()
    tol = parity.FLOAT64_TOLERANCES["fp32"]
    assert tol.max_rel is None and tol.cosine is None  # against float64: the noise rule alone
    rng = np.random.default_rng(1)
    close = truth.y64 * (1 + 2e-7 * rng.choice([-1.0, 1.0], size=truth.y64.shape))
    metrics, sets, problems = parity.judge(truth, close, tol)
    assert problems == [] and set(sets) == {"natural", "stress"}
    assert 0 < sets["natural"]["noise_ratio"] <= 1 and sets["stress"]["samples"] == 2
    assert sets["natural"]["reference_noise"] == pytest.approx(truth.noise[truth.indices("natural")].max())
    assert sets["natural"]["top1_accuracy"] is None
    bad = close.copy()
    bad[7, 3] += 1e-3 * np.abs(truth.y64[7]).max()  # one class of one stress sample, 0.1 % of the sample's scale
    names = tuple(f"s{i}" for i in range(8))
    _, sets, problems = parity.judge(truth, bad, tol, names)
    assert sets["natural"]["noise_ratio"] <= 1 and sets["stress"]["noise_ratio"] > 1
    assert len(problems) == 1 and problems[0].startswith("stress: noise_ratio") and "s7" in problems[0]


def test_noisy_samples_get_a_wider_allowance_than_quiet_ones():
    truth = _truth(noise=1e-7)
    y32 = truth.y32.copy()
    y32[0] = truth.y64[0] * (1 + 1e-3)  # sample 0 is chaotic in float32 (noise 1e-3)
    truth = GroundTruth(truth.y64, y32, truth.sets)
    cand = truth.y64.copy()
    cand[0] *= 1 + 5e-3  # 5x its noise: passes
    assert parity.judge(truth, cand, parity.FLOAT64_TOLERANCES["fp32"])[2] == []
    cand[1] *= 1 + 5e-3  # the same error on a quiet sample: fails
    assert parity.judge(truth, cand, parity.FLOAT64_TOLERANCES["fp32"])[2]


def test_existing_keys_apply_on_top_of_the_noise_rule():
    truth = _truth()
    cand = truth.y64 * (1 + 5e-7)  # within the noise rule (floor 1e-6)
    tol = parity.tolerances(["fp32.max_rel=1e-7"], parity.FLOAT64_TOLERANCES)["fp32"]
    problems = parity.judge(truth, cand, tol)[2]
    assert problems and all("max_rel" in p for p in problems)
    off = parity.tolerances(["fp32.noise_floor=none", "fp32.noise_k=none"], parity.FLOAT64_TOLERANCES)["fp32"]
    assert not off.noise_rule()
    _, sets, problems = parity.judge(truth, truth.y64 * 1.1, off)  # no check left: nothing fails
    assert problems == [] and sets["natural"]["noise_ratio"] is None


def _fp16(truth: GroundTruth) -> GroundTruth:
    """`truth` with an fp16 reference: the float64 outputs rounded to float16 (an error of ~2.4e-4 relative)."""
    return replace(truth, y16=truth.y64.astype(np.float16).astype(np.float64))


def test_fp16_profile_is_judged_per_set_against_float64():
    truth = _fp16(_truth(n=8))
    cand = truth.y64.copy()
    cand[3] = -cand[3]  # one stress sample flipped: cosine -1 there
    _, sets, problems = parity.judge(truth, cand, parity.FLOAT64_TOLERANCES["fp16"])
    assert sets["natural"]["problems"] == [] and sets["stress"]["problems"]
    assert any(p.startswith("stress: cosine") for p in problems)


def test_fp16_rule_allows_a_few_times_the_fp16_references_error_per_sample():
    truth = _fp16(_truth(n=8))
    tol = parity.FLOAT64_TOLERANCES["fp16"]
    ref_err = sample_errors(truth.y64, truth.y16)
    # a correct fp16 artifact: another rounding, errors of the reference's size
    ok = truth.y64 * (1 + 2.0 ** -11 * np.random.default_rng(1).choice([-1.0, 1.0], size=truth.y64.shape))
    _, sets, problems = parity.judge(truth, ok, tol)
    assert problems == [] and all(0 < d["noise_ratio"] <= 1 for d in sets.values()), sets
    assert all(d["reference_fp16_error"] == ref_err[truth.indices(s)].max() for s, d in sets.items())
    # one channel of one natural sample off by 10x the reference's error there: beyond K = 4
    bad = ok.copy()
    bad[1, 2] += 10 * np.abs(truth.y64[1]).max() * max(ref_err[truth.indices("natural")].max(), 2.0 ** -11)
    _, sets, problems = parity.judge(truth, bad, tol)
    assert sets["stress"]["problems"] == [] and len(problems) == 1, problems
    assert problems[0].startswith("natural: noise_ratio") and "x fp16 error" in problems[0]
    assert sets["natural"]["worst_sample"]["index"] == 1


def test_fp16_median_ratio_catches_a_systematic_error_no_single_sample_shows():
    truth = _truth(n=16)  # 12 natural samples: enough for the median, 4 stress: too few
    rng = np.random.default_rng(2)  # an fp16 reference with errors above the floor (~2e-3 of the largest logit)
    truth = replace(truth, y16=truth.y64 * (1 + 2.0 ** -9 * rng.choice([-1.0, 1.0], size=truth.y64.shape)))
    tol = parity.FLOAT64_TOLERANCES["fp16"]
    ref_err = np.empty(16)
    for s in truth.present():  # each sample's allowance basis: its reference error raised to its set's median
        ref_err[truth.indices(s)] = effective_noise(truth.noise16[truth.indices(s)])
    scale = np.abs(truth.y64).max(axis=1)

    def shifted(times):  # every sample's largest logit moved by `times` its reference error
        out = truth.y64.copy()
        out[np.arange(16), np.abs(truth.y64).argmax(1)] += times * ref_err * scale
        return out

    _, sets, problems = parity.judge(truth, shifted(1.0), tol)
    assert problems == [] and sets["natural"]["fp16_median_ratio"] <= 1.0 and sets["stress"]["fp16_median_ratio"] is None
    _, sets, problems = parity.judge(truth, shifted(3.0), tol)  # within K = 4 on every sample, 3x on the typical one
    assert all(d["noise_ratio"] <= 1 for d in sets.values())
    assert problems == [f"natural: fp16 median ratio {sets['natural']['fp16_median_ratio']:.3g} > 2 (the typical "
                        "sample's error over the fp16 reference's: a systematic error)"]


def test_fp16_rule_without_its_reference_is_an_error_not_a_pass():
    with pytest.raises(ValueError, match="fp16 reference"):
        parity.judge(_truth(n=8), _truth(n=8).y64, parity.FLOAT64_TOLERANCES["fp16"])


def test_fp16_reference_rounds_weights_and_module_outputs():
    import torch

    lin = torch.nn.Linear(4, 3).double()
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    y16 = parity.fp16_reference(lin, x)
    with torch.no_grad():
        w, b = lin.weight.half().float(), lin.bias.half().float()
        want = (torch.as_tensor(x).half().float() @ w.T + b).half().double().numpy()
    assert np.array_equal(y16, want)


def test_tol_parsing_accepts_the_noise_keys():
    assert parity.parse_tol("fp32.noise_k=10") == ("fp32", "noise_k", 10.0)
    assert parity.parse_tol("fp32.noise_floor=none") == ("fp32", "noise_floor", None)
    t = parity.tolerances(["fp32.noise_k=7", "fp32.noise_floor=2e-6"], parity.FLOAT64_TOLERANCES)["fp32"]
    assert (t.noise_k, t.noise_floor) == (7.0, 2e-6)
    with pytest.raises(VitedgeError, match="noise_floor"):
        parity.parse_tol("fp32.noise_flor=1")


def test_check_hop_with_ground_truth_reports_sets_and_fails_nonfinite():
    truth = _truth()
    tol = parity.FLOAT64_TOLERANCES["fp32"]
    hop = parity.check_hop("onnx", ArrayRunner(truth.y64, batch=4), np.zeros((8, 3, 2, 2), np.float32), None, tol,
                           truth=truth)
    assert hop.status == "passed" and set(hop.sets) == {"natural", "stress"}
    assert hop.metrics.max_rel < 1e-6  # float32-rounded float64 truth
    y = truth.y64.copy()
    y[2, 0] = np.nan
    hop = parity.check_hop("onnx", ArrayRunner(y), np.zeros((8, 3, 2, 2), np.float32), None, tol, truth=truth)
    assert hop.status == "failed" and hop.reason.startswith("non-finite outputs")
    assert hop.sets["natural"]["noise_ratio"] == np.inf


def test_an_artifact_with_another_output_shape_fails_its_hop_and_says_why():
    """Another class count (an older artifact without its class count in the metadata, checked with another
    --checkpoint): the hop fails naming both shapes, against the truth and against a float32 reference alike;
    it is never a crash (exit 3)."""
    truth = _truth()
    wide = np.zeros((truth.y64.shape[0], truth.y64.shape[1] + 2))
    for ref, kw in ((None, {"truth": truth}), (truth.y64, {})):
        tol = parity.FLOAT64_TOLERANCES["fp32"] if ref is None else parity.DEFAULT_TOLERANCES["fp32"]
        hop = parity.check_hop("onnx", ArrayRunner(wide), np.zeros((8, 3, 2, 2), np.float32), ref, tol, **kw)
        assert hop.status == "failed" and hop.metrics is None
        assert f"output shape {wide.shape} differs from the reference's {truth.y64.shape}" in hop.reason


def test_check_hop_without_ground_truth_refuses_the_noise_keys():
    tol = parity.FLOAT64_TOLERANCES["fp32"]
    y = np.ones((2, 3))
    with pytest.raises(VitedgeError, match="float64 ground truth"):
        parity.check_hop("onnx", ArrayRunner(y), np.zeros((2, 3, 2, 2), np.float32), y, tol)
    hop = parity.check_hop("onnx", ArrayRunner(y), np.zeros((2, 3, 2, 2), np.float32), y,
                           parity.DEFAULT_TOLERANCES["fp32"])
    assert hop.status == "passed" and hop.sets is None


def test_accuracy_and_reference_summary_with_labels():
    y = np.array([[3.0, 1, 0, 0, 0, 0], [0, 2, 1, 0, 0, 0], [0, 0, 0, 0, 0, 9], [1, 0, 0, 0, 0, 0]])
    labels = np.array([0, 2, 4, -1])
    assert accuracy(y, labels, 1) == pytest.approx(1 / 3)
    assert accuracy(y, labels, 5) == pytest.approx(2 / 3)  # label 4 of sample 2 ties with 0s: not in its top 5
    assert accuracy(y, None, 1) is None and accuracy(y, np.array([-1, -1, -1, -1]), 1) is None
    truth = GroundTruth(y, y * (1 + 1e-7), ("user", "user", "user", "stress"), labels)
    ref = reference_summary(truth)
    assert ref["user"]["top1_accuracy"] == pytest.approx(1 / 3) and ref["stress"]["top1_accuracy"] is None
    assert ref["user"]["reference_noise"] == pytest.approx(1e-7, rel=1e-6)
    _, sets, _ = parity.judge(truth, y, parity.FLOAT64_TOLERANCES["fp32"])
    assert sets["user"]["top5_accuracy"] == pytest.approx(2 / 3)


# ---- one allowance: only the module defining NoiseRule writes max(floor, K * noise) -----------------------------

ROOT = Path(vitedge.__file__).resolve().parent
SCANNED = ("exporter", "targets", "models", "benchmarks", "scripts", "examples", "tests")
MAX_CALLS = {"max", "maximum", "fmax", "clamp", "clip"}


def _names(node: ast.AST) -> set[str]:
    """Identifiers and attribute names read in `node` (the callee of a call excluded: np.floor(x) is no floor)."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id.lower())
        elif isinstance(n, ast.Attribute):
            out.add(n.attr.lower())
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            out.discard((n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")).lower())
    return out


def _scaled_noise(node: ast.AST) -> bool:
    """A product (K * noise) or the median-raised noise itself (K = 1)."""
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) for n in ast.walk(node)) or any(
        isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == "effective_noise"
        for n in ast.walk(node))


def allowance_copies(source: str | ast.AST) -> list[int]:
    """Lines of `source` computing an allowance by hand: a max of a floor and a scaled noise."""
    found = []
    for n in ast.walk(ast.parse(source) if isinstance(source, str) else source):
        if not isinstance(n, ast.Call):
            continue
        name = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
        args = list(n.args) + [k.value for k in n.keywords]  # clamp(x, min=floor)
        if name not in MAX_CALLS or len(args) < 2:
            continue
        floors = [i for i, a in enumerate(args) if any("floor" in s for s in _names(a))]
        if floors and any(_scaled_noise(a) for i, a in enumerate(args) if i not in floors):
            found.append(n.lineno)
    return found


def test_the_allowance_detector_sees_the_hand_written_forms():
    for copy in ("allowed = np.maximum(rule.floor, rule.k * eff)",
                 "a = max(NOISE_FLOOR, NOISE_K * noise)",
                 "a = np.maximum(WEIGHT_FLOOR, k * np.maximum(ref, np.median(ref)))",
                 "m = np.median(err / np.maximum(effective_noise(noise), rule.floor))",
                 "a = torch.clamp(tol.fp16_k * n, min=tol.fp16_floor)"):
        assert allowance_copies(copy) == [1], copy
    for fine in ("allowed = rule.allowance(noise)", "a = NoiseRule(WEIGHT_FLOOR, k).allowance(ref)",
                 "y = np.maximum(x, np.floor(2 * x))", "s = max(scale, 1e-30)"):
        assert allowance_copies(fine) == [], fine


def test_only_the_noise_rule_module_computes_the_allowance():
    """parity.judge, the weights check, localization and the benchmarks all go through NoiseRule (or
    criteria.allowances beside it): a second copy of the formula could drift from the one the verdict uses."""
    files = sorted(p for d in SCANNED for p in (ROOT / d).rglob("*.py")) + sorted(ROOT.glob("*.py"))
    trees = {str(p.relative_to(ROOT)): ast.parse(p.read_text()) for p in files}
    home = [f for f, tree in trees.items() if any(isinstance(n, ast.ClassDef) and n.name == "NoiseRule"
                                                  for n in tree.body)]
    assert len(home) == 1, home
    copies = {f: lines for f, tree in trees.items() if f not in home for lines in [allowance_copies(tree)] if lines}
    assert copies == {}, f"allowance computed outside {home[0]}: {copies}"
    assert allowance_copies(trees[home[0]])  # the formula is there, and the detector sees it
    rule = NoiseRule(floor=1e-5, k=20)
    np.testing.assert_array_equal(rule.allowance(np.array([1e-9, 1e-3, 2e-3])), [2e-2, 2e-2, 4e-2])  # median-raised
