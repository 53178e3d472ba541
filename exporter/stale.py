"""Names for the hidden build siblings of an output, and recovery of those a killed run left behind.

Every output is built in a hidden sibling and renamed into place (`.DIR.tmp-*`; with --force the previous
output is first moved aside to `.DIR.old-*`). A SIGKILL or power loss can leave such siblings. Their names
carry the owning process (`pid@host`), so the next run can tell an abandoned sibling from one a concurrent
run is still using: only siblings of a process on this host that no longer exists are touched.

- an abandoned `.tmp-*` is an unfinished build: removed;
- an abandoned `.old-*` is the previous complete output. If DIR is missing (the run died between moving it
  aside and moving the new one in), it is put back as DIR; if DIR exists, the commit had finished and the
  old copy is removed.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import uuid
from pathlib import Path

_OWNER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-[0-9a-f]+-(?P<pid>\d+)@(?P<host>[A-Za-z0-9_.]*)$")


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
