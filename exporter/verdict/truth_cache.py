"""A disk cache of the train-form's float64 ground truth (parity.ground_truth), so that re-exporting or
re-checking the same weights on the same parity set skips the costliest step of a run (16 of the main job's 42 s
on the 2-core development machine, when it was measured).

The key is the sha256 of a canonical JSON of everything the two outputs depend on:
  - the model: its structure (`repr`: every module and hyper-parameter), the bytecode of every method of every
    module class in it without file names (a patched `forward` is a different model; where vitedge is installed
    is not), and a digest of every parameter and buffer;
  - the inputs, by content; the chunk size and the float32 run's thread count (its rounding depends on both);
  - torch's version and CPU capability (the float32 kernels), numpy's version, vitedge's source digest.
A model that runs hooks or has an instance-level `forward` is not cached: its computation is not in the key.

An entry is one .npz (y64 float64; y32 and y32_alt float32: the two float32 runs' outputs, stored exactly) plus
its key and a sha256 of the key and the three arrays (`digest`), written by rename; it is used only when its
stored key equals the one asked for, its arrays re-hash to its digest, have the inputs' row count and are finite,
else recomputed and replaced. The digest catches an entry changed after it was written (truncated, edited,
its outputs rescaled); it is not a signature: whoever can write the cache folder can write a matching digest,
so a cache folder shared with someone untrusted is turned off. Where: $VITEDGE_CACHE_DIR/truth, else $XDG_CACHE_HOME/vitedge/truth,
else ~/.cache/vitedge/truth; the oldest entries go beyond MAX_ENTRIES. Off with $VITEDGE_TRUTH_CACHE=off or
`--no-truth-cache`. report.json `reference.cache` says what happened ("hit", "stored", "off", "uncacheable" and
why, "not stored" and why).
"""
from __future__ import annotations

import hashlib
import json
import marshal
import os
import platform
import tempfile
import types
from pathlib import Path

import numpy as np

from .criteria import GroundTruth
from ..core.digests import json_digest
from .parity import GROUND_TRUTH_BATCH, REFERENCE_THREADS, ground_truth

SCHEMA = 3  # 2: the second float32 computation (channels-last) is stored too; 3: with the digest of its contents
MAX_ENTRIES = 64          # ~3 MB each at 256 inputs x 1000 classes
SWITCH_ENV = "VITEDGE_TRUTH_CACHE"
DIR_ENV = "VITEDGE_CACHE_DIR"


def cache_dir() -> Path:
    """Where ground truths are kept ($VITEDGE_CACHE_DIR, else the XDG cache folder)."""
    root = os.environ.get(DIR_ENV)
    if root:
        return Path(root) / "truth"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vitedge" / "truth"


def enabled(requested: bool = True) -> bool:
    """The cache is used unless the caller or $VITEDGE_TRUTH_CACHE (off / 0 / no / false) turns it off."""
    return requested and os.environ.get(SWITCH_ENV, "on").strip().lower() not in ("off", "0", "no", "false")


def _why_uncacheable(model) -> str | None:
    for name, m in model.named_modules():
        if "forward" in vars(m):
            return f"module {name or '(root)'} has an instance-level forward"
        if m._forward_hooks or m._forward_pre_hooks:
            return f"module {name or '(root)'} runs forward hooks"
    return None


def _code_digest(model) -> str:
    """sha256 over the bytecode of every function defined on the classes of `model`'s modules (and their bases
    up to torch's own): a class patched at run time changes it."""
    h = hashlib.sha256()
    seen = set()
    for m in model.modules():
        for cls in type(m).__mro__:
            if cls in seen or cls.__module__.startswith(("torch.", "builtins")) or cls is object:
                continue
            seen.add(cls)
            h.update(f"{cls.__module__}.{cls.__qualname__}".encode())
            for attr, fn in sorted(vars(cls).items()):
                code = getattr(fn, "__code__", None)
                if code is not None:
                    h.update(attr.encode() + b"\0" + marshal.dumps(_without_paths(code)))
    return h.hexdigest()


def _without_paths(code: types.CodeType) -> types.CodeType:
    """`code` with no file name, nested code (comprehensions, lambdas) included: where vitedge is installed (a
    checkout run as cli.py, a site-packages copy) is not part of the computation, and the key is written into
    bundles, which must not change with it."""
    consts = tuple(_without_paths(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename="", co_consts=consts)


def _weights_digest(model) -> str:
    import torch

    h = hashlib.sha256()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        a = t.detach().cpu().contiguous()
        h.update(f"{name}:{a.dtype}:{tuple(a.shape)}".encode())
        if a.numel():
            h.update(a.view(-1).view(torch.uint8).numpy())  # the bytes, without a copy
    return h.hexdigest()


def truth_key(model, x: np.ndarray, batch: int = GROUND_TRUTH_BATCH, threads: int = REFERENCE_THREADS) -> dict:
    """What the ground truth of `model` on `x` depends on (canonical, JSON-able); its `json_digest` names it."""
    import torch

    from ..core.digests import source_digest
    from ..core.report import versions

    v = versions()
    return {"schema": SCHEMA, "structure": hashlib.sha256(repr(model).encode()).hexdigest(),
            "code": _code_digest(model), "weights": _weights_digest(model),
            "inputs": hashlib.sha256(np.ascontiguousarray(x, dtype=np.float32).tobytes()).hexdigest(),
            "shape": list(np.shape(x)), "batch": int(batch), "float32_threads": int(threads),
            "torch": torch.__version__, "cpu": torch.backends.cpu.get_cpu_capability(), "machine": platform.machine(),
            "numpy": v.get("numpy"), "vitedge": v.get("vitedge"), "vitedge_source": source_digest()}


def _load(path: Path, key: dict, rows: int) -> tuple[np.ndarray, np.ndarray] | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            stored_key = str(z["key"])
            if json.loads(stored_key) != key:
                return None
            y64, y32, alt = z["y64"], z["y32"], z["y32_alt"]
            if str(z["digest"]) != _contents_digest(stored_key, y64, y32, alt):
                return None  # changed after it was written: never trusted
            y64, y32, alt = np.asarray(y64, np.float64), np.asarray(y32, np.float32), np.asarray(alt, np.float32)
    except Exception:  # unreadable, truncated, or without a digest: recompute and replace
        return None
    if y64.shape != y32.shape or y64.shape != alt.shape or y64.ndim != 2 or len(y64) != rows:
        return None
    if not (np.isfinite(y64).all() and np.isfinite(y32).all() and np.isfinite(alt).all()):
        return None
    return y64, y32, alt


def _contents_digest(key_json: str, *arrays: np.ndarray) -> str:
    """sha256 of an entry's key (its stored JSON) and arrays (dtype, shape and bytes of each)."""
    h = hashlib.sha256(key_json.encode())
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"\0{a.dtype.str}:{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _store(folder: Path, path: Path, key: dict, truth: GroundTruth) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    key_json = json.dumps(key, sort_keys=True)
    y64, y32, alt = (np.asarray(truth.y64), truth.y32.astype(np.float32), truth.y32_alt.astype(np.float32))
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, key=np.array(key_json), y64=y64, y32=y32, y32_alt=alt,
                     digest=np.array(_contents_digest(key_json, y64, y32, alt)))
        os.replace(tmp, path)  # readers see the old entry or the whole new one
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    entries = sorted(folder.glob("*.npz"), key=lambda p: p.stat().st_mtime)
    for old in entries[:max(0, len(entries) - MAX_ENTRIES)]:
        old.unlink(missing_ok=True)


def cached_ground_truth(model, x, sets: tuple[str, ...], labels=None, use_cache: bool = True,
                        **kw) -> tuple[GroundTruth, dict]:
    """`parity.ground_truth(model, x, sets, labels, **kw)` through the disk cache: (truth, what happened: the
    report's `reference.cache` block)."""
    if not enabled(use_cache):
        return ground_truth(model, x, sets, labels, **kw), {"status": "off"}
    why = _why_uncacheable(model)
    if why is not None:
        return ground_truth(model, x, sets, labels, **kw), {"status": "uncacheable", "why": why}
    key = truth_key(model, x, kw.get("batch", GROUND_TRUTH_BATCH), kw.get("threads", REFERENCE_THREADS))
    digest = json_digest(key)
    folder = cache_dir()
    path = folder / f"{digest}.npz"
    hit = _load(path, key, len(x)) if path.is_file() else None
    if hit is not None:
        os.utime(path)  # recently used entries are the last pruned
        truth = GroundTruth(hit[0], hit[1].astype(np.float64), tuple(sets),
                            None if labels is None else np.asarray(labels, dtype=np.int64),
                            float32_threads=key["float32_threads"], y32_alt=hit[2].astype(np.float64))
        return truth, {"status": "hit", "key": digest[:16], "path": str(path)}
    truth = ground_truth(model, x, sets, labels, **kw)
    try:
        _store(folder, path, key, truth)
    except OSError as e:  # a read-only or full disk costs the next run time, never this run's verdict
        return truth, {"status": "not stored", "key": digest[:16], "why": f"{type(e).__name__}: {e}"}
    return truth, {"status": "stored", "key": digest[:16], "path": str(path)}
