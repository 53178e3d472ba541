"""The digests the caches key by (the matrix cache, exporter/matrix/cache.py, and the ground-truth cache,
exporter/verdict/truth_cache.py): of a canonical JSON document, and of vitedge's own source (a development checkout
changes without a version bump).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

_SOURCE_SKIP = {"tests", "benchmarks", "scripts", "examples", "docs", "runs", "build"}
_PACKAGE_DATA = ("exporter/verdict/photos",)


def json_digest(obj) -> str:
    """sha256 of `obj` as canonical JSON (sorted keys, no spaces; what JSON cannot hold, as str)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def source_digest() -> str:
    """sha256 over vitedge's own .py files (not tests or benchmarks) and the package data that shapes verdicts
    (the natural parity set's photos): a change to either is a new toolchain."""
    root = Path(__file__).resolve().parents[2]  # the package root (the repository top level)
    h = hashlib.sha256()
    data = [p for d in _PACKAGE_DATA if (root / d).is_dir() for p in (root / d).rglob("*") if p.is_file()]
    for p in sorted([*root.rglob("*.py"), *data]):
        rel = p.relative_to(root)
        if rel.parts[0] in _SOURCE_SKIP or any(part.startswith(".") for part in rel.parts):
            continue
        h.update(str(rel).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()
