"""Exit 3, an internal error (a bug in vitedge): one line on stderr, the traceback (with the command and the
versions) saved to a file to attach to a report."""
from __future__ import annotations

import json
import os
import sys

CRASH_EXIT = 3  # (vitedge/cli.py EXIT_INTERNAL)


CRASH_DIR_ENV = "VITEDGE_CRASH_DIR"  # where an internal error's traceback is saved (default: the temp folder)


def one_line_warnings(message, category, filename, lineno, file=None, line=None):
    print(f"vitedge: warning: {message}", file=sys.stderr)


def crash(e: BaseException, argv: list[str]) -> int:
    """Exit 3: one line on stderr, the traceback (with the command and versions) saved to a file to report."""
    import platform
    import shlex
    import tempfile
    import time
    import traceback

    from vitedge import __version__

    first = (str(e).strip().splitlines() or [""])[0][:300]
    text = (f"vitedge {__version__}: internal error\ncommand: vitedge {shlex.join(argv)}\n"
            f"python {platform.python_version()} on {platform.platform()}\n")
    try:
        from vitedge.exporter.core.report import versions

        text += f"versions: {json.dumps(versions(), sort_keys=True)}\n"
    except Exception:  # noqa: BLE001  (the crash report must not crash)
        pass
    text += "\n" + "".join(traceback.format_exception(type(e), e, e.__traceback__))
    folder = os.environ.get(CRASH_DIR_ENV) or tempfile.gettempdir()
    try:
        os.makedirs(folder, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix=f"vitedge-crash-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".txt",
                                    dir=folder)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        where = f"traceback saved to {path}"
    except OSError as w:
        where = f"the traceback could not be saved ({w}; rerun with VITEDGE_DEBUG=1 to see it)"
    print(f"vitedge: internal error: {type(e).__name__}: {first}; {where}. This is a bug in vitedge: please report "
          "it with that file.", file=sys.stderr)
    return CRASH_EXIT

