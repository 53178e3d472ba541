"""Interleaved timing for the benchmark scripts: candidates timed in rounds (call by call, or in blocks for
multi-thread sessions), so load from other processes hits all of them alike; ONNX Runtime sessions created so
that their placement favours no candidate.

Timing is the project's own (`vitedge.exporter.timing.latency`); the ratios and their intervals are `_stats`.
"""
from __future__ import annotations

import math
import random
import time
from typing import Callable

import numpy as np
import onnx
import torch

from vitedge.exporter.timing import latency
from vitedge.targets.onnx.target import OnnxRuntimeRunner

from _stats import rel_width, speedup

def time_rounds(fns: dict[str, Callable[[], object]], min_rounds: int, max_s: float) -> dict[str, list[float]]:
    """Interleaved rounds (A, B, C, A, B, C, ...) after a short warm-up: at least `min_rounds`, until `max_s`."""
    return latency.time_interleaved(fns, warmup_s=min(0.2, max_s), min_iters=min_rounds, max_s=max_s)


def time_blocks(fns: dict[str, Callable[[], object]], rounds: int, block_s: float,
                seed: int = 0) -> dict[str, list[float]]:
    """Interleaved *blocks*: per round, each candidate runs back to back for at least `block_s` (and at least
    two calls); the median of the block's second half is that round's time (paired across candidates).

    For multi-thread ONNX Runtime sessions: each session owns a thread pool whose idle workers spin, and
    alternating sessions call by call makes them compete for the cores (measured: docs/benchmarks/index.md, method
    notes)."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    rng = random.Random(seed)
    for _ in range(rounds):
        order = list(fns)
        rng.shuffle(order)  # as latency.time_interleaved: where a candidate falls in the order shifts its time
        for k in order:
            f = fns[k]
            ts, end = [], time.perf_counter() + block_s
            while len(ts) < 2 or time.perf_counter() < end:
                t0 = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t0)
            out[k].append(float(np.median(ts[len(ts) // 2:])))
    return out


def time_until_precise(fns: dict[str, Callable[[], object]], pairs: list[tuple[str, str]], min_rounds: int,
                       max_s: float, ci_width: float, block_s: float = 0.0,
                       min_s: float = 0.0) -> dict[str, list[float]]:
    """Interleaved rounds (call by call, or blocks of `block_s` with `time_blocks`) until every (new, base)
    speedup's 95 % CI is at most `ci_width` wide (relative to the ratio), or `max_s` has passed; at least
    `min_rounds` and `min_s` (so that a cell spans more than a passing moment of the machine).

    The stopping rule looks at the interval's width only, never at where it lies, so it cannot steer a ratio
    towards a threshold; it spends rounds where the machine is noisy instead of reporting an interval too
    wide to say anything."""
    def rounds(n: int, warmup_s: float, seed: int) -> dict[str, list[float]]:
        # `seed`: the rounds done so far, so that every batch of rounds gets orders of its own
        if block_s > 0:
            return time_blocks(fns, n, block_s, seed=seed)  # the first half of every block is its own warm-up
        return latency.time_interleaved(fns, warmup_s=warmup_s, min_iters=n, max_s=0.0, seed=seed)

    start = time.perf_counter()
    times = rounds(min_rounds, min(0.2, max_s), 0)
    while time.perf_counter() - start < max(max_s, min_s):
        widths = [rel_width(speedup(times[base], times[new])) for new, base in pairs]
        if all(w <= ci_width for w in widths) and time.perf_counter() - start >= min_s:
            break
        # grow by half each time (few bootstrap checks), but not far past the time budget
        done, elapsed = len(next(iter(times.values()))), time.perf_counter() - start
        n = max(1, min(max(min_rounds, done // 2), math.ceil((max(max_s, min_s) - elapsed) * done / elapsed)))
        for k, v in rounds(n, 0.0, done).items():
            times[k] += v
    return times


def time_sessions(make: Callable[[int], tuple[dict[str, Callable[[], object]], Callable[[], None]]],
                  pairs: list[tuple[str, str]], sessions: int, min_rounds: int, max_s: float, ci_width: float,
                  block_s: float = 0.0, min_s: float = 0.0) -> dict[str, list[list[float]]]:
    """`time_until_precise` in `sessions` epochs, its time budget split evenly between them. Epoch e calls
    `make(e)` for fresh candidates (new ONNX Runtime sessions, programs loaded anew) and a function that releases
    them, so each candidate is timed in several sessions: candidate -> its rounds per session, for
    `_stats.speedup_sessions`. The ci_width stopping rule applies within each epoch."""
    out: dict[str, list[list[float]]] = {}
    for e in range(sessions):
        fns, close = make(e)
        try:
            times = time_until_precise(fns, pairs, min_rounds, max_s / sessions, ci_width, block_s=block_s,
                                       min_s=min_s / sessions)
        finally:
            close()
        for k, v in times.items():
            out.setdefault(k, []).append(v)
    return out


def ort_fresh(graphs: dict[str, onnx.ModelProto], threads: int, x: np.ndarray, spinning: bool | None = None,
              copies: int = 1):
    """`make(epoch)` for `time_sessions`: every graph in new ONNX Runtime sessions each epoch (`ort_sessions`, seeded
    by the epoch), each run on `x`."""
    def make(epoch):
        made = ort_sessions(graphs, threads, spinning, seed=1000 * epoch, copies=copies)
        return {k: (lambda s=s: s.run(x)) for k, s in made.items()}, made.clear
    return make


def pooled(per: dict[str, list[list[float]]]) -> dict[str, list[float]]:
    """`time_sessions`' rounds per session, pooled per candidate (for latency statistics)."""
    return {k: [t for s in v for t in s] for k, v in per.items()}


def ort(model: onnx.ModelProto, threads: int, spinning: bool | None = None) -> OnnxRuntimeRunner:
    """ONNX Runtime CPU session; threads=0 lets ORT use every core; spinning None = ORT's default (on)."""
    return OnnxRuntimeRunner(model, threads=threads, spinning=spinning)


class Alternating:
    """Several sessions of one graph behind one `run`, used in turn, call by call: a candidate's time is then an
    average over where its sessions landed in memory rather than one placement's luck."""

    def __init__(self, runners: list):
        self.runners, self.calls = runners, 0

    def run(self, x: np.ndarray) -> np.ndarray:
        self.calls += 1
        return self.runners[self.calls % len(self.runners)].run(x)


def ort_sessions(graphs: dict[str, onnx.ModelProto], threads: int, spinning: bool | None = None, seed: int = 0,
                 copies: int = 1) -> dict[str, OnnxRuntimeRunner | Alternating]:
    """`ort` for each graph (`copies` sessions of each behind an `Alternating`), created in a seeded random order
    and returned in the given key order. Identical sessions of one graph differed by up to 2.6 % in speed (A/A tests
    here: docs/benchmarks/index.md, method notes), by when and where they were created; shuffling the creation order
    and alternating copies keeps that from favouring one candidate."""
    order = [(k, i) for k in graphs for i in range(copies)]
    random.Random(seed).shuffle(order)
    made: dict[str, list] = {k: [] for k in graphs}
    for k, _ in order:
        made[k].append(ort(graphs[k], threads, spinning))
    return {k: v[0] if copies == 1 else Alternating(v) for k, v in made.items()}


def gemm_fn(n: int) -> tuple[Callable[[], object], float]:
    """An fp32 n x n x n torch matmul and its GFLOP: the machine's compute ceiling (single-thread once the
    caller has set `torch.set_num_threads(1)`, as deploy_speed.py does)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    out = torch.empty(n, n)

    def run():
        torch.mm(a, b, out=out)
    return run, 2.0 * n ** 3 / 1e9
