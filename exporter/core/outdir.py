"""The output folder as one transaction: build in a hidden sibling, commit with renames, quarantine a failed
run's artifacts, recover what killed runs left behind, and make Ctrl-C end a run with nothing partial.

Every output is built in a hidden sibling and renamed into place (`.DIR.tmp-*`; with --force the previous
output is first moved aside to `.DIR.old-*`). A SIGKILL or power loss can leave such siblings. Their names
carry the owning process (`pid@host`), so the next run can tell an abandoned sibling from one a concurrent
run is still using: only siblings of a process on this host that no longer exists are touched.

- an abandoned `.tmp-*` is an unfinished build: removed;
- an abandoned `.old-*` is the previous complete output. If DIR is missing (the run died between moving it
  aside and moving the new one in), it is put back as DIR; if DIR exists, the commit had finished and the
  old copy is removed.

Ctrl-C: Python raises KeyboardInterrupt wherever the main thread is, and code that catches exceptions broadly
can swallow it. Measured here: an interrupt that lands while a C-extension module is being imported (e.g.
`import onnxruntime` on the first ONNX hop) surfaces as ImportError("initialization failed"), which optional-
dependency probes (ours and libraries') turn into "not installed" and go on. So during a run (InterruptWatch)
SIGINT is also recorded, and every `checkpoint()` and the commit re-raise KeyboardInterrupt if one was
recorded: the build folder is removed, DIR stays as it was, the CLI exits 130. The commit's renames are never
cut in half: a Ctrl-C there is raised once they are done.

Test hook: with VITEDGE_TEST_PAUSE_AT=NAME, `checkpoint(NAME)` writes the file VITEDGE_TEST_PAUSE_FILE and
waits (up to 120 s) before going on, so tests can signal a run at a known point instead of racing it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from ...errors import VitedgeError

QUARANTINE = "quarantine"
MANIFEST = ".vitedge-files.json"   # the files vitedge wrote in an output folder: what --force may replace
PAUSE_AT, PAUSE_FILE = "VITEDGE_TEST_PAUSE_AT", "VITEDGE_TEST_PAUSE_FILE"
PAUSE_LIMIT_S = 120.0

_OWNER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-[0-9a-f]+-(?P<pid>\d+)@(?P<host>[A-Za-z0-9_.]*)$")


# ---- hidden siblings and their recovery -----------------------------------------------------------------

def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())


def sibling(path: Path, kind: str) -> Path:
    """A fresh hidden sibling name of `path` for a build (`kind` "tmp") or a moved-aside output ("old")."""
    if kind not in ("tmp", "old"):
        raise ValueError(f"kind must be tmp or old; got {kind!r}")
    return path.with_name(f".{path.name}.{kind}-{uuid.uuid4().hex[:12]}-{os.getpid()}@{_host()}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def abandoned(path: Path) -> list[Path]:
    """Hidden siblings of `path` whose owning process (on this host) has ended."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    found = []
    for entry in path.parent.iterdir():
        m = _OWNER.match(entry.name)
        if m and m["name"] == path.name and m["host"] == _host() and not _alive(int(m["pid"])):
            found.append(entry)
    # moved-aside outputs first, the newest first: it is the one to put back if DIR is missing
    return sorted(found, key=lambda p: (".old-" not in p.name, -p.stat().st_mtime, p.name))


def recover(path: Path) -> list[str]:
    """Clean up after killed runs that wrote `path`; returns one line per action (for the user's log)."""
    path = Path(path)
    done = []
    for entry in abandoned(path):
        if ".old-" in entry.name and not path.exists():
            os.rename(entry, path)
            done.append(f"restored {path} from {entry.name} (a run replacing it was killed mid-way)")
        elif entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
            done.append(f"removed {entry.name} left by a killed run")
        else:
            entry.unlink(missing_ok=True)
            done.append(f"removed {entry.name} left by a killed run")
    return done


def replace(tmp: Path, path: Path) -> None:
    """Rename the finished folder `tmp` to `path`, which may exist: it is moved aside (`.old-*`) first and deleted
    after, so a kill at any moment leaves `path` complete-old, complete-new, or missing with the old copy aside
    (which `recover` puts back)."""
    if not os.path.lexists(path):
        os.rename(tmp, path)
        return
    old = sibling(path, "old")
    os.rename(path, old)
    try:
        os.rename(tmp, path)
    except BaseException:
        os.rename(old, path)
        raise
    shutil.rmtree(old, ignore_errors=True)


def check_out(out: Path, force: bool, clean: bool = False) -> None:
    """Refuse (VitedgeError, before any work, nothing touched) an --out vitedge cannot commit to: `.` or `..`, a
    file, a path under a file, a folder whose nearest existing ancestor cannot be written (permissions, an
    immutable folder, a read-only filesystem, /proc), a folder holding files without --force, and with --force one
    holding files vitedge did not write (MANIFEST), unless --clean."""
    out = Path(out)
    if clean and not force:
        raise VitedgeError("--clean deletes files vitedge did not write and only goes with --force; add --force")
    if out.name in ("", ".", ".."):
        raise VitedgeError(f"--out {out} names a folder by '.' or '..', which cannot be replaced as a unit; give the "
                           "folder's own name or a new one, e.g. --out runs/NAME")
    if out.exists() and not out.is_dir():
        raise VitedgeError(f"--out {out} is a file; give a folder path")
    check_parent(out)
    if out.exists() and any(out.iterdir()):
        if not force:
            raise VitedgeError(f"{out} already holds artifacts; pass --force to replace them or choose another --out")
        foreign = [] if clean else foreign_files(out)
        if foreign:
            more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            raise VitedgeError(f"--force would delete files vitedge did not write in {out}: {', '.join(foreign[:3])}"
                               f"{more}; move them away, or pass --force --clean to delete them too")


def check_parent(out: Path) -> None:
    """Refuse (VitedgeError) an output path (a folder or a file) under a file, or whose nearest existing folder
    cannot be written: outputs are built in a sibling there, so try it now, once, before the run instead of at its
    commit (root ignores permission bits, not an immutable folder, a read-only filesystem or /proc)."""
    out = Path(out)
    anc = next(p for p in out.parents if os.path.lexists(p))
    if not anc.is_dir():
        raise VitedgeError(f"--out {out} is under {anc}, which is a file; give a path in a folder")
    _check_writable(out, anc)


def _check_writable(out: Path, folder: Path) -> None:
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".vitedge-probe-", dir=folder))
    except OSError as e:
        raise VitedgeError(f"--out {out}: cannot write in {folder} ({e.strerror or e}); choose a folder you can write "
                           "(not a read-only filesystem or an immutable folder)") from None


def write_manifest(folder: Path) -> None:
    """Record every file of a finished output `folder` (relative paths) in MANIFEST: what --force may replace."""
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                   if (p.is_file() or p.is_symlink()) and p.name != MANIFEST)
    (folder / MANIFEST).write_text(json.dumps({"written_by": "vitedge", "files": files}, indent=1) + "\n")


def foreign_files(folder: Path) -> list[str]:
    """Files in `folder` that its MANIFEST does not list (all of them without a readable manifest)."""
    try:
        known = set(json.loads((folder / MANIFEST).read_text())["files"])
    except (OSError, ValueError, KeyError, TypeError):
        known = set()
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if (p.is_file() or p.is_symlink()) and p.name != MANIFEST and p.relative_to(folder).as_posix()
                  not in known)


def quarantine(folder: Path, keep: tuple[str, ...] = ("report.json",),
               add: Callable[[Path], None] | None = None) -> str | None:
    """Move every entry of `folder` but `keep` under folder/quarantine/ (so no app build picks it up), then let
    `add(q)` write more there. Returns "quarantine", or None (and no such folder) when nothing went there."""
    q = folder / QUARANTINE
    q.mkdir()
    for entry in folder.iterdir():
        if entry.name not in (QUARANTINE, *keep):
            entry.rename(q / entry.name)
    if add is not None:
        add(q)
    if any(q.iterdir()):
        return QUARANTINE
    q.rmdir()
    return None


# ---- interrupts ------------------------------------------------------------------------------------------

class InterruptWatch:
    """Records SIGINT while installed (main thread, default handler only) and raises KeyboardInterrupt as the
    default handler does, except inside `deferred()`; `raise_if_interrupted()` raises again where an earlier
    KeyboardInterrupt was swallowed."""

    def __init__(self):
        self.received = False
        self._defer = False
        self._previous = None

    def __enter__(self) -> "InterruptWatch":
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        self.received = True
        if not self._defer:
            raise KeyboardInterrupt

    def raise_if_interrupted(self) -> None:
        if self.received:
            raise KeyboardInterrupt

    @contextmanager
    def deferred(self):
        """Steps that must not stop half-way (the commit's renames): a Ctrl-C there is raised right after."""
        self._defer = True
        try:
            yield
        finally:
            self._defer = False
        self.raise_if_interrupted()

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


def _pause_for_tests(name: str) -> None:
    if os.environ.get(PAUSE_AT) != name:
        return
    marker = os.environ.get(PAUSE_FILE)
    if marker:
        Path(marker).write_text(f"{os.getpid()} {name}\n")
    end = time.monotonic() + PAUSE_LIMIT_S
    while time.monotonic() < end:  # a signal sent now lands here, at a known point of the run
        time.sleep(0.05)


# ---- the transaction -------------------------------------------------------------------------------------

class OutputFolder:
    """`with OutputFolder(out, force) as tx:` build into `tx.tmp`, call `tx.commit()` at the end. Leaving the
    block without a commit (an exception, Ctrl-C) removes the build folder and the parents it made; `out` is
    then exactly as it was. `interrupts`: a watch the caller opened earlier (to cover the work before the build
    folder exists); without one the folder watches Ctrl-C itself while it is open."""

    def __init__(self, out: Path, force: bool, interrupts: InterruptWatch | None = None):
        self.out, self.force = Path(out), force
        self.tmp = sibling(self.out, "tmp")
        self.committed = False
        self._made: list[Path] = []
        self._own_watch = interrupts is None
        self._interrupts = interrupts or InterruptWatch()

    def __enter__(self) -> "OutputFolder":
        if self._own_watch:
            self._interrupts.__enter__()
        try:  # (an exception here never reaches __exit__: clean up by hand)
            self._made = [p for p in [self.out.parent, *self.out.parent.parents] if not p.exists()]
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.tmp.mkdir()  # not mkdtemp: its 0700 mode would become the output folder's; mkdir follows the umask
            self.checkpoint("build-folder")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def checkpoint(self, name: str) -> None:
        """A named point of the run: re-raises a swallowed Ctrl-C; the test hook may pause here."""
        self._interrupts.raise_if_interrupted()
        _pause_for_tests(name)
        self._interrupts.raise_if_interrupted()

    def commit(self) -> None:
        """Rename the finished build folder into place (an empty existing folder is replaced by the rename). A
        Ctrl-C during the renames is raised once they are done: `out` is never left half-replaced."""
        self.checkpoint("commit")
        with self._interrupts.deferred():
            self._rename_into_place()

    def _rename_into_place(self) -> None:
        if not self.force and self.out.exists() and any(self.out.iterdir()):  # appeared while we were building
            raise VitedgeError(f"{self.out} already holds artifacts; pass --force to replace them")
        write_manifest(self.tmp)
        replace(self.tmp, self.out)
        self.committed = True

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if not self.committed:
                shutil.rmtree(self.tmp, ignore_errors=True)
                for p in self._made:  # innermost first; a folder someone else filled meanwhile stays
                    try:
                        p.rmdir()
                    except OSError:
                        break
        finally:
            if self._own_watch:
                self._interrupts.__exit__(exc_type, exc, tb)
