"""Latency statistics and timing loops: time-based warm-up, minimum iterations, percentiles,
bootstrap confidence intervals, interleaved paired ratios, and the regression gate.

Pure measurement code: no model or backend knowledge (the harness in bench.py drives it).
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


def percentile(times: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    return float(np.percentile(np.asarray(times, dtype=np.float64), q))


def bootstrap_ci(values: Sequence[float], stat: Callable[[np.ndarray], float] = np.median,
                 resamples: int = BOOTSTRAP_RESAMPLES, confidence: float = CONFIDENCE,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of `stat` over `values` (seeded: reports are reproducible)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("no values")
    if v.size == 1:
        return float(v[0]), float(v[0])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, v.size, size=(resamples, v.size))
    stats = np.apply_along_axis(stat, 1, v[idx]) if stat is not np.median else np.median(v[idx], axis=1)
    lo, hi = np.quantile(stats, [(1 - confidence) / 2, 1 - (1 - confidence) / 2])
    return float(lo), float(hi)


@dataclass
class LatencyStats:
    iters: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    std_ms: float
    cv: float                 # coefficient of variation, std / mean
    p50_ci_ms: tuple          # bootstrap CI of the median
    throughput: float         # images / s at the median latency
    batch: int

    def to_dict(self) -> dict:
        d = asdict(self)
        d["p50_ci_ms"] = list(self.p50_ci_ms)
        return d


def summarize(times_s: Sequence[float], batch: int = 1) -> LatencyStats:
    t = np.asarray(times_s, dtype=np.float64) * 1e3
    if t.size == 0:
        raise ValueError("no timings")
    mean, std = float(t.mean()), float(t.std(ddof=1)) if t.size > 1 else 0.0
    p50 = percentile(t, 50)
    return LatencyStats(iters=int(t.size), p50_ms=p50, p90_ms=percentile(t, 90), p99_ms=percentile(t, 99),
                        mean_ms=mean, std_ms=std, cv=std / mean if mean > 0 else math.nan,
                        p50_ci_ms=bootstrap_ci(t), throughput=batch * 1e3 / p50 if p50 > 0 else math.inf,
                        batch=batch)


def time_loop(fn: Callable[[], object], warmup_s: float = 0.5, min_iters: int = 50, max_s: float = 10.0,
              clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Time-based warm-up (at least one call), then timed calls until `max_s` has passed AND at least
    `min_iters` were timed (min_iters wins over max_s: the count is a floor)."""
    start = clock()
    fn()
    while clock() - start < warmup_s:
        fn()
    times: list[float] = []
    t_end = clock() + max_s
    while len(times) < min_iters or clock() < t_end:
        t0 = clock()
        fn()
        times.append(clock() - t0)
        if len(times) >= min_iters and clock() >= t_end:
            break
    return times


def time_interleaved(fns: dict[str, Callable[[], object]], warmup_s: float = 0.5, min_iters: int = 50,
                     max_s: float = 10.0, clock: Callable[[], float] = time.perf_counter,
                     seed: int = 0) -> dict[str, list[float]]:
    """Time several callables in rounds so drift and noise hit all alike, each round in a fresh (seeded) random
    order: where a call falls in the order shifts its time (an A/A test of four ONNX Runtime sessions of one graph
    here: 1.2-2.1 % between identical sessions in a fixed order), enough to fake a speed-up between candidates.

    Returns per-name timings of equal length; index i of each list is from the same round (paired)."""
    names = list(fns)
    rng = random.Random(seed)
    start = clock()
    for n in names:
        fns[n]()
    while clock() - start < warmup_s:
        for n in names:
            fns[n]()
    out: dict[str, list[float]] = {n: [] for n in names}
    t_end = clock() + max_s
    rounds = 0
    while rounds < min_iters or clock() < t_end:
        order = names[:]
        rng.shuffle(order)
        for n in order:
            t0 = clock()
            fns[n]()
            out[n].append(clock() - t0)
        rounds += 1
        if rounds >= min_iters and clock() >= t_end:
            break
    return out


def paired_ratio(num_s: Sequence[float], den_s: Sequence[float]) -> dict:
    """Ratio of medians num/den with a paired bootstrap CI (pairs resampled together, round by round)."""
    a, b = np.asarray(num_s, dtype=np.float64), np.asarray(den_s, dtype=np.float64)
    if a.shape != b.shape or a.size == 0:
        raise ValueError("paired_ratio needs equal-length, non-empty timings")
    ratio = float(np.median(a) / np.median(b))
    rng = np.random.default_rng(0)
    idx = rng.integers(0, a.size, size=(BOOTSTRAP_RESAMPLES, a.size))
    boot = np.median(a[idx], axis=1) / np.median(b[idx], axis=1)
    lo, hi = np.quantile(boot, [(1 - CONFIDENCE) / 2, 1 - (1 - CONFIDENCE) / 2])
    return {"ratio": ratio, "ci": [float(lo), float(hi)], "pairs": int(a.size)}


def paired_ratio_sessions(num_s: Sequence[Sequence[float]], den_s: Sequence[Sequence[float]]) -> dict:
    """Ratio of medians num/den over several sessions' paired rounds (session i: num_s[i] against den_s[i]),
    with a two-level bootstrap CI: sessions resampled, then rounds within each resampled session. Identical
    sessions of one graph differ in speed by more than one session's rounds vary, so an interval over one session
    pair is too narrow; this one carries the session-to-session spread. `per_session`: each pair's own ratio."""
    pairs = [(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)) for a, b in zip(num_s, den_s)]
    if not pairs or len(num_s) != len(den_s) or any(a.shape != b.shape or a.size == 0 for a, b in pairs):
        raise ValueError("paired_ratio_sessions needs as many sessions on each side, each with equal-length timings")
    a_all, b_all = np.concatenate([a for a, _ in pairs]), np.concatenate([b for _, b in pairs])
    ratio = float(np.median(a_all) / np.median(b_all))
    rng = np.random.default_rng(0)
    boot = np.empty(BOOTSTRAP_RESAMPLES)
    for r in range(BOOTSTRAP_RESAMPLES):
        picked = [pairs[i] for i in rng.integers(0, len(pairs), len(pairs))]
        idx = [rng.integers(0, a.size, a.size) for a, _ in picked]
        boot[r] = (np.median(np.concatenate([a[i] for (a, _), i in zip(picked, idx)]))
                   / np.median(np.concatenate([b[i] for (_, b), i in zip(picked, idx)])))
    lo, hi = np.quantile(boot, [(1 - CONFIDENCE) / 2, 1 - (1 - CONFIDENCE) / 2])
    return {"ratio": ratio, "ci": [float(lo), float(hi)], "pairs": int(a_all.size), "sessions": len(pairs),
            "per_session": [float(np.median(a) / np.median(b)) for a, b in pairs]}


def regression_check(current: dict[str, float], baseline: dict[str, float], max_regression_pct: float) -> list[dict]:
    """Compare p50 latencies by key; return the entries that regressed by more than the threshold.

    Keys missing on either side are ignored (a new backend is not a regression)."""
    if max_regression_pct < 0:
        raise ValueError("--max-regression must be >= 0")
    out = []
    for key, cur in current.items():
        base = baseline.get(key)
        if base is None or base <= 0:
            continue
        pct = (cur / base - 1.0) * 100.0
        if pct > max_regression_pct:
            out.append({"key": key, "baseline_ms": base, "current_ms": cur, "regression_pct": pct})
    return out
