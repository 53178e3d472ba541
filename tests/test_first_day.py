"""A demanding user's first day: mistakes in what a user gives vitedge (a file that is not what its suffix says,
sizes and paths it cannot use) end in one clear line and exit 2 before any work, never in exit 3, an abort or a
half-written folder."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vitedge.tests.conftest import REPO


def _cli(*args, cwd=None, env=None) -> subprocess.CompletedProcess:
    """The command line in a child process: an abort (SIGABRT) there is an exit status here, not a dead test run."""
    return subprocess.run([sys.executable, str(REPO / "cli.py"), *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=600)


@pytest.mark.parametrize("content", [os.urandom(4096), b"", b"PK\x03\x04not a program at all"],
                         ids=["random", "empty", "zip"])
def test_a_pte_that_is_not_a_program_is_a_usage_error_not_an_abort(tmp_path, content):
    bad = tmp_path / "model.pte"
    bad.write_bytes(content)
    r = _cli("parity", "--artifact", str(bad), "--model", "swiftformer_xs", "--imgsz", "32", "--samples", "2")
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "is not an ExecuTorch program" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("content", [b"", os.urandom(4096)], ids=["empty", "random"])
def test_an_onnx_file_that_holds_no_graph_is_a_usage_error(tmp_path, content, capsys):
    from vitedge.cli import main

    bad = tmp_path / "model.onnx"
    bad.write_bytes(content)
    assert main(["-q", "parity", "--artifact", str(bad), "--model", "swiftformer_xs", "--imgsz", "32",
                 "--samples", "2"]) == 2
    assert "is not a readable ONNX file" in capsys.readouterr().err
