"""CPU seconds per test file: the measurement behind docs/contributing.md's "The suite's time".

    python scripts/suite_cpu.py [--out FILE] [-- PYTEST_ARGS...]

runs `python -m pytest -q` (the README's test command, with PYTEST_ARGS added) with this module loaded as a
pytest plugin in the main process and in every xdist worker, then prints each file's CPU and wall seconds, the
costliest first, and writes them as JSON (--out, default suite_cpu.json in the current folder).

Why CPU and not `--durations`: the suite runs on two workers that keep both cores busy, so a test's wall time
includes the other worker's load (a test beside the benchmark scripts' concurrent run reads several times its
cost). A file's cost is its CPU time: its worker's and that of the subprocesses it started and waited for
(`resource.getrusage`, self and children, around each test, setup and teardown included). A subprocess that is
never waited for (a pool that outlives its test) is not counted.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest

RECORD_DIR = "VITEDGE_SUITE_CPU_DIR"  # where each pytest process writes its record (set by main())
_cpu: dict[str, float] = defaultdict(float)
_wall: dict[str, float] = defaultdict(float)


def _cpu_now() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


# ---- the pytest plugin (`-p suite_cpu`): one record per pytest process ----

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = _cpu_now(), time.perf_counter()
    yield
    _cpu[item.nodeid] += _cpu_now() - cpu
    _wall[item.nodeid] += time.perf_counter() - wall


def pytest_sessionfinish(session):
    folder = os.environ.get(RECORD_DIR)
    if folder and _cpu:
        name = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(folder, f"{name}.json").write_text(json.dumps({"cpu": _cpu, "wall": _wall}))


# ---- the runner and its table ----

def per_file(records: list[dict]) -> list[dict]:
    """Per test file: tests run, CPU and wall seconds, the costliest first."""
    files: dict[str, dict] = {}
    for rec in records:
        for nodeid, cpu in rec["cpu"].items():
            f = files.setdefault(nodeid.split("::")[0], {"tests": 0, "cpu_s": 0.0, "wall_s": 0.0})
            f["tests"] += 1
            f["cpu_s"] += cpu
            f["wall_s"] += rec["wall"][nodeid]
    rows = [{"file": k, "tests": v["tests"], "cpu_s": round(v["cpu_s"], 1), "wall_s": round(v["wall_s"], 1)}
            for k, v in files.items()]
    return sorted(rows, key=lambda r: (-r["cpu_s"], r["file"]))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, pytest_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="suite_cpu.json", help="the JSON written (default: suite_cpu.json here)")
    args = ap.parse_args(own)
    with tempfile.TemporaryDirectory(prefix="vitedge-suite-cpu-") as folder:
        env = {**os.environ, RECORD_DIR: folder,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))}
        started = time.perf_counter()
        rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "suite_cpu", *pytest_args], env=env).returncode
        wall = time.perf_counter() - started
        records = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))]
    rows = per_file(records)
    total = round(sum(r["cpu_s"] for r in rows), 1)
    Path(args.out).write_text(json.dumps({"pytest_exit_code": rc, "wall_s": round(wall, 1), "cpu_s_in_tests": total,
                                          "processes": len(records), "files": rows}, indent=1) + "\n")
    print(f"\n{'file':<60} {'tests':>5} {'CPU s':>8} {'wall s':>8}")
    for r in rows:
        print(f"{r['file']:<60} {r['tests']:>5} {r['cpu_s']:>8.1f} {r['wall_s']:>8.1f}")
    print(f"\n{total:.1f} CPU s inside the tests of {len(rows)} files, {wall:.1f} s wall for the whole run "
          f"(pytest exit {rc}); written to {args.out}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
