"""The matrix cache verifies before it trusts: an artifact swapped in DIR or inside the cache is re-hashed against
the sha256 its report records, never reported as passed; `--verify-cache` re-checks every entry without building."""
from __future__ import annotations

import json

from vitedge.cli import main
from vitedge.exporter.matrix import matrix
from vitedge.exporter.matrix.cache import Cache
from vitedge.targets.base import sha256_file
from vitedge.tests._matrix import XS, built, plan_of, write_plan

CELL = "swiftformer_xs/32/onnx-fp32"


def _swap(path):
    """Another file in place of an artifact: its bytes changed, its report untouched."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _artifact(folder):
    report = json.loads((folder / "report.json").read_text())
    entry = report["artifacts"]["onnx"]
    return folder / entry["path"], entry["sha256"]


def test_swapped_artifacts_in_dir_and_in_the_cache_are_caught(tmp_path, capsys):
    plan = write_plan(tmp_path / "plan", plan_of([XS]))
    out = tmp_path / "out"
    first = matrix(plan, out=out, workers=1, progress=False)
    assert first.exit_code == 0 and built(first) == {CELL}
    key = first.cell(CELL).cache_key

    # a swapped artifact in DIR: the cell is re-copied from the (verified) cache, saying so, never "passed" as is
    path, recorded = _artifact(out / CELL)
    _swap(path)
    second = matrix(plan, out=out, workers=1, progress=False)
    cell = second.cell(CELL)
    assert cell.from_cache and cell.status == "passed" and "re-copied from the cache" in cell.reason
    assert sha256_file(path) == recorded

    # a swapped artifact inside the cache, DIR's copy gone: the cell is rebuilt, saying why
    cached, _ = _artifact(Cache(out / ".cache").cell_output(key))
    _swap(cached)
    assert main(["-q", "matrix", "--out", str(out), "--verify-cache"]) == 1
    printed = capsys.readouterr().out
    assert "UNTRUSTED" in printed and "sha256" in printed and "1 cannot be trusted" in printed
    import shutil
    shutil.rmtree(out / CELL)
    third = matrix(plan, out=out, workers=1, progress=False)
    cell = third.cell(CELL)
    assert not cell.from_cache and cell.status == "passed" and "could not be trusted" in cell.reason
    assert sha256_file(_artifact(out / CELL)[0]) == _artifact(out / CELL)[1]
    assert main(["-q", "matrix", "--out", str(out), "--verify-cache"]) == 0
    assert "0 cannot be trusted" in capsys.readouterr().out


def test_require_verified_fails_an_untrusted_cache_entry_instead_of_rebuilding(tmp_path):
    plan = write_plan(tmp_path / "plan", plan_of([XS]))
    out = tmp_path / "out"
    key = matrix(plan, out=out, workers=1, progress=False).cell(CELL).cache_key
    store = Cache(out / ".cache")
    (store.cell_output(key) / "report.json").write_text("{ not json")  # an unreadable report is never trusted
    assert "report.json" in store.untrusted(key)
    result = matrix(plan, out=out, workers=1, progress=False, require_verified=True)
    cell = result.cell(CELL)
    assert cell.status == "failed" and "cannot be trusted" in cell.reason and result.exit_code == 1
    assert store.lookup(key) is None  # the untrusted entry is gone: the next run rebuilds it


def test_verify_cache_without_a_cache_is_a_usage_error(tmp_path, capsys):
    assert main(["-q", "matrix", "--out", str(tmp_path / "none"), "--verify-cache"]) == 2
    assert "no matrix cache" in capsys.readouterr().err
    assert main(["-q", "matrix", "--out", str(tmp_path / "none")]) == 2
    assert "needs a PLAN" in capsys.readouterr().err


def test_matrix_runs_from_a_plain_script_without_a_main_guard(tmp_path):
    """The Python API guide's five lines (docs/python.md) as a plain script: the workers never re-run it (its top
    level runs once) and every cell is built (before: every cell "error: the worker process died")."""
    import subprocess
    import sys

    write_plan(tmp_path, plan_of([XS]))
    (tmp_path / "script.py").write_text(
        "import vitedge\n"
        "print('TOP-LEVEL', flush=True)\n"
        "result = vitedge.matrix('plan.yaml', out='out', workers=2, progress=False)\n"
        "print('EXIT', result.exit_code, [c.status for c in result.cells], flush=True)\n")
    p = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("TOP-LEVEL") == 1 and "EXIT 0 ['passed']" in p.stdout, p.stdout + p.stderr
