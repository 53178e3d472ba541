"""In CI (.ci/run exports CI=1 and installs them), a test whose reference library is missing fails instead of
skipping: the timm cross-check, the transformers round trip, the hub and Ray tests. Outside CI they skip with the
reason. (The official golden fixtures fail everywhere when missing: tests/test_golden_required.py.)"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vitedge.tests import _timm
from vitedge.tests._ci import require
from vitedge.tests.conftest import REPO

TIMM_TEST = "tests/test_swiftformer.py::test_matches_timm_swiftformer_xs"


@pytest.mark.parametrize("ci,outcome", [(None, pytest.skip.Exception), ("0", pytest.skip.Exception),
                                        ("1", pytest.fail.Exception), ("true", pytest.fail.Exception)])
def test_a_missing_reference_skips_outside_ci_and_fails_in_ci(monkeypatch, ci, outcome):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    for name in ("timm", "transformers"):
        monkeypatch.setitem(sys.modules, name, None)  # `import timm` raises ImportError
    for missing in (_timm.import_timm, _timm.import_transformers,
                    lambda: require("no_such_module_vitedge", "a reference library")):
        with pytest.raises(outcome, match="not importable|No module named|is not importable"):
            missing()


def test_ci_run_sets_ci_before_the_test_command():
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    test = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    assert any(line.startswith("export CI=") for line in lines[:test]), "export CI=1 before the test command"


def test_the_timm_cross_check_fails_in_ci_without_timm(tmp_path):
    """End to end: the real cross-check test, with `import timm` failing, is a failure under CI=1, not a skip."""
    (tmp_path / "timm.py").write_text("raise ImportError('timm removed for this test')\n")
    env = dict(os.environ, CI="1",
               PYTHONPATH=os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", TIMM_TEST], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "1 failed" in r.stdout and "skipped" not in r.stdout, r.stdout[-2000:]
    assert "timm removed for this test" in r.stdout and "CI installs it" in r.stdout
