"""Where cells run: the local process pool (default) here; Ray in ray_engine.py. Both take Jobs and give back
(job, result) pairs from `poll()`, so the driver (run.py) does not care which one runs a cell.

The local pool keeps N worker processes (`--workers`, default from the cores), each with cores // N
intra-op threads (torch and ONNX Runtime), so workers x threads <= cores. Workers are forked from
multiprocessing's fork server, which imports torch and the pipeline once (preload) and never runs a cell, so
a worker starts in milliseconds and the driver itself never imports torch (spawn where there is no fork
server). A worker runs cells one at a time; the driver sends each job to an idle worker over a pipe, so it
knows which cell a dying worker was running: that cell becomes status "error" (its exit signal and the log
tail saved) and a fresh worker takes the slot. Workers die with the fork server, which dies with the driver
(PR_SET_PDEATHSIG on Linux). Their stdout/stderr (library chatter) go to DIR/.matrix/worker-N.log.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .plan import Cell

MAX_DEFAULT_WORKERS = 8  # each worker holds torch and a model; more rarely helps an export-bound matrix
STOP_GRACE_S = 10.0      # how long an interrupted worker may take to clean up its build folder
LOG_TAIL = 4000


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def size_pool(workers: int | None, cells: int) -> tuple[int, int]:
    """(workers, intra-op threads per worker): workers x threads <= cores."""
    n = cores()
    w = workers or max(1, min(n, MAX_DEFAULT_WORKERS, cells))
    return w, max(1, n // w)


@dataclass
class Job:
    cell: Cell
    key: str
    out: str | None = None        # local pool: the cache folder the export writes
    base: str | None = None       # local pool: the verified base's folder (read, or written by its group's first)
    base_blob: object = None      # Ray: the packed verified base (an ObjectRef), or None
    build_base: bool = False      # the first cell of its model and size: stores the verified base it builds
    bench: bool = False
    index: int = 0

    def payload(self) -> dict:
        return {"cell": self.cell.to_dict(), "out": self.out, "base": self.base, "bench": self.bench}


def crashed(what: str, log: Path | None = None) -> dict:
    tail = ""
    if log is not None and log.is_file():
        tail = "\n--- worker log (tail) ---\n" + log.read_text(errors="replace")[-LOG_TAIL:]
    return {"status": "error", "reason": what, "report": None, "traceback": what + tail, "latency": None,
            "base_stored": False, "seconds": None}


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this worker when the driver dies (Linux), so no orphan keeps exporting."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


DRIVER_POLL_S = 0.5  # how often a worker checks that its driver is alive


def _watch_driver(driver: int) -> None:
    """Stop this worker once the driver process `driver` is gone: its kernel parent is the fork server, not the
    driver, so PR_SET_PDEATHSIG alone let the workers of a SIGKILLed driver export (and store verified bases) for
    about 20 s more. SIGINT first (the export removes its build folder), SIGKILL after STOP_GRACE_S, as the
    driver's own stop."""
    def watch() -> None:
        while True:
            time.sleep(DRIVER_POLL_S)
            try:
                os.kill(driver, 0)
            except ProcessLookupError:
                break
            except PermissionError:  # alive, under another user (its pid reused): not ours to wait for
                break
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(STOP_GRACE_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="vitedge-driver-watch", daemon=True).start()


def _worker_main(conn, threads: int, log: str, driver: int | None = None) -> None:
    _die_with_parent()
    if driver is not None:
        _watch_driver(driver)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)  # for libraries loaded from here on (torch's own count is set below)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    from .cell import configure_threads, run_cell

    configure_threads(threads)
    while True:
        try:
            job = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if job is None:
            return
        try:
            result = run_cell(**job)
        except KeyboardInterrupt:  # the export removed its build folder; the driver is stopping
            return
        conn.send(result)


@contextmanager
def _main_script_hidden():
    """Start a worker without re-running the user's script in it. multiprocessing's spawn and fork-server children
    import __main__ again (as __mp_main__), which runs a plain script's unguarded `vitedge.matrix(...)` once per
    worker; a worker runs vitedge's own code only, so it is started as if __main__ had no file."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in getattr(main, "__dict__", {})}
    try:
        main.__dict__.pop("__file__", None)
        if "__spec__" in saved:
            main.__spec__ = None
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)


def _context():
    """The fork server (torch and the pipeline preloaded once) where there is one, else spawn; never a plain fork
    of the driver, which may hold threads (Ray's, the progress timer's)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([f"{__name__.rsplit('.', 1)[0]}.preload"])
    return ctx


@dataclass
class _Slot:
    n: int
    proc: object = None
    conn: object = None
    job: Job | None = None
    log: Path | None = None


class LocalPool:
    name = "local"

    def __init__(self, workers: int, threads: int, log_dir: Path):
        self.workers, self.threads, self.log_dir = workers, threads, Path(log_dir)
        self.ctx = _context()
        self.slots: list[_Slot] = []

    def describe(self) -> str:
        return f"local pool: {self.workers} worker(s) x {self.threads} thread(s)"

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.slots = [_Slot(i) for i in range(self.workers)]

    def _spawn(self, s: _Slot) -> None:
        s.log = self.log_dir / f"worker-{s.n}.log"
        parent, child = self.ctx.Pipe()
        s.proc = self.ctx.Process(target=_worker_main, args=(child, self.threads, str(s.log), os.getpid()),
                                  daemon=True, name=f"vitedge-matrix-{s.n}")
        with _main_script_hidden():
            s.proc.start()
        child.close()
        s.conn = parent

    def free(self) -> int:
        return sum(s.job is None for s in self.slots)

    def running(self) -> int:
        return sum(s.job is not None for s in self.slots)

    def submit(self, job: Job) -> None:
        s = next(s for s in self.slots if s.job is None)
        if s.proc is None or not s.proc.is_alive():
            self._spawn(s)
        s.job = job
        s.conn.send(job.payload())

    def poll(self, timeout: float) -> list[tuple[Job, dict]]:
        from multiprocessing.connection import wait

        busy = [s for s in self.slots if s.job is not None]
        if not busy:
            time.sleep(timeout)
            return []
        wait([s.conn for s in busy] + [s.proc.sentinel for s in busy], timeout)
        done = []
        for s in busy:
            result = None
            if s.conn.poll():
                try:
                    result = s.conn.recv()
                except (EOFError, OSError):
                    result = None
            if result is None and s.proc.is_alive():
                continue
            if result is None:  # died without answering: this slot's cell crashed the process
                code = s.proc.exitcode
                how = f"signal {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
                result = crashed(f"the worker process died ({how}) while running this cell", s.log)
                s.proc = None
            done.append((s.job, result))
            s.job = None
        return done

    def stop(self, interrupted: bool = False) -> None:
        """Idle workers are told to exit; on an interrupt busy ones get SIGINT (their export removes its build
        folder) and, after STOP_GRACE_S, SIGKILL."""
        for s in self.slots:
            if s.proc is None:
                continue
            if s.job is None:
                try:
                    s.conn.send(None)
                except OSError:
                    pass
            elif interrupted and s.proc.is_alive():
                os.kill(s.proc.pid, signal.SIGINT)
        deadline = time.monotonic() + STOP_GRACE_S
        for s in self.slots:
            if s.proc is None:
                continue
            s.proc.join(max(0.0, deadline - time.monotonic()))
            if s.proc.is_alive():
                s.proc.kill()
                s.proc.join()
            s.conn.close()
            s.proc = None
