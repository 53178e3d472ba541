"""Up-front checks of the paths a run will write (a report file, an output or cache folder), and the one line
a full or read-only disk gets: the user's environment, exit 2, never an internal error.

A run that writes its report only at the end would otherwise fail after all its work (and exit 3) on a --report
that names a folder or a place nothing can be written (`/proc/x.json`); each check here is called before any work.
Writability is probed by creating (and removing) a temporary file where the path will go: permission bits say
nothing on a read-only mount, for root, or under /proc.
"""
from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from ...errors import VitedgeError

# OSErrors that are the machine's state, not a bug: said in one line, exit 2
DISK_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is exceeded",
               errno.EROFS: "the file system is read-only"}


def _nearest_existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _probe(folder: Path, what: str) -> None:
    """VitedgeError unless a file can be created in the existing folder `folder`."""
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".vitedge-probe-"):
            pass
    except OSError as e:
        raise VitedgeError(f"{what}: cannot write in {folder} ({e.strerror or type(e).__name__}); give a writable "
                           "path") from None


def check_file_path(path: str | Path | None, flag: str) -> None:
    """A file the run writes at its end (`--report`, `--plot`): not a folder, and its folder (made if missing)
    writable. None: nothing to check."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise VitedgeError(f"{flag} {path} is a folder; give a file path (e.g. {path / 'report.json'})")
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise VitedgeError(f"{flag} {path}: {base} is a file, not a folder; give a path in a folder")
    _probe(base, f"{flag} {path}")


def check_folder_path(path: str | Path | None, flag: str) -> None:
    """A folder the run writes into (`--out`, `--cache`): not a file, and writable (or its nearest existing
    parent, where it is made). None: nothing to check."""
    if path is None:
        return
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise VitedgeError(f"{flag} {path} is a file; give a folder path")
    base = _nearest_existing(path)
    if not base.is_dir():
        raise VitedgeError(f"{flag} {path}: {base} is a file, not a folder; give a folder path")
    _probe(base, f"{flag} {path}")


def environment_error(e: BaseException) -> str | None:
    """The one line for an OSError that is the disk's state (full, over quota, read-only), else None."""
    if not isinstance(e, OSError) or e.errno not in DISK_ERRNOS:
        return None
    where = f" writing {e.filename}" if getattr(e, "filename", None) else ""
    return (f"{DISK_ERRNOS[e.errno]}{where}; nothing was kept from this run: free space (or choose another --out) "
            "and run it again")
