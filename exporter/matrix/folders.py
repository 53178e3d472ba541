"""Atomic cell folders: copy a cached cell into DIR, commit a built folder, pack one for Ray's object store.

Every cell folder under DIR is built in a hidden sibling (exporter/core/outdir.py names it after its process) and
renamed into place in one step, as `vitedge export` does, so a killed matrix leaves each cell complete-old,
complete-new or absent. `.matrix-key` inside a cell folder names the cache entry it holds; a folder without
it (a crashed cell's traceback, a copy interrupted before the key was known), or whose artifacts no longer have the
sha256 their report records, is rebuilt or re-copied.
"""
from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

from ..core import outdir
from ...targets.base import sha256_file

KEY_FILE = ".matrix-key"
TRACEBACK = "traceback.txt"


def current_key(dest: Path) -> str | None:
    """The cache key of the intact cell folder `dest` (its report readable and every artifact it lists present with
    the sha256 the report records), or None."""
    dest = Path(dest)
    try:
        key = (dest / KEY_FILE).read_text().strip()
    except OSError:
        return None
    return key if key and untrusted(dest) is None else None


def untrusted(folder: Path) -> str | None:
    """Why the cell folder `folder` cannot be trusted as its report describes it, or None: its report.json missing
    or unreadable, or an artifact it lists missing or with another sha256 than the report records (re-hashed now:
    nothing cached is trusted without re-checking its hash)."""
    folder = Path(folder)
    try:
        report = json.loads((folder / "report.json").read_text())
        artifacts = (report.get("artifacts") or {}).items()
    except (OSError, ValueError, AttributeError) as e:
        return f"its report.json is missing or unreadable ({type(e).__name__})"
    for name, a in artifacts:
        path = folder / a["path"]
        if not path.exists():
            return f"artifact {a['path']} ({name}) is missing"
        if a.get("sha256") and sha256_file(path) != a["sha256"]:
            return (f"artifact {a['path']} ({name}) has sha256 {sha256_file(path)[:12]}..., its report records "
                    f"{a['sha256'][:12]}...")
    return None


BASE_META = "hub.json"  # a verified base's record (the base's former name, kept on disk)


def base_files(folder: Path) -> dict:
    """{file name: sha256} of every file of a verified base's folder but its hub.json (the record hub.json keeps
    of them)."""
    folder = Path(folder)
    return {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != BASE_META}


def base_untrusted(folder: Path) -> str | None:
    """Why the verified base's folder `folder` cannot be served to a cell, or None: its hub.json missing or
    unreadable, or its files not exactly those hub.json recorded when the base was verified (each re-hashed now, as
    a cell's artifacts are: a base's ONNX or ground truth changed in the cache would otherwise pass every cell built
    on it). The messages name it "hub", as its folder (hubs/) and --verify-cache's lines do."""
    folder = Path(folder)
    try:
        recorded = json.loads((folder / BASE_META).read_text()).get("files")
    except (OSError, ValueError, AttributeError) as e:
        return f"hub {folder.name[:12]}...: its {BASE_META} is missing or unreadable ({type(e).__name__})"
    if not isinstance(recorded, dict):
        return f"hub {folder.name[:12]}...: its {BASE_META} records no sha256 of its files (an older hub)"
    try:
        found = base_files(folder)
    except OSError as e:
        return f"hub {folder.name[:12]}...: unreadable ({type(e).__name__})"
    for name in sorted(set(recorded) | set(found)):
        if name not in found:
            return f"hub {folder.name[:12]}...: {name} is missing"
        if name not in recorded:
            return f"hub {folder.name[:12]}...: {name} was not there when the hub was verified"
        if found[name] != recorded[name]:
            return (f"hub {folder.name[:12]}...: {name} has sha256 {found[name][:12]}..., its {BASE_META} records "
                    f"{recorded[name][:12]}...")
    return None


def _fill(dest: Path, fill) -> None:
    """Build `dest` in a fresh hidden sibling with `fill(tmp)`, then commit it; nothing partial on any error."""
    dest = Path(dest)
    outdir.recover(dest)  # siblings a killed run left behind
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = outdir.sibling(dest, "tmp")
    try:
        fill(tmp)
        outdir.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def materialize(src: Path, dest: Path, key: str) -> None:
    """Put a copy of the cached cell folder `src` at `dest` (report.json's out_dir rewritten to `dest`)."""
    def fill(tmp: Path) -> None:
        # copies, not hard links: an artifact edited in place in DIR must never change the cache's copy
        shutil.copytree(src, tmp)
        report = tmp / "report.json"
        if report.is_file():
            data = json.loads(report.read_text())
            data["out_dir"] = str(dest)
            report.write_text(json.dumps(data, indent=2) + "\n")
        (tmp / KEY_FILE).write_text(key + "\n")

    _fill(dest, fill)


def write_error(dest: Path, text: str) -> None:
    """A crashed cell's folder: its traceback only (no report: the export never finished)."""
    def fill(tmp: Path) -> None:
        tmp.mkdir()
        (tmp / TRACEBACK).write_text(text)

    _fill(dest, fill)


def pack(folder: Path) -> bytes:
    """A folder as tar bytes (a Ray worker on another node sends its output back through the object store)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in sorted(Path(folder).rglob("*")):
            tar.add(p, arcname=str(p.relative_to(folder)), recursive=False)
    return buf.getvalue()


def unpack(data: bytes, dest: Path) -> None:
    """Unpack `pack()` bytes as the folder `dest`, atomically (replacing what was there)."""
    def fill(tmp: Path) -> None:
        tmp.mkdir()
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            tar.extractall(tmp, filter="data")  # refuses absolute paths, .. and links out of the folder

    _fill(dest, fill)
