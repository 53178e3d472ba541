"""sha256 of files on disk: a checkpoint's weights (models/checkpoints/), and (through targets/base.py) every
artifact vitedge writes.

One implementation for every layer: models/ is the lowest layer that both the checkpoint room and the targets can
import. Torch-free, so the CLI's parsers (built from targets/base.py) stay fast.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 1 << 20  # bytes read at a time: a 1 GB checkpoint is never held in memory whole


def sha256_file(path: str | Path, chunk: int = CHUNK) -> str:
    """sha256 of a file, or of every file in a folder (sorted relative paths + contents; .mlpackage is a folder)."""
    path = Path(path)
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        if path.is_dir():
            h.update(str(f.relative_to(path)).encode() + b"\0")
        with open(f, "rb") as fh:
            while block := fh.read(chunk):
                h.update(block)
    return h.hexdigest()


def digest_files(files) -> str:
    """sha256 of a checkpoint's weights: the file's own for one file, else over every file's name and sha256 (the
    shards of a sharded checkpoint, in index order)."""
    files = tuple(files)
    if len(files) == 1:
        return sha256_file(files[0])
    h = hashlib.sha256()
    for f in files:
        h.update(f"{Path(f).name}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()
