"""The official golden fixtures are ground truth: a test that needs one fails (never skips) when it is missing."""
from __future__ import annotations

import os
import subprocess
import sys

from vitedge.tests.conftest import GOLDEN, REPO

TEST = "tests/test_swiftformer.py::test_golden_eval_output"


def _run(golden: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, VITEDGE_GOLDEN=golden)
    # -n 0: one process for one test (the suite's own -n 2 would start two workers for it)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", TEST], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_missing_golden_folder_fails_the_test(tmp_path):
    missing = tmp_path / "no_such_golden"
    r = _run(str(missing))
    assert r.returncode == 1, r.stdout[-2000:]
    assert "1 failed" in r.stdout and "skipped" not in r.stdout
    assert str(missing) in r.stdout and "VITEDGE_GOLDEN" in r.stdout


def test_the_same_test_passes_with_the_fixtures():
    assert GOLDEN.is_dir(), f"golden fixtures expected in {GOLDEN}; set VITEDGE_GOLDEN"
    r = _run(str(GOLDEN))
    assert r.returncode == 0, r.stdout[-2000:]
    assert "1 passed" in r.stdout
