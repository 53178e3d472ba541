"""Latency statistics on synthetic timings (no real timing involved)."""
import numpy as np
import pytest

from vitedge.exporter.timing.latency import (bootstrap_ci, paired_ratio, percentile, regression_check, summarize,
                                             time_interleaved, time_loop)


def test_percentiles_on_known_series():
    t = list(range(1, 101))  # 1..100
    assert percentile(t, 50) == pytest.approx(50.5)
    assert percentile(t, 90) == pytest.approx(90.1)
    assert percentile(t, 99) == pytest.approx(99.01)


def test_summary_fields_and_ci_contains_median():
    rng = np.random.default_rng(3)
    times = (2.0 + rng.gamma(2.0, 0.1, size=400)) / 1e3  # seconds, right-skewed like real latencies
    s = summarize(times, batch=4)
    ms = np.asarray(times) * 1e3
    assert s.iters == 400
    assert s.p50_ms == pytest.approx(float(np.median(ms)))
    assert s.p50_ci_ms[0] <= s.p50_ms <= s.p50_ci_ms[1]
    assert s.p50_ci_ms[1] - s.p50_ci_ms[0] > 0
    assert s.p50_ms <= s.p90_ms <= s.p99_ms
    assert s.cv == pytest.approx(np.std(ms, ddof=1) / np.mean(ms))
    assert s.throughput == pytest.approx(4 * 1e3 / s.p50_ms)


def test_bootstrap_ci_narrows_with_more_samples():
    rng = np.random.default_rng(0)
    small = bootstrap_ci(rng.normal(10, 1, 30))
    large = bootstrap_ci(rng.normal(10, 1, 3000))
    assert (large[1] - large[0]) < (small[1] - small[0])


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_time_loop_respects_min_iters_and_warmup():
    clock = FakeClock()
    calls = []

    def fn():
        calls.append(1)
        clock.t += 0.01

    times = time_loop(fn, warmup_s=0.1, min_iters=25, max_s=0.0, clock=clock)
    assert len(times) == 25
    assert len(calls) >= 25 + 10  # warm-up ran for its time budget first
    assert all(t == pytest.approx(0.01) for t in times)


def test_interleaved_rounds_are_paired():
    clock = FakeClock()
    order = []

    def mk(name, dt):
        def fn():
            order.append(name)
            clock.t += dt
        return fn

    out = time_interleaved({"a": mk("a", 0.002), "b": mk("b", 0.001)}, warmup_s=0.0, min_iters=10, max_s=0.0,
                           clock=clock)
    assert len(out["a"]) == len(out["b"]) == 10
    rounds = [tuple(order[i:i + 2]) for i in range(len(order) - 20, len(order), 2)]
    assert all(sorted(r) == ["a", "b"] for r in rounds)  # every round runs each candidate once ...
    assert {("a", "b"), ("b", "a")} <= set(rounds)  # ... in an order that changes from round to round
    order.clear()
    time_interleaved({"a": mk("a", 0.002), "b": mk("b", 0.001)}, warmup_s=0.0, min_iters=10, max_s=0.0, clock=clock)
    assert [tuple(order[i:i + 2]) for i in range(len(order) - 20, len(order), 2)] == rounds  # seeded: repeatable
    r = paired_ratio(out["a"], out["b"])
    assert r["ratio"] == pytest.approx(2.0)
    assert r["ci"][0] <= 2.0 <= r["ci"][1] + 1e-12


def test_regression_gate_both_ways():
    base = {"onnxruntime@224": 10.0, "torch@224": 20.0}
    assert regression_check({"onnxruntime@224": 10.9, "torch@224": 19.0}, base, 10.0) == []
    bad = regression_check({"onnxruntime@224": 11.5, "torch@224": 19.0}, base, 10.0)
    assert [b["key"] for b in bad] == ["onnxruntime@224"]
    assert bad[0]["regression_pct"] == pytest.approx(15.0)
    assert regression_check({"new@224": 99.0}, base, 10.0) == []


def test_session_ratio_interval_carries_the_spread_between_sessions():
    """Four session pairs whose ratios differ by +-3 % (as identical ONNX Runtime sessions did here): pooling their
    rounds into one paired interval would claim a precision the sessions do not have; the two-level interval covers
    the per-session ratios' spread."""
    from vitedge.exporter.timing.latency import paired_ratio_sessions

    rng = np.random.default_rng(1)
    shifts = [0.97, 1.0, 1.01, 1.03]
    num = [list(0.010 * s * (1 + 0.002 * rng.standard_normal(200))) for s in shifts]
    den = [list(0.010 * (1 + 0.002 * rng.standard_normal(200))) for _ in shifts]
    two = paired_ratio_sessions(num, den)
    pooled = paired_ratio(sum(num, []), sum(den, []))
    assert two["sessions"] == 4 and two["pairs"] == 800
    assert two["ratio"] == pytest.approx(pooled["ratio"])
    assert len(two["per_session"]) == 4 and two["per_session"][0] < 0.98 < 1.02 < two["per_session"][3]
    # the pooled interval is narrower than the spread of the sessions (0.97-1.03); the two-level one is far wider
    assert pooled["ci"][1] - pooled["ci"][0] < 0.01
    assert two["ci"][1] - two["ci"][0] > 3 * (pooled["ci"][1] - pooled["ci"][0])
    assert two["ci"][0] < 0.99 and two["ci"][1] > 1.015


def test_session_ratio_of_identical_sessions_matches_one_session():
    from vitedge.exporter.timing.latency import paired_ratio_sessions

    rng = np.random.default_rng(2)
    a, b = list(1.2 + 0.01 * rng.standard_normal(100)), list(1.0 + 0.01 * rng.standard_normal(100))
    r = paired_ratio_sessions([a], [b])
    assert r["ratio"] == pytest.approx(paired_ratio(a, b)["ratio"]) and r["ci"][0] < 1.2 < r["ci"][1]
    with pytest.raises(ValueError):
        paired_ratio_sessions([a, a], [b])
    with pytest.raises(ValueError):
        paired_ratio_sessions([a], [b[:-1]])
