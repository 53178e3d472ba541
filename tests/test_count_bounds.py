"""Agreement and accuracy bounds are judged as counts (k of n), never as fractions that round: for every n from 1
to 300 a bound passes exactly the counts integer arithmetic says it should (a (n-1)/n bound once failed n-1 of n
by one float step: `top1_agreement 0.8571 < 0.8571`)."""
from __future__ import annotations

import numpy as np
import pytest

from vitedge.exporter.verdict import parity
from vitedge.exporter.quantize.compressed import resolution_bounds
from vitedge.exporter.verdict.criteria import GroundTruth
from vitedge.exporter.core.report import Metrics, Tolerance, allowed_count, required_count

# every lower bound the shipped profiles state, as the integers a reader means by it
STATED = {0.99: (99, 100), 0.95: (95, 100), 0.9: (9, 10), 0.7: (7, 10), 0.8: (4, 5), 0.5: (1, 2)}
NS = range(1, 301)


def _need(num: int, den: int, n: int) -> int:
    return -(-num * n // den)  # ceil(num * n / den) in integers


def _metrics(n: int, agreeing: int) -> Metrics:
    return Metrics(max_abs=0.0, max_rel=0.0, cosine=1.0, psnr_db=300.0, top1_agreement=agreeing / n,
                   top5_agreement=1.0, samples=n, top1_agreeing=agreeing, top5_agreeing=n)


@pytest.mark.parametrize("bound", sorted(STATED))
def test_required_count_is_the_integer_ceiling_for_every_n(bound):
    num, den = STATED[bound]
    assert [required_count(bound, n) for n in NS] == [_need(num, den, n) for n in NS]


def test_resolution_bound_tolerates_exactly_one_disagreeing_sample_for_every_n():
    for n in NS:
        for bound, (num, den) in STATED.items():
            tol = resolution_bounds(Tolerance("int8", top1_agreement=bound), n, 0)
            need = min(_need(num, den, n), n - 1)
            assert tol.violations(_metrics(n, need)) == [], (n, bound)
            if need > 0:
                bad = tol.violations(_metrics(n, need - 1))
                assert bad and bad[0].startswith(f"top1_agreement {need - 1}/{n} < {need}/{n}"), (n, bound, bad)


def test_the_reported_slip_passes_six_of_seven():
    # int8's 0.9 bound on 7 samples, one disagreeing sample tolerated: 6 of 7 passes, 5 of 7 fails
    tol = resolution_bounds(parity.COMPRESSED_TOLERANCES["int8"], 7, 0)
    assert tol.violations(_metrics(7, 6)) == []
    assert tol.violations(_metrics(7, 5))


def test_allowed_count_is_the_integer_floor_for_every_n():
    for n in NS:
        assert allowed_count(0.005, n) == 5 * n // 1000
        assert allowed_count(0.02, n) == 2 * n // 100
        assert allowed_count(1.0 / n, n) == 1          # the resolution bound: one misclassified sample
        assert allowed_count(max(0.005, 1.0 / n), n) == max(1, 5 * n // 1000)


def _labelled(n: int, ref_correct: int, cand_correct: int):
    """Logits over 2 classes for n labelled samples (label 0): the float64 truth right on `ref_correct` samples, a
    candidate right on `cand_correct`."""
    truth = np.tile([[1.0, 0.0]], (n, 1))
    truth[ref_correct:] = [0.0, 1.0]
    cand = np.tile([[1.0, 0.0]], (n, 1))
    cand[cand_correct:] = [0.0, 1.0]
    gt = GroundTruth(truth, truth.copy(), ("user",) * n, labels=np.zeros(n, np.int64))
    return gt, cand


@pytest.mark.parametrize("n", [1, 3, 7, 19, 27, 63, 200, 300])
def test_accuracy_drop_is_judged_in_misclassified_samples(n):
    # with the resolution bound, one more misclassified sample than the float64 truth passes, two fail
    tol = resolution_bounds(Tolerance("int8", accuracy_drop=0.005), n, n)
    allowed = max(1, 5 * n // 1000)
    gt, ok = _labelled(n, n, n - allowed)
    assert parity.judge(gt, ok, tol)[2] == []
    if n - allowed - 1 >= 0:
        gt, bad = _labelled(n, n, n - allowed - 1)
        problems = parity.judge(gt, bad, tol)[2]
        assert len(problems) == 1 and f"{allowed + 1} more misclassified, {allowed} allowed" in problems[0]


def test_compute_metrics_records_the_counts():
    ref = np.eye(7)
    out = ref.copy()
    out[0] = np.roll(out[0], 1)
    m = parity.compute_metrics(ref, out)
    assert (m.samples, m.top1_agreeing) == (7, 6) and m.top1_agreement == 6 / 7
