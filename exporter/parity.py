"""Parity: the metrics, the tolerance profiles and one ladder hop (candidate vs train-form on the parity set).

Every hop is compared with the train-form eval model on the same inputs (exporter/inputs.py), never with
the previous hop, so errors cannot hide by accumulating in small steps.
"""
from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np

from ..errors import VitedgeError
from ..targets.base import Runner, pad_batch
from .report import Hop, Metrics, Tolerance

# The documented defaults (README "Tolerances"); `--tol PROFILE.KEY=VALUE` overrides any of them.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance("fp32", max_rel=1e-4, cosine=0.99999),
    "fp16": Tolerance("fp16", cosine=0.999, psnr_db=35.0, top1_agreement=0.99),
}
TOL_KEYS = Tolerance.UPPER + Tolerance.LOWER
PSNR_CAP_DB = 300.0  # identical outputs (RMSE 0) report this instead of infinity
REFERENCE_BATCH = 32


def parse_tol(spec: str) -> tuple[str, str, float | None]:
    """`"fp16.psnr_db=30"` -> ("fp16", "psnr_db", 30.0); a value of `none` disables that check."""
    try:
        lhs, value = spec.split("=", 1)
        profile, key = lhs.strip().split(".", 1)
    except ValueError:
        raise VitedgeError(f"--tol expects PROFILE.KEY=VALUE (e.g. fp16.psnr_db=30); got {spec!r}") from None
    if profile not in DEFAULT_TOLERANCES:
        raise VitedgeError(f"--tol profile must be one of {', '.join(DEFAULT_TOLERANCES)}; got {profile!r}")
    if key not in TOL_KEYS:
        raise VitedgeError(f"--tol key must be one of {', '.join(TOL_KEYS)}; got {key!r}")
    if value.strip().lower() == "none":
        return profile, key, None
    try:
        return profile, key, float(value)
    except ValueError:
        raise VitedgeError(f"--tol value must be a number or 'none'; got {value!r} in {spec!r}") from None


def tolerances(overrides: dict | list | None = None) -> dict[str, Tolerance]:
    """The default profiles with overrides applied: `{"fp16": {"psnr_db": 30}}` or a list of `--tol` strings."""
    if isinstance(overrides, (list, tuple)):
        parsed: dict = {}
        for spec in overrides:
            p, k, v = parse_tol(spec)
            parsed.setdefault(p, {})[k] = v
        overrides = parsed
    out = dict(DEFAULT_TOLERANCES)
    for profile, values in (overrides or {}).items():
        if profile not in out:
            raise VitedgeError(f"unknown tolerance profile {profile!r}; use one of {', '.join(out)}")
        bad = set(values) - set(TOL_KEYS)
        if bad:
            raise VitedgeError(f"unknown tolerance key(s) {sorted(bad)}; use {', '.join(TOL_KEYS)}")
        out[profile] = replace(out[profile], **values)
    return out


def _topk_sets(y: np.ndarray, k: int) -> np.ndarray:
    return np.sort(np.argsort(-y, axis=1, kind="stable")[:, :k], axis=1)


def compute_metrics(reference: np.ndarray, candidate: np.ndarray) -> Metrics:
    """Metrics of `candidate` vs `reference` logits, both (samples, classes); computed in float64."""
    ref = np.asarray(reference, dtype=np.float64)
    out = np.asarray(candidate, dtype=np.float64)
    if ref.shape != out.shape:
        raise ValueError(f"output shape {out.shape} differs from the reference {ref.shape}")
    diff = out - ref
    scale = float(np.abs(ref).max())
    max_abs = float(np.abs(diff).max())
    max_rel = max_abs / max(scale, 1e-30)
    dots = (ref * out).sum(1)
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(out, axis=1)
    cos = np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), np.where(np.abs(out).sum(1) == 0, 1.0, 0.0))
    rmse = float(np.sqrt(np.mean(diff ** 2)))
    psnr = PSNR_CAP_DB if rmse == 0 else min(PSNR_CAP_DB, 20 * math.log10(max(scale, 1e-30) / rmse))
    k = min(5, ref.shape[1])
    top1 = float(np.mean(ref.argmax(1) == out.argmax(1)))
    top5 = float(np.mean(np.all(_topk_sets(ref, k) == _topk_sets(out, k), axis=1)))
    if not np.isfinite(out).all():
        max_abs = max_rel = cos_min = float("nan")
        psnr = float("nan")
    else:
        cos_min = float(cos.min())
    return Metrics(max_abs=max_abs, max_rel=max_rel, cosine=cos_min, psnr_db=psnr, top1_agreement=top1,
                   top5_agreement=top5)


def run_batched(runner: Runner, x: np.ndarray, batch: int = REFERENCE_BATCH) -> np.ndarray:
    """Run `x` through `runner` in chunks; a static-batch artifact gets exactly its batch (last chunk padded)."""
    static = runner.max_batch()
    step = static or batch
    outs = []
    for i in range(0, len(x), step):
        chunk = x[i:i + step]
        n = len(chunk)
        if static:
            chunk = pad_batch(chunk, static)
        outs.append(np.asarray(runner.run(np.ascontiguousarray(chunk)))[:n])
    return np.concatenate(outs)


def check_hop(hop: str, runner: Runner, inputs: np.ndarray, reference: np.ndarray, tolerance: Tolerance) -> Hop:
    """Run one hop on the parity set and judge it against `tolerance`."""
    t0 = time.perf_counter()
    cap = getattr(runner, "max_samples", None)  # e.g. an emulator runs a documented subset of the parity set
    if cap:
        inputs, reference = inputs[:cap], reference[:cap]
    out = run_batched(runner, inputs)
    metrics = compute_metrics(reference, out)
    problems = tolerance.violations(metrics)
    nonfinite = int((~np.isfinite(out)).any(axis=1).sum())
    if nonfinite:
        problems.insert(0, f"non-finite outputs (NaN/Inf) in {nonfinite} of {len(out)} samples")
    return Hop(hop=hop, backend=runner.backend, status="failed" if problems else "passed", mode=runner.mode,
               reason="; ".join(problems) or None, samples=int(len(inputs)), metrics=metrics, tolerance=tolerance,
               seconds=round(time.perf_counter() - t0, 3))


def unverified(hop: str, backend: str, reason: str, tolerance: Tolerance | None = None) -> Hop:
    return Hop(hop=hop, backend=backend, status="unverified", mode=None, reason=reason, tolerance=tolerance)


def failed(hop: str, backend: str, reason: str, mode: str | None = None, tolerance: Tolerance | None = None,
           diverging_module: str | None = None) -> Hop:
    return Hop(hop=hop, backend=backend, status="failed", mode=mode, reason=reason, tolerance=tolerance,
               diverging_module=diverging_module)
