"""A cell's verdict from its report.json (plain dicts: read by the driver without torch).

- "failed": a parity hop failed (the report says which and why);
- "unverified": no hop failed but one could not run here, or the cell asks `coreml_mode: device` and the
  CoreML hop ran emulated, or (set by the engines) the cluster lacks the resources the cell needs;
- "error": the cell crashed or its input was refused (set by the worker, traceback saved);
- "passed": every hop ran and passed.
"""
from __future__ import annotations

from ..core.target_plans import artifact_key
from .plan import Cell

STATUSES = ("passed", "failed", "unverified", "error")
_UPPER = ("max_abs", "max_rel")
_LOWER_TO_ONE = ("cosine", "top1_agreement", "top5_agreement")


def cell_status(report: dict, cell: Cell) -> tuple[str, str | None]:
    hops = report.get("parity") or []
    bad = [h for h in hops if h["status"] == "failed"]
    if bad:
        return "failed", "; ".join(f"{h['hop']}: {h.get('reason') or 'failed'}" for h in bad)
    if cell.coreml_mode == "device":
        h = next((h for h in hops if h["hop"] == cell.hop), None)
        if h is not None and h["status"] == "passed" and h.get("mode") != "device":
            return "unverified", (f"coreml_mode device: the {cell.hop} hop ran {h.get('mode')} here; only the CoreML "
                                  "framework on macOS verifies it (run the plan with --ray on a cluster with a Mac)")
    unv = [h for h in hops if h["status"] == "unverified"]
    if unv:
        return "unverified", "; ".join(f"{h['hop']}: {h.get('reason') or 'unverified'}" for h in unv)
    return "passed", None


def _ratio(key: str, value: float, limit: float) -> float:
    """How much of the tolerance a metric uses: > 1 misses it."""
    if key in _UPPER:
        return value / limit if limit > 0 else (0.0 if value == 0 else float("inf"))
    if key in _LOWER_TO_ONE:  # closeness to 1 in units of the allowed shortfall
        room = 1.0 - limit
        return (1.0 - value) / room if room > 0 else (0.0 if value >= 1 else float("inf"))
    return limit / value if value > 0 else float("inf")  # psnr_db


def worst_metric(report: dict | None) -> dict | None:
    """The checked metric closest to (or furthest past) its threshold over every hop of the cell."""
    worst = None
    for h in (report or {}).get("parity") or []:
        m, tol = h.get("metrics"), h.get("tolerance")
        if not m or not tol:
            continue
        for key, limit in tol.items():
            if key == "profile" or limit is None or m.get(key) is None:
                continue
            r = _ratio(key, float(m[key]), float(limit))
            if worst is None or r > worst["ratio"]:
                worst = {"hop": h["hop"], "metric": key, "value": m[key], "limit": limit, "ratio": r}
    return worst


def artifact_bytes(report: dict | None, cell: Cell) -> int | None:
    a = ((report or {}).get("artifacts") or {}).get(artifact_key(cell.hop))
    return a.get("bytes") if a else None
