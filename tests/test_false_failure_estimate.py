"""The false-failure study's tail estimate (benchmarks/false_failures.py), both ways: a light (exponential) tail far
below ratio 1 gives a negligible chance of failing at 5000 samples, a heavy (power-law) tail with the same bulk a
large one, and the upper bound never sits below the estimate. The study's K rests on this estimate."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def study():
    import sys

    sys.path.insert(0, str(BENCH))  # the benchmark imports its sibling helpers (_script, _corpus)
    try:
        spec = importlib.util.spec_from_file_location("false_failures_under_test", BENCH / "false_failures.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH))
    return mod


@pytest.fixture(scope="module")
def tail_estimate(study):
    return study.tail_estimate


def test_light_tail_heavy_tail_and_the_upper_bound(tail_estimate):
    rng = np.random.default_rng(0)
    light = 0.05 + rng.exponential(0.03, 5000)               # the correct artifacts' shape: max near 0.3
    heavy = 0.05 + 0.03 * (rng.pareto(2.5, 5000))            # a power law (shape 0.4) with the same bulk
    lt, ht = tail_estimate(light, boot=50), tail_estimate(heavy, boot=50)
    assert abs(lt["shape"]) < 0.15 and ht["shape"] > 0.2
    assert lt["p_fail_at_n"] < 1e-6 < 1e-3 < ht["p_fail_at_n"]
    for t in (lt, ht):
        assert t["p_fail_at_n_upper"] >= t["p_fail_at_n"] and t["shape_upper"] >= max(0.0, t["shape"])
        assert t["shape_ci95"][0] <= t["shape"] <= t["shape_ci95"][1] and t["n"] == 5000
    # the exponential's exact P(one sample > 1), exp(-0.95 / 0.03), lies under the upper bound (the point estimate,
    # extrapolated this far beyond the data, may land orders of magnitude off either way)
    assert lt["p_sample_upper"] >= np.exp(-(1 - 0.05) / 0.03)


def test_the_photo_corpus_is_photographs_each_counted_for_what_it_is(study):
    """The non-digit corpus: views of scikit-learn's two sample images and the shipped photos, named per view, every
    photo's first view its eval transform and the next ones crops."""
    x, sets, what = study.photo_corpus("swiftformer_xs", 32, 40)
    assert x.shape == (40, 3, 32, 32) and x.dtype == np.float32 and np.isfinite(x).all()
    assert set(sets) == {"natural"} and what["views"] == 40
    assert what["sklearn_sample_images"] == 2 and what["distinct_photos"] == 2 + what["shipped_photos"] >= 10
    k = what["distinct_photos"]
    assert len({x[i].tobytes() for i in range(40)}) == 40  # every view its own image
    assert what["views_per_photo"] == [40 // k, -(-40 // k)]
