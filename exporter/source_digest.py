"""A digest of vitedge's own source: what the caches key a toolchain by (the matrix cache, exporter/matrix/cache.py,
and the ground-truth cache, exporter/truth_cache.py), since a development checkout changes without a version bump.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

_SOURCE_SKIP = {"tests", "benchmarks", "scripts", "examples", "docs", "runs", "build"}
_PACKAGE_DATA = ("exporter/photos",)


def source_digest() -> str:
    """sha256 over vitedge's own .py files (not tests or benchmarks) and the package data that shapes verdicts
    (the natural parity set's photos): a change to either is a new toolchain."""
    root = Path(__file__).resolve().parents[1]  # the package root (the repository top level)
    h = hashlib.sha256()
    data = [p for d in _PACKAGE_DATA if (root / d).is_dir() for p in (root / d).rglob("*") if p.is_file()]
    for p in sorted([*root.rglob("*.py"), *data]):
        rel = p.relative_to(root)
        if rel.parts[0] in _SOURCE_SKIP or any(part.startswith(".") for part in rel.parts):
            continue
        h.update(str(rel).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()
