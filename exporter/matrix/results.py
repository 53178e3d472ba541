"""What a matrix run gives back: DIR/matrix.json, DIR/matrix.md, the progress lines and the CLI summary.

`MatrixResult.to_dict()` is matrix.json (and what `vitedge.matrix()` returns): every cell's status, reason,
report (the full report.json, or null when the cell never produced one), cache key and whether it came from
the cache. Field names are a public contract (README "matrix.json"); add, never rename.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..core.report import EXIT_FAILED, EXIT_OK, finite
from ..core.settings import written


@dataclass
class CellResult:
    id: str                       # LABEL/IMGSZ/TARGET-PRECISION[-ARCH], also its folder under DIR
    model: str                    # registry name
    label: str
    imgsz: object                 # S for a square size (as it always was), [H, W] otherwise
    target: str
    precision: str
    trt_arch: str | None
    status: str                   # passed | failed | unverified | error (dry run: pending)
    reason: str | None = None
    cache_key: str | None = None
    from_cache: bool = False
    cached: bool | None = None    # dry run: whether the cache holds a passed entry for the key
    path: str | None = None       # the cell folder, relative to DIR
    report_path: str | None = None
    traceback: str | None = None  # relative to DIR (error cells)
    worst: dict | None = None     # the checked metric with the least headroom: hop, metric, value, limit, ratio
    bytes: int | None = None      # the cell's artifact
    latency: dict | None = None   # --bench: p50_ms, ... on the artifact's own runtime
    seconds: float | None = None  # build time (of the run that built it)
    resources: dict | None = None  # Ray: what the cell asked the cluster for
    node: str | None = None       # where it ran (Ray)
    report: dict | None = None


@dataclass
class MatrixResult:
    plan: str
    out: str
    cache: str
    engine: str
    cells: list = field(default_factory=list)     # [CellResult]
    skipped: list = field(default_factory=list)   # cross-product pairs a target does not support
    counts: dict = field(default_factory=dict)
    exit_code: int = EXIT_OK
    require_verified: bool = False
    bench: bool = False
    dry_run: bool = False
    seconds: float = 0.0
    versions: dict = field(default_factory=dict)

    def finalize(self) -> "MatrixResult":
        self.counts = {s: sum(c.status == s for c in self.cells) for s in ("passed", "failed", "unverified", "error")}
        self.counts["from_cache"] = sum(c.from_cache for c in self.cells)
        bad = self.counts["failed"] + self.counts["error"] + (self.counts["unverified"] if self.require_verified else 0)
        self.exit_code = EXIT_FAILED if bad else EXIT_OK
        return self

    def cell(self, cell_id: str) -> CellResult | None:
        return next((c for c in self.cells if c.id == cell_id), None)

    def to_dict(self) -> dict:
        return finite(asdict(self))

    def write(self, out: Path) -> None:
        _atomic(out / "matrix.json", json.dumps(self.to_dict(), indent=1) + "\n")
        _atomic(out / "matrix.md", markdown(self))


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ---- matrix.md ---------------------------------------------------------------------------------------

def _size(n: int | None) -> str:
    return "-" if n is None else (f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB")


def _worst(w: dict | None) -> str:
    if not w:
        return "-"
    op = "≤" if w["metric"] in ("max_abs", "max_rel") else "≥"
    return f"{w['hop']} {w['metric']} {w['value']:.3g} ({op} {w['limit']:.3g})"


def _column(c: CellResult) -> str:
    return c.id.split("/", 2)[2]


def markdown(r: MatrixResult) -> str:
    cols = list(dict.fromkeys(_column(c) for c in r.cells))
    rows = list(dict.fromkeys((c.label, _hashable(c.imgsz)) for c in r.cells))
    by = {(c.label, _hashable(c.imgsz), _column(c)): c for c in r.cells}
    n = r.counts
    lines = [f"# vitedge matrix: {Path(r.plan).name}", "",
             f"{len(r.cells)} cells: {n['passed']} passed, {n['failed']} failed, {n['unverified']} unverified, "
             f"{n['error']} error; {n['from_cache']} from the cache; exit code {r.exit_code}. Engine: {r.engine}.",
             "", "Each cell: status (linked to its report.json), the worst metric against its threshold, artifact "
             "size" + (", p50 latency on the artifact's own runtime" if r.bench else "") + ".", "",
             "| model | imgsz | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for label, imgsz in rows:
        cells = []
        for col in cols:
            c = by.get((label, imgsz, col))
            if c is None:
                cells.append("")
                continue
            link = c.report_path or c.traceback
            status = f"[{c.status}]({link})" if link else c.status
            bits = [status + (" (cached)" if c.from_cache else ""), _worst(c.worst), _size(c.bytes)]
            if r.bench:
                p50 = (c.latency or {}).get("p50_ms")
                bits.append("-" if p50 is None else f"{p50:.2f} ms")
            cells.append("<br>".join(bits))
        lines.append(f"| {label} | {written(imgsz)} | " + " | ".join(cells) + " |")
    notes = [c for c in r.cells if c.status != "passed"]
    if notes:
        lines += ["", "## Not passed", ""] + [f"- `{c.id}` **{c.status}**: {c.reason or '-'}" for c in notes]
    if r.skipped:
        lines += ["", "## Skipped (not supported by the target)", ""]
        lines += [f"- {s['model']}: {s['target']}-{s['precision']}: {s['why']}" for s in r.skipped]
    return "\n".join(lines) + "\n"


# ---- terminal ----------------------------------------------------------------------------------------

def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min"


class MatrixProgress:
    """One stderr line per finished cell: done/total, its status and time, failures so far, ETA."""

    def __init__(self, total: int, enabled: bool = True, stream=None):
        self.total, self.enabled = total, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.done = self.failures = self.built = 0
        self.t0 = time.monotonic()
        self.building_since: float | None = None

    def say(self, text: str) -> None:
        if self.enabled:
            print(text, file=self.stream, flush=True)

    def started_building(self) -> None:
        self.building_since = time.monotonic()

    def cell(self, c: CellResult) -> None:
        self.done += 1
        self.failures += c.status in ("failed", "error")
        if not c.from_cache:
            self.built += 1
        left = self.total - self.done
        eta = ""
        if left and self.built and self.building_since is not None:
            rate = (time.monotonic() - self.building_since) / self.built  # wall time per built cell, in parallel
            eta = f"  ETA {_duration(rate * left)}"
        took = "cached" if c.from_cache else (f"{c.seconds:.1f} s" if c.seconds is not None else "-")
        width = len(str(self.total))
        self.say(f"[{self.done:>{width}}/{self.total}] {c.status:<10} {c.id}  ({took})  "
                 f"failures: {self.failures}{eta}")


def format_summary(r: MatrixResult) -> str:
    rows = [("cell", "status", "worst metric", "size", "latency", "cache", "note")]
    for c in r.cells:
        p50 = (c.latency or {}).get("p50_ms")
        rows.append((c.id, c.status, _worst(c.worst), _size(c.bytes), "-" if p50 is None else f"{p50:.2f} ms",
                     "hit" if c.from_cache else "built", (c.reason or "")[:100]))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    table = "\n".join("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows)
    n = r.counts
    verdict = "PASSED" if r.exit_code == 0 else "FAILED"
    return (f"{table}\n\n{verdict}: {n['passed']} passed, {n['failed']} failed, {n['unverified']} unverified, "
            f"{n['error']} error ({n['from_cache']} from the cache) in {r.seconds:.1f} s   "
            f"table: {os.path.join(r.out, 'matrix.md')}")


def format_dry_run(r: MatrixResult) -> str:
    lines = [f"{len(r.cells)} cells ({sum(bool(c.cached) for c in r.cells)} in the cache {r.cache}):"]
    width = max(len(c.id) for c in r.cells)
    for c in r.cells:
        lines.append(f"  {c.id:<{width}}  {'cached' if c.cached else 'to build'}"
                     + (f"  ({c.reason})" if c.reason else ""))
    if r.skipped:
        lines.append(f"skipped ({len(r.skipped)}: the target does not support the precision):")
        lines += [f"  {s['model']}: {s['target']}-{s['precision']}" for s in r.skipped]
    return "\n".join(lines)


def _hashable(imgsz):
    """A result's size as a dict key (a non-square size read back from JSON is a list)."""
    return tuple(imgsz) if isinstance(imgsz, list) else imgsz
